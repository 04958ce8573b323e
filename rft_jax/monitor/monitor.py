"""Failure-signature monitor: pure, jittable `monitor_update(state, metrics) -> (state, alarms)`.

One call per training step, on device, inside or next to the train step:

  mstate = init_monitor(cfg)
  update = jax.jit(functools.partial(monitor_update, cfg=cfg))
  mstate, alarms = update(mstate, metrics)            # metrics: dict of scalars (missing = ok)
  if jax.device_get(alarms.fired).any():              # the only host round-trip, one bool
    incidents = incidents_from_alarms(jax.device_get(alarms), step)

Per step: the S drifting signals go through the detectors (detectors.py) -> up/down scores [S];
the I invariants are checked exactly -> scores [I] (cfg.invariant_score when violated, else 0);
then every signature k (signatures.SIGNATURES, K of them) evaluates
  strength_k = min over its up/down conditions c of score_c / min_score_c
  holds_k    = strength_k >= 1 and all its 'not_up' gates hold
  active_k   = holds_k or (active_k(prev) and strength_k >= release and gates hold)
  fired_k    = active_k and not active_k(prev)
  onset_k    = from its conditions' starts (CUSUM excursion start: the step after the CUSUM
               was last within onset_reset of 0; or the first violating step of an invariant
               streak): the earliest, but no more than cfg.onset_lead steps before the latest
               (onset_lead -1: the earliest, unbounded); latched when it fires.
While k is active, the signals it uses adapt only slowly (detectors.py: freeze).
"""
from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rft_jax.monitor import signals as sig
from rft_jax.monitor import signatures as sigs
from rft_jax.monitor.detectors import DetectorState, MonitorConfig, detector_update, init_detectors

__all__ = ['MonitorConfig', 'MonitorState', 'Alarms', 'init_monitor', 'monitor_update',
           'incidents_from_alarms', 'alarm_metrics', 'run_monitor']

_USES = sigs.uses_matrix()     # [K, S]


@flax.struct.dataclass
class MonitorState:
  """Shapes as commented, with optional leading batch dims (see init_monitor)."""
  detectors: DetectorState
  step: jnp.ndarray            # int32: updates seen so far (= index of the next update)
  invariant_run: jnp.ndarray   # [I] int32: consecutive violating steps per invariant
  active: jnp.ndarray          # [K] bool
  onset: jnp.ndarray           # [K] int32: onset of the current/last firing (monitor steps)
  fired_count: jnp.ndarray     # [K] int32


@flax.struct.dataclass
class Alarms:
  fired: jnp.ndarray           # [K] bool   became active this step
  active: jnp.ndarray          # [K] bool
  score: jnp.ndarray           # [K] f32    strength (min over conditions of score / min_score)
  onset: jnp.ndarray           # [K] int32  onset step (monitor steps) of the active firing
  signal_up: jnp.ndarray       # [S] f32
  signal_down: jnp.ndarray     # [S] f32
  value: jnp.ndarray           # [S] f32    last valid raw value per signal
  baseline: jnp.ndarray        # [S] f32    baseline in signal units (exp back from log space)
  invariant: jnp.ndarray       # [I] f32    invariant scores (cfg.invariant_score if violated)
  invariant_value: jnp.ndarray  # [I] f32   invariant inputs of this step
  step: jnp.ndarray            # int32      monitor step index of this update
  # cfg.not_up_max, the up score below which a 'not_up' gate holds (static: no device array),
  # so that an incident's evidence can state the test its gates passed
  not_up_max: float = flax.struct.field(pytree_node=False)


def init_monitor(cfg: MonitorConfig, batch_shape: tuple[int, ...] = ()) -> MonitorState:
  """A fresh monitor; batch_shape (e.g. (N,)) makes N independent monitors updated together by
  monitor_update with metrics of shape [N] (faster than jax.vmap: see detectors.detector_update)."""
  b = tuple(batch_shape)
  k, i = len(sigs.SIGNATURES), len(sig.INVARIANTS)
  return jax.device_put(MonitorState(   # NumPy, placed: no XLA program (as init_detectors)
      detectors=init_detectors(cfg, b), step=np.zeros(b, np.int32),
      invariant_run=np.zeros(b + (i,), np.int32), active=np.zeros(b + (k,), bool),
      onset=np.zeros(b + (k,), np.int32), fired_count=np.zeros(b + (k,), np.int32)))


def _invariants(state: MonitorState, metrics: Mapping[str, Any], cfg: MonitorConfig):
  """-> (run, score, onset, value), each [..., I], of the exact checks at this step."""
  value = sig.invariant_vector(metrics)
  kinds = [kind for _, kind, _ in sig.INVARIANTS]
  is_nonfinite = np.array([kd == 'nonfinite' for kd in kinds])
  violated = jnp.where(is_nonfinite, value > 0.5, value > sig.INVARIANT_THRESHOLD)
  run = jnp.where(violated, state.invariant_run + 1, 0)
  need = np.array([getattr(cfg, sig.PERSIST_FIELD[kd]) if kd in sig.PERSIST_FIELD else 1
                   for kd in kinds], np.int32)
  score = jnp.where(run >= need, cfg.invariant_score, 0.0).astype(jnp.float32)
  return run, score, state.step[..., None] - run + 1, value


def monitor_update(state: MonitorState, metrics: Mapping[str, jax.Array],
                   cfg: MonitorConfig) -> tuple[MonitorState, Alarms]:
  """One monitor step. Pure; jit with cfg static (functools.partial(monitor_update, cfg=cfg))."""
  step = state.step
  freeze = jnp.any(state.active[..., :, None] & _USES, axis=-2)                  # [..., S]
  det, up, down = detector_update(state.detectors, sig.metrics_vector(metrics), step, cfg,
                                  freeze)
  inv_run, inv_score, inv_onset, inv_value = _invariants(state, metrics, cfg)
  warm = det.count >= cfg.warmup

  def lookup(name: str, direction: str):
    """(score, onset, warm) of one condition's signal and direction."""
    if name in sig.INVARIANT_NAMES:
      i = sig.INVARIANT_NAMES.index(name)
      return inv_score[..., i], inv_onset[..., i], jnp.ones_like(inv_score[..., i], bool)
    s = sig.SIGNALS.index(name)
    if direction == 'down':
      return down[..., s], det.cusum_neg_start[..., s], warm[..., s]
    return up[..., s], det.cusum_pos_start[..., s], warm[..., s]

  strength, gate, onset = [], [], []
  for signature in sigs.SIGNATURES:
    ratios, gates, starts = [], [], []
    for c in signature.conditions:
      score, start, is_warm = lookup(c.signal, c.direction)
      if c.direction == 'not_up':
        gates.append(is_warm & (score < cfg.not_up_max))
      else:
        ratios.append(score / c.min_score)
        starts.append(start)
    strength.append(jnp.min(jnp.stack(ratios, -1), -1))
    gate.append(jnp.all(jnp.stack(gates, -1), -1) if gates else jnp.ones_like(ratios[0], bool))
    st = jnp.stack(starts, -1)
    earliest = jnp.min(st, -1)
    onset.append(earliest if cfg.onset_lead < 0 else
                 jnp.maximum(earliest, jnp.max(st, -1) - cfg.onset_lead))
  strength = jnp.stack(strength, -1).astype(jnp.float32)                          # [..., K]
  gate, onset = jnp.stack(gate, -1), jnp.stack(onset, -1).astype(jnp.int32)

  holds = gate & (strength >= 1.0)
  active = holds | (state.active & gate & (strength >= cfg.release))
  fired = active & ~state.active
  new_onset = jnp.where(fired, onset, state.onset)
  new_state = MonitorState(
      detectors=det, step=step + 1, invariant_run=inv_run, active=active, onset=new_onset,
      fired_count=state.fired_count + fired.astype(jnp.int32))
  alarms = Alarms(
      fired=fired, active=active, score=strength, onset=new_onset, signal_up=up,
      signal_down=down, value=det.last, baseline=sig.untransform(det.baseline),
      invariant=inv_score, invariant_value=inv_value, step=step, not_up_max=cfg.not_up_max)
  return new_state, alarms


def run_monitor(metrics_seq: Mapping[str, jax.Array], cfg: MonitorConfig,
                state: MonitorState | None = None) -> tuple[MonitorState, Alarms]:
  """lax.scan of the monitor over a recorded run. metrics_seq: name -> [T] (one run) or [N, T]
  (N runs as one batch, time last) -> (final state, Alarms with [T, ...] or [N, T, ...] leaves).
  Jittable with cfg static."""
  xs = {k: jnp.moveaxis(jnp.asarray(v, jnp.float32), -1, 0) for k, v in metrics_seq.items()}
  batch_shape = next(iter(xs.values())).shape[1:]
  state = init_monitor(cfg, batch_shape) if state is None else state

  def body(st, m):
    return monitor_update(st, m, cfg)
  final, alarms = jax.lax.scan(body, state, xs)
  return final, jax.tree.map(lambda a: jnp.moveaxis(a, 0, len(batch_shape)), alarms)


def _num(v) -> float | None:
  v = float(v)
  return v if math.isfinite(v) else None


def incident(s: sigs.Signature, step: int, onset: int, score: float, evidence: list) -> dict:
  """The JSON-serialisable record of signature `s` firing at `step` (incidents.jsonl's shape)."""
  return {'step': int(step), 'onset_step': int(onset), 'signature': s.name,
          'fault_class': s.fault_class, 'severity': s.severity, 'remediation': s.remediation,
          'description': s.description, 'score': score, 'evidence': evidence}


def incidents_from_alarms(alarms: Alarms, step: int) -> list[dict]:
  """Host-side: one JSON-serialisable dict per signature that fired in this step's `alarms`
  (host numpy from jax.device_get; one unbatched step), most serious and specific first
  (signatures.rank_key).

  `step` is the caller's step number for this update; onset_step is mapped into the same
  numbering. Evidence lists every condition: signal, direction, score, and for drifting signals
  the last value and the baseline (signal units); an exact check's value is its input and its
  'limit' the threshold the value passed (its score is cfg.invariant_score, the same for every
  violation, so the console shows value and limit instead). A 'not_up' gate's score is the
  signal's up score (its CUSUM: the steps' rises beyond the allowance, accumulated), its 'limit' the
  cfg.not_up_max it was below: that, not value against baseline, is what the gate tested (a
  signal may rise above its baseline and still score below the limit).
  """
  fired = np.asarray(alarms.fired)
  out = []
  for k in np.flatnonzero(fired):
    s = sigs.SIGNATURES[k]
    evidence = []
    for c in s.conditions:
      if c.signal in sig.INVARIANT_NAMES:
        i = sig.INVARIANT_NAMES.index(c.signal)
        evidence.append({'signal': c.signal, 'direction': c.direction,
                         'score': _num(alarms.invariant[i]),
                         'value': _num(alarms.invariant_value[i]),
                         'limit': float(sig.INVARIANT_THRESHOLD[i])})
        continue
      j = sig.SIGNALS.index(c.signal)
      scores = alarms.signal_down if c.direction == 'down' else alarms.signal_up
      item = {'signal': c.signal, 'direction': c.direction, 'score': _num(scores[j])}
      if c.direction == 'not_up':
        item['limit'] = float(alarms.not_up_max)
      evidence.append({**item, 'value': _num(alarms.value[j]),
                       'baseline': _num(alarms.baseline[j])})
    lag = int(alarms.step) - int(alarms.onset[k])
    out.append(incident(s, step, int(step) - lag, _num(alarms.score[k]), evidence))
  out.sort(key=lambda inc: sigs.rank_key(sigs.SIGNATURES[sigs.SIGNATURE_NAMES.index(
      inc['signature'])], inc['score'] or 0.0))
  return out


def alarm_metrics(alarms: Alarms) -> dict[str, jax.Array]:
  """Flat telemetry: 'monitor/active/<signature>' (0/1), 'monitor/score/<signature>', and
  'monitor/num_active'. Works on device arrays (inside jit) and on host numpy."""
  out = {}
  for k, name in enumerate(sigs.SIGNATURE_NAMES):
    out[f'monitor/active/{name}'] = alarms.active[..., k].astype(jnp.float32)
    out[f'monitor/score/{name}'] = alarms.score[..., k]
  out['monitor/num_active'] = alarms.active.sum(-1).astype(jnp.float32)
  return out
