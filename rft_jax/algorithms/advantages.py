"""Advantage estimators (registry entries). Pure jnp; rows are grouped consecutively.

Rows [g*G, (g+1)*G) hold the G completions of prompt g (the sampler's layout). valid_b marks rows
whose reward is trustworthy (a verifier that raised or timed out makes a row invalid); invalid rows
get advantage 0 and do not enter their group's statistics.
"""
import jax.numpy as jnp

from rft_jax.algorithms.registry import register_advantage


def group_stats(x_b, valid_b, group_size: int):
  """Per-row mean and std (population, ddof=0) of x over the valid rows of its group.

  Returns (mean_b, std_b, count_b) broadcast back to [B]. Groups with no valid rows get mean 0.
  """
  x_gk = x_b.reshape(-1, group_size)
  v_gk = valid_b.reshape(-1, group_size).astype(x_b.dtype)
  count_g = v_gk.sum(-1, keepdims=True)
  mean_g = (x_gk * v_gk).sum(-1, keepdims=True) / jnp.maximum(count_g, 1.0)
  var_g = (((x_gk - mean_g) ** 2) * v_gk).sum(-1, keepdims=True) / jnp.maximum(count_g, 1.0)
  tile = lambda a: jnp.broadcast_to(a, x_gk.shape).reshape(-1)
  return tile(mean_g), tile(jnp.sqrt(var_g)), tile(count_g)


@register_advantage('grpo')
def grpo(rewards_b, valid_b, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6):
  """GRPO (Shao et al. 2024): A_i = (r_i - mean(r_group)) / (std(r_group) + eps).

  With scale_by_std=False this is the Dr.GRPO estimator A_i = r_i - mean(r_group).
  rewards_b, valid_b: [B] with B = num_groups * group_size. Returns adv_b [B] (0 on invalid rows,
  and 0 for a group whose rewards are all equal).
  """
  mean_b, std_b, _ = group_stats(rewards_b, valid_b, group_size)
  adv_b = rewards_b - mean_b
  if scale_by_std:
    # A group of equal rewards has std ~1e-8 from float rounding of its mean; dividing that
    # residue by (std + eps) would give spurious advantages of order 0.01-0.1. Such groups carry
    # no signal: their advantage is exactly 0.
    adv_b = jnp.where(std_b > eps, adv_b / (std_b + eps), 0.0)
  return jnp.where(valid_b, adv_b, 0.0)
