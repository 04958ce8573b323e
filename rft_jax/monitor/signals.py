"""The signals the failure monitor watches, and its exact invariant checks.

A *signal* is one scalar telemetry series the trainer emits every step (names as in
`rft_jax.telemetry.metrics`). The monitor models each signal's healthy drift (detectors.py);
*invariants* are exact properties of a correct GRPO step that need no model: a single violation
is a fault.

Signals are standardised on a per-signal scale before detection:

  y = log(max(x, 0) + offset_s)   for multiplicative (positive, heavy-tailed) signals: kl,
                                   entropy, lengths, norms, the sampler mismatch, lr
  y = x                            for bounded / additive signals: rewards, fractions, ratio, loss

In log space a KL that doubles moves by the same amount at 0.01 and at 1.0, lognormal noise
becomes Gaussian, and an exponential blow-up becomes a linear ramp. `offset_s` keeps exact zeros
(KL at step 0) finite. `floor_s` is the smallest robust scale the detector may use for the signal
(transformed units), so a constant signal (lr, adv/mean of GRPO) cannot give infinite z-scores.

Missing metrics are NaN: a NaN observation leaves that signal's detector untouched.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

# (name, log offset (0: identity transform), absolute scale floor in transformed units)
SIGNAL_TABLE: tuple[tuple[str, float, float], ...] = (
    ('reward/mean', 0.0, 0.01),
    ('reward/std', 0.0, 0.01),
    ('reward/zero_std_frac', 0.0, 0.02),
    ('reward/correct/mean', 0.0, 0.01),
    ('response/len_mean', 1.0, 0.01),
    ('response/clip_frac', 0.0, 0.005),
    ('kl', 1e-3, 0.05),
    ('entropy', 1e-3, 0.01),
    ('clip_frac', 0.0, 0.002),
    ('ratio/mean', 0.0, 1e-3),
    ('grad_norm', 1e-6, 0.05),
    ('update_norm', 1e-12, 0.02),
    ('loss', 0.0, 1e-3),
    ('adv/mean', 0.0, 1e-4),
    ('mismatch/logp_abs_diff', 1e-10, 0.05),
    ('lr', 1e-12, 0.01),
)

SIGNALS: tuple[str, ...] = tuple(name for name, _, _ in SIGNAL_TABLE)
LOG_OFFSET = np.array([off for _, off, _ in SIGNAL_TABLE], np.float32)    # [S]
IS_LOG = LOG_OFFSET > 0                                                   # [S] bool
SCALE_FLOOR = np.array([fl for _, _, fl in SIGNAL_TABLE], np.float32)    # [S]

# Exact checks: (name, kind, threshold). Kinds:
#   'nonfinite'      violated when any present source is NaN/Inf (threshold unused). Two of
#                    them: the loss and gradient norm of the step (its update is skipped on
#                    device, the parameters are intact), and the parameter norm after the
#                    update ('param_norm' = sqrt(sum p^2) in float32: it overflows once the norm
#                    passes ~1.8e19 even while every parameter is finite, which is garbage too;
#                    the parameters are no longer usable and only a restore can repair them).
#   'above'          violated when value > threshold, on the first such step
#   'above_persist'  violated when value > threshold for MonitorConfig.stall_persistence
#                    consecutive steps (a single all-equal batch is not a fault, a streak is)
#   'above_credit'   violated when value > threshold for MonitorConfig.credit_persistence
#                    consecutive steps
# The two credit invariants (rft_jax/monitor/credit.py) read (1 - mean within-group correlation
# of the advantage with a per-row reference) / 2, ~ the share of groups trained in the wrong
# direction. Thresholds from first principles, not from FaultBench runs:
#   adv_reward_disagreement: against the reward the estimator received it is 0 by construction
#     for every group estimator (affine increasing within a group); 0.25 (a quarter of the
#     informative groups reversed) leaves room for KL-in-reward shaping and float rounding, and
#     one step over it is a bug between the estimator and the loss (like the mask invariant).
#   adv_correct_disagreement: against the verifier's correctness it is ~0 when correctness
#     dominates the reward (format bonus 0.1 vs 1: at most a few hundredths on healthy batches,
#     synthetic.credit_batch_stats); the same 0.25 for credit_persistence steps in a row, so a
#     recipe with heavier shaping needs a sustained reversal, not one odd batch, to alarm.
INVARIANTS: tuple[tuple[str, str, float], ...] = (
    ('invariant/nonfinite', 'nonfinite', 0.0),
    ('invariant/param_nonfinite', 'nonfinite', 0.0),
    ('invariant/group_adv_mean_max', 'above', 1e-3),
    ('invariant/prompt_loss_tokens', 'above', 0.0),
    ('invariant/zero_std_frac', 'above_persist', 0.95),
    ('invariant/adv_reward_disagreement', 'above', 0.25),
    ('invariant/adv_correct_disagreement', 'above_credit', 0.25),
    ('invariant/reward_out_of_range', 'above', 0.0),
    ('invariant/group_prompt_mismatch', 'above', 0.0),
)
INVARIANT_NAMES: tuple[str, ...] = tuple(name for name, _, _ in INVARIANTS)
# The metric keys each invariant reads.
INVARIANT_SOURCES: dict[str, tuple[str, ...]] = {
    'invariant/nonfinite': ('loss', 'grad_norm'),
    'invariant/param_nonfinite': ('param_norm',),
    'invariant/group_adv_mean_max': ('invariant/group_adv_mean_max',),
    'invariant/prompt_loss_tokens': ('invariant/prompt_loss_tokens',),
    'invariant/zero_std_frac': ('reward/zero_std_frac',),
    'invariant/adv_reward_disagreement': ('invariant/adv_reward_disagreement',),
    'invariant/adv_correct_disagreement': ('invariant/adv_correct_disagreement',),
    'invariant/reward_out_of_range': ('invariant/reward_out_of_range',),
    'invariant/group_prompt_mismatch': ('invariant/group_prompt_mismatch',),
}
INVARIANT_THRESHOLD = np.array([thr for _, _, thr in INVARIANTS], np.float32)  # [I]
INVARIANT_PERSIST = np.array([kind.startswith('above_') for _, kind, _ in INVARIANTS])  # [I]
# The MonitorConfig field holding the streak length each persistent kind needs.
PERSIST_FIELD = {'above_persist': 'stall_persistence', 'above_credit': 'credit_persistence'}


def _values(metrics: Mapping[str, Any], keys) -> tuple[dict[str, jnp.ndarray], tuple[int, ...]]:
  """The present keys as float32 arrays, and their common (broadcast) batch shape."""
  vals = {k: jnp.asarray(metrics[k], jnp.float32) for k in keys if k in metrics}
  return vals, jnp.broadcast_shapes(*(v.shape for v in vals.values())) if vals else ()


def metrics_vector(metrics: Mapping[str, Any]) -> jnp.ndarray:
  """The watched signals of one step as x [..., S] (float32), NaN where a key is missing.

  Works inside jit (a dict of jnp scalars: the key set is static) and on host (floats). Values
  may carry leading batch dims [...] (a batch of independent runs); scalars give x [S].
  """
  vals, shape = _values(metrics, SIGNALS)
  nan = jnp.full(shape, jnp.nan, jnp.float32)
  return jnp.stack([jnp.broadcast_to(vals[k], shape) if k in vals else nan for k in SIGNALS], -1)


def invariant_vector(metrics: Mapping[str, Any]) -> jnp.ndarray:
  """The invariant inputs of one step, v [..., I] (float32), NaN where the sources are missing.

  A 'nonfinite' invariant ('invariant/nonfinite': 'loss', 'grad_norm';
  'invariant/param_nonfinite': 'param_norm') is 1.0 when any present source is NaN or +-Inf,
  0.0 when all present sources are finite, NaN when none is present. The others are the raw
  value of their source key.
  """
  keys = {k for srcs in INVARIANT_SOURCES.values() for k in srcs}
  vals, shape = _values(metrics, keys)
  out = []
  for name, kind, _ in INVARIANTS:
    present = [jnp.broadcast_to(vals[k], shape) for k in INVARIANT_SOURCES[name] if k in vals]
    if not present:
      out.append(jnp.full(shape, jnp.nan, jnp.float32))
    elif kind == 'nonfinite':
      out.append(jnp.any(jnp.stack([~jnp.isfinite(v) for v in present]), 0).astype(jnp.float32))
    else:
      out.append(present[0])
  return jnp.stack(out, -1)


def transform(x: jnp.ndarray) -> jnp.ndarray:
  """x [..., S] raw -> y [..., S] detector units: log(max(x, 0) + offset) (log signals) or x."""
  logged = jnp.log(jnp.maximum(x, 0.0) + LOG_OFFSET)
  return jnp.where(IS_LOG, logged, x)


def untransform(y: jnp.ndarray) -> jnp.ndarray:
  """Inverse of `transform` (for reporting baselines in the signal's own units)."""
  return jnp.where(IS_LOG, jnp.exp(y) - LOG_OFFSET, y)
