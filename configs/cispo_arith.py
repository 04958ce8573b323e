r"""CISPO on the arithmetic task: REINFORCE-style loss weighted by a clipped, stop-gradient
importance ratio, token-mean loss, no KL (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585).

  python -m rft_jax.main --config configs/cispo_arith.py --workdir runs/cispo_arith

Everything but the algorithm section is configs/grpo_arith.py (and its `:tiny` variant). As in
the paper there is no lower bound on the weight (clip_eps = 1: the bound is 0); the paper
tunes only the upper bound and we did not find its value: 0.28 (DAPO's clip-higher) is our choice.
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'cispo_arith'
  config.algo.advantage = 'grpo'
  config.algo.loss = 'cispo'
  config.algo.clip_eps = 1.0         # lower bound 1 - 1 = 0: none (clip_eps_low follows it)
  config.algo.clip_eps_high = 0.28
  config.algo.loss_agg = 'token_mean'
  config.algo.kl_coef = 0.0
  return config
