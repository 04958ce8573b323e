"""Backtesting a scaling fit on a finished run: fit the early part, predict the end, score it.

For a run with eval points (C_i, y_i), i = 1..n, ordered by compute, and the base eval R0 at
C = 0, the fit uses the points with C_i <= fraction * C_n (plus R0) and predicts the final
accuracy y_n at C_n with its 95% bootstrap band [lo, hi]. Reported:

  error    = prediction - y_n              (signed; > 0 = the fit was optimistic)
  covered  = lo <= y_n <= hi
  error_tail, covered_tail: the same against mean(y_{n-m+1..n}) (the last m evals averaged),
           a less noisy 'final accuracy' than one eval.

The band is the bootstrap band of the fitted *mean curve*; y_n is one noisy eval, so coverage
of y_n is expected below the nominal level when the eval noise is not small against the band.
`interval_obs` widens the band by that noise, side by side in quadrature, with sigma the fit's
residual sd and z = 1.96:

  lo_obs = pred - sqrt((pred - lo)^2 + (z sigma)^2)
  hi_obs = pred + sqrt((hi - pred)^2 + (z sigma)^2)

and `covered_obs` says whether it holds y_n.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rft_jax.scaling import common
from rft_jax.scaling.live import residual_sd
from rft_jax.scaling.power_law import fit_power_law
from rft_jax.scaling.sigmoid import fit_sigmoid


def backtest(compute: Any, values: Any, r0: float | None, *, fraction: float = 0.5,
             model: str = 'sigmoid', exclude_first: float = 0.1, n_boot: int = 1000,
             tail: int = 3, seed: int = 0) -> dict[str, Any]:
  """Fits the points with C <= fraction * max C and scores the prediction at max C.

  Returns a dict: model, fraction, n_fit_points, fit_compute_max, target_compute, prediction,
  interval, actual, error, covered, interval_obs, covered_obs, actual_tail, error_tail,
  covered_tail, tail, A_identified (sigmoid), fit (the fit's to_dict()) -- all JSON-safe -- and
  '_fit' (the fit object itself, for plots; pop it before json.dump). Raises ScalingFitError on
  bad input or a first part too short to fit (the message says how many points it had).
  """
  if not 0 < fraction < 1:
    raise common.ScalingFitError(f'fraction must be in (0, 1), got {fraction}')
  if model not in ('sigmoid', 'power_law'):
    raise common.ScalingFitError(f"model must be 'sigmoid' or 'power_law', got {model!r}")
  c, y = common.as_series(compute, values, 'accuracy')
  if c.size < 2 or c[-1] <= 0:
    raise common.ScalingFitError(f'a backtest needs eval points at positive compute, got '
                                 f'{c.size}')
  target = float(c[-1])
  early = c <= fraction * target
  fc, fy = list(c[early]), list(y[early])
  if r0 is not None:
    fc, fy = [0.0] + fc, [float(r0)] + fy
  kw = dict(target_compute=target, n_boot=n_boot, seed=seed)
  try:
    fit = (fit_sigmoid(fc, fy, exclude_first, **kw) if model == 'sigmoid'
           else fit_power_law(fc, fy, exclude_first, **kw))
  except common.ScalingFitError as e:
    raise common.ScalingFitError(f'first {fraction:.0%} of the compute: {e}') from None
  lo, hi = fit.prediction_interval
  pred, zs = fit.prediction, 1.96 * residual_sd(fit)
  lo_obs, hi_obs = pred - math.hypot(pred - lo, zs), pred + math.hypot(hi - pred, zs)
  actual, actual_tail = float(y[-1]), float(np.mean(y[-tail:]))
  j = common.json_float
  return {'model': model, 'fraction': fraction, 'n_fit_points': int(fit.compute.size),
          'fit_compute_max': j(fit.compute[-1]), 'target_compute': target,
          'prediction': j(fit.prediction), 'interval': [j(lo), j(hi)],
          'actual': actual, 'error': j(fit.prediction - actual),
          'covered': bool(lo <= actual <= hi), 'interval_obs': [j(lo_obs), j(hi_obs)],
          'covered_obs': bool(lo_obs <= actual <= hi_obs),
          'actual_tail': actual_tail, 'error_tail': j(fit.prediction - actual_tail),
          'covered_tail': bool(lo <= actual_tail <= hi), 'tail': int(min(tail, y.size)),
          'A_identified': bool(fit.A_identified) if model == 'sigmoid' else None,
          'fit': fit.to_dict(), '_fit': fit}
