"""Offline replay of other frameworks' logs: name mapping, detection, CLI, plot marking.

The verl and TRL logs are written here in those frameworks' own metric names (literal strings
below, as their trainers log them), from the monitor's synthetic traces: one healthy, one with a
KL explosion injected at step 120.
"""

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from rft_jax.monitor import formats, signals, synthetic
from rft_jax.telemetry import plot, sinks
from tools import monitor_replay

STEPS = 240
ONSET = 120  # index into the trace; logged step = index + 1 (both frameworks count from 1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# rft_jax name -> the name verl's trainer logs it under.
VERL_KEYS = {
    'reward/mean': 'critic/score/mean', 'kl': 'actor/kl_loss', 'entropy': 'actor/entropy',
    'clip_frac': 'actor/pg_clipfrac', 'grad_norm': 'actor/grad_norm', 'loss': 'actor/pg_loss',
    'lr': 'actor/lr', 'adv/mean': 'critic/advantages/mean',
    'response/len_mean': 'response_length/mean', 'response/clip_frac': 'response_length/clip_ratio',
}
# rft_jax name -> the name TRL's GRPOTrainer logs it under.
TRL_KEYS = {
    'reward/mean': 'reward', 'reward/std': 'reward_std',
    'reward/zero_std_frac': 'frac_reward_zero_std', 'kl': 'kl', 'entropy': 'entropy',
    'clip_frac': 'clip_ratio/region_mean', 'grad_norm': 'grad_norm', 'loss': 'loss',
    'lr': 'learning_rate', 'response/len_mean': 'completions/mean_length',
    'response/clip_frac': 'completions/clipped_ratio',
    'mismatch/logp_abs_diff': 'sampling/sampling_logp_difference/mean',
    'reward/correct/mean': 'rewards/accuracy_reward/mean',
}


def _traces():
  """A healthy trace and the same run with a KL explosion from index ONSET on."""
  healthy = synthetic.healthy_trace(np.random.default_rng(1), STEPS)
  return healthy, synthetic.inject(healthy, 'kl_explosion', ONSET, 1.0)


@pytest.fixture(scope='module')
def traces():
  return _traces()


def _write_verl(trace, path, wrapped=False):
  """verl's per-step logger dicts; `wrapped` is its 'file' backend: {"step", "data"}."""
  with open(path, 'w', encoding='utf-8') as f:
    for i in range(STEPS):
      data = {'training/global_step': i + 1, 'training/epoch': 0,
              'timing_s/gen': 3.5, 'actor/ppo_kl': 1e-4, 'critic/score/max': 1.0}
      data.update({verl: float(trace[ours][i]) for ours, verl in VERL_KEYS.items()
                   if ours in trace})
      f.write(json.dumps({'step': i + 1, 'data': data} if wrapped else data) + '\n')


def _write_trl_state(trace, path):
  """TRL's trainer_state.json: log_history with one entry per step, an eval entry and the
  end-of-training summary."""
  history = []
  for i in range(STEPS):
    entry = {'step': i + 1, 'epoch': (i + 1) / STEPS, 'num_tokens': 1000.0 * (i + 1),
             'completions/min_length': 3.0, 'rewards/format_reward/mean': 0.9}
    entry.update({trl: float(trace[ours][i]) for ours, trl in TRL_KEYS.items() if ours in trace})
    history.append(entry)
  history.insert(100, {'step': 100, 'epoch': 0.4, 'eval_loss': 0.3, 'eval_reward': 0.5})
  history.append({'step': STEPS, 'epoch': 1.0, 'train_runtime': 120.0, 'train_loss': 0.01})
  with open(path, 'w', encoding='utf-8') as f:
    json.dump({'global_step': STEPS, 'log_history': history, 'max_steps': STEPS}, f, indent=2)


def _check_png(path):
  with open(path, 'rb') as f:
    data = f.read()
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  width, height = struct.unpack('>II', data[16:24])
  assert width > 1000 and height > 600


def _kl_incidents(incidents):
  return [i for i in incidents if i['fault_class'] == 'kl_explosion']


# ----------------------------------------------------------------------------
# Reading.


@pytest.mark.parametrize('wrapped', [False, True])
def test_load_verl_maps_names_and_steps(tmp_path, traces, wrapped):
  healthy, _ = traces
  path = tmp_path / 'verl.jsonl'
  _write_verl(healthy, path, wrapped=wrapped)
  records = formats.load_run(path)  # auto-detected
  assert records == formats.load_run(path, 'verl')
  assert [r['step'] for r in records] == list(range(1, STEPS + 1))
  for ours in VERL_KEYS:
    if ours in healthy:
      got = np.array([r[ours] for r in records])
      np.testing.assert_allclose(got, healthy[ours], rtol=1e-12, equal_nan=True)
  allowed = {'step'} | set(VERL_KEYS)
  assert set().union(*records) <= allowed  # timing_s/*, actor/ppo_kl, ... dropped


def test_load_trl_trainer_state_maps_names_and_steps(tmp_path, traces):
  healthy, _ = traces
  path = tmp_path / 'trainer_state.json'
  _write_trl_state(healthy, path)
  records = formats.load_run(path)
  assert records == formats.load_run(path, 'trl')
  # The eval entry and the end-of-training summary add no steps and no values.
  assert [r['step'] for r in records] == list(range(1, STEPS + 1))
  for ours in TRL_KEYS:
    if ours in healthy:
      np.testing.assert_allclose([r[ours] for r in records], healthy[ours], rtol=1e-12)
  assert records[0]['reward/format_reward/mean'] == 0.9
  assert records[0]['response/len_min'] == 3.0
  if 'reward/correct/mean' in healthy:  # accuracy_reward is also the correctness signal
    assert records[5]['reward/accuracy_reward/mean'] == records[5]['reward/correct/mean']
  assert not any(k.startswith(('eval', 'train_', 'num_tokens', 'epoch'))
                 for r in records for k in r)


def test_load_trl_jsonl_and_openrlhf_prefixed(tmp_path):
  trl = tmp_path / 'trl.jsonl'
  trl.write_text(
      json.dumps({'step': 10, 'reward': 0.25, 'rewards/correctness_reward/mean': 0.2,
                  'kl': math.nan, 'clip_ratio': 0.01}) + '\n'
      + json.dumps({'step': 20, 'reward': 0.5, 'completion_length': 17.0}) + '\n')
  records = formats.load_run(trl)
  assert records[0]['step'] == 10 and records[0]['reward/mean'] == 0.25
  assert records[0]['reward/correct/mean'] == 0.2 and math.isnan(records[0]['kl'])
  assert records[0]['clip_frac'] == 0.01 and records[1]['response/len_mean'] == 17.0

  orl = tmp_path / 'openrlhf.jsonl'
  orl.write_text(json.dumps({'train/global_step': 3, 'train/reward': 0.4, 'train/kl': 0.02,
                             'train/policy_loss': -0.1, 'train/ppo_clip_ratio': 0.05,
                             'train/response_length': 120.0, 'train/actor_lr': 1e-6,
                             'train/return': 0.3}) + '\n')
  assert formats.load_run(orl) == [{'step': 3, 'reward/mean': 0.4, 'kl': 0.02, 'loss': -0.1,
                                    'clip_frac': 0.05, 'response/len_mean': 120.0,
                                    'lr': 1e-6}]


def test_load_rft_jax_and_errors(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  sink.on_start(0, 3, {})
  for step in (1, 2, 3):
    sink.on_step(step, {'reward/mean': 0.1 * step, 'kl': math.nan})
  sink.on_eval(3, {'eval/greedy_acc': 0.5})
  sink.close()
  records = formats.load_run(path)
  assert [r['step'] for r in records] == [1, 2, 3]
  assert records[2]['reward/mean'] == pytest.approx(0.3) and math.isnan(records[0]['kl'])

  unknown = tmp_path / 'other.jsonl'
  unknown.write_text(json.dumps({'foo/bar': 1, 'step': 1}) + '\n')
  with pytest.raises(ValueError, match='other.jsonl'):
    formats.load_run(unknown)
  with pytest.raises(ValueError, match='unknown format'):
    formats.load_run(path, 'wandb')
  with pytest.raises(FileNotFoundError):
    formats.load_run(tmp_path / 'missing.jsonl')


# ----------------------------------------------------------------------------
# Replay.


@pytest.mark.parametrize('framework', ['verl', 'trl'])
def test_replay_finds_kl_explosion_only_in_the_faulty_log(tmp_path, traces, framework):
  writer = _write_verl if framework == 'verl' else _write_trl_state
  healthy, faulty = traces
  onset_step = ONSET + 1
  for name, trace in (('healthy', healthy), ('faulty', faulty)):
    path = tmp_path / f'{name}.json'
    writer(trace, path)
    incidents = monitor_replay.replay(formats.load_run(path))
    if name == 'healthy':
      assert incidents == [], [monitor_replay.format_incident(i) for i in incidents]
      continue
    kl = _kl_incidents(incidents)
    assert kl, [monitor_replay.format_incident(i) for i in incidents]
    first = kl[0]
    assert onset_step <= first['step'] <= onset_step + 10
    assert first['onset_step'] <= first['step']
    assert not [i for i in incidents if i['step'] < onset_step]  # nothing before the fault


def test_replay_missing_metric_is_not_a_nan_loss(traces):
  healthy, _ = traces
  # A log without grad_norm and entropy, and without loss until step 60: a missing signal is
  # NaN (not observed), a missing input of the non-finite check is left out ...
  records = [{'step': i + 1, **{k: float(v[i]) for k, v in healthy.items()
                                if k not in ('grad_norm', 'entropy') and (k != 'loss' or i >= 59)}}
             for i in range(80)]
  inputs = monitor_replay.step_inputs(records[0])
  assert 'loss' not in inputs and 'grad_norm' not in inputs and math.isnan(inputs['entropy'])
  assert monitor_replay.step_inputs(records[59])['loss'] == np.float32(healthy['loss'][59])
  records[70]['loss'] = math.nan  # ... but a logged NaN loss is.
  incidents = monitor_replay.replay(records)
  assert [(i['step'], i['fault_class']) for i in incidents] == [(71, 'nan_loss')]


def test_cli_writes_incidents_and_png(tmp_path, traces):
  _, faulty = traces
  run = tmp_path / 'faulty' / 'verl_metrics.jsonl'
  run.parent.mkdir()
  _write_verl(faulty, run, wrapped=True)
  out = tmp_path / 'replay'
  proc = subprocess.run(
      [sys.executable, '-m', 'tools.monitor_replay', str(run), '--format', 'verl',
       '--out', str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert any('kl_explosion' in line and 'onset=' in line for line in lines)
  written = sinks.read_jsonl(out / 'incidents.jsonl')
  assert written and all(r['kind'] == 'incident' for r in written)
  assert _kl_incidents(written)
  assert f'{len(written)} incident(s)' in proc.stdout
  _check_png(out / 'replay.png')


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
  assert monitor_replay.main([str(tmp_path / 'missing.jsonl')]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and 'missing.jsonl' in err

  unknown = tmp_path / 'unknown.jsonl'
  unknown.write_text(json.dumps({'foo': 1}) + '\n')
  assert monitor_replay.main([str(unknown)]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and 'unknown.jsonl' in err

  assert monitor_replay.main([str(unknown), '--format', 'mlflow']) == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------
# Plot marking.


def _marked_lines(ax):
  """x positions of the vertical lines on `ax` (axvline draws a 2-point line at fixed x)."""
  return sorted(line.get_xdata()[0] for line in ax.get_lines()
                if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1])


def test_plot_run_marks_incidents_from_jsonl_and_argument(tmp_path, monkeypatch):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  for step in range(1, 41):
    sink.on_step(step, {'reward/mean': 0.01 * step, 'kl': 0.001 * step, 'entropy': 1.0,
                        'grad_norm': 1.0, 'response/len_mean': 10.0})
  sink.write(25, 'incident', {'onset_step': 21, 'fault_class': 'kl_explosion',
                              'severity': 'high'})
  sink.write(26, 'action', {'action': 'raise_kl_coef', 'signature': 'kl_explosion'})
  sink.write(30, 'verdict', {'signature': 'kl_explosion', 'helped': True})  # not marked
  sink.close()

  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figures = []
  real_savefig = Figure.savefig

  def savefig(fig, *args, **kwargs):
    figures.append(fig)
    return real_savefig(fig, *args, **kwargs)

  monkeypatch.setattr(Figure, 'savefig', savefig)
  png = tmp_path / 'run.png'
  plot.plot_run(path, png, incidents=[{'step': 35, 'onset_step': 33,
                                       'fault_class': 'entropy_collapse'}])
  _check_png(png)
  (fig,) = figures
  train_axes = [ax for ax in fig.axes if ax.get_title() in
                ('reward', 'KL', 'entropy', 'response length', 'grad norm')]
  assert len(train_axes) == 5
  for ax in train_axes:
    assert _marked_lines(ax) == [25, 26, 35]
    labels = {t.get_text().strip() for t in ax.texts}
    assert {'kl_explosion', 'entropy_collapse', 'raise_kl_coef'} <= labels
    spans = [p for p in ax.patches if p.get_alpha() == pytest.approx(0.12)]
    assert len(spans) == 2  # onset..step shading for both incidents
  # Existing callers: no incidents, no marks.
  figures.clear()
  plain = tmp_path / 'plain.jsonl'
  sink = sinks.JsonlSink(plain)
  sink.on_step(1, {'kl': 0.1})
  sink.on_step(2, {'kl': 0.2})
  sink.close()
  plot.plot_run(plain, tmp_path / 'plain.png')
  kl_ax = next(ax for ax in figures[0].axes if ax.get_title() == 'KL')
  assert _marked_lines(kl_ax) == []


# ----------------------------------------------------------------------------
# rft_jax logs with remediation restores; inputs the tool must refuse or find.


def _write_rft_jax(path, segments):
  """metrics.jsonl train records of `segments` [(trace, first step, last step)], in order (a
  restore logs the steps after its checkpoint again)."""
  sink = sinks.JsonlSink(path)
  for trace, first, last in segments:
    for step in range(first, last + 1):
      sink.on_step(step, {k: float(v[step - 1]) for k, v in trace.items()})
  sink.close()


def test_replay_of_a_restored_run_keeps_the_faulty_steps_and_restores_the_monitor(tmp_path,
                                                                                    traces):
  """Steps logged again after a restore restart from the monitor's state at the checkpoint:
  the same fault seen again fires again at the same step. (The replay kept only each step's
  last record, so a run whose restore fixed the fault replayed with no incident at all.)"""
  healthy, faulty = traces
  fixed = tmp_path / 'fixed' / 'metrics.jsonl'
  fixed.parent.mkdir()
  _write_rft_jax(fixed, [(faulty, 1, ONSET + 20), (healthy, ONSET - 10, ONSET + 40)])
  records = formats.load_run(fixed)
  assert [r['step'] for r in records][ONSET + 19:ONSET + 21] == [ONSET + 20, ONSET - 10]
  first_pass = _kl_incidents(monitor_replay.replay(records))
  assert first_pass and ONSET < first_pass[0]['step'] <= ONSET + 20
  again = tmp_path / 'again' / 'metrics.jsonl'
  again.parent.mkdir()
  _write_rft_jax(again, [(faulty, 1, ONSET + 20), (faulty, ONSET - 10, ONSET + 20)])
  steps = [i['step'] for i in _kl_incidents(monitor_replay.replay(formats.load_run(again)))]
  half = len(steps) // 2   # each pass the same firings (kl_explosion and its clipping variant)
  assert half and steps[:half] == steps[half:], steps


def test_cli_reads_the_runs_warmup_a_directory_and_refuses_empty_logs(tmp_path, traces,
                                                                      capsys):
  healthy, _ = traces
  run = tmp_path / 'run'
  run.mkdir()
  _write_rft_jax(run / 'metrics.jsonl', [(healthy, 1, 30)])
  (run / 'config.json').write_text(json.dumps({'monitor': {'warmup': 4}}))
  assert monitor_replay.main([str(run), '--out', str(tmp_path / 'out')]) == 0
  assert '30 logged steps of' in capsys.readouterr().out   # the directory's metrics.jsonl
  assert monitor_replay.run_monitor_section(str(run)) == {'warmup': 4}
  trl = tmp_path / 'trl_out' / 'checkpoint-20'   # TRL writes trainer_state.json only there
  trl.mkdir(parents=True)
  _write_trl_state(healthy, trl / 'trainer_state.json')
  assert formats.load_run(tmp_path / 'trl_out') == formats.load_run(trl / 'trainer_state.json')
  empty = tmp_path / 'empty.jsonl'
  empty.write_text('')
  binary = tmp_path / 'events.png'
  binary.write_bytes(b'\x89PNG\r\n\x1a\n\xa3\x00')
  for argv in ([str(empty), '--format', 'verl'], [str(binary)],
               [str(trl / 'trainer_state.json'), '--format', 'verl']):
    assert monitor_replay.main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith('error: '), err
  assert monitor_replay.main([str(run), '--out', str(run / 'metrics.jsonl' / 'x')]) == 1
  assert capsys.readouterr().err.startswith('error: cannot write the replay to')


def test_cli_says_which_watched_signals_a_log_lacks(tmp_path, capsys):
  """An SFT or DPO log (no reward, KL, entropy or length): not a bare '0 incident(s)'."""
  log, rec = tmp_path / 'metrics.jsonl', {'kind': 'train', 'grad_norm': 0.5, 'lr': 1e-5}
  log.write_text(''.join(json.dumps({'step': s, 'loss': 1 / s, **rec}) + '\n'
                         for s in range(1, 21)))
  assert monitor_replay.main([str(log), '--out', str(tmp_path / 'out')]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith('0 incident(s) over 20 logged steps') and lines[1] == (
      'the log lacks 13 of the 16 signals the monitor watches, so the signatures on them could '
      'not fire: ' + ', '.join(s for s in signals.SIGNALS if s not in ('loss', 'grad_norm', 'lr')))
