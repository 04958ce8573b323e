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


def group_spread(x_b, valid_b, group_size: int):
  """Per-row bool [B]: the valid rows of its group hold at least two different values of x
  (max > min, compared exactly). A group of equal rewards has no spread, whatever its rounding:
  its float32 mean can differ from the rewards by an ulp (~1e-6 at 10, ~8e-6 at 100), which a
  std threshold does not catch and (r - mean) / (std + eps) blows up to ~±1 in every row."""
  x_gk, v_gk = x_b.reshape(-1, group_size), valid_b.reshape(-1, group_size)
  hi = jnp.where(v_gk, x_gk, -jnp.inf).max(-1, keepdims=True)
  lo = jnp.where(v_gk, x_gk, jnp.inf).min(-1, keepdims=True)
  return jnp.broadcast_to(hi > lo, x_gk.shape).reshape(-1)


def _scale(x_b, std, eps: float):
  """x / (std + eps), and exactly 0 where std <= eps (no signal)."""
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
    adv_b = _scale(adv_b, std_b, eps)
  # A group of equal rewards carries no signal: its advantage is exactly 0, not its mean's
  # rounding residue (divided by the residue's std, that would be ~±1: group_spread).
  return jnp.where(valid_b & group_spread(rewards_b, valid_b, group_size), adv_b, 0.0)


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
  keep_b = valid_b & group_spread(rewards_b, valid_b, group_size)   # equal rewards: exactly 0
  return jnp.where(keep_b, _scale(rewards_b - mean_b, std, eps), 0.0)


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


def whiten_token_returns(score_b, valid_b, mask_bl=None, kl_bl=None, kl_coef=0.0,
                         eps: float = 1e-6):
  """REINFORCE++'s advantage (Hu 2025, arXiv:2501.03262; OpenRLHF's 'reinforce'): the return of
  each completion token, whitened over all the batch's loss tokens.

    G_bt = s_b - kl_coef * sum_{i >= t} m_bi * kl_bi     return to go (gamma = 1): the score
                                                          s_b at EOS, -kl_coef * KL_i per token
    A_bt = m_bt * (G_bt - mean_m(G)) / (std_m(G) + eps)   mean and std over tokens with m = 1

  so a token is charged only for the KL of itself and the tokens after it, and a longer
  completion weighs more in the batch statistics. score_b, valid_b: [B]; mask_bl: [B, L] loss
  mask (0 on prompt and padding positions; rows with valid_b False are masked out here);
  kl_bl: [B, L] per-token KL estimate, or None for no KL term. Returns adv_bl [B, L].
  Without mask_bl every row is one token: adv_b [B], the row-level whitening
  (s_b - mean_B(s)) / (std_B(s) + eps) over the valid rows.
  """
  rows_only = mask_bl is None
  if rows_only:
    mask_bl, kl_bl = jnp.ones_like(score_b)[:, None], None
  m_bl = mask_bl.astype(score_b.dtype) * valid_b[:, None]
  g_bl = jnp.broadcast_to(score_b[:, None], m_bl.shape)
  if kl_bl is not None:
    kl_m = kl_bl.astype(score_b.dtype) * m_bl
    g_bl = g_bl - kl_coef * jnp.flip(jnp.cumsum(jnp.flip(kl_m, -1), -1), -1)
  n = jnp.maximum(m_bl.sum(), 1.0)
  mean = (g_bl * m_bl).sum() / n
  std = jnp.sqrt((((g_bl - mean) ** 2) * m_bl).sum() / n)
  # Returns all equal (no KL term, equal rewards): exactly 0, not the mean's rounding residue
  # over its std (group_spread, the whole batch one group).
  spread = group_spread(g_bl.reshape(-1), (m_bl > 0).reshape(-1), g_bl.size)
  adv_bl = jnp.where((m_bl > 0) & spread.reshape(g_bl.shape), _scale(g_bl - mean, std, eps), 0.0)
  return adv_bl[:, 0] if rows_only else adv_bl


@register_advantage('reinforce_pp', min_group_size=1, zero_group_mean=False, token_level=True)
def reinforce_pp(rewards_b, valid_b, group_size: int, *, mask_bl=None, kl_bl=None,
                 kl_coef=0.0, eps: float = 1e-6):
  """REINFORCE++ (Hu 2025) for outcome rewards: no group baseline, global normalisation.

  whiten_token_returns with s_b = r_b: with the loss mask (as the train step calls it) the
  token-level advantage [B, L]; without it (each row one token) A_i = (r_i - mean_B(r)) /
  (std_B(r) + eps) over the valid rows [B]. Works with G = 1; group_size is unused.
  """
  del group_size
  return whiten_token_returns(rewards_b, valid_b, mask_bl, kl_bl, kl_coef, eps)


@register_advantage('reinforce_pp_baseline', zero_group_mean=False, token_level=True)
def reinforce_pp_baseline(rewards_b, valid_b, group_size: int, *, mask_bl=None, kl_bl=None,
                          kl_coef=0.0, eps: float = 1e-6):
  """REINFORCE++-baseline (Hu 2025): subtract the group mean, then whiten over the batch.

  whiten_token_returns with s_b = r_b - mean(r_group). Without the loss mask (each row one
  token): A_i = (a_i - mean_B(a)) / (std_B(a) + eps), a_i = r_i - mean(r_group), [B]; with it
  the token-level advantage [B, L], whose batch mean is taken over tokens, so a group's
  advantages no longer sum to 0 (the monitor's zero-group-mean invariant does not apply).
  """
  mean_b, _, _ = group_stats(rewards_b, valid_b, group_size)
  a_b = jnp.where(valid_b, rewards_b - mean_b, 0.0)
  return whiten_token_returns(a_b, valid_b, mask_bl, kl_bl, kl_coef, eps)


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
