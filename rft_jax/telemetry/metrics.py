"""Metric math shared by the train steps and the trainer: pure jnp (jit-friendly), plus one
host-side numpy helper for completion diversity."""
import jax
import jax.numpy as jnp
import numpy as np


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
  GRPO learning signal; a group without a valid reward counts too). response/clip_frac is the
  fraction of completions cut at max_new_tokens. Rewards are over valid samples, lengths and
  clip_frac over all.
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


def completion_diversity(tokens_bt, mask_bt, n: int = 2) -> dict:
  """Host-side diversity of a batch of completions (numpy; token ids, masked).

  distinct-n = |unique n-grams| / |n-grams| over the whole batch (1.0 = no n-gram repeats);
  repetition = fraction of completions containing some n-gram twice (degenerate loops).
  """
  tokens_bt, mask_bt = np.asarray(tokens_bt), np.asarray(mask_bt)
  all_grams, repeated = [], 0
  for row, keep in zip(tokens_bt, mask_bt):
    seq = tuple(int(t) for t, k in zip(row, keep) if k)
    grams = [seq[i:i + n] for i in range(len(seq) - n + 1)]
    all_grams.extend(grams)
    repeated += len(set(grams)) < len(grams)
  return {f'response/distinct_{n}': len(set(all_grams)) / len(all_grams) if all_grams else 1.0,
          'response/repetition_frac': repeated / max(len(tokens_bt), 1)}
