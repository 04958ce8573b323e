"""Policy losses, KL estimators and loss aggregations (registry entries). Pure jnp.

Per-token tensors are [B, L] over target positions (index t scores token t+1 of the sequence);
mask_bl is 1 on completion tokens. Losses return per-token values; an aggregation turns them into
(sum, count) so micro-batches and data-parallel shards add up to the exact global mean.
"""
import jax.numpy as jnp

from rft_jax.algorithms.registry import register_loss, register_loss_agg


@register_loss('ppo_clip')
def ppo_clip(logp_bl, old_logp_bl, adv_b, mask_bl, *, clip_eps: float = 0.2):
  """PPO clipped surrogate (Schulman et al. 2017), as used by GRPO.

  ratio = exp(logp - old_logp); loss_t = -min(ratio * A, clip(ratio, 1-eps, 1+eps) * A).
  Returns (loss_bl, stats) where stats holds per-token indicators for the clip fractions:
  'clip_low' (ratio < 1-eps with A < 0 bound active), 'clip_high' (ratio > 1+eps with A > 0).
  """
  adv_bl = adv_b[:, None]
  ratio = jnp.exp(logp_bl - old_logp_bl)
  unclipped = ratio * adv_bl
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv_bl
  loss_bl = -jnp.minimum(unclipped, clipped)
  stats = {
      'clip_low': ((ratio < 1.0 - clip_eps) & (adv_bl < 0)).astype(jnp.float32),
      'clip_high': ((ratio > 1.0 + clip_eps) & (adv_bl > 0)).astype(jnp.float32),
      'ratio': ratio,
  }
  return loss_bl, stats


def kl_penalty(logp_bl, ref_logp_bl, estimator: str = 'k3'):
  """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

  With d = ref_logp - logp: k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1 (unbiased, >= 0).
  """
  d = ref_logp_bl - logp_bl
  if estimator == 'k1':
    return -d
  if estimator == 'k2':
    return 0.5 * d * d
  if estimator == 'k3':
    return jnp.exp(d) - d - 1.0
  raise ValueError(f'unknown KL estimator {estimator!r}; known: k1, k2, k3')


@register_loss_agg('token_mean')
def token_mean(x_bl, mask_bl):
  """Token mean over the whole (global) batch: returns (sum_t x*mask, sum_t mask)."""
  return (x_bl * mask_bl).sum(), mask_bl.sum().astype(jnp.float32)
