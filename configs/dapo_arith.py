r"""DAPO-style GRPO on the arithmetic task: decoupled clip bounds (clip-higher), token-mean loss,
no KL term (Yu et al. 2025, arXiv:2503.14476).

  python -m rft_jax.main --config configs/dapo_arith.py --workdir runs/dapo_arith

Everything but the algorithm section is configs/grpo_arith.py (same data, model, budget, and the
`:tiny` variant). Only the loss-side parts of DAPO are here: dynamic sampling and the overlong
reward shaping are not implemented.
"""
from configs import grpo_arith


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'dapo_arith'
  config.algo.advantage = 'grpo'
  config.algo.loss = 'ppo_clip'
  config.algo.clip_eps_low = 0.2     # ratio >= 1 - 0.2 for A < 0
  config.algo.clip_eps_high = 0.28   # clip-higher: ratio <= 1 + 0.28 for A > 0
  config.algo.loss_agg = 'token_mean'
  config.algo.kl_coef = 0.0
  return config
