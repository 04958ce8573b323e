r"""GSPO on the arithmetic task: one length-normalised importance ratio per completion, clipped
to [1 - 3e-4, 1 + 4e-4] (Zheng et al. 2025, arXiv:2507.18071, section 5.1), sequence-mean loss,
no KL.

  python -m rft_jax.main --config configs/gspo_arith.py --workdir runs/gspo_arith

Everything but the algorithm section is configs/grpo_arith.py (and its `:tiny` variant). The
bounds are tiny because the ratio is a geometric mean over tokens; with updates_per_batch = 2 the
second update clips a large share of sequences (watch clip_frac).
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'gspo_arith'
  config.algo.advantage = 'grpo'
  config.algo.loss = 'gspo'
  config.algo.clip_eps = 3e-4        # the lower bound (clip_eps_low follows it)
  config.algo.clip_eps_high = 4e-4
  config.algo.loss_agg = 'seq_mean_token_mean'   # GSPO-token + this = GSPO's sequence objective
  config.algo.kl_coef = 0.0
  return config
