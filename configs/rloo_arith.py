r"""RLOO on the arithmetic task: leave-one-out group baseline, sequence-level KL penalty in the
reward (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740; Kool et al. 2019).

  python -m rft_jax.main --config configs/rloo_arith.py --workdir runs/rloo_arith

Everything but the algorithm section is configs/grpo_arith.py (and its `:tiny` variant).
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'rloo_arith'
  config.algo.advantage = 'rloo'      # A_i = r_i - mean_{j != i} r_j
  config.algo.loss = 'ppo_clip'
  config.algo.loss_agg = 'token_mean'
  config.algo.kl_in_reward = True     # r_i -= kl_coef * sum_t k3(old_logp, ref_logp)
  config.algo.kl_estimator = 'k3'     # (the paper's log-ratio is 'k1'; k3 is >= 0, lower variance)
  config.algo.kl_coef = 0.02
  return config
