"""Live scaling fit: refit a run's eval curve every k held-out evals while it trains, log the
predicted final accuracy with its band, and flag an eval point far below the previous fit.

Each eval gives a point (step, C, y): C the cumulative training FLOPs at that step
(`compute/flops_cumulative`), y the held-out accuracy (`eval/mean@K_acc`). Every `every`-th
eval, the model (`sigmoid` or `power_law`, rft_jax.scaling) is refitted to all points so far,
the base eval (C = 0) giving R0 as in `tools.scaling fit`, and predicts the accuracy at the
run's planned compute

  C_final = C_now * total_steps / step        (the mean cost of a step so far, extrapolated)

with its 95% bootstrap band: metrics scaling/pred_final, scaling/pred_lo, scaling/pred_hi, and
for the sigmoid scaling/A_identified (0/1; A and its interval only when 1 -- before the run has
passed C_mid the extrapolation is unreliable and the flag says so).

Anomaly: every new point is compared with the latest fit made from earlier points only. With
lo(C) that fit's lower band edge at the point's compute (its curve when it has no band: a fit
through every point) and sigma its residual sd (accuracy units, sqrt(SSE / (n - p))):

  anomalous  iff  y < lo(C) - margin,    margin = max(anomaly_sd * sigma, anomaly_min_drop)
  score      = (lo(C) - y) / margin      (>= 1 when anomalous)

A point that becomes anomalous after one that was not raises one 'scaling_anomaly' incident
(latched like the monitor's signatures: a collapse that stays down reports once; a point back
above the threshold re-arms it). Anomalous points are held out of the fits, so one bad eval
does not bend the prediction; `accept_after` (3) of them in a row are a new regime, not a
glitch: they join the fit at once and the prediction follows the run down.

State: the points (with their held-out flags), the size of the latest fit and the latch -- a
small JSON dict the trainer keeps in the checkpoint's metadata (meta['scaling_live']). The
latest fit itself is not stored: it is a deterministic function of (its points, settings,
seed), recomputed from the stored points after a resume, so a resumed run logs exactly what an
uninterrupted one logs. A point at
a step not after the last one (a remediation rewind re-running steps) first drops the points
of the abandoned trajectory from that step on.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rft_jax.scaling import common
from rft_jax.scaling.power_law import fit_power_law
from rft_jax.scaling.sigmoid import fit_sigmoid

MODELS = ('sigmoid', 'power_law')
META_KEY = 'scaling_live'


@dataclasses.dataclass(frozen=True)
class LiveConfig:
  """config.scaling: every = live_every (0 = off); see the module docstring for the rest."""
  every: int = 0
  model: str = 'sigmoid'
  exclude_first: float = 0.1
  n_boot: int = 200               # ~0.1-0.6 s per sigmoid fit on one CPU core
  anomaly_sd: float = 3.0
  anomaly_min_drop: float = 0.05
  level: float = 0.95
  seed: int = 0
  accept_after: int = 3           # anomalous evals in a row that the fit then follows

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f'scaling.live_every must be >= 0, got {self.every}')
    if self.model not in MODELS:
      raise ValueError(f'scaling.model must be one of {", ".join(MODELS)}, got {self.model!r}')
    if not 0 <= self.exclude_first < 1:
      raise ValueError(f'scaling.exclude_first must be in [0, 1), got {self.exclude_first}')
    if self.n_boot < 20:
      raise ValueError(f'scaling.n_boot must be >= 20, got {self.n_boot}')
    if self.anomaly_sd < 0 or self.anomaly_min_drop < 0:
      raise ValueError('scaling.anomaly_sd and scaling.anomaly_min_drop must be >= 0')

  @classmethod
  def from_config(cls, config) -> LiveConfig:
    """From config.scaling (optional section and keys); every = 0 when it is absent."""
    s = config.get('scaling')
    if s is None:
      return cls()
    return cls(every=int(s.get('live_every', 0)), model=s.get('model', 'sigmoid'),
               exclude_first=float(s.get('exclude_first', 0.1)),
               n_boot=int(s.get('n_boot', 200)), anomaly_sd=float(s.get('anomaly_sd', 3.0)),
               anomaly_min_drop=float(s.get('anomaly_min_drop', 0.05)), seed=int(config.seed))


def fit_points(compute: Sequence[float], values: Sequence[float], r0: float | None,
               cfg: LiveConfig, target_compute: float | None = None):
  """The configured fit of (compute, values) with the base eval r0 at C = 0 (if given).

  Raises ScalingFitError (too few points, constant accuracy, NaN, ...), saying why.
  """
  c, y = list(compute), list(values)
  if r0 is not None:
    c, y = [0.0] + c, [float(r0)] + y
  kw = dict(target_compute=target_compute, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
  if cfg.model == 'sigmoid':
    return fit_sigmoid(c, y, cfg.exclude_first, **kw)
  return fit_power_law(c, y, cfg.exclude_first, **kw)


def residual_sd(fit) -> float:
  """sigma = sqrt(sum (y_i - f(C_i))^2 / (n - p)) in accuracy units, p = 3 (sigmoid) or 2."""
  p = 3 if fit.kind == 'sigmoid' else 2
  r = np.asarray(fit.values) - fit.predict(fit.compute)
  return math.sqrt(float(r @ r) / max(r.size - p, 1))


def check_point(fit, compute: float, value: float, cfg: LiveConfig) -> dict[str, float]:
  """The previous fit's verdict on a new point: expected, lo, hi, margin, score, anomalous.

  Without a band (a fit through every point: fit.interval_reason; or every refit failed) lo and
  hi are NaN and the point is measured from the curve itself (lo(C) = expected in the module's
  formula)."""
  expected = float(fit.predict(compute))
  lo, hi = (float(v[0]) for v in fit.band([compute], cfg.level))
  floor = lo if math.isfinite(lo) else expected
  margin = max(cfg.anomaly_sd * residual_sd(fit), cfg.anomaly_min_drop)
  score = (floor - value) / margin if margin > 0 else (math.inf if value < floor else 0.0)
  return {'expected': expected, 'lo': lo, 'hi': hi, 'margin': margin, 'score': score,
          'anomalous': bool(value < floor - margin)}


def fit_metrics(fit) -> dict[str, float]:
  """scaling/* metrics of a fit made with a target compute."""
  out = {'scaling/pred_final': fit.prediction, 'scaling/planned_compute': fit.target_compute,
         'scaling/n_points': float(fit.compute.size)}
  shown = fit.interval_reason is None   # else zero-width intervals: not identified, not logged
  if shown:
    out['scaling/pred_lo'], out['scaling/pred_hi'] = fit.prediction_interval
  if fit.kind == 'sigmoid':
    out.update({'scaling/A_identified': float(fit.A_identified), 'scaling/B': fit.B,
                'scaling/C_mid': fit.C_mid})
    if fit.A_identified:
      out.update({'scaling/A': fit.A, 'scaling/A_lo': fit.intervals['A'][0],
                  'scaling/A_hi': fit.intervals['A'][1]})
  else:
    out['scaling/k'] = fit.k
    if shown:
      out['scaling/k_lo'], out['scaling/k_hi'] = fit.intervals['k']
  return {k: float(v) for k, v in out.items()}


def anomaly_incident(step: int, metric: str, value: float, check: Mapping[str, float]) -> dict:
  """An incident dict shaped like the monitor's (rft_jax.monitor.monitor.incidents_from_alarms)."""
  banded = math.isfinite(check['lo'])
  below = (f'95% band [{check["lo"]:.3g}, {check["hi"]:.3g}]' if banded
           else f'curve ({check["expected"]:.3g}; the fit has no band)')
  return {
      'kind': 'incident', 'step': int(step), 'onset_step': int(step),
      'signature': 'scaling_anomaly', 'fault_class': 'scaling_anomaly', 'severity': 'warn',
      'remediation': 'warn_only',
      'description': (f'{metric} {value:.3g} fell below the scaling fit\'s {below} by more '
                      f'than {check["margin"]:.3g}'),
      'score': float(check['score']),
      'evidence': [{'signal': metric, 'direction': 'down', 'score': float(check['score']),
                    'value': float(value), 'baseline': float(check['expected']),
                    'band': [float(check['lo']), float(check['hi'])] if banded else None}]}


@dataclasses.dataclass
class LiveUpdate:
  """What one eval produced: metrics for its eval record, incidents, console messages."""
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  incidents: list[dict] = dataclasses.field(default_factory=list)
  messages: list[str] = dataclasses.field(default_factory=list)

  def report(self, step: int, hooks, incident_log) -> None:
    """Messages to the hooks; incidents to incidents.jsonl and the hooks (as the monitor's)."""
    for text in self.messages:
      hooks.on_message(text)
    for incident in self.incidents:
      incident_log.add(incident)
      hooks.on_incident(step, incident)


class LiveFit:
  """The live fit of one run (a no-op when cfg.every == 0). Host-side, after each eval."""

  def __init__(self, cfg: LiveConfig, metric: str, total_steps: int,
               state: Mapping[str, Any] | None = None):
    self.cfg, self.metric, self.total_steps = cfg, metric, int(total_steps)
    state = dict(state or {})
    # [step, compute, value, held_out]: held_out = anomalous, kept out of the fits for now
    self.points = [[int(p[0]), float(p[1]), float(p[2]), bool(p[3])]
                   for p in state.get('points', [])]
    self.n_fitted = int(state.get('n_fitted', 0))   # the latest fit used points[:n_fitted]
    self.latched = bool(state.get('latched', False))
    self.evals = int(state.get('evals', 0))         # evals seen (the fit cadence)
    self.said = str(state.get('said', ''))          # the last refusal said (digits masked)
    self._fit, self._fit_n = None, -1               # cache of the latest fit

  @classmethod
  def from_config(cls, config, meta: Mapping[str, Any]) -> LiveFit:
    return cls(LiveConfig.from_config(config), f'eval/mean@{config.eval.k}_acc',
               config.train.steps, meta.get(META_KEY))

  @property
  def enabled(self) -> bool:
    return self.cfg.every > 0

  def state_dict(self) -> dict[str, Any]:
    return {'points': [list(p) for p in self.points], 'n_fitted': self.n_fitted,
            'latched': self.latched, 'evals': self.evals, 'said': self.said}

  def _fit_now(self, n: int, r0: float | None):
    """Fit of the points among the first n that are not held out; raises ScalingFitError."""
    pts = [p for p in self.points[:n] if not p[3]]
    planned = self.points[n - 1][1] * max(self.total_steps, self.points[n - 1][0]) / max(
        self.points[n - 1][0], 1)
    return fit_points([p[1] for p in pts], [p[2] for p in pts], r0, self.cfg, planned)

  def _latest_fit(self, r0: float | None):
    """The latest fit (recomputed from the stored points after a resume), or None."""
    if self.n_fitted < 1:
      return None
    if self._fit_n != self.n_fitted:
      try:
        self._fit = self._fit_now(self.n_fitted, r0)
      except (ValueError, ArithmeticError):   # ScalingFitError or a failed refit
        self._fit = None
      self._fit_n = self.n_fitted
    return self._fit

  def observe(self, step: int, compute: float, value: float, r0: float | None) -> LiveUpdate:
    """One eval point -> LiveUpdate: the anomaly check against the latest fit, then a refit
    every cfg.every evals (and at once when held-out points are accepted as a new regime)."""
    out = LiveUpdate()
    if not self.enabled:
      return out
    if not (math.isfinite(compute) and math.isfinite(value)):
      out.messages.append(f'scaling: eval at step {step} is not finite ({self.metric}={value}, '
                          f'compute={compute}); left out of the live fit')
      return out
    if self.points and step <= self.points[-1][0]:   # a rewind: drop the abandoned points
      self.points = [p for p in self.points if p[0] < step]
      if self.n_fitted > len(self.points):
        self.n_fitted, self._fit_n = len(self.points), -1
    fit, anomalous = self._latest_fit(r0), False
    if fit is not None:
      check = check_point(fit, compute, value, self.cfg)
      anomalous = check['anomalous']
      out.metrics.update({'scaling/expected': check['expected'],
                          'scaling/anomaly': float(anomalous)})
      if math.isfinite(check['lo']):   # NaN: the fit has no band (check_point)
        out.metrics['scaling/expected_lo'] = check['lo']
      if anomalous and not self.latched:
        out.incidents.append(anomaly_incident(step, self.metric, value, check))
    self.latched = anomalous
    self.points.append([int(step), float(compute), float(value), anomalous])
    self.evals += 1
    tail = self.points[-self.cfg.accept_after:]
    accepted = len(tail) == self.cfg.accept_after and all(p[3] for p in tail)
    if accepted:   # not a glitch: the run has changed, and the fit follows it from now on
      for p in tail:
        p[3] = False
      out.messages.append(f'scaling: {len(tail)} evals in a row below the band of the live '
                          f'fit (step {step}); they are now part of the fit')
    if self.evals % self.cfg.every and not accepted:
      return out
    t0 = time.perf_counter()
    try:
      fit = self._fit_now(len(self.points), r0)
    except (ValueError, ArithmeticError) as e:   # ScalingFitError says why; never stop the run
      why = str(e) if isinstance(e, common.ScalingFitError) else f'{type(e).__name__}: {e}'
      if re.sub(r'\d[\d.e+-]*', '#', why) != self.said:   # once per reason, not every eval
        out.messages.append(f'scaling: no live fit at step {step}: {why}')
        self.said = re.sub(r'\d[\d.e+-]*', '#', why)
      return out   # the previous fit (if any) stays the reference for the anomaly check
    self.n_fitted = self._fit_n = len(self.points)
    self._fit, self.said = fit, ''
    out.metrics.update(fit_metrics(fit))
    out.metrics['scaling/fit_s'] = time.perf_counter() - t0
    return out

  def observe_eval(self, step: int, result: Mapping[str, float],
                   meta: dict[str, Any]) -> LiveUpdate:
    """The trainer's call after an eval: compute from meta['flops'], R0 from meta['base_eval'];
    the state goes back into meta (saved with the next checkpoint)."""
    if not self.enabled:
      return LiveUpdate()
    if self.metric not in result:
      return LiveUpdate(messages=[f'scaling: {self.metric} not in the eval results; no live fit'])
    r0 = (meta.get('base_eval') or {}).get(self.metric)
    out = self.observe(step, float(meta.get('flops', math.nan)), float(result[self.metric]),
                       None if r0 is None else float(r0))
    meta[META_KEY] = self.state_dict()
    return out


def replay(steps: Sequence[int], compute: Sequence[float], values: Sequence[float],
           r0: float | None, cfg: LiveConfig, total_steps: int,
           metric: str = 'eval') -> list[LiveUpdate]:
  """What a run with these eval points would have logged, eval by eval (a fresh LiveFit)."""
  if not len(steps) == len(compute) == len(values):
    raise common.ScalingFitError(f'replay needs as many steps, compute values and accuracies; '
                                 f'got {len(steps)}, {len(compute)} and {len(values)}')
  live = LiveFit(cfg, metric, total_steps)
  return [live.observe(s, c, v, r0) for s, c, v in zip(steps, compute, values)]
