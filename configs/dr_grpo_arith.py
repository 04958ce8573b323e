r"""Dr.GRPO on the arithmetic task: group-mean baseline without std scaling, token sums divided by
a constant length, no KL (Liu et al. 2025, "Understanding R1-Zero-Like Training",
arXiv:2503.20783).

  python -m rft_jax.main --config configs/dr_grpo_arith.py --workdir runs/dr_grpo_arith

Everything but the algorithm section is configs/grpo_arith.py (and its `:tiny` variant).
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'dr_grpo_arith'
  config.algo.advantage = 'dr_grpo'                 # A = r - mean(r_group)
  config.algo.loss = 'ppo_clip'
  config.algo.loss_agg = 'seq_mean_token_sum_norm'  # sum_t loss / max_len, mean over sequences
  # max_len, the constant normaliser, is left out: it then is rollout.max_new_tokens (the
  # generation budget), also after an override of that.
  config.algo.kl_coef = 0.0
  return config
