r"""REINFORCE++ on the arithmetic task: no group baseline, the KL penalty in the reward per token
(each token's return is the reward minus the KL from it to the end), returns whitened over the
whole batch's tokens, PPO-clip loss (Hu 2025, arXiv:2501.03262; OpenRLHF's 'reinforce').

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
  config.algo.advantage = 'reinforce_pp'   # A_t = whitened over the batch's tokens of
  config.algo.loss = 'ppo_clip'            #   G_t = r - kl_coef * sum_{i >= t} KL_i
  config.algo.loss_agg = 'token_mean'
  config.algo.kl_in_reward = True          # KL per token, as a return to go (the paper's form)
  config.algo.kl_estimator = 'k3'          # the paper's is the log-ratio 'k1'; k3 is >= 0 and
                                           # keeps the monitored 'kl' signal non-negative, but as
                                           # a reward its expected gradient is not KL's gradient
                                           # (k1's is): a biased penalty, not only a noisier one
  config.algo.kl_coef = 0.01
  return config
