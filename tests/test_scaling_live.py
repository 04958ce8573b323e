"""The live scaling fit: predictions, the anomaly incident, resume, and a short live run."""
import json
import os

import numpy as np
import pytest

from configs import common, grpo_arith
from rft_jax import config as config_lib
from rft_jax.scaling import live, sigmoid_curve
from rft_jax.telemetry.sinks import read_jsonl

TRUE = dict(A=0.93, B=1.5, C_mid=2e13, R0=0.6)   # C = step * 1e12: midpoint at step 20
FAST = live.LiveConfig(every=1, n_boot=100)


def curve(seed, noise=0.01, n=20, drop_at=(), drop=0.25):
  """Eval points every 5 steps of a sigmoid run, i.i.d. noise, optional drops at indices."""
  rng = np.random.default_rng(seed)
  steps = np.arange(1, n + 1) * 5
  c = steps * 1e12
  y = sigmoid_curve(c, **TRUE) + rng.normal(0, noise, n)
  for i in drop_at:
    y[i] -= drop
  return steps, c, y


def incident_steps(updates):
  return [inc['step'] for u in updates for inc in u.incidents]


def test_a_fit_through_mostly_equal_evals_is_not_identified():
  """A tiny run's evals: the base, one on the rise, then the same accuracy five times. A steep
  sigmoid passes through all of them, the residual bootstrap has nothing to resample, and the
  live fit logged A 0.781 [0.781, 0.781] as identified: a zero-width band from no noise."""
  steps, c = np.arange(1, 7) * 5, np.arange(1, 7) * 1e12
  y = [0.75] + [0.781] * 5
  updates = live.replay(steps, c, y, 0.5, FAST, total_steps=30)
  last = updates[-1].metrics
  assert last['scaling/A_identified'] == 0.0 and 'scaling/A' not in last, last
  fit = live.fit_points(c, y, 0.5, FAST)
  assert fit.intervals['A'][1] - fit.intervals['A'][0] < 1e-4   # the collapse, still there
  assert 'passes through every fitted point' in fit.A_reason and 'zero width' in fit.A_reason
  assert 'A     = not reported: the curve passes through' in fit.summary()
  noisy = live.fit_points(*curve(0)[1:], TRUE['R0'], FAST)   # a real curve stays identified
  assert noisy.A_identified, noisy.A_reason


def test_a_point_far_below_the_band_raises_one_incident_shaped_like_the_monitors():
  steps, c, y = curve(0, drop_at=(12,))
  updates = live.replay(steps, c, y, TRUE['R0'], FAST, total_steps=100, metric='eval/m')
  assert incident_steps(updates) == [steps[12]]
  inc = updates[12].incidents[0]
  assert inc['kind'] == 'incident' and inc['fault_class'] == 'scaling_anomaly'
  assert inc['severity'] == 'warn' and inc['score'] >= 1
  ev = inc['evidence'][0]
  assert ev['signal'] == 'eval/m' and ev['direction'] == 'down' and ev['value'] == y[12]
  assert ev['band'][0] - ev['value'] > 0.05
  assert updates[12].metrics['scaling/anomaly'] == 1.0
  assert all(u.metrics.get('scaling/anomaly', 0.0) == 0.0 for i, u in enumerate(updates)
             if i != 12)


def test_healthy_curves_raise_no_anomaly_and_the_late_band_covers_the_truth():
  covered = 0
  for seed in range(5):
    steps, c, y = curve(seed, noise=0.02)
    updates = live.replay(steps, c, y, TRUE['R0'], live.LiveConfig(every=2, n_boot=100),
                          total_steps=100)
    assert incident_steps(updates) == [], seed
    assert 'scaling/pred_final' not in updates[3].metrics       # 4 points: too few to fit
    last = updates[-1].metrics
    assert last['scaling/planned_compute'] == pytest.approx(1e14)
    truth = sigmoid_curve(1e14, **TRUE)
    covered += last['scaling/pred_lo'] <= truth <= last['scaling/pred_hi']
  assert covered >= 4


def test_a_dip_is_held_out_of_the_fit_and_a_second_drop_after_recovery_reports_again():
  steps, c, y = curve(1, drop_at=(10, 11, 17))
  updates = live.replay(steps, c, y, TRUE['R0'], FAST, total_steps=100)
  assert incident_steps(updates) == [steps[10], steps[17]]
  clean = live.replay(steps, c, curve(1)[2], TRUE['R0'], FAST, total_steps=100)
  assert updates[16].metrics['scaling/pred_final'] == pytest.approx(
      clean[16].metrics['scaling/pred_final'], abs=0.02)      # the dip did not bend the fit


def test_a_collapse_that_stays_down_reports_once_and_the_prediction_follows_it():
  steps, c, y = curve(1, drop_at=range(10, 20))
  updates = live.replay(steps, c, y, TRUE['R0'], FAST, total_steps=100)
  assert incident_steps(updates) == [steps[10]]
  assert any('now part of the fit' in m for m in updates[12].messages)
  before = updates[9].metrics['scaling/pred_final']
  after = updates[-1].metrics['scaling/pred_final']
  assert after < before - 0.1, (before, after)


def test_a_small_dip_within_the_margin_is_not_an_anomaly():
  steps, c, y = curve(2, drop_at=(12,), drop=0.03)
  assert incident_steps(live.replay(steps, c, y, TRUE['R0'], FAST, total_steps=100)) == []


def test_power_law_model_logs_k_and_a_prediction():
  steps, c, y = curve(3)
  cfg = live.LiveConfig(every=2, model='power_law', n_boot=100)
  updates = live.replay(steps, c, y, TRUE['R0'], cfg, total_steps=100)
  fitted = [u.metrics for u in updates if 'scaling/pred_final' in u.metrics]
  assert len(fitted) >= 8 and all('scaling/k' in m and 'scaling/A' not in m for m in fitted)
  assert all(m['scaling/pred_lo'] <= m['scaling/pred_final'] <= m['scaling/pred_hi']
             for m in fitted)


def test_state_survives_a_json_round_trip_exactly():
  """Resume: stop after 12 evals, keep only state_dict() (as the checkpoint meta does)."""
  steps, c, y = curve(4, drop_at=(15,))
  cfg = live.LiveConfig(every=3, n_boot=100)
  full = live.LiveFit(cfg, 'm', 100)
  expected = [full.observe(s, ci, yi, 0.6) for s, ci, yi in zip(steps, c, y)]
  first = live.LiveFit(cfg, 'm', 100)
  for s, ci, yi in zip(steps[:12], c[:12], y[:12]):
    first.observe(s, ci, yi, 0.6)
  resumed = live.LiveFit(cfg, 'm', 100, json.loads(json.dumps(first.state_dict())))
  got = [resumed.observe(s, ci, yi, 0.6) for s, ci, yi in zip(steps[12:], c[12:], y[12:])]
  for a, b in zip(got, expected[12:]):
    a.metrics.pop('scaling/fit_s', None)
    b.metrics.pop('scaling/fit_s', None)
    assert a.metrics == b.metrics and a.incidents == b.incidents
  assert incident_steps(got) == [steps[15]]


def test_a_rewind_drops_the_abandoned_points():
  fit = live.LiveFit(FAST, 'm', 100)
  for s in (5, 10, 15, 20):
    fit.observe(s, s * 1e12, 0.7, 0.6)
  fit.observe(10, 11e12, 0.71, 0.6)      # a remediation rewind re-ran steps 6..10
  assert [p[0] for p in fit.points] == [5, 10]


def test_bad_points_and_short_runs_give_one_line_messages_not_crashes():
  fit = live.LiveFit(FAST, 'm', 100)
  out = fit.observe(5, 5e12, float('nan'), 0.6)
  assert out.messages and 'not finite' in out.messages[0] and not fit.points
  msgs = [m for s in (5, 10, 15) for m in fit.observe(s, s * 1e12, 0.7, 0.6).messages]
  assert len(msgs) == 1 and 'need at least 5' in msgs[0]   # said once, not at every eval
  const = live.LiveFit(FAST, 'm', 100)
  msgs = [m for s in range(1, 8) for m in const.observe(s, s * 1e12, 0.7, 0.7).messages]
  assert any('constant' in m for m in msgs)
  assert live.LiveFit(live.LiveConfig(), 'm', 100).observe(5, 1.0, 0.5, 0.4).metrics == {}
  with pytest.raises(ValueError, match='scaling.model'):
    live.LiveConfig(every=1, model='spline')
  with pytest.raises(live.common.ScalingFitError, match='as many'):
    live.replay([1, 2], [1.0], [0.5], None, FAST, 10)


@pytest.mark.parametrize('key,value,match', [
    ('scaling.model', 'spline', "must be 'sigmoid' or 'power_law'"),
    ('scaling.live_every', -1, 'must be >= 0'),
    ('scaling.exclude_first', 1.0, r'must be in \[0, 1\)'),
    ('scaling.n_boot', 5, 'must be >= 20'),
])
def test_config_errors_are_one_line(key, value, match):
  config = grpo_arith.get_config('tiny')
  config.scaling = common.scaling(live_every=1)
  config_lib.validate(config)
  config.update_from_flattened_dict({key: value})
  with pytest.raises(config_lib.ConfigError, match=match) as e:
    config_lib.validate(config)
  assert '\n' not in str(e.value) and key in str(e.value)


def _live_config(**overrides):
  config = grpo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.telemetry.plot = False
  config.rewards.num_workers = 0
  config.scaling = common.scaling(live_every=1)
  config.scaling.n_boot = 50
  config.update_from_flattened_dict({
      'train.steps': 8, 'train.eval_every': 1, 'train.ckpt_every': 3, 'optim.lr': 1e-3,
      'optim.warmup_steps': 1, 'eval.num_prompts': 32, 'eval.k': 2, **overrides})
  return config


def _evals(workdir):
  recs = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  flops = {r['step']: r['compute/flops_cumulative'] for r in recs if r['kind'] == 'train'}
  evals = {r['step']: r for r in recs if r['kind'] == 'eval' and r['step'] > 0}
  base = next(r for r in recs if r['kind'] == 'eval' and r['step'] == 0)
  return evals, flops, base


def test_a_short_live_run_logs_predictions_and_resumes_exactly(tmp_path):
  """8 steps, an eval and a fit after each, stopped after step 6 and resumed. A fresh LiveFit
  replaying the logged eval points (= an uninterrupted live fit) gives the logged metrics."""
  from rft_jax import trainer  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path)
  trainer.run(_live_config(**{'train.steps': 6}), workdir)
  trainer.run(_live_config(), workdir)
  evals, flops, base = _evals(workdir)
  fitted = sorted(s for s, r in evals.items() if 'scaling/pred_final' in r)
  assert fitted == [5, 6, 7, 8]                 # from the 5th eval point on, every eval
  for s in fitted:
    r = evals[s]
    assert r['scaling/pred_lo'] <= r['scaling/pred_final'] <= r['scaling/pred_hi']
    assert r['scaling/planned_compute'] == pytest.approx(flops[s] * (6 if s <= 6 else 8) / s)
    assert r['scaling/fit_s'] < 5.0
  steps, metric = sorted(evals), 'eval/mean@2_acc'
  cfg = live.LiveConfig.from_config(_live_config())
  for total, check in ((6, steps[:6]), (8, steps[6:])):   # total steps of each invocation
    replayed = live.replay(steps[:check[-1]], [flops[s] for s in steps[:check[-1]]],
                           [evals[s][metric] for s in steps[:check[-1]]],
                           base['eval/base_mean@2_acc'], cfg, total_steps=total)
    for s in check:
      logged = {k: v for k, v in evals[s].items() if k.startswith('scaling/')}
      want = dict(replayed[s - 1].metrics)
      logged.pop('scaling/fit_s', None)
      want.pop('scaling/fit_s', None)
      assert logged == pytest.approx(want, rel=1e-12), s
  assert 'scaling/expected' in evals[7]          # checked against the fit recomputed on resume


def test_backtest_on_synthetic_runs_predicts_the_end_within_its_band():
  from rft_jax.scaling import backtest  # pylint: disable=g-import-not-at-top
  hits = 0
  for seed in range(5):
    steps, c, y = curve(seed, noise=0.01)
    bt = backtest.backtest(c, y, TRUE['R0'], fraction=0.5, n_boot=300)
    assert bt['n_fit_points'] == 9 and bt['target_compute'] == c[-1]   # 10 evals, 1 excluded
    assert bt['actual'] == y[-1] and bt['error'] == pytest.approx(bt['prediction'] - y[-1])
    assert abs(bt['error']) < 0.04, bt['error']
    lo, hi = bt['interval_obs']
    assert lo <= bt['interval'][0] and hi >= bt['interval'][1]
    hits += bt['covered_obs']
  assert hits >= 4


def test_backtest_refuses_a_first_half_too_short_to_fit():
  from rft_jax.scaling import backtest  # pylint: disable=g-import-not-at-top
  steps, c, y = curve(0, n=8)
  with pytest.raises(live.common.ScalingFitError, match='first 50% of the compute: .*need at '
                     'least 5'):
    backtest.backtest(c, y, TRUE['R0'])
  with pytest.raises(live.common.ScalingFitError, match='fraction'):
    backtest.backtest(c, y, TRUE['R0'], fraction=1.0)
  with pytest.raises(live.common.ScalingFitError, match='not finite'):
    backtest.backtest(c, np.r_[y[:-1], np.nan], TRUE['R0'])
