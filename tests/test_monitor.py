"""The failure-signature monitor: detectors, signatures, invariants, incidents, on synthetic traces.

Trace batches run as one batched monitor in a jitted lax.scan (one compile per batch shape).
"""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compile_log import programs_compiled
from rft_jax.monitor import signals as sig
from rft_jax.monitor import signatures as sigs
from rft_jax.monitor import synthetic
from rft_jax.monitor.detectors import MonitorConfig, detector_update, init_detectors
from rft_jax.monitor.monitor import (alarm_metrics, incidents_from_alarms, init_monitor,
                                     monitor_update, run_monitor)
from tools import monitor_false_alarms
from tools.monitor_false_alarms import first_diagnosis

CFG = MonitorConfig()
STEPS = 300
PER_CLASS = 8
DRIFT = [f for f in synthetic.FAULT_CLASSES if f not in ('nan_loss', 'credit_assignment')]


@functools.partial(jax.jit, static_argnames='cfg')
def _run_batch(stacked, cfg):
  return run_monitor(stacked, cfg)[1]


def run_batch(traces, cfg=CFG):
  return jax.device_get(_run_batch(synthetic.stack_traces(traces), cfg))


@pytest.fixture(scope='module')
def suite():
  """20 healthy traces + PER_CLASS faulty traces per fault class, one monitor pass."""
  rng = np.random.default_rng(1234)
  healthy = [synthetic.healthy_trace(rng, STEPS) for _ in range(20)]
  faulty, labels, onsets = [], [], []
  for fault in synthetic.FAULT_CLASSES:
    for _ in range(PER_CLASS):
      onset = int(rng.integers(CFG.warmup + 30, STEPS - 40))
      faulty.append(synthetic.inject(synthetic.healthy_trace(rng, STEPS), fault, onset, rng=rng))
      labels.append(fault)
      onsets.append(onset)
  alarms = run_batch(healthy + faulty)
  return {'alarms': alarms, 'n_healthy': len(healthy), 'labels': labels, 'onsets': onsets,
          'faulty': faulty}


def test_metrics_vector_host_jit_and_missing_keys():
  host = {'kl': 0.5, 'reward/mean': np.float32(0.25)}
  x = np.asarray(sig.metrics_vector(host))
  assert x.shape == (len(sig.SIGNALS),)
  assert x[sig.SIGNALS.index('kl')] == 0.5 and x[sig.SIGNALS.index('reward/mean')] == 0.25
  assert np.isnan(np.delete(x, [sig.SIGNALS.index('kl'), sig.SIGNALS.index('reward/mean')])).all()
  jitted = jax.jit(sig.metrics_vector)({k: jnp.float32(v) for k, v in host.items()})
  np.testing.assert_array_equal(np.asarray(jitted), x)

  inv = lambda m: np.asarray(sig.invariant_vector(m))  # noqa: E731
  names = sig.INVARIANT_NAMES
  assert np.isnan(inv({})).all()
  assert inv({'loss': 1.0})[names.index('invariant/nonfinite')] == 0.0
  assert inv({'loss': 1.0, 'grad_norm': np.inf})[names.index('invariant/nonfinite')] == 1.0
  assert inv({'loss': np.nan})[names.index('invariant/nonfinite')] == 1.0
  assert inv({'invariant/prompt_loss_tokens': 3})[names.index('invariant/prompt_loss_tokens')] == 3
  # Parameters: their norm after the update (an overflowed norm is broken parameters too).
  params = names.index('invariant/param_nonfinite')
  assert inv({'param_norm': 51.0})[params] == 0.0
  assert inv({'param_norm': np.inf})[params] == 1.0 and inv({'param_norm': np.nan})[params] == 1.0
  assert np.isnan(inv({'loss': 1.0})[params])                     # missing: not checked
  assert inv({'param_norm': np.inf})[names.index('invariant/nonfinite')] != 1.0
  # log-transformed signals round-trip
  x = np.linspace(0.1, 2.0, len(sig.SIGNALS)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(sig.untransform(sig.transform(jnp.asarray(x)))), x,
                             rtol=1e-5)


def test_detector_step_change_constant_signal_and_missing():
  """lr is constant (scale floor, no alarm) until it jumps x10; kl never observed stays cold."""
  cfg = MonitorConfig()
  s_lr, s_kl = sig.SIGNALS.index('lr'), sig.SIGNALS.index('kl')
  update = jax.jit(functools.partial(detector_update, cfg=cfg))
  state = init_detectors(cfg)
  ups = []
  for t in range(40):
    x = np.full(len(sig.SIGNALS), np.nan, np.float32)
    x[s_lr] = 1e-5 if t < 30 else 1e-4
    state, up, down = update(state, x, t)
    ups.append(float(up[s_lr]))
    assert float(down[s_lr]) == 0.0
    if t == 29:
      assert float(state.scale[s_lr]) == pytest.approx(sig.SCALE_FLOOR[s_lr])
  assert max(ups[:30]) == 0.0
  assert min(ups[32:]) >= 1.0          # CUSUM clipped to z_clip - k per step: fires in 3-4 steps
  assert int(state.count[s_lr]) == 40 and int(state.count[s_kl]) == 0
  assert int(state.cusum_pos_start[s_lr]) == 30        # onset estimate: the jump step


def test_healthy_traces_stay_silent(suite):
  fired = suite['alarms'].fired[:suite['n_healthy']]
  n_steps = fired.shape[0] * fired.shape[1]
  names = [sigs.SIGNATURE_NAMES[k] for k in np.nonzero(fired)[2]]
  assert fired.sum() * 1000.0 / n_steps <= 1.0, names


def test_reward_that_rises_within_the_warm_up_and_levels_off_is_not_a_collapse():
  """RL from an SFT policy often gains most of its reward in the first ~10 steps (the warm-up)
  and then levels off. An undamped trend fitted on that rise keeps predicting a rising reward,
  and the shortfall accumulates into reward_collapse on healthy runs (it did in FaultBench's
  healthy seed-1 run); the damped trend of additive signals does not. 120 healthy traces of
  60 steps (a FaultBench run's length) whose reward rises within the warm-up."""
  rng = np.random.default_rng(2026)
  traces = [synthetic.healthy_trace(rng, 60, early_rise=True) for _ in range(120)]
  collapse = sigs.SIGNATURE_NAMES.index('reward_collapse')

  def share_with_collapse(cfg):
    return float(run_batch(traces, cfg).fired[:, :, collapse].any(1).mean())

  undamped = share_with_collapse(MonitorConfig(additive_trend_damping=1.0))
  damped = share_with_collapse(CFG)
  assert undamped >= 0.08, undamped     # the failure the damping exists for
  assert damped <= 0.02, (damped, undamped)


@pytest.mark.parametrize('fault', synthetic.FAULT_CLASSES)
def test_each_fault_class_detected_within_10_steps_and_diagnosed_first(suite, fault):
  al, n0 = suite['alarms'], suite['n_healthy']
  is_class = np.array([s.fault_class == fault for s in sigs.SIGNATURES])
  detected, first_ok = 0, 0
  for i, (label, onset) in enumerate(zip(suite['labels'], suite['onsets'])):
    if label != fault:
      continue
    hits = np.flatnonzero(al.fired[n0 + i, onset:][:, is_class].any(1))
    detected += bool(len(hits)) and hits[0] <= 10
    _, k = first_diagnosis(al.fired[n0 + i], al.score[n0 + i], onset)
    first_ok += k is not None and sigs.SIGNATURES[k].fault_class == fault
  # the false-alarm tool measures >= 96% on 200 traces per class; allow one miss of 8 here
  assert detected >= PER_CLASS - 1, (fault, detected)
  assert first_ok >= PER_CLASS - 1, (fault, first_ok)


def test_onset_estimate_close_to_true_onset(suite):
  al, n0 = suite['alarms'], suite['n_healthy']
  errors = []
  for i, (label, onset) in enumerate(zip(suite['labels'], suite['onsets'])):
    if label not in DRIFT:
      continue
    t, k = first_diagnosis(al.fired[n0 + i], al.score[n0 + i], onset)
    if k is not None:
      errors.append(int(al.onset[n0 + i, t, k]) - onset)
  errors = np.abs(errors)
  assert np.median(errors) <= 2, errors
  assert np.mean(errors <= 4) >= 0.85, errors


@pytest.mark.parametrize('variant', ['nan_loss', 'param_nonfinite', 'group_adv_mean_max',
                                     'prompt_loss_tokens', 'group_prompt_mismatch',
                                     'reward_out_of_range'])
def test_invariants_fire_on_the_same_step(variant):
  trace = synthetic.healthy_trace(np.random.default_rng(7), 60)
  onset = 5                                   # inside warm-up: invariants need no baseline
  severity = 'critical'
  if variant == 'nan_loss':
    trace = synthetic.inject(trace, 'nan_loss', onset)
    expect = 'nan_loss'
  elif variant == 'param_nonfinite':          # finite loss and gradient, overflowed params
    trace['param_norm'] = np.full(60, 51.0, np.float32)
    trace['param_norm'][onset] = np.inf
    expect = 'nan_loss'
  else:
    trace[f'invariant/{variant}'] = np.zeros(60, np.float32)    # the healthy value
    trace[f'invariant/{variant}'][onset:] = {'group_adv_mean_max': 0.5,
                                             'reward_out_of_range': 0.01}.get(variant, 4.0)
    expect = 'credit_assignment'
    if variant == 'reward_out_of_range':
      expect, severity = 'reward_pipeline', 'warn'
  al = run_batch([trace])
  fired_steps, ks = np.nonzero(al.fired[0])
  assert fired_steps.min() == onset
  first = [sigs.SIGNATURES[k] for t, k in zip(fired_steps, ks) if t == onset]
  assert [s.fault_class for s in first] == [expect]
  incidents = incidents_from_alarms(jax.tree.map(lambda a: a[0, onset], al), step=onset + 100)
  assert incidents[0]['onset_step'] == onset + 100 and incidents[0]['step'] == onset + 100
  assert incidents[0]['severity'] == severity
  if variant == 'param_nonfinite':   # only a restore repairs parameters: not skip_batch
    assert [(i['signature'], i['remediation']) for i in incidents] == [
        ('nonfinite_params', 'restore_and_lower_lr')]


def test_reward_stall_needs_persistence():
  trace = synthetic.healthy_trace(np.random.default_rng(3), 80)
  trace['reward/zero_std_frac'][40:43] = 1.0            # a 3-step streak: not a stall
  trace['reward/zero_std_frac'][60:] = 1.0              # a lasting one
  al = run_batch([trace])
  k = sigs.SIGNATURE_NAMES.index('reward_stall')
  assert np.flatnonzero(al.fired[0, :, k]).tolist() == [60 + CFG.stall_persistence - 1]
  assert al.onset[0, -1, k] == 60


def test_persistent_fault_yields_one_incident(suite):
  """Hysteresis: a fault that stays (kl x300 for the rest of the run) is one firing, not one per
  step, and stays active for a while (the frozen baseline only follows its pre-alarm trend)."""
  al, n0 = suite['alarms'], suite['n_healthy']
  k = sigs.SIGNATURE_NAMES.index('kl_explosion')
  for i, (label, onset) in enumerate(zip(suite['labels'], suite['onsets'])):
    if label == 'kl_explosion':
      t = np.flatnonzero(al.fired[n0 + i, :, k])
      assert len(t) == 1 and t[0] <= onset + 10
      assert al.active[n0 + i, t[0]:t[0] + 15, k].all()


def test_jit_equals_eager_and_missing_keys_tolerated():
  """Eager and jitted updates agree; a metrics dict with most keys missing still works, and a
  'not_up' gate on a never-observed signal (reward/correct/mean) blocks its signature."""
  cfg = MonitorConfig(warmup=5)
  trace = synthetic.inject(synthetic.healthy_trace(np.random.default_rng(11), 40),
                           'reward_hacking', 12)
  trace = synthetic.inject(trace, 'nan_loss', 14)
  keys = ('kl', 'reward/mean', 'loss', 'grad_norm', 'entropy')
  step_jit = jax.jit(functools.partial(monitor_update, cfg=cfg))
  s_eager, s_jit = init_monitor(cfg), init_monitor(cfg)
  fired_any = []
  for t in range(18):
    m = {k: jnp.float32(trace[k][t]) for k in keys}
    s_eager, a_eager = monitor_update(s_eager, m, cfg)
    s_jit, a_jit = step_jit(s_jit, m)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                                                         atol=1e-6), (s_eager, a_eager),
                 (s_jit, a_jit))
    fired_any += [sigs.SIGNATURE_NAMES[k] for k in np.flatnonzero(np.asarray(a_jit.fired))]
  assert 'nan_loss' in fired_any
  assert 'reward_hacking' not in fired_any and 'reward_correctness_divergence' not in fired_any
  assert int(s_jit.detectors.count[sig.SIGNALS.index('reward/correct/mean')]) == 0
  # nan_loss step: the NaN loss is not learned as an observation
  assert int(s_jit.detectors.count[sig.SIGNALS.index('loss')]) == 17


def test_a_fresh_monitor_is_placed_without_compiling():
  """init_monitor builds its state in NumPy and places it: no XLA program at a run's set-up
  (its eager jnp zeros compiled 9 small ones, ~0.3 s of a cold start); same values."""
  cfg = MonitorConfig(warmup=4)
  assert programs_compiled(init_monitor, cfg, (2,)) == []
  state = init_monitor(cfg, (2,))
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
  s, k = len(sig.SIGNALS), len(sigs.SIGNATURES)
  d = state.detectors
  assert d.window.shape == (2, s, 4) and d.window.dtype == jnp.float32
  assert d.count.dtype == state.onset.dtype == state.step.dtype == jnp.int32
  assert state.active.shape == (2, k) and state.active.dtype == jnp.bool_
  assert (np.asarray(d.scale) == 1).all() and (np.asarray(d.ewvar) == 1).all()
  assert np.isnan(np.asarray(d.last)).all() and not np.asarray(d.ewma).any()


def test_batched_monitor_equals_single_runs():
  rng = np.random.default_rng(5)
  traces = [synthetic.inject(synthetic.healthy_trace(rng, 120), 'gradient_explosion', 60),
            synthetic.inject(synthetic.healthy_trace(rng, 120), 'length_collapse', 50)]
  batched = run_batch(traces)
  single = jax.jit(lambda m: run_monitor(m, CFG)[1])
  for i, trace in enumerate(traces):
    one = jax.device_get(single({k: np.float32(v) for k, v in trace.items()}))
    np.testing.assert_array_equal(one.fired, batched.fired[i])
    np.testing.assert_allclose(one.score, batched.score[i], rtol=1e-5, atol=1e-6)
    assert one.fired.any()


def test_incidents_and_alarm_metrics(suite):
  al, n0 = suite['alarms'], suite['n_healthy']
  i = suite['labels'].index('kl_explosion')
  onset = suite['onsets'][i]
  t = int(np.flatnonzero(al.fired[n0 + i].any(-1))[0])
  one = jax.tree.map(lambda a: a[n0 + i, t], al)
  incidents = incidents_from_alarms(one, step=t + 1)     # caller counts steps from 1
  json.dumps(incidents, allow_nan=False)
  inc = incidents[0]
  assert inc['fault_class'] == 'kl_explosion' and inc['remediation'] == 'raise_kl_coef'
  assert inc['step'] == t + 1 and abs(inc['onset_step'] - (onset + 1)) <= 3
  assert inc['score'] >= 1.0
  ev = {e['signal']: e for e in inc['evidence']}
  assert ev['kl']['direction'] == 'up' and ev['kl']['score'] >= 1.0
  assert ev['kl']['value'] > ev['kl']['baseline'] > 0
  assert set(inc) >= {'step', 'onset_step', 'signature', 'fault_class', 'severity', 'remediation',
                      'description', 'score', 'evidence'}
  metrics = alarm_metrics(one)
  assert metrics[f'monitor/active/{inc["signature"]}'] == 1.0
  assert metrics[f'monitor/score/{inc["signature"]}'] == pytest.approx(inc['score'])
  assert metrics['monitor/num_active'] >= 1.0
  jitted = jax.jit(alarm_metrics)(jax.tree.map(jnp.asarray, one))
  assert set(jitted) == set(metrics)


def test_signature_table_is_consistent():
  assert set(synthetic.FAULT_CLASSES) <= set(sigs.FAULT_CLASSES)
  for s in sigs.SIGNATURES:
    assert s.severity in ('critical', 'warn') and s.remediation and s.description
  with pytest.raises(ValueError):
    sigs.Condition('no/such/signal', 'up')
  with pytest.raises(ValueError):
    sigs.Condition('kl', 'sideways')
  uses = sigs.uses_matrix()
  assert uses.shape == (len(sigs.SIGNATURES), len(sig.SIGNALS))
  assert uses[sigs.SIGNATURE_NAMES.index('reward_hacking'),
              sig.SIGNALS.index('reward/correct/mean')] == 0     # a gate is not evidence


def test_false_alarm_tool_rejects_too_few_steps_in_one_line(capsys):
  """Fault onsets are drawn from [warmup + 30, steps - 40): --steps 60 had crashed with a
  'low >= high' traceback from numpy; now one line naming the minimum (no usage line), exit 2."""
  with pytest.raises(SystemExit) as e:
    monitor_false_alarms.main(['--traces', '4', '--steps', '60'])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err == ('error: --steps=60: at least 81 (faults start in '
                                       '[warmup + 30, steps - 40) with warmup=10)\n'), err
  with pytest.raises(SystemExit, match='2'):   # the minimum follows --set warmup=...
    monitor_false_alarms.main(['--traces', '1', '--steps', '81', '--set', 'warmup=11'])
  assert 'at least 82' in capsys.readouterr().err
  monitor_false_alarms.main(['--traces', '1', '--steps', '81'])   # the minimum runs
  assert 'credit_assignment' in capsys.readouterr().out


def test_from_reference_traces_start_at_zero_kl_and_keep_the_other_draws():
  """healthy_trace(from_reference=True): KL exactly 0 at the first step (policy == reference),
  then a steep rise under the lr warm-up; every signal but kl, lr, update_norm and loss is the
  default trace's of the same seed."""
  plain = synthetic.healthy_trace(np.random.default_rng(5), 60)
  ref = synthetic.healthy_trace(np.random.default_rng(5), 60, from_reference=True)
  assert ref['kl'][0] == 0.0 and np.median(ref['kl'][20:]) > 30 * max(ref['kl'][1], 1e-6)
  assert ref['lr'][0] < ref['lr'][-1] and np.all(np.diff(ref['lr']) >= 0)
  for name in plain:
    if name not in ('kl', 'lr', 'update_norm', 'loss'):
      np.testing.assert_array_equal(plain[name], ref[name], err_msg=name)
