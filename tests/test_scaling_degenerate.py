"""What the scaling fits say about what the data cannot tell them: where R0 came from, and
prediction bands that a bootstrap with nothing to resample would give zero width."""
import numpy as np

from rft_jax import scaling

A, B, C_MID, R0 = 0.8, 2.0, 1e16, 0.3


def noisy_run(n=20, seed=0):
  rng = np.random.default_rng(seed)
  c = np.arange(1, n + 1) * C_MID * 4 / n
  return c, scaling.sigmoid_curve(c, A, B, C_MID, R0) + rng.normal(0, 0.01, n)


def test_sigmoid_says_where_r0_came_from():
  """The note said the base eval at C = 0 'sets R0' when an API caller passed R0= too (the base
  eval then has no part in the fit)."""
  c, r = noisy_run()
  c0, r0 = np.r_[0.0, c], np.r_[0.45, r]
  given = scaling.fit_sigmoid(c0, r0, R0=R0, n_boot=20)
  text = given.summary()
  assert 'it sets R0' not in text and given.R0 == R0, text
  assert ('(excluded: the base eval at C = 0 (unused: R0 was given); 2 with C <= 0.1 * max C, '
          'the start of the run), R0=0.3 (given), ') in text, text
  assert given.to_dict()['R0_source'] == 'given'
  base = scaling.fit_sigmoid(c0, r0, n_boot=20)
  assert base.R0 == 0.45 and '(it sets R0)' in base.summary() and 'R0=0.45, ' in base.summary()
  assert base.to_dict()['R0_source'] == 'base_eval'
  first = scaling.fit_sigmoid(c, r, n_boot=20)   # no base eval: the first eval's value
  assert first.R0 == r[0] and first.to_dict()['R0_source'] == 'first_eval'
  assert '(the eval at the smallest compute)' in first.summary(), first.summary()


def test_a_power_law_through_collinear_points_reports_no_band():
  """ln(1 - acc) exactly linear in ln C: the residuals are 0, every bootstrap replicate is the
  fit itself, and the prediction was reported as acc = p [p, p], a certainty it does not have."""
  c = np.geomspace(1e14, 1e16, 8)
  acc = 1 - np.exp(2.0 - 0.12 * np.log(c))
  fit = scaling.fit_power_law(c, acc, n_boot=50, target_compute=1e18)
  assert fit.interval_reason and 'passes through every fitted point' in fit.interval_reason
  assert np.isnan(fit.prediction_interval).all() and np.isnan(fit.band(c)).all()
  doc = fit.to_dict()
  assert doc['prediction_interval'] is None and doc['intervals'] == {'k': None, 'E': None}
  text = fit.summary()
  assert f'acc(1e+18) = {fit.prediction:.4g}\n' in text and '[' not in text, text
  assert 'intervals and band not identified: the curve passes through' in text, text
  noisy = scaling.fit_power_law(c, acc + np.tile([0.002, -0.002], 4), n_boot=50,
                                target_compute=1e18)
  lo, hi = noisy.prediction_interval
  assert noisy.interval_reason is None and lo < hi   # a real band stays


def test_a_sigmoid_through_every_point_reports_no_band():
  """The base eval, one eval on the rise, then equal evals: A was already not reported, but the
  band and the prediction's interval had zero width."""
  c = np.arange(1, 7) * 1e12
  fit = scaling.fit_sigmoid(np.r_[0.0, c], [0.5, 0.75] + [0.781] * 5, exclude_first=0,
                            n_boot=50, target_compute=1e14)
  assert not fit.A_identified and fit.interval_reason
  assert np.isnan(fit.prediction_interval).all() and np.isnan(fit.band(c)).all()
  doc = fit.to_dict()
  assert doc['prediction_interval'] is None and set(doc['intervals'].values()) == {None}
  text = fit.summary()
  assert f'R(1e+14) = {fit.prediction:.4g}  (extrapolation unreliable' in text, text
  assert 'B     = ' in text and '[' not in text, text


def test_the_live_fit_logs_no_band_for_an_exact_fit_and_still_checks_points():
  """The live fit logged scaling/pred_lo = pred_hi for such a fit; now it logs neither, and a new
  eval is measured from the curve itself (the band is NaN)."""
  from rft_jax.scaling import live  # pylint: disable=g-import-not-at-top
  cfg = live.LiveConfig(every=1, n_boot=50)
  c = np.arange(1, 7) * 1e12
  fit = live.fit_points(c, [0.75] + [0.781] * 5, 0.5, cfg, target_compute=1e13)
  metrics = live.fit_metrics(fit)
  assert 'scaling/pred_final' in metrics and 'scaling/pred_lo' not in metrics, metrics
  check = live.check_point(fit, 7e12, 0.6, cfg)
  assert np.isnan(check['lo']) and check['anomalous'], check
  assert not live.check_point(fit, 7e12, 0.77, cfg)['anomalous']
  incident = live.anomaly_incident(7, 'eval/m', 0.6, check)
  assert "fell below the scaling fit's curve (0.781; the fit has no band)" in (
      incident['description']) and incident['evidence'][0]['band'] is None
