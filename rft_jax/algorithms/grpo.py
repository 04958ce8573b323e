"""The GRPO-family policy-gradient step: batch preparation and the pure train step.

Sequence layout. A rollout row is the left-padded prompt (P slots) followed by the completion
(T slots): tokens_bs with S = P + T. Per-token quantities live on L = S - 1 target positions
(index l scores token l + 1), so completion token j sits at l = P - 1 + j.

  prepare_batch(params, ref_params, rollout, rewards_b, valid_b) -> batch, metrics
      old_logp_bl (trainer's log-probs at the sampling params), ref_logp_bl, adv_b, loss_mask_bl
  train_step(state, batch) -> state, metrics
      loss = agg(ppo_clip(logp, old_logp, adv)) + kl_coef * agg(kl(logp, ref_logp))
"""
import dataclasses

import jax
import jax.numpy as jnp

from rft_jax.algorithms import registry
from rft_jax.algorithms.advantages import group_stats
from rft_jax.algorithms import train_state as ts
from rft_jax.algorithms.losses import kl_penalty
from rft_jax.models import functional as lm
from rft_jax.sampling.sampler import Rollout
from rft_jax.telemetry.metrics import masked_mean, rollout_metrics, token_entropy


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """The algorithm section of a recipe (config.algo), frozen for use as a static jit argument."""
  advantage: str = 'grpo'
  loss: str = 'ppo_clip'
  loss_agg: str = 'token_mean'
  clip_eps: float = 0.2
  kl_coef: float = 0.0
  kl_estimator: str = 'k3'
  updates_per_batch: int = 1
  microbatches: int = 1
  group_size: int = 2
  use_reference: bool = False   # compute reference log-probs (always on when kl_coef > 0)

  def __post_init__(self):
    if self.kl_coef > 0:
      object.__setattr__(self, 'use_reference', True)

  @classmethod
  def from_config(cls, config, use_reference: bool = False) -> 'GRPOConfig':
    """config.algo plus the rollout group size. use_reference forces the reference pass even at
    kl_coef = 0 (so a KL term can be switched on at run time, e.g. by the monitor)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in dict(config.algo).items() if k in fields}
    return cls(group_size=config.rollout.group_size, use_reference=use_reference, **d)


def sequence_logprobs(graphdef, params, tokens_bs, mask_bs):
  """log pi(token_{l+1} | tokens_{<=l}) and the policy entropy at each position -> two [B, L]."""
  logits = lm.forward(graphdef, params, tokens_bs, mask_bs)[:, :-1]
  logp_blv = jax.nn.log_softmax(logits, axis=-1)
  logp_bl = jnp.take_along_axis(logp_blv, tokens_bs[:, 1:, None], axis=-1)[..., 0]
  return logp_bl, token_entropy(logits)


def rollout_sequences(rollout: Rollout):
  """(tokens_bs, mask_bs, loss_mask_bl, sampler_logp_bl) in the sequence layout above."""
  b, p = rollout.prompt_tokens_bp.shape
  tokens_bs = jnp.concatenate([rollout.prompt_tokens_bp, rollout.tokens_bt], axis=1)
  mask_bs = jnp.concatenate([rollout.prompt_mask_bp, rollout.mask_bt], axis=1)
  pad = jnp.zeros((b, p - 1), jnp.float32)
  loss_mask_bl = jnp.concatenate([pad, rollout.mask_bt.astype(jnp.float32)], axis=1)
  sampler_logp_bl = jnp.concatenate([pad, rollout.logp_bt], axis=1)
  return tokens_bs, mask_bs, loss_mask_bl, sampler_logp_bl


def prepare_batch(params, ref_params, rollout: Rollout, rewards_b, valid_b, *, graphdef,
                  algo: GRPOConfig):
  """Scores a rollout with the trainer: old and reference log-probs, advantages, metrics.

  Rows with invalid rewards (valid_b False) are dropped from the loss by zeroing their mask.
  Without algo.use_reference (kl_coef == 0) the reference forward pass is skipped entirely.
  Also returns the exact invariants the monitor checks: the largest |mean advantage| of a group
  (0 for group-normalised estimators) and the number of loss tokens on prompt positions (0).
  """
  tokens_bs, mask_bs, loss_mask_bl, sampler_logp_bl = rollout_sequences(rollout)
  loss_mask_bl = loss_mask_bl * valid_b[:, None]
  old_logp_bl, _ = sequence_logprobs(graphdef, params, tokens_bs, mask_bs)
  old_logp_bl = jax.lax.stop_gradient(old_logp_bl)
  if algo.use_reference:
    ref_logp_bl, _ = sequence_logprobs(graphdef, ref_params, tokens_bs, mask_bs)
  else:
    ref_logp_bl = old_logp_bl
  adv_b = registry.get_advantage(algo.advantage)(rewards_b, valid_b, algo.group_size)
  batch = {'tokens': tokens_bs, 'mask': mask_bs, 'loss_mask': loss_mask_bl,
           'old_logp': old_logp_bl, 'ref_logp': ref_logp_bl, 'adv': adv_b}
  metrics = rollout_metrics(rewards_b, valid_b, rollout.mask_bt, rollout.truncated_b,
                            algo.group_size)
  metrics['adv/mean'] = masked_mean(adv_b, valid_b)
  metrics['adv/abs_mean'] = masked_mean(jnp.abs(adv_b), valid_b)
  metrics['adv/std'] = jnp.sqrt(masked_mean((adv_b - metrics['adv/mean']) ** 2, valid_b))
  metrics['adv/pos_frac'] = masked_mean((adv_b > 0).astype(jnp.float32), valid_b)
  metrics['adv/neg_frac'] = masked_mean((adv_b < 0).astype(jnp.float32), valid_b)
  adv_mean_g, _, _ = group_stats(adv_b, valid_b, algo.group_size)
  metrics['invariant/group_adv_mean_max'] = jnp.max(jnp.abs(adv_mean_g))
  p = rollout.prompt_tokens_bp.shape[1]
  metrics['invariant/prompt_loss_tokens'] = loss_mask_bl[:, :p - 1].sum()
  # Sampler/trainer mismatch: same params, so only numerics and sampling temperature differ.
  metrics['mismatch/logp_abs_diff'] = masked_mean(jnp.abs(old_logp_bl - sampler_logp_bl),
                                                  loss_mask_bl)
  return batch, metrics


def loss_fn(params, mb, *, graphdef, algo: GRPOConfig, kl_coef=None):
  """Micro-batch loss as (sum, (count, metric sums)); see train_state.accumulate_grads.

  kl_coef (a traced scalar, default algo.kl_coef) weights the KL term when algo.use_reference.
  """
  logp_bl, entropy_bl = sequence_logprobs(graphdef, params, mb['tokens'], mb['mask'])
  mask_bl = mb['loss_mask']
  pg_bl, stats = registry.get_loss(algo.loss)(logp_bl, mb['old_logp'], mb['adv'], mask_bl,
                                              clip_eps=algo.clip_eps)
  kl_bl = kl_penalty(logp_bl, mb['ref_logp'], algo.kl_estimator)
  kl_coef = algo.kl_coef if kl_coef is None else kl_coef
  loss_bl = pg_bl + kl_coef * kl_bl if algo.use_reference else pg_bl
  agg = registry.get_loss_agg(algo.loss_agg)
  loss_sum, count = agg(loss_bl, mask_bl)
  sg = jax.lax.stop_gradient
  sums = {'loss': sg(loss_sum), 'pg_loss': sg(agg(pg_bl, mask_bl)[0]),
          'kl': sg(agg(kl_bl, mask_bl)[0]),
          'kl/k1': sg(agg(kl_penalty(logp_bl, mb['ref_logp'], 'k1'), mask_bl)[0]),
          'kl/k3': sg(agg(kl_penalty(logp_bl, mb['ref_logp'], 'k3'), mask_bl)[0]),
          # verl's ppo_kl: k1 estimate of KL(old || current) on the sampled tokens.
          'ppo_kl': sg(agg(mb['old_logp'] - logp_bl, mask_bl)[0]),
          'ratio/abs_dev': sg(agg(jnp.abs(stats['ratio'] - 1.0), mask_bl)[0]),
          'entropy': sg(agg(entropy_bl, mask_bl)[0]),
          'clip_frac/low': agg(stats['clip_low'], mask_bl)[0],
          'clip_frac/high': agg(stats['clip_high'], mask_bl)[0],
          'ratio/mean': sg(agg(stats['ratio'], mask_bl)[0])}
  return loss_sum, (count, sums)


def train_step(state: ts.TrainState, batch: dict, *, graphdef, algo: GRPOConfig, tx, schedule):
  """One optimiser update on a prepared batch -> (state, metrics). Pure; jit with donation."""
  kl_coef = state.control('kl_coef', algo.kl_coef)
  grads, metrics = ts.accumulate_grads(
      lambda p, mb: loss_fn(p, mb, graphdef=graphdef, algo=algo, kl_coef=kl_coef), state.params,
      batch, algo.microbatches)
  metrics['kl_coef'] = kl_coef
  state, opt_stats = ts.apply_gradients(state, grads, tx, schedule)
  metrics['clip_frac'] = metrics['clip_frac/low'] + metrics['clip_frac/high']
  return state, {**metrics, **opt_stats}
