"""ScaleRL's sigmoidal compute-performance curve, fitted with block-bootstrap intervals.

  R(C) - R0 = (A - R0) / (1 + (C_mid / C)^B)

(Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for LLMs", ScaleRL):
R0 the performance at the start, A the asymptote (the ceiling at infinite compute), B the
scaling exponent (efficiency: how steeply R rises), C_mid the compute at which half of the
gain A - R0 is reached. As in the paper, the first part of the run (its noisy start) is left out
of the fit: here points with C <= exclude_first * max(C).

With x = ln C, m = ln C_mid and s = 1 / (1 + exp(B (m - x))) this is R = R0 + (A - R0) s,
fitted by least squares in (A, B, m) from a grid of starts (for fixed B, m the best A is
closed-form: A - R0 = sum s (R - R0) / sum s^2). Intervals: the residual block bootstrap of
`common`, all replicates refitted at once by a batched Levenberg-Marquardt from the estimate.
A is *identified* only when the run has gone past its midpoint: before C_mid a
sigmoid with a higher ceiling and a later midpoint fits the same points, so A (and with it the
extrapolation) is left unreported, with the reason, when the fit or its bootstrap puts C_mid
beyond the last observed compute, or when A's interval is wider than the gain it describes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rft_jax.scaling import common


def _expit(z):
  """1 / (1 + exp(-z)) as 0.5 * (1 + tanh(z / 2)): the same function, overflow-free, without
  importing scipy.special (0.15 s of every run's start-up for this one function)."""
  return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z)))

PARAMS = ('A', 'B', 'C_mid')
_B_BOUNDS = (1e-2, 50.0)


def sigmoid_curve(compute: Any, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
  """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
  c = np.asarray(compute, dtype=float)
  with np.errstate(divide='ignore'):
    x = np.log(c)
  return R0 + (A - R0) * _expit(B * (x - math.log(C_mid)))


def _residual_fn(x, y, r0):
  def fun(theta):
    a, b, m = theta
    return r0 + (a - r0) * _expit(b * (x - m)) - y

  def jac(theta):
    a, b, m = theta
    s = _expit(b * (x - m))
    ds = s * (1 - s)
    return np.stack([s, (a - r0) * ds * (x - m), -(a - r0) * ds * b], axis=1)
  return fun, jac


def _bounds(x, upper):
  """A in [0, upper] for an accuracy (upper = 1.0; a negative ceiling put bands below 0),
  (-inf, upper] otherwise; B in _B_BOUNDS; the midpoint within 5 spans of the data."""
  span = max(x[-1] - x[0], 1.0)
  lo = np.array([0.0 if upper == 1.0 else -np.inf, _B_BOUNDS[0], x[0] - 5 * span])
  hi = np.array([np.inf if upper is None else upper, _B_BOUNDS[1], x[-1] + 5 * span])
  return lo, hi


def _least_squares(x, y, r0, theta0, bounds):
  fun, jac = _residual_fn(x, y, r0)
  theta0 = np.clip(theta0, bounds[0] + 1e-9, bounds[1] - 1e-9)
  from scipy import optimize  # pylint: disable=g-import-not-at-top  (~0.4 s: only when fitting)
  res = optimize.least_squares(fun, theta0, jac=jac, bounds=bounds, method='trf',
                               x_scale='jac', max_nfev=200)
  return res.x, float(np.sum(res.fun ** 2))


def _batch_refit(x, ys, r0s, theta0, bounds, iters: int = 100, tol: float = 1e-10):
  """Levenberg-Marquardt on all bootstrap replicates at once (rows of ys), from theta0.

  Per row: (J'J + lam diag(J'J)) d = -J'r, the step kept (and lam /= 3) when it lowers the
  sum of squares, else lam *= 10; steps are clipped to the bounds. Rows whose cost stalls stop.
  """
  n_rep = ys.shape[0]
  th = np.tile(np.clip(theta0, bounds[0] + 1e-9, bounds[1] - 1e-9), (n_rep, 1))
  lam = np.full(n_rep, 1e-3)
  r0 = r0s[:, None]

  def resid_jac(t):
    a, b, m = (t[:, k:k + 1] for k in range(3))
    s = _expit(b * (x[None] - m))
    ds = s * (1 - s)
    r = r0 + (a - r0) * s - ys
    return r, np.stack([s, (a - r0) * ds * (x[None] - m), -(a - r0) * ds * b], axis=2)

  r, jac = resid_jac(th)
  cost = np.sum(r ** 2, axis=1)
  active = np.ones(n_rep, bool)
  for _ in range(iters):
    g = np.einsum('rni,rn->ri', jac, r)
    h = np.einsum('rni,rnj->rij', jac, jac)
    damp = lam[:, None] * np.diagonal(h, axis1=1, axis2=2) + 1e-12
    step = -np.linalg.solve(h + damp[:, :, None] * np.eye(3)[None], g[:, :, None])[:, :, 0]
    new = np.clip(th + step, bounds[0], bounds[1])
    r_new, jac_new = resid_jac(new)
    cost_new = np.sum(r_new ** 2, axis=1)
    better = active & (cost_new < cost)
    converged = better & (cost - cost_new <= tol * np.maximum(cost, 1e-300))
    th[better], r[better], jac[better], cost[better] = (new[better], r_new[better],
                                                       jac_new[better], cost_new[better])
    lam = np.where(better, lam / 3, np.minimum(lam * 10, 1e12))
    active &= ~converged & (lam < 1e12)
    if not active.any():
      break
  return th


def _grid_starts(x, y, r0, upper, top: int = 3):
  """The best (A, B, m) of a grid over B and m, A in closed form (clipped to `upper`)."""
  span = max(x[-1] - x[0], 1.0)
  cands = []
  for b in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
    for m in np.linspace(x[0] - span, x[-1] + 2 * span, 16):
      s = _expit(b * (x - m))
      a = r0 + float(s @ (y - r0)) / max(float(s @ s), 1e-12)
      if upper is not None:
        a = min(a, upper)
      cands.append((float(np.sum((r0 + (a - r0) * s - y) ** 2)), (a, b, m)))
  cands.sort(key=lambda t: t[0])
  return [np.array(t[1]) for t in cands[:top]]


def _fit_point(x, y, r0, upper):
  bounds = _bounds(x, upper)
  best = None
  for start in _grid_starts(x, y, r0, upper):
    theta, sse = _least_squares(x, y, r0, start, bounds)
    if best is None or sse < best[1]:
      best = (theta, sse)
  return best


@dataclasses.dataclass
class SigmoidFit:
  """A fitted sigmoid with bootstrap intervals; A is None-reported when not identified."""
  A: float
  B: float
  C_mid: float
  R0: float
  intervals: dict[str, tuple[float, float]]
  boot: np.ndarray            # [n_boot, 3] replicate (A, B, C_mid); NaN rows = failed refits
  boot_r0: np.ndarray         # [n_boot] replicate R0 (constant when R0 was given)
  compute: np.ndarray         # fitted points
  values: np.ndarray
  excluded: int               # points left out: at C = 0 (at_zero of them) or the start
  residual_sd: float
  A_identified: bool
  A_reason: str | None
  level: float = 0.95
  block: int = 1
  upper: float | None = 1.0
  target_compute: float | None = None
  prediction: float | None = None
  prediction_interval: tuple[float, float] | None = None
  kind: str = 'sigmoid'
  at_zero: int = 0            # of `excluded`: points at C = 0 (the base eval)
  exclude_first: float = 0.0
  # Where R0 came from: 'given' (fit_sigmoid's R0 argument), 'base_eval' (the point at C = 0)
  # or 'first_eval' (no point at C = 0: the eval at the smallest compute).
  r0_source: str = 'base_eval'
  # Why the intervals and the band are not identified (common.exact_fit_reason), or None. Then
  # band() is NaN; `intervals` keep the bootstrap's zero-width ones, which are not reported.
  interval_reason: str | None = None

  def predict(self, compute: Any) -> np.ndarray:
    return sigmoid_curve(compute, self.A, self.B, self.C_mid, self.R0)

  def band(self, compute: Any, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise percentile band of the bootstrap curves at `compute`; NaN where there is none
    (every refit failed, or interval_reason)."""
    level = self.level if level is None else level
    ok = np.all(np.isfinite(self.boot), axis=1)
    c = np.atleast_1d(np.asarray(compute, dtype=float))
    if not ok.any() or self.interval_reason:
      return np.full(c.shape, np.nan), np.full(c.shape, np.nan)
    curves = np.stack([sigmoid_curve(c, a, b, m, r0)
                       for (a, b, m), r0 in zip(self.boot[ok], self.boot_r0[ok])])
    lo, hi = np.quantile(curves, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi

  def to_dict(self) -> dict[str, Any]:
    """JSON-safe summary; A and its interval are None when A is not identified, every interval
    when they are not (interval_reason)."""
    j, ji = common.json_float, common.json_interval
    shown = self.interval_reason is None
    d = {'kind': self.kind, 'formula': 'R(C) - R0 = (A - R0) / (1 + (C_mid / C)^B)',
         'A': j(self.A) if self.A_identified else None,
         'B': j(self.B), 'C_mid': j(self.C_mid), 'R0': j(self.R0), 'R0_source': self.r0_source,
         'intervals': {k: (ji(v) if shown and (k != 'A' or self.A_identified) else None)
                       for k, v in self.intervals.items()},
         'A_identified': self.A_identified, 'A_reason': self.A_reason,
         'interval_reason': self.interval_reason,
         'level': self.level, 'n_points': int(self.compute.size),
         'n_excluded': self.excluded, 'n_excluded_at_zero': self.at_zero,
         'n_boot': int(self.boot.shape[0]), 'block': self.block,
         'boot_failed': int(np.sum(~np.all(np.isfinite(self.boot), axis=1))),
         'compute_range': [j(self.compute[0]), j(self.compute[-1])],
         'residual_sd': j(self.residual_sd), 'upper_bound_A': self.upper,
         'target_compute': j(self.target_compute), 'prediction': j(self.prediction),
         'prediction_interval': ji(self.prediction_interval) if shown else None}
    return d

  def summary(self) -> str:
    """A few human-readable lines."""
    iv = self.intervals
    pct = f'{self.level:.0%}'
    given = self.r0_source == 'given'   # then the base eval at C = 0 has no part in the fit
    points = common.points_note(self.compute.size, self.excluded, self.at_zero,
                                self.exclude_first, 'unused: R0 was given' if given
                                else 'it sets R0')
    source = {'given': ' (given)', 'base_eval': '',
              'first_eval': ' (the eval at the smallest compute)'}[self.r0_source]
    lines = [f'sigmoid fit on {points}, R0={self.R0:.4g}{source}, '
             f'residual sd {self.residual_sd:.3g}']
    shown = self.interval_reason is None
    if self.A_identified:
      lines.append(f'  A     = {common.with_interval(self.A, iv["A"])} ({pct})')
    else:
      lines.append(f'  A     = not reported: {self.A_reason}')
    lines.append(f'  B     = {common.with_interval(self.B, iv["B"], shown)}')
    lines.append(f'  C_mid = {common.with_interval(self.C_mid, iv["C_mid"], shown)}')
    if self.prediction is not None:
      lines.append(f'  R({self.target_compute:.4g}) = '
                   + common.with_interval(self.prediction, self.prediction_interval, shown)
                   + ('' if self.A_identified
                      else '  (extrapolation unreliable: A not identified)'))
    if not shown:
      lines.append(f'  intervals and band not identified: {self.interval_reason}')
    return '\n'.join(lines)


def identify_A(A: float, C_mid: float, R0: float, intervals: dict, c_max: float,
               upper: float | None) -> tuple[bool, str | None]:
  """Whether the data pin down A; (False, why) when they do not.

  Not identified when: the point estimate C_mid lies beyond the last observed compute (the run
  has not passed its midpoint); the upper end of C_mid's interval does (it may not have);
  A's interval touches `upper` (the fit leans on the bound, not the data); or A's interval
  is wider than the gain |A - R0| itself.
  """
  (a_lo, a_hi), (_, m_hi) = intervals['A'], intervals['C_mid']
  if not all(map(math.isfinite, (a_lo, a_hi, m_hi))):
    return False, 'the bootstrap refits failed: A is not identified'
  if C_mid >= c_max:
    return False, (f'the run has not passed C_mid (fitted C_mid {C_mid:.3g} >= last compute '
                   f'{c_max:.3g}): A is not identified')
  if m_hi >= c_max:
    return False, (f"C_mid's interval reaches past the last compute ({m_hi:.3g} >= "
                   f'{c_max:.3g}): the run may not have passed its midpoint, A is not identified')
  if upper is not None and a_hi >= upper - 1e-6:
    return False, (f"A's interval reaches the bound {upper:g}: the data do not pin A down")
  if a_hi - a_lo > abs(A - R0):
    return False, (f"A's interval [{a_lo:.3g}, {a_hi:.3g}] is wider than the gain "
                   f'|A - R0| = {abs(A - R0):.3g}: A is not identified')
  return True, None


def fit_sigmoid(compute: Any, reward: Any, exclude_first: float = 0.1, *,
                R0: float | None = None, upper: float | None = 1.0,
                target_compute: float | None = None, n_boot: int = 1000,
                block: int | None = None, level: float = 0.95, seed: int = 0) -> SigmoidFit:
  """Fits R(C) - R0 = (A - R0) / (1 + (C_mid / C)^B) to eval points (compute, reward).

  Args:
    compute, reward: eval points (any order; compute >= 0). A point at C = 0 (the base
      model's eval) only sets R0 (unused when R0 is given).
    exclude_first: points with C <= exclude_first * max(C) are left out of the fit.
    R0: the starting performance; None = the value at the smallest compute (then resampled
      with the residuals in the bootstrap, since it is one noisy eval too). The fit's
      r0_source says which ('given', 'base_eval' at C = 0, 'first_eval' otherwise).
    upper: bound on A (1.0 for an accuracy, which also keeps A >= 0; None for an unbounded
      reward).
    target_compute: also predict R there, with an interval.
    n_boot, block, level, seed: the residual block bootstrap (block None = chosen from
      the residuals' autocorrelation, see `common`).
  Raises:
    ScalingFitError: NaNs, mismatched or too few points (< 5 after exclusion), constant reward.
  """
  common.check_level(level)
  common.check_n_boot(n_boot)
  if not 0 <= exclude_first < 1:
    raise common.ScalingFitError(f'exclude_first must be in [0, 1), got {exclude_first}')
  c, r = common.as_series(compute, reward, 'reward')
  if c.size == 0:
    raise common.ScalingFitError('no eval points')
  r0_given = R0 is not None
  r0 = float(R0) if r0_given else float(r[0])
  keep = (c > 0) & (c > exclude_first * c.max())
  cf, rf = c[keep], r[keep]
  common.require_points(cf.size, 3, f'sigmoid fit (excluding C <= {exclude_first:g} * max C)')
  common.require_varying(rf, 'reward')
  common.require_varying(cf, 'compute')
  if upper is not None and upper < rf.max():   # A could not reach the data: a silent misfit
    raise common.ScalingFitError(f'upper={upper:g}: below the largest value fitted '
                                 f'({rf.max():g}); the bound on A must be at least that')
  x = np.log(cf)
  (a, b, m), sse = _fit_point(x, rf, r0, upper)
  fitted = r0 + (a - r0) * _expit(b * (x - m))
  resid = rf - fitted
  rng = np.random.default_rng(seed)
  ys, block = common.bootstrap_targets(rng, fitted, resid, 3, n_boot, block)
  scale = math.sqrt(cf.size / max(cf.size - 3, 1))
  r0s = (np.full(n_boot, r0) if r0_given
         else r0 + scale * rng.choice(resid - resid.mean(), size=n_boot))
  bounds = _bounds(x, upper)
  boot = _batch_refit(x, ys, r0s, np.array([a, b, m]), bounds)
  boot[:, 2] = np.exp(boot[:, 2])
  intervals = {p: common.interval(boot[:, k], level) for k, p in enumerate(PARAMS)}
  identified, reason = identify_A(a, math.exp(m), r0, intervals, float(cf[-1]), upper)
  sd = math.sqrt(sse / max(cf.size - 3, 1))
  exact = common.exact_fit_reason(sd, max(float(np.ptp(rf)), abs(a - r0)))
  if identified and exact:
    identified, reason = False, (f'{exact}; A is not identified (more evals, or evals that '
                                 'are not mostly equal)')
  fit = SigmoidFit(A=float(a), B=float(b), C_mid=math.exp(m), R0=r0, intervals=intervals,
                   boot=boot, boot_r0=r0s, compute=cf, values=rf,
                   excluded=int(c.size - cf.size),
                   residual_sd=sd,
                   A_identified=identified, A_reason=reason, level=level, block=block,
                   upper=upper, at_zero=int(np.sum(c == 0)), exclude_first=exclude_first,
                   r0_source='given' if r0_given else 'base_eval' if c[0] == 0 else 'first_eval',
                   interval_reason=exact)
  if target_compute is not None:
    if not target_compute > 0:
      raise common.ScalingFitError(f'target_compute must be > 0, got {target_compute}')
    fit.target_compute = float(target_compute)
    fit.prediction = float(fit.predict(target_compute))
    lo, hi = fit.band([target_compute], level)
    fit.prediction_interval = (float(lo[0]), float(hi[0]))
  return fit
