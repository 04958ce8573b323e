"""Advantage estimators (registry entries) and GAE. Pure jnp; rows are grouped consecutively.

Rows [g*G, (g+1)*G) hold the G completions of prompt g (the sampler's layout). valid_b marks rows
whose reward is trustworthy (a verifier that raised or timed out makes a row invalid); invalid rows
get advantage 0 and do not enter any statistic (group or batch).

Every registered estimator has the signature `(rewards_b, valid_b, group_size, **options) -> adv_b`
with rewards_b, valid_b, adv_b all [B], B = num_groups * G. Registration records two traits that
config validation and telemetry read (see registry.register_advantage):
  min_group_size   the smallest G the estimator is meaningful for (2 for group baselines).
  zero_group_mean  the advantages of every group sum to 0 (the monitor's group-mean invariant).
"""
import jax
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


def batch_stats(x_b, valid_b):
  """Mean and std (population) of x over the valid rows of the whole batch -> two scalars."""
  v = valid_b.astype(x_b.dtype)
  n = jnp.maximum(v.sum(), 1.0)
  mean = (x_b * v).sum() / n
  return mean, jnp.sqrt((((x_b - mean) ** 2) * v).sum() / n)


def _scale(x_b, std, eps: float):
  """x / (std + eps), and exactly 0 where std <= eps (no signal; avoids dividing rounding residue
  of an all-equal set of rewards into spurious advantages)."""
  return jnp.where(std > eps, x_b / (std + eps), 0.0)


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
    adv_b = _scale(adv_b, std_b, eps)
  return jnp.where(valid_b, adv_b, 0.0)


@register_advantage('dr_grpo')
def dr_grpo(rewards_b, valid_b, group_size: int):
  """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean(r_group).

  No std division (it up-weights near-uniform groups). [B] -> [B]."""
  return grpo(rewards_b, valid_b, group_size, scale_by_std=False)


@register_advantage('grpo_batch_norm')
def grpo_batch_norm(rewards_b, valid_b, group_size: int, *, eps: float = 1e-6):
  """Group-mean baseline, batch-level std (Lite PPO, Liu et al. 2025 "Tricks or Traps"; TRL
  scale_rewards='batch'): A_i = (r_i - mean(r_group)) / (std_batch(r) + eps).

  std_batch is the std of the raw rewards over all valid rows of the batch. [B] -> [B].
  """
  mean_b, _, _ = group_stats(rewards_b, valid_b, group_size)
  _, std = batch_stats(rewards_b, valid_b)
  return jnp.where(valid_b, _scale(rewards_b - mean_b, std, eps), 0.0)


@register_advantage('rloo')
def rloo(rewards_b, valid_b, group_size: int):
  """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - mean_{j != i, j valid} r_j.

  The baseline of row i excludes row i itself, so it is independent of r_i (an unbiased
  estimator). Equivalently A_i = n/(n-1) * (r_i - mean_group) with n valid rows in the group.
  A row that is its group's only valid row has no baseline: advantage 0. [B] -> [B].
  """
  mean_b, _, count_b = group_stats(rewards_b, valid_b, group_size)
  others = jnp.maximum(count_b - 1.0, 1.0)
  baseline_b = (mean_b * count_b - rewards_b) / others
  return jnp.where(valid_b & (count_b > 1.5), rewards_b - baseline_b, 0.0)


@register_advantage('reinforce_pp', min_group_size=1, zero_group_mean=False)
def reinforce_pp(rewards_b, valid_b, group_size: int, *, eps: float = 1e-6):
  """REINFORCE++ (Hu 2025) for outcome rewards: global batch normalisation, no group baseline.

  A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps) over the valid rows. Works with G = 1.
  group_size is unused (kept for the common signature). [B] -> [B].
  """
  del group_size
  mean, std = batch_stats(rewards_b, valid_b)
  return jnp.where(valid_b, _scale(rewards_b - mean, std, eps), 0.0)


@register_advantage('reinforce_pp_baseline')
def reinforce_pp_baseline(rewards_b, valid_b, group_size: int, *, eps: float = 1e-6):
  """REINFORCE++-baseline (Hu 2025): subtract the group mean, then whiten over the batch.

  a_i = r_i - mean(r_group);  A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps).
  Unlike grpo_batch_norm the std is that of the centred a (within-group spread only);
  mean_batch(a) is 0 up to rounding. [B] -> [B].
  """
  mean_b, _, _ = group_stats(rewards_b, valid_b, group_size)
  a_b = jnp.where(valid_b, rewards_b - mean_b, 0.0)
  mean, std = batch_stats(a_b, valid_b)
  return jnp.where(valid_b, _scale(a_b - mean, std, eps), 0.0)


def gae(rewards_bt, values_bt, mask_bt, gamma: float, lam: float):
  """Generalised advantage estimation (Schulman et al. 2016) for PPO with a critic.

    delta_t = r_t + gamma * m_{t+1} * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * m_{t+1} * A_{t+1}        (A_T = V_T = 0)
    R_t     = A_t + V_t                                         (the critic's target)

  rewards_bt, values_bt, mask_bt: [B, T]; mask_bt is 1 on completion tokens, a right-padded
  prefix (a 0 ends the episode: nothing after it is bootstrapped). Computed with a reversed
  lax.scan over time. Returns (adv_bt, returns_bt), both 0 where mask_bt is 0.
  """
  m = mask_bt.astype(values_bt.dtype)
  r, v = rewards_bt * m, values_bt * m
  next_v = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
  next_m = jnp.concatenate([m[:, 1:], jnp.zeros_like(m[:, :1])], axis=1)
  delta = r + gamma * next_m * next_v - v

  def step(adv_next_b, xs):
    delta_b, next_m_b = xs
    adv_b = delta_b + gamma * lam * next_m_b * adv_next_b
    return adv_b, adv_b

  _, adv_tb = jax.lax.scan(step, jnp.zeros_like(v[:, 0]), (delta.T, next_m.T), reverse=True)
  adv_bt = adv_tb.T * m
  return adv_bt, (adv_bt + v) * m
