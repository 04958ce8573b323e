r"""PPO with a critic on the arithmetic task (Schulman et al. 2017; the RLHF form of Ouyang et al.
2022): GAE advantages from a learned value function, token-level rewards (the verifier's score on
the last completion token), clipped policy and value losses, 2 epochs of 2 mini-batches per
rollout batch.

  python -m rft_jax.main --config configs/ppo_arith.py --workdir runs/ppo_arith

Everything but the algorithm section is configs/grpo_arith.py (same data, model, budget and the
`:tiny` variant). The critic is a value head on the policy's own backbone
(`--config.algo.critic=separate` trains a second copy of the base model as the critic instead,
at about twice the forward/backward cost). Critic metrics use verl's names: critic/vf_loss,
critic/vf_clipfrac, critic/vf_explained_var, critic/values/mean, critic/returns/mean.
`--config.algo.advantage=grpo` (or any other critic-free advantage) runs the same settings
without a critic: the PPO keys below keep their values, unused (rft_jax/config_rules.py).
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'ppo_arith'
  config.algo.advantage = 'gae'        # GAE over completion tokens, from the critic's values
  config.algo.critic = 'shared'        # value head on the policy backbone; or 'separate'
  config.algo.gamma = 1.0              # no discount within a (short) completion
  config.algo.lam = 0.95
  config.algo.adv_whiten = True        # advantages whitened over the batch's completion tokens
  config.algo.vf_coef = 0.1            # the value loss's weight on the shared backbone
  config.algo.vf_clip = 0.2            # |V - V_old| <= 0.2 in the clipped value loss
  config.algo.critic_lr = 1e-3         # the value head's (or separate critic's) optimiser
  config.algo.loss = 'ppo_clip'
  config.algo.loss_agg = 'token_mean'
  config.algo.clip_eps = 0.2
  config.algo.kl_coef = 0.02           # k3 KL to the reference in the loss, as grpo_arith
  config.algo.kl_estimator = 'k3'
  config.algo.updates_per_batch = 2    # PPO epochs over each rollout batch ...
  config.algo.minibatches = 2          # ... each of 2 mini-batch updates: 4 updates per step
  return config
