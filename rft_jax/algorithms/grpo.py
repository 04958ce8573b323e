"""The GRPO-family policy-gradient step: batch preparation and the pure train step.

Sequence layout. A rollout row is the left-padded prompt (P slots) followed by the completion
(T slots): tokens_bs with S = P + T. Per-token quantities live on L = S - 1 target positions
(index l scores token l + 1), so completion token j sits at l = P - 1 + j.

  prepare_batch(params, ref_params, rollout, rewards_b, valid_b) -> batch, metrics
      old_logp_bl (trainer's log-probs at the sampling params), ref_logp_bl, adv_b, loss_mask_bl
  train_step(state, batch) -> state, metrics
      loss = agg(pg_loss(logp, old_logp, adv)) + kl_coef * agg(kl(logp, ref_logp))
             - entropy_coef * agg(entropy)
  With algo.kl_in_reward the KL is instead subtracted from each sequence's reward before the
  advantages: r_i <- r_i - kl_coef * sum_t kl(old_logp_it, ref_logp_it), and the loss has no KL;
  a token-level estimator (REINFORCE++) takes it per token instead, as a return to go:
  adv_bl [B, L] (advantages.whiten_token_returns).
  With algo.tis_cap = C > 0 the policy-gradient term of each token is multiplied by
  w = sg(min(exp(old_logp - sampler_logp), C)) (truncated importance sampling; corrections.py);
  algo.overlong == 'mask' drops truncated completions from the loss.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp

from rft_jax.algorithms import corrections, kl_control, registry
from rft_jax.algorithms.advantages import group_stats
from rft_jax.algorithms import train_state as ts
from rft_jax.algorithms.losses import kl_penalty, masked, token_mean
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
  clip_eps_low: float | None = None    # None = clip_eps (DAPO clip-higher: 0.2 / 0.28)
  clip_eps_high: float | None = None
  clip_c: float = 0.0           # dual-clip constant c > 1 (Ye et al. 2020); 0 = off
  entropy_coef: float = 0.0     # entropy bonus: loss -= entropy_coef * agg(entropy)
  kl_in_reward: bool = False    # KL penalty in the reward (per sequence; per token for REINFORCE++)
  max_len: int = 0              # seq_mean_token_sum_norm's constant; from_config: max_new_tokens
  score_chunks: int = 0         # row chunks of the scoring forward passes; 0 = microbatches
  overlong: str = 'none'        # 'none' | 'mask' | 'soft' (DAPO; see corrections.py)
  overlong_cache: int = 0       # soft punishment's Lcache; from_config: 0 -> max(1, max_len // 5)
  tis_cap: float = 0.0          # truncated importance sampling cap C; 0 = off (corrections.py)
  dynamic_sampling: bool = False   # host-side (rft_jax/rollouts.py): drop zero-spread groups
  max_sampling_rounds: int = 4     # ... and refill from at most this many prompt batches
  dynamic_sampling_metric: str = 'accuracy'   # what must vary within a kept group: 'accuracy'
  # (the verifier with the largest reward weight; DAPO eq. 11) or 'reward' (the total the
  # estimator gets, format bonus and overlong penalty included)
  kl_ctrl: str = 'fixed'        # 'fixed' | 'adaptive' KL coefficient (kl_control.py)
  kl_target: float = 0.1        # adaptive: the KL the controller steers towards
  kl_horizon: float = 10000.0   # adaptive: horizon in sequences (verl's default)
  shared_prompt: bool = True    # score each group's prompt once (forward_completions)

  def prompt_group(self) -> int:
    """The rows that share a prompt in the scoring passes: group_size with shared_prompt."""
    return self.group_size if self.shared_prompt else 1

  def __post_init__(self):
    if self.kl_coef > 0:
      object.__setattr__(self, 'use_reference', True)

  @classmethod
  def from_config(cls, config, use_reference: bool = False) -> 'GRPOConfig':
    """config.algo plus the rollout group size. use_reference forces the reference pass even at
    kl_coef = 0 (so a KL term can be switched on at run time, e.g. by the monitor)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in dict(config.algo).items() if k in fields}
    d['max_len'] = d.get('max_len') or config.rollout.max_new_tokens
    d['overlong_cache'] = d.get('overlong_cache') or max(1, config.rollout.max_new_tokens // 5)
    if config.model.get('remat', 'none') != 'none' or config.model.get('scan_layers', False):
      d['shared_prompt'] = False   # the shared pass has neither (config_rules rejects asking)
    if any(f['type'] == 'mask_shift' for f in config.get('faults', [])):
      d['shared_prompt'] = False   # that fault puts a prompt position in the loss: score it
    return cls(group_size=config.rollout.group_size, use_reference=use_reference, **d)

  def loss_options(self) -> dict:
    """Keyword options every registered policy loss accepts (see losses.py)."""
    return dict(clip_eps=self.clip_eps, clip_eps_low=self.clip_eps_low,
                clip_eps_high=self.clip_eps_high, clip_c=self.clip_c)


def sequence_logprobs(graphdef, params, tokens_bs, mask_bs, first: int = 0,
                      group_size: int = 1, temperature=None):
  """log pi(token_{l+1} | tokens_{<=l}) and the policy entropy at each position -> two [B, L].

  temperature (a traced scalar; None = 1): pi = softmax(logits / temperature), the distribution
  the sampler drew from at that temperature (without its top-k / top-p filter), as verl scores.

  first > 0 (static): the LM head and softmax run on positions l >= first only, and both are 0
  before it. With first = P - 1 that is the completion: the loss never reads prompt positions.
  group_size K > 1 (static, needs first = P - 1): rows [g*K, (g+1)*K) share their prompt, which
  runs through the model once per group (models/functional.forward_completions); same values.
  """
  if group_size > 1:
    logits = lm.forward_completions(graphdef, params, tokens_bs, mask_bs, first + 1, group_size)
  else:
    logits = lm.forward(graphdef, params, tokens_bs, mask_bs, logits_from=first)[:, :-1]
  logp_bl, logits = target_logprobs(logits, tokens_bs[:, first + 1:], temperature)
  pad = lambda x_bl: jnp.pad(x_bl, ((0, 0), (first, 0))) if first else x_bl
  return pad(logp_bl), pad(token_entropy(logits))


def target_logprobs(logits_blv, targets_bl, temperature=None):
  """log pi(target_bl) with pi = softmax(logits_blv / temperature) (temperature None = 1)
  -> (logp_bl [B, L], the tempered logits [B, L, V], e.g. for token_entropy)."""
  if temperature is not None:
    logits_blv = logits_blv / jnp.asarray(temperature, logits_blv.dtype)
  logp_blv = jax.nn.log_softmax(logits_blv, axis=-1)
  return jnp.take_along_axis(logp_blv, targets_bl[..., None], axis=-1)[..., 0], logits_blv


def score_logprobs(graphdef, params, tokens_bs, mask_bs, chunks: int = 1, first: int = 0,
                   group_size: int = 1, temperature=None):
  """The log-probs of sequence_logprobs -> [B, L], computed `chunks` row chunks at a time
  (map_chunks: only [B / chunks, L, V] logits exist at once, so a real vocabulary fits; 152k x
  128 rows x 900 positions would be ~70 GB in one pass). Each row is scored on its own, so the
  values equal the single pass (chunks = 1). first, group_size, temperature: as
  sequence_logprobs.
  """
  def score(tokens, mask, group_size):
    return sequence_logprobs(graphdef, params, tokens, mask, first=first, group_size=group_size,
                             temperature=temperature)[0]
  return map_chunks(score, tokens_bs, mask_bs, chunks, group_size)


def map_chunks(fn, tokens_bs, mask_bs, chunks: int, group_size: int = 1):
  """fn(tokens, mask, group_size) -> a pytree of [rows, ...] arrays, on `chunks` row chunks one
  after another (lax.map), reassembled in row order.

  Chunk c holds rows c, c + n, c + 2n, ... (n = chunks): with rows sharded over the data axis,
  every chunk spans every shard. With group_size K > 1 the unit is a group of K consecutive rows
  instead of a row (chunk c holds groups c, c + n, ...), so each chunk can run its prompts once;
  where the chunks do not divide the groups, fn gets group_size 1 (row by row).
  """
  if group_size > 1 and chunks > 1 and (tokens_bs.shape[0] // group_size) % chunks:
    group_size = 1   # chunks do not divide the groups: score row by row (same values)
  if chunks <= 1:
    return fn(tokens_bs, mask_bs, group_size)
  b, k = tokens_bs.shape[0], group_size
  split = lambda x: (x.reshape(b // (chunks * k), chunks, k, *x.shape[1:]).swapaxes(0, 1)
                     .reshape(chunks, b // chunks, *x.shape[1:]))
  merge = lambda x: (x.reshape(chunks, b // (chunks * k), k, *x.shape[2:]).swapaxes(0, 1)
                     .reshape(b, *x.shape[2:]))
  out = jax.lax.map(lambda tm: fn(*tm, group_size), (split(tokens_bs), split(mask_bs)))
  return jax.tree.map(merge, out)


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
                  algo: GRPOConfig, kl_coef=None, temperature=None):
  """Scores a rollout with the trainer: old and reference log-probs, advantages, metrics.

  Rows with invalid rewards (valid_b False) are dropped from the loss by zeroing their mask, and
  with algo.overlong == 'mask' so are truncated rows. Without algo.use_reference (kl_coef == 0)
  the reference forward pass is skipped entirely. Forward passes run in algo.score_chunks row
  chunks (0 = algo.microbatches; see score_logprobs); with algo.shared_prompt they score the
  completion positions only (0 on prompt positions), each group's prompt run once. With
  algo.tis_cap the batch also holds 'tis_weight' [B, L] (corrections.tis_weights); metrics hold
  the sampler/trainer mismatch.
  Also returns the exact invariants the monitor checks: the largest |mean advantage| of a group
  (0 for group-normalised estimators) and the number of loss tokens on prompt positions (0).
  kl_coef (traced scalar, default algo.kl_coef) weights the KL in the reward (kl_in_reward).
  temperature (traced scalar, default 1): the sampling temperature the policy and reference are
  scored at (sequence_logprobs); the train step must use the same (controls['temperature']).
  """
  tokens_bs, mask_bs, _, _ = rollout_sequences(rollout)
  kw = dict(chunks=algo.score_chunks or algo.microbatches, temperature=temperature)
  if algo.shared_prompt:   # completion positions only, each group's prompt once (else all)
    kw.update(first=rollout.prompt_tokens_bp.shape[1] - 1, group_size=algo.group_size)
  old_logp_bl = score_logprobs(graphdef, params, tokens_bs, mask_bs, **kw)
  old_logp_bl = jax.lax.stop_gradient(old_logp_bl)
  if algo.use_reference:
    ref_logp_bl = score_logprobs(graphdef, ref_params, tokens_bs, mask_bs, **kw)
  else:
    ref_logp_bl = old_logp_bl
  return assemble_batch(rollout, old_logp_bl, ref_logp_bl, rewards_b, valid_b, algo=algo,
                        kl_coef=kl_coef)


def assemble_batch(rollout: Rollout, old_logp_bl, ref_logp_bl, rewards_b, valid_b, *,
                   algo: GRPOConfig, kl_coef=None):
  """prepare_batch after its forward passes: the batch and metrics from old and reference
  log-probs [B, L] (ref_logp_bl = old_logp_bl without a reference). Also used by
  grpo_fused.fused_step, whose old log-probs are the update's own forward pass."""
  tokens_bs, mask_bs, loss_mask_bl, sampler_logp_bl = rollout_sequences(rollout)
  loss_mask_bl = loss_mask_bl * valid_b[:, None]
  if algo.overlong == 'mask':
    loss_mask_bl = corrections.overlong_loss_mask(loss_mask_bl, rollout.truncated_b)
  estimator = registry.get_advantage(algo.advantage)
  metrics = {}
  adv_rewards_b, kl_bl, kl_coef = rewards_b, None, algo.kl_coef if kl_coef is None else kl_coef
  if algo.kl_in_reward and algo.use_reference and algo.kl_coef:
    kl_bl = masked(kl_penalty(old_logp_bl, ref_logp_bl, algo.kl_estimator), loss_mask_bl)
    kl_b = kl_bl.sum(-1)
    adv_rewards_b = rewards_b - kl_coef * kl_b
    metrics['kl_reward/seq_kl'] = masked_mean(kl_b, valid_b)
    metrics['kl_reward/penalty'] = kl_coef * metrics['kl_reward/seq_kl']
  if estimator.token_level:   # [B, L]: the KL per token, as a return to go
    adv = estimator(rewards_b, valid_b, algo.group_size, mask_bl=loss_mask_bl, kl_bl=kl_bl,
                    kl_coef=kl_coef)
    weight = loss_mask_bl   # the advantage metrics: over loss tokens
  else:                       # [B]: the sequence's KL taken off its reward
    adv = estimator(adv_rewards_b, valid_b, algo.group_size)
    weight = valid_b
  batch = {'tokens': tokens_bs, 'mask': mask_bs, 'loss_mask': loss_mask_bl,
           'old_logp': old_logp_bl, 'ref_logp': ref_logp_bl, 'adv': adv}
  metrics.update(rollout_metrics(rewards_b, valid_b, rollout.mask_bt, rollout.truncated_b,
                                 algo.group_size))
  metrics['adv/mean'] = masked_mean(adv, weight)
  metrics['adv/abs_mean'] = masked_mean(jnp.abs(adv), weight)
  metrics['adv/std'] = jnp.sqrt(masked_mean((adv - metrics['adv/mean']) ** 2, weight))
  metrics['adv/pos_frac'] = masked_mean((adv > 0).astype(jnp.float32), weight)
  metrics['adv/neg_frac'] = masked_mean((adv < 0).astype(jnp.float32), weight)
  if estimator.zero_group_mean:   # e.g. not reinforce_pp (batch baseline): no invariant to check
    adv_mean_g, _, _ = group_stats(adv, valid_b, algo.group_size)
    metrics['invariant/group_adv_mean_max'] = jnp.max(jnp.abs(adv_mean_g))
  p = rollout.prompt_tokens_bp.shape[1]
  metrics['invariant/prompt_loss_tokens'] = loss_mask_bl[:, :p - 1].sum()
  if algo.shared_prompt and algo.group_size > 1:   # scored with each group's first prompt
    metrics['invariant/group_prompt_mismatch'] = group_prompt_mismatch(rollout, algo.group_size)
  # Sampler/trainer mismatch: same params, so only numerics and sampling temperature differ.
  corrections.add_mismatch(batch, metrics, old_logp_bl, sampler_logp_bl, loss_mask_bl,
                           algo.tis_cap)
  return batch, metrics


def group_prompt_mismatch(rollout: Rollout, group_size: int):
  """Rows whose prompt (tokens or mask) differs from their group's first row: 0 for the
  sampler's layout, which algo.shared_prompt relies on."""
  def differ(x_bp):
    x_gkp = x_bp.reshape(-1, group_size, x_bp.shape[1])
    return jnp.any(x_gkp != x_gkp[:, :1], axis=-1)
  return (differ(rollout.prompt_tokens_bp) | differ(rollout.prompt_mask_bp)).sum()


# Diagnostics reported as token means whatever algo.loss_agg is (the monitor's signals keep one
# meaning across recipes); 'loss' and 'pg_loss' are in the loss's own aggregation.
TOKEN_MEAN_METRICS = ('kl', 'kl/k1', 'kl/k3', 'ppo_kl', 'ratio/abs_dev', 'entropy',
                      'clip_frac/low', 'clip_frac/high', 'clip_frac/dual', 'ratio/mean')


def loss_fn(params, mb, *, graphdef, algo: GRPOConfig, kl_coef=None, temperature=None):
  """Micro-batch loss as (sum, (count, metric sums)); see train_state.accumulate_grads.

  kl_coef (a traced scalar, default algo.kl_coef) weights the KL term when algo.use_reference
  (and not algo.kl_in_reward). (sum, count) come from algo.loss_agg. The TOKEN_MEAN_METRICS are
  token sums; for an aggregation other than token_mean (whose count is not the token count) the
  sums also hold 'count/tokens', and train_step turns those sums into exact token means.
  temperature: as sequence_logprobs (train_step passes controls['temperature']).
  """
  logp_bl, entropy_bl = sequence_logprobs(graphdef, params, mb['tokens'], mb['mask'],
                                          temperature=temperature)
  return loss_terms(logp_bl, entropy_bl, mb, algo=algo, kl_coef=kl_coef)


def loss_terms(logp_bl, entropy_bl, mb, *, algo: GRPOConfig, kl_coef=None):
  """loss_fn after the forward pass: the policy's log-probs and entropies [B, L] -> (loss sum,
  (count, metric sums)). Shared with PPO (rft_jax/algorithms/ppo.py), whose forward pass also
  yields the values."""
  mask_bl = mb['loss_mask']
  # Off the loss mask the scored old/reference log-probs may be 0 (prompt positions scored with
  # first = P - 1): take logp = old_logp there, so no masked position can reach exp(+large).
  logp_bl = jnp.where(mask_bl > 0, logp_bl, mb['old_logp'])
  pg_bl, stats = registry.get_loss(algo.loss)(logp_bl, mb['old_logp'], mb['adv'], mask_bl,
                                              **algo.loss_options())
  if algo.tis_cap:   # truncated importance sampling: w_t * pg_t (corrections.py)
    pg_bl = pg_bl * mb['tis_weight']
  kl_bl = kl_penalty(logp_bl, mb['ref_logp'], algo.kl_estimator)
  kl_coef = algo.kl_coef if kl_coef is None else kl_coef
  loss_bl = pg_bl + kl_coef * kl_bl if algo.use_reference and not algo.kl_in_reward else pg_bl
  if algo.entropy_coef:
    loss_bl = loss_bl - algo.entropy_coef * entropy_bl
  agg = functools.partial(registry.get_loss_agg(algo.loss_agg), norm_len=algo.max_len)
  tok = token_mean
  loss_sum, count = agg(loss_bl, mask_bl)
  sg = jax.lax.stop_gradient
  sums = {'loss': sg(loss_sum), 'pg_loss': sg(agg(pg_bl, mask_bl)[0]),
          # verl's ppo_kl: k1 estimate of KL(old || current) on the sampled tokens.
          'ppo_kl': sg(tok(mb['old_logp'] - logp_bl, mask_bl)[0]),
          'ratio/abs_dev': sg(tok(jnp.abs(stats['ratio'] - 1.0), mask_bl)[0]),
          'entropy': sg(tok(entropy_bl, mask_bl)[0]),
          'clip_frac/low': tok(stats['clip_low'], mask_bl)[0],
          'clip_frac/high': tok(stats['clip_high'], mask_bl)[0],
          'ratio/mean': sg(tok(stats['ratio'], mask_bl)[0])}
  if algo.use_reference:   # without a reference mb['ref_logp'] is old_logp: no KL to report
    sums.update({'kl': sg(tok(kl_bl, mask_bl)[0]),
                 'kl/k1': sg(tok(kl_penalty(logp_bl, mb['ref_logp'], 'k1'), mask_bl)[0]),
                 'kl/k3': sg(tok(kl_penalty(logp_bl, mb['ref_logp'], 'k3'), mask_bl)[0])})
  if 'clip_dual' in stats:
    sums['clip_frac/dual'] = tok(stats['clip_dual'], mask_bl)[0]
  if algo.loss_agg != 'token_mean':
    sums['count/tokens'] = tok(jnp.ones_like(mask_bl), mask_bl)[0]
  return loss_sum, (count, sums)


def token_means(metrics: dict) -> dict:
  """Accumulated metrics (sums / global count) -> TOKEN_MEAN_METRICS as exact token means.

  With 'count/tokens' present each such metric is (S_k / C) / (T / C) = S_k / T: the global
  token mean, whatever the loss aggregation's count C. Without it (token_mean) C = T already.
  """
  if 'count/tokens' not in metrics:
    return metrics
  metrics = dict(metrics)
  per = metrics.pop('count/tokens')
  safe = jnp.where(per > 0, per, 1.0)
  for k in TOKEN_MEAN_METRICS:
    if k in metrics:
      metrics[k] = metrics[k] / safe
  return metrics


def train_step(state: ts.TrainState, batch: dict, *, graphdef, algo: GRPOConfig, tx, schedule):
  """One optimiser update on a prepared batch -> (state, metrics). Pure; jit with donation."""
  kl_coef = kl_control.coef(state, algo)   # controls['kl_coef'] x the adaptive scale, if any
  temperature = scoring_temperature(state)
  grads, metrics = ts.accumulate_grads(
      lambda p, mb: loss_fn(p, mb, graphdef=graphdef, algo=algo, kl_coef=kl_coef,
                            temperature=temperature), state.params, batch, algo.microbatches)
  return finish_update(state, grads, metrics, kl_coef, tx, schedule)


def scoring_temperature(state: ts.TrainState):
  """controls['temperature'] (the sampler's intended temperature), or None (= 1) without it."""
  if state.controls is None or 'temperature' not in state.controls:
    return None
  return state.controls['temperature']


def finish_update(state: ts.TrainState, grads, metrics: dict, kl_coef, tx, schedule):
  """train_step after its gradients (of the global mean loss) and metric means: the optimiser
  update and the step's metrics."""
  metrics = token_means(metrics)
  metrics['kl_coef'] = kl_coef
  state, opt_stats = ts.apply_gradients(state, grads, tx, schedule)
  metrics['clip_frac'] = metrics['clip_frac/low'] + metrics['clip_frac/high']
  return state, {**metrics, **opt_stats}
