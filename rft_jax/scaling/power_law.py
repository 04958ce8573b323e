"""The power law of "Scaling Behaviors of LLM RL Post-Training" (Tan et al. 2025, arXiv 2509.25300).

  log L = -k(N) log C + E(N),   L = 1 - accuracy (the paper's test loss),

a straight line in log-log space for one model of size N: k is the learning efficiency (how fast
the error falls with compute), E the offset. Fitted by least squares on y = ln L, x = ln C, with
the residual block bootstrap of `common` for intervals (ordinary least squares on every
replicate at once: beta* = (X'X)^-1 X' y*). Unlike the sigmoid it has no ceiling: the predicted
accuracy 1 - exp(E) C^-k tends to 1, so long extrapolations are optimistic by construction.

Across model sizes, k(N) rises and saturates; `fit_k_of_n` fits the saturating form

  k(N) = K_max * N / (N + N0)

(K_max the efficiency ceiling, N0 the size at half of it) to the per-size k's, weighted by
their bootstrap spread, with intervals from pairing the sizes' bootstrap replicates. This
Michaelis-Menten form is our choice of a saturating curve (the paper reports the saturation
trend of k(N)); K_max is refused, like the sigmoid's A, when N0 lies beyond the largest size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rft_jax.scaling import common


@dataclasses.dataclass
class PowerLawFit:
  """ln(1 - acc) = -k ln C + E, with bootstrap intervals."""
  k: float
  E: float
  intervals: dict[str, tuple[float, float]]
  boot: np.ndarray            # [n_boot, 2] replicate (k, E)
  compute: np.ndarray
  values: np.ndarray          # accuracies of the fitted points
  excluded: int
  residual_sd: float          # in ln L
  level: float = 0.95
  block: int = 1
  target_compute: float | None = None
  prediction: float | None = None       # accuracy at target_compute
  prediction_interval: tuple[float, float] | None = None
  kind: str = 'power_law'
  at_zero: int = 0            # of `excluded`: points at C = 0 (the base eval)
  exclude_first: float = 0.0
  # Why the intervals and the band are not identified (common.exact_fit_reason: collinear
  # points in log-log space), or None. Then band() is NaN and no interval is reported.
  interval_reason: str | None = None

  def predict(self, compute: Any) -> np.ndarray:
    """accuracy(C) = 1 - exp(E) * C^-k."""
    return 1 - np.exp(self.E - self.k * np.log(np.asarray(compute, dtype=float)))

  def band(self, compute: Any, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise percentile band of the bootstrap curves at `compute` (NaN: interval_reason)."""
    level = self.level if level is None else level
    x = np.log(np.atleast_1d(np.asarray(compute, dtype=float)))
    if self.interval_reason:
      return np.full(x.shape, np.nan), np.full(x.shape, np.nan)
    acc = 1 - np.exp(self.boot[:, 1:2] - self.boot[:, 0:1] * x[None])
    lo, hi = np.quantile(acc, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi

  def to_dict(self) -> dict[str, Any]:
    j, ji = common.json_float, common.json_interval
    shown = self.interval_reason is None
    return {'kind': self.kind, 'formula': 'log(1 - acc) = -k log C + E',
            'k': j(self.k), 'E': j(self.E),
            'intervals': {k: ji(v) if shown else None for k, v in self.intervals.items()},
            'interval_reason': self.interval_reason,
            'level': self.level, 'n_points': int(self.compute.size),
            'n_excluded': self.excluded, 'n_excluded_at_zero': self.at_zero,
            'n_boot': int(self.boot.shape[0]), 'block': self.block,
            'compute_range': [j(self.compute[0]), j(self.compute[-1])],
            'residual_sd_log_loss': j(self.residual_sd),
            'target_compute': j(self.target_compute), 'prediction': j(self.prediction),
            'prediction_interval': ji(self.prediction_interval) if shown else None}

  def summary(self) -> str:
    iv, shown = self.intervals, self.interval_reason is None
    points = common.points_note(self.compute.size, self.excluded, self.at_zero,
                                self.exclude_first, 'log C is undefined there')
    lines = [f'power-law fit on {points}, '
             f'residual sd {self.residual_sd:.3g} in ln(1 - acc)',
             f'  k = {common.with_interval(self.k, iv["k"], shown)}'
             + (f' ({self.level:.0%})' if shown else ''),
             f'  E = {common.with_interval(self.E, iv["E"], shown)}']
    if self.prediction is not None:
      lines.append(f'  acc({self.target_compute:.4g}) = '
                   + common.with_interval(self.prediction, self.prediction_interval, shown))
    if not shown:
      lines.append(f'  intervals and band not identified: {self.interval_reason}')
    return '\n'.join(lines)


def fit_power_law(compute: Any, accuracy: Any, exclude_first: float = 0.0, *,
                  target_compute: float | None = None, n_boot: int = 1000,
                  block: int | None = None, level: float = 0.95, seed: int = 0) -> PowerLawFit:
  """Fits ln(1 - acc) = -k ln C + E to eval points with C > exclude_first * max(C), C > 0.

  Raises ScalingFitError for NaNs, accuracies outside [0, 1) (1 - acc must be > 0 for its log),
  fewer than 4 fitted points, a constant accuracy or compute, n_boot < 20, or an accuracy that
  falls with compute (k <= 0: the law describes improvement; its extrapolation would go below
  0).
  """
  common.check_level(level)
  common.check_n_boot(n_boot)
  if not 0 <= exclude_first < 1:
    raise common.ScalingFitError(f'exclude_first must be in [0, 1), got {exclude_first}')
  c, acc = common.as_series(compute, accuracy, 'accuracy')
  if c.size == 0:
    raise common.ScalingFitError('no eval points')
  keep = (c > 0) & (c > exclude_first * c.max())
  cf, af = c[keep], acc[keep]
  common.require_points(cf.size, 2, 'power-law fit')
  if np.any((af < 0) | (af >= 1)):
    bad = af[(af < 0) | (af >= 1)][0]
    raise common.ScalingFitError(
        f'accuracy {bad:g} is outside [0, 1): the power law fits ln(1 - accuracy), so every '
        'fitted point needs an accuracy below 1 (a score that is not an accuracy: use the sigmoid)')
  common.require_varying(af, 'accuracy')
  common.require_varying(cf, 'compute')
  x, y = np.log(cf), np.log1p(-af)
  design = np.stack([-x, np.ones_like(x)], axis=1)
  pinv = np.linalg.pinv(design)                   # [2, n]: beta = pinv @ y
  k, e = pinv @ y
  if k <= 0:
    raise common.ScalingFitError(
        f'accuracy does not rise with compute over the fitted points (k = {k:.3g}): the power '
        'law in 1 - accuracy describes improvement (the sigmoid fits a falling curve)')
  fitted = design @ np.array([k, e])
  resid = y - fitted
  rng = np.random.default_rng(seed)
  ys, block = common.bootstrap_targets(rng, fitted, resid, 2, n_boot, block)
  boot = ys @ pinv.T
  intervals = {'k': common.interval(boot[:, 0], level), 'E': common.interval(boot[:, 1], level)}
  sd = math.sqrt(float(resid @ resid) / max(cf.size - 2, 1))
  fit = PowerLawFit(k=float(k), E=float(e), intervals=intervals, boot=boot, compute=cf,
                    values=af, excluded=int(c.size - cf.size), residual_sd=sd,
                    level=level, block=block, at_zero=int(np.sum(c == 0)),
                    exclude_first=exclude_first,
                    interval_reason=common.exact_fit_reason(sd, float(np.ptp(y))))
  if target_compute is not None:
    if not target_compute > 0:
      raise common.ScalingFitError(f'target_compute must be > 0, got {target_compute}')
    fit.target_compute = float(target_compute)
    fit.prediction = float(fit.predict(target_compute))
    lo, hi = fit.band([target_compute], level)
    fit.prediction_interval = (float(lo[0]), float(hi[0]))
  return fit


# ----------------------------------------------------------------------------
# k(N) across model sizes.


@dataclasses.dataclass
class KofNFit:
  """k(N) = K_max * N / (N + N0) fitted to per-size power-law k's."""
  K_max: float
  N0: float
  intervals: dict[str, tuple[float, float]]
  boot: np.ndarray            # [n_boot, 2] replicate (K_max, N0)
  sizes: np.ndarray
  fits: list[PowerLawFit]
  K_max_identified: bool
  K_max_reason: str | None
  level: float = 0.95
  kind: str = 'k_of_n'

  def predict_k(self, n_params: Any) -> np.ndarray:
    n = np.asarray(n_params, dtype=float)
    return self.K_max * n / (n + self.N0)

  def k_interval(self, n_params: float) -> tuple[float, float]:
    return common.interval(self.boot[:, 0] * n_params / (n_params + self.boot[:, 1]), self.level)

  def to_dict(self) -> dict[str, Any]:
    j, ji = common.json_float, common.json_interval
    return {'kind': self.kind, 'formula': 'k(N) = K_max * N / (N + N0)',
            'K_max': j(self.K_max) if self.K_max_identified else None, 'N0': j(self.N0),
            'intervals': {'K_max': ji(self.intervals['K_max']) if self.K_max_identified
                          else None, 'N0': ji(self.intervals['N0'])},
            'K_max_identified': self.K_max_identified, 'K_max_reason': self.K_max_reason,
            'sizes': [j(n) for n in self.sizes],
            'k': [j(f.k) for f in self.fits], 'k_intervals': [ji(f.intervals['k'])
                                                             for f in self.fits],
            'E': [j(f.E) for f in self.fits], 'level': self.level}


def _k_of_n_grid(sizes: np.ndarray, ks: np.ndarray, w: np.ndarray, ln_n0: np.ndarray):
  """Profile least squares over a grid of ln N0: K_max closed-form for each.

  ks [R, S] (R replicates), w [S] weights; returns (K_max [R], ln N0 [R]).
  """
  g = sizes[None, :] / (sizes[None, :] + np.exp(ln_n0)[:, None])          # [G, S]
  kmax = (ks * w) @ g.T / np.maximum((g ** 2) @ w, 1e-300)[None, :]       # [R, G]
  sse = (ks ** 2 * w).sum(1)[:, None] - kmax ** 2 * ((g ** 2) @ w)[None, :]
  best = np.argmin(sse, axis=1)
  return kmax[np.arange(ks.shape[0]), best], ln_n0[best]


def fit_k_of_n(runs: Mapping[float, Any], *, level: float = 0.95, n_boot: int = 1000,
               seed: int = 0) -> KofNFit:
  """Fits k(N) = K_max * N / (N + N0) across model sizes.

  Args:
    runs: {N (parameter count): PowerLawFit or (compute, accuracy)}; at least 3 sizes.
  Intervals: replicate j refits k(N) to the sizes' j-th bootstrap k's (the runs are
  independent, so pairing replicates by index is a valid joint resample).
  """
  common.check_level(level)
  if len(runs) < 3:
    raise common.ScalingFitError(f'k(N) has 2 parameters: need runs at >= 3 model sizes, got '
                                 f'{len(runs)}')
  sizes, fits = [], []
  for n, run in sorted(runs.items()):
    if not (isinstance(n, (int, float)) and math.isfinite(n) and n > 0):
      raise common.ScalingFitError(f'model size must be a positive number, got {n!r}')
    fit = run if isinstance(run, PowerLawFit) else fit_power_law(*run, n_boot=n_boot,
                                                                 level=level, seed=seed + len(fits))
    sizes.append(float(n))
    fits.append(fit)
  sizes = np.array(sizes)
  if np.unique(sizes).size < 3:
    raise common.ScalingFitError('need >= 3 distinct model sizes')
  n_rep = min(f.boot.shape[0] for f in fits)
  boot_k = np.stack([f.boot[:n_rep, 0] for f in fits], axis=1)            # [R, S]
  ks = np.array([f.k for f in fits])
  sd = np.maximum(boot_k.std(axis=0), 1e-12)
  w = 1 / sd ** 2
  lo, hi = math.log(sizes.min()) - 6, math.log(sizes.max()) + 8
  grid = np.linspace(lo, hi, 1401)
  kmax0, ln_n00 = _k_of_n_grid(sizes, ks[None], w, grid)

  def resid(theta):
    return (theta[0] * sizes / (sizes + math.exp(theta[1])) - ks) * np.sqrt(w)
  from scipy import optimize  # pylint: disable=g-import-not-at-top  (~0.4 s: only when fitting)
  res = optimize.least_squares(resid, [kmax0[0], ln_n00[0]], bounds=([-np.inf, lo], [np.inf, hi]))
  kmax, ln_n0 = res.x
  bk, bn = _k_of_n_grid(sizes, boot_k, w, grid)
  boot = np.stack([bk, np.exp(bn)], axis=1)
  intervals = {'K_max': common.interval(bk, level), 'N0': common.interval(np.exp(bn), level)}
  n0, k_lo, k_hi = math.exp(ln_n0), *intervals['K_max']
  identified, reason = True, None
  if n0 >= sizes.max():
    identified, reason = False, (f'k(N) has not saturated over the sizes given (N0 {n0:.3g} '
                                 f'>= largest N {sizes.max():.3g}): K_max is not identified')
  elif k_hi - k_lo > abs(kmax):
    identified, reason = False, (f"K_max's interval [{k_lo:.3g}, {k_hi:.3g}] is wider than "
                                 'K_max itself: K_max is not identified')
  return KofNFit(K_max=float(kmax), N0=n0, intervals=intervals, boot=boot, sizes=sizes,
                 fits=fits, K_max_identified=identified, K_max_reason=reason, level=level)
