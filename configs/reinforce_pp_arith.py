r"""REINFORCE++ on the arithmetic task: rewards normalised over the whole batch (no group
baseline), KL penalty in the reward, PPO-clip loss (Hu 2025, arXiv:2501.03262).

  python -m rft_jax.main --config configs/reinforce_pp_arith.py --workdir runs/reinforce_pp_arith

Everything but the algorithm section is configs/grpo_arith.py (and its `:tiny` variant). The
estimator also accepts rollout.group_size = 1; the recipe keeps G = 8 so that runs are comparable
(and the monitor's zero-std check, which reads a group of 1 as "no signal", stays meaningful).
Use algo.advantage = 'reinforce_pp_baseline' for the group-mean-baseline variant.
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'reinforce_pp_arith'
  config.algo.advantage = 'reinforce_pp'   # A = (r - mean_batch r) / std_batch r
  config.algo.loss = 'ppo_clip'
  config.algo.loss_agg = 'token_mean'
  config.algo.kl_in_reward = True          # per-token KL summed into each sequence's reward
  config.algo.kl_estimator = 'k3'          # the paper's is the log-ratio 'k1'; k3 is >= 0 and
                                           # keeps the monitored 'kl' signal non-negative
  config.algo.kl_coef = 0.01
  return config
