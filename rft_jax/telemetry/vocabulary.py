"""Metric names in the field's common vocabulary: aliases the RL trainer logs next to its own names.

rft_jax's own names ('clip_frac', 'kl', 'entropy', ...) stay: the failure monitor's signals
(rft_jax/monitor/signals.py) and existing runs use them. Each alias below is the verl name of the
*same* quantity (same estimator, same units), so dashboards and scripts written for verl read an
rft_jax run as they are; the README's "Metric names" table documents every name with its verl and
TRL counterparts. PPO's critic metrics are emitted under verl's names directly (critic/...).
rft_jax/monitor/formats.py is the reverse mapping, for replaying other frameworks' logs.
"""

# verl name -> rft_jax name.
ALIASES: dict[str, str] = {
    'actor/pg_loss': 'pg_loss',             # the policy-gradient term (no KL, no entropy)
    'actor/pg_clipfrac': 'clip_frac',       # tokens whose clipped surrogate is active
    'actor/pg_clipfrac_lower': 'clip_frac/dual',   # dual-clip active (A < 0)
    'actor/ppo_kl': 'ppo_kl',               # k1 KL(old || current) on the sampled tokens
    'actor/entropy': 'entropy',             # token-mean policy entropy
    'actor/kl_loss': 'kl',                  # token-mean KL to the reference (kl_estimator)
    'actor/kl_coef': 'kl_coef',             # the KL coefficient the step used
    'actor/grad_norm': 'grad_norm',         # policy gradient norm before clipping
    'actor/lr': 'lr',
    'critic/score/mean': 'reward/mean',     # verifier score (before any KL in the reward)
    'response_length/mean': 'response/len_mean',
    'response_length/max': 'response/len_max',
    'response_length/min': 'response/len_min',
    'response_length/clip_ratio': 'response/clip_frac',
}


def with_aliases(metrics: dict) -> dict:
  """metrics plus every alias whose rft_jax name is present (host-side, per step)."""
  return {**metrics, **{alias: metrics[name] for alias, name in ALIASES.items()
                        if name in metrics}}
