"""Shared pieces of the scaling fits: input checks, the residual block bootstrap, intervals.

Block bootstrap over eval points (moving blocks of residuals): with fitted values f_i and
residuals e_i = y_i - f_i (i = 1..n, ordered by compute), each replicate is

  y*_i = f_i + s * e_{j(i)},   s = sqrt(n / (n - p)),

where j(.) concatenates ceil(n / b) blocks of b consecutive indices (circularly: index n + i is
i) with uniformly drawn starts and keeps the first n. s undoes the shrinkage of least-squares
residuals (p parameters). Blocks keep the correlation of neighbouring eval points (successive
checkpoints scored on one eval set). b defaults to 1 (the ordinary residual bootstrap) unless
the residuals' lag-1 autocorrelation rho exceeds 2/sqrt(n); then the AR(1) rule
b = (2 rho / (1 - rho^2))^(2/3) n^(1/3) (Politis & White 2004), clipped to [2, n/4].
On independent noise blocks only widen the resampling's variance error, which is why b = 1
is the default there. The design (the compute values) stays fixed,
so every replicate covers the same compute range as the run. Intervals are percentiles of the
replicates' estimates: [q_{(1-level)/2}, q_{(1+level)/2}].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


class ScalingFitError(ValueError):
  """Input a scaling fit cannot use (too short, NaN, constant, ...); the message says why."""


def as_series(compute: Any, values: Any, name: str = 'accuracy') -> tuple[np.ndarray, np.ndarray]:
  """Checks and sorts (compute, values) by compute. Raises ScalingFitError on bad input."""
  try:
    c = np.asarray(compute, dtype=float)
    y = np.asarray(values, dtype=float)
  except (TypeError, ValueError) as e:
    raise ScalingFitError(f'compute and {name} must be numbers: {e}') from None
  if c.ndim != 1 or y.ndim != 1:
    raise ScalingFitError(f'compute and {name} must be 1-D sequences, got shapes {c.shape} and '
                          f'{y.shape}')
  if c.shape != y.shape:
    raise ScalingFitError(f'compute has {c.size} points but {name} has {y.size}')
  for label, arr in (('compute', c), (name, y)):
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
      raise ScalingFitError(f'{label} is not finite (NaN or inf) at point {int(bad[0])} of '
                            f'{arr.size}: {arr[bad[0]]}')
  if np.any(c < 0):
    raise ScalingFitError(f'compute must be >= 0, got {c.min():g}')
  order = np.argsort(c, kind='stable')
  return c[order], y[order]


def points_note(n_fit: int, excluded: int, at_zero: int, exclude_first: float,
                zero_role: str) -> str:
  """'15 of 17 points (excluded: the base eval at C = 0 (<zero_role>); 1 with C <= 0.1 * max C,
  the start of the run)': every eval point counted once, each exclusion said."""
  parts = [f'{"the base eval" if at_zero == 1 else f"{at_zero} points"} at C = 0 ({zero_role})'
           ] if at_zero else []
  if excluded > at_zero:
    parts.append(f'{excluded - at_zero} with C <= {exclude_first:g} * max C, the start of the run')
  return f'{n_fit} of {n_fit + excluded} points' + (f' (excluded: {"; ".join(parts)})'
                                                    if parts else '')


def require_points(n: int, n_params: int, what: str) -> None:
  """At least n_params + 2 points: residual degrees of freedom left for the bootstrap."""
  need = n_params + 2
  if n < need:
    raise ScalingFitError(f'{what}: {n} eval point(s) left to fit, need at least {need} for '
                          f'{n_params} parameters (a longer run or more frequent evals)')


def check_n_boot(n_boot: int) -> None:
  """A percentile interval needs replicates to take percentiles of (0 raised IndexError, 1
  gave a zero-width interval reported as identified)."""
  if not isinstance(n_boot, (int, np.integer)) or n_boot < 20:
    raise ScalingFitError(f'n_boot must be an integer >= 20 bootstrap replicates, got {n_boot}')


def require_varying(y: np.ndarray, name: str) -> None:
  if y.size and np.ptp(y) <= 1e-12:
    raise ScalingFitError(f'{name} is constant ({y[0]:g}) over all {y.size} fitted points: '
                          'there is no curve to fit')


def default_block(resid: np.ndarray) -> int:
  """1 for uncorrelated residuals, else the AR(1) block length (module docstring)."""
  n = resid.size
  e = resid - resid.mean()
  denom = float(e @ e)
  rho = float(e[1:] @ e[:-1]) / denom if denom > 0 else 0.0
  if n < 8 or rho <= 2 / math.sqrt(n):
    return 1
  rho = min(rho, 0.95)
  b = (2 * rho / (1 - rho ** 2)) ** (2 / 3) * n ** (1 / 3)
  return int(min(max(round(b), 2), max(n // 4, 2)))


def block_indices(rng: np.random.Generator, n: int, n_boot: int, block: int) -> np.ndarray:
  """[n_boot, n] indices of circular-block resamples of range(n)."""
  block = int(min(max(block, 1), n))
  k = math.ceil(n / block)
  starts = rng.integers(0, n, size=(n_boot, k))
  idx = (starts[:, :, None] + np.arange(block)[None, None, :]) % n
  return idx.reshape(n_boot, k * block)[:, :n]


def bootstrap_targets(rng: np.random.Generator, fitted: np.ndarray, resid: np.ndarray,
                      n_params: int, n_boot: int,
                      block: int | None) -> tuple[np.ndarray, int]:
  """([n_boot, n] replicates y* = fitted + sqrt(n/(n-p)) * block-resampled centred residuals,
  the block length used)."""
  n = fitted.size
  block = default_block(resid) if block is None else block
  scale = math.sqrt(n / max(n - n_params, 1))
  e = (resid - resid.mean()) * scale
  return fitted[None, :] + e[block_indices(rng, n, n_boot, block)], int(block)


# A fit whose residual sd is at most EXACT times the span of the values it fits interpolates its
# points (collinear points for the power law; a base eval, one point on the rise, then equal evals
# for the sigmoid): the residual bootstrap then resamples nothing, and its intervals and bands
# have zero width, which is not evidence that the curve is known.
EXACT = 1e-4


def exact_fit_reason(sd: float, span: float) -> str | None:
  """Why the bootstrap's intervals and band are not identified (sd <= EXACT * span: the curve
  passes through every fitted point), or None when the residuals give them a width."""
  if sd > EXACT * span:
    return None
  return (f'the curve passes through every fitted point (residual sd {sd:.2g}): the bootstrap '
          'has no noise to resample, so every interval would have zero width')


def with_interval(value: float, iv: Sequence[float], shown: bool = True) -> str:
  """'0.5  [0.4, 0.6]' (4 significant digits), or '0.5' alone when the interval is not shown."""
  return f'{value:.4g}  [{iv[0]:.4g}, {iv[1]:.4g}]' if shown else f'{value:.4g}'


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
  """Percentile interval of the finite samples (NaN, NaN when there are none)."""
  s = np.asarray(samples, dtype=float)
  s = s[np.isfinite(s)]
  if s.size == 0:
    return (math.nan, math.nan)
  lo, hi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2])
  return (float(lo), float(hi))


def check_level(level: float) -> None:
  if not 0 < level < 1:
    raise ScalingFitError(f'level must be in (0, 1), got {level}')


def json_float(x: Any) -> float | None:
  """A float for JSON: None for NaN/inf."""
  if x is None:
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def json_interval(iv: Sequence[float] | None) -> list[float | None] | None:
  return None if iv is None else [json_float(v) for v in iv]
