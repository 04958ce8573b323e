"""On-device metric math shared by the train steps and the trainer. Pure jnp, jit-friendly."""
import jax
import jax.numpy as jnp


def masked_mean(x, mask):
  """sum(x * mask) / max(sum(mask), 1)."""
  mask = mask.astype(jnp.float32)
  return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def token_entropy(logits_blv):
  """Entropy of softmax(logits) per position: H = logsumexp(z) - sum_v p_v z_v. -> [B, L]."""
  logp = jax.nn.log_softmax(logits_blv, axis=-1)
  return -(jnp.exp(logp) * logp).sum(-1)


def rollout_metrics(rewards_b, valid_b, mask_bt, truncated_b, group_size: int) -> dict:
  """Reward and response-length statistics of one rollout batch.

  reward/zero_std_frac is the fraction of groups whose valid rewards are all equal (they carry no
  GRPO learning signal). response/clip_frac is the fraction of completions cut at max_new_tokens.
  """
  valid = valid_b.astype(jnp.float32)
  n_valid = jnp.maximum(valid.sum(), 1.0)
  mean = (rewards_b * valid).sum() / n_valid
  std = jnp.sqrt((((rewards_b - mean) ** 2) * valid).sum() / n_valid)
  r_gk = jnp.where(valid_b, rewards_b, jnp.nan).reshape(-1, group_size)
  group_range = jnp.nanmax(r_gk, -1) - jnp.nanmin(r_gk, -1)
  length_b = mask_bt.sum(-1).astype(jnp.float32)
  return {
      'reward/mean': mean,
      'reward/std': std,
      'reward/zero_std_frac': jnp.mean(jnp.nan_to_num(group_range, nan=0.0) == 0.0),
      'response/len_mean': length_b.mean(),
      'response/len_max': length_b.max(),
      'response/len_min': length_b.min(),
      'response/clip_frac': truncated_b.astype(jnp.float32).mean(),
  }
