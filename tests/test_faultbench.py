"""`python -m tools.faultbench --suite ci` on real runs: the scoring works on its own results.

Asserts what the benchmark must get right whatever the monitor's quality: every run finishes,
the exact-invariant fault (mask_shift) is detected after its onset with a credit-assignment
diagnosis, and the report and score files agree with the per-run records. Headline numbers
(recall, false alarms) are the benchmark's output, not test assertions.
"""
import json
import os
import subprocess
import sys

import pytest

import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_suite_runs_and_scores_itself(tmp_path):
  """One of the ci suite's five runs, a real 40-step run through tools.faultbench, then scored:
  mask_shift (the one fault with an exact detection invariant). The other four (healthy, the
  false-alarm side; lr_spike, reward_length, the benign lr_schedule_step) cost ~45 s each of the
  default suite on 2 cores; false alarms are scored per healthy step in
  test_false_alarms_are_per_healthy_step_the_monitor_observed, detection of an LR spike on a
  live run is tests/test_monitor_live.py's, and `make test-all` runs the whole ci suite
  (test_ci_suite_all_five_runs)."""
  check_ci_suite(tmp_path, ['mask_shift'])


@pytest.mark.slow
def test_ci_suite_all_five_runs(tmp_path):
  check_ci_suite(tmp_path, [])


def check_ci_suite(tmp_path, faults):
  out = str(tmp_path / 'fb')
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
             XLA_FLAGS=xla_flags.without_fast_compile())   # runs long: XLA's default level
  # One run at a time: `make test` already keeps both cores busy.
  proc = subprocess.run([sys.executable, '-m', 'tools.faultbench', '--suite', 'ci', '--jobs',
                         '1', '--out', out, '--faults', ','.join(faults)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(out, 'results.jsonl')) as f:
    records = {r['fault']: r for r in map(json.loads, f)}
  assert set(records) == set(faults or {'healthy', 'lr_spike', 'mask_shift', 'reward_length',
                                        'lr_schedule_step'})
  assert all(r['error'] is None for r in records.values()), records
  assert all(r['steps_done'] == 40 for r in records.values()
             if not r.get('halted')), records
  shift = records['mask_shift']
  after = [i for i in shift['incidents'] if i['step'] >= shift['onset']]
  assert after and after[0]['step'] == shift['onset']       # an exact invariant: no delay
  assert after[0]['fault_class'] == 'credit_assignment'
  assert not [i for i in shift['incidents'] if i['step'] < shift['onset']
              and i['signature'] == 'prompt_tokens_in_loss']
  with open(os.path.join(out, 'score.json')) as f:
    score = json.load(f)
  rows = {r['fault']: r for r in score['faults']}
  assert rows['mask_shift']['detected'] == 1 and rows['mask_shift']['delay_median'] == 0
  assert rows['mask_shift']['top1'] == 1.0
  flagged = sum(bool([i for i in r['incidents'] if i['step'] >= r['onset']])
                for k, r in records.items() if k in ('lr_spike', 'mask_shift', 'reward_length'))
  assert score['overall']['tp'] == flagged
  report = open(os.path.join(out, 'report.md')).read()
  assert '| mask_shift | credit | 1 | 1 | 0 |' in report
  assert os.path.exists(os.path.join(out, 'recall.png'))


def test_a_run_past_its_wall_limit_or_whose_process_dies_is_recorded(tmp_path):
  """One run killed at --run-timeout-s (a 40-step run cannot finish in 8 s), one whose process
  dies (a spec without 'seed' fails before training; a limit it cannot reach, so a slow start on
  a loaded machine is not taken for a timeout): each gets a record with its error."""
  from tools import faultbench  # pylint: disable=g-import-not-at-top
  slow, broken = faultbench.plan('ci', [1], ['healthy', 'lr_spike'])
  del broken['seed']
  out = str(tmp_path / 'fb')
  [died] = faultbench.run_all([broken], out, jobs=1, run_timeout_s=600)
  assert died['error'] == 'the run process died (exit code 1)'
  [killed] = faultbench.run_all([slow], out, jobs=1, run_timeout_s=8)
  assert killed['error'] == 'timeout: killed after 8 s (--run-timeout-s)'
  assert killed['wall_s'] >= 8 and killed['steps_done'] < 40
  with open(os.path.join(out, 'results.jsonl')) as f:
    assert [json.loads(line)['fault'] for line in f] == ['healthy']   # this call's runs


def _fake_run(out, spec, steps, incident_steps):
  """A run's workdir as tools.faultbench leaves it: metrics.jsonl with the train records of
  `steps` in the order run (a restore logs the steps after its checkpoint again), and
  incidents.jsonl with an incident at each of `incident_steps`."""
  from rft_jax.telemetry import sinks  # pylint: disable=g-import-not-at-top
  workdir = os.path.join(out, 'runs', spec['name'])
  sink = sinks.JsonlSink(os.path.join(workdir, 'metrics.jsonl'))
  for step in steps:
    sink.on_step(step, {'reward/mean': 0.5})
  sink.close()
  with open(os.path.join(workdir, 'incidents.jsonl'), 'w') as f:
    for step in incident_steps:
      f.write(json.dumps({'kind': 'incident', 'step': step, 'onset_step': step,
                          'fault_class': 'kl_explosion', 'signature': 'kl_trend',
                          'severity': 'critical'}) + '\n')


def test_false_alarms_are_per_healthy_step_the_monitor_observed(tmp_path):
  """The false-alarm rate's denominator is the healthy steps the monitor observed: a step
  redone after an auto-mode restore was observed (and could fire) once more, so it counts once
  more, as its alarms do (incidents.jsonl keeps those of abandoned steps); a run stopped before
  its onset counts the steps it ran. Both modes count. (The denominator was the highest step,
  or onset - 1 for a faulted run, over warn-mode runs only.)"""
  # pylint: disable-next=g-import-not-at-top
  from tools import faultbench, faultbench_report, faultbench_score
  out = str(tmp_path / 'fb')
  base = {'seed': 1, 'steps': 10}
  healthy = {**base, 'fault': 'healthy', 'mode': 'auto', 'onset': 11, 'name': 'h'}
  spiked = {**base, 'fault': 'lr_spike', 'mode': 'auto', 'onset': 6, 'name': 'f'}
  halted = {**base, 'fault': 'mask_shift', 'mode': 'warn', 'onset': 8, 'name': 'w'}
  # healthy: a false alarm at step 8, restored to step 5's checkpoint, steps 6-10 again.
  _fake_run(out, healthy, [*range(1, 9), *range(6, 11)], [8])
  # lr_spike: caught at 7, restored to step 3's checkpoint: steps 4-5 (healthy) run again, and
  # the redo raises a false alarm at step 4.
  _fake_run(out, spiked, [*range(1, 8), *range(4, 11)], [7, 4])
  # mask_shift, warn mode: the run stopped after step 4, before its onset.
  _fake_run(out, halted, range(1, 5), [])
  records = [faultbench.record(s, out, {}, None, 1.0) for s in (healthy, spiked, halted)]
  assert [(r['steps_done'], r['steps_observed'], r['steps_observed_before_onset'])
          for r in records] == [(10, 13, 13), (10, 14, 7), (4, 4, 4)]
  assert faultbench_score.false_alarms_per_1000(records) == (1000 * 2 / 24, 2, 24)
  scores = faultbench_score.score(records)
  fa = scores['false_alarms']
  assert (fa['alarms'], fa['healthy_steps']) == (2, 24)
  assert fa['by_mode'] == {
      'auto': {'per_1000_steps': 1000 * 2 / 20, 'alarms': 2, 'healthy_steps': 20},
      'warn': {'per_1000_steps': 0.0, 'alarms': 0, 'healthy_steps': 4}}
  report = faultbench_report.write(out, scores, records, command='test')
  assert '(2 in 24 steps the monitor observed' in report
  assert 'warn mode 0 in 4; auto mode 2 in 20;' in report
  # Records from before the observed counts: the highest step, onset - 1 at most, as before.
  old = [{k: v for k, v in r.items() if not k.startswith('steps_observed')} for r in records]
  assert faultbench_score.false_alarms_per_1000(old)[1:] == (2, 10 + 5 + 4)


def test_onset_error_of_the_first_detection_is_scored_and_reported(tmp_path):
  """score.json's 'onset': the first detection's onset_step minus the injected onset, over the
  flagged faulted warn-mode runs (the README had computed it by hand)."""
  # pylint: disable-next=g-import-not-at-top
  from tools import faultbench_report, faultbench_score

  def run(fault, onset, incidents, mode='warn'):
    return {'fault': fault, 'family': 'healthy' if fault == 'healthy' else 'optimisation',
            'seed': 3, 'onset': onset, 'mode': mode, 'steps': 60, 'steps_done': 60,
            'final_acc': 0.9, 'error': None,
            'incidents': [{'step': s, 'onset_step': o, 'fault_class': 'kl_explosion',
                           'signature': 'kl_explosion', 'severity': 'critical'}
                          for s, o in incidents]}
  records = [run('lr_spike', 31, [(20, 18), (33, 13), (40, 31)]),   # first detection: -18
             run('grad_clip_off_high_lr', 30, [(32, 31)]),           # +1
             run('lr_spike', 31, []),                                # not flagged: not scored
             run('healthy', 31, [(12, 10)]),                         # a false alarm: not scored
             run('grad_clip_off_high_lr', 30, [(31, 25)], mode='auto')]  # not scored
  assert [faultbench_score.onset_error(r) for r in records[:3]] == [-18, 1, None]
  onset = faultbench_score.score(records)['onset']
  assert onset == {'runs': 2, 'mean_abs': 9.5, 'off_by_more_than_2': 1}
  report = faultbench_report.write(str(tmp_path), faultbench_score.score(records), records,
                                   command='test')
  assert '2 flagged runs): mean |error| 9.50 steps, 1 off by more than 2.' in report
