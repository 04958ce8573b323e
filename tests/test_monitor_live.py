"""The failure monitor inside live training runs: detection, halt and auto remediation."""
import json
import os
import re

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rft_jax import trainer
from rft_jax.telemetry.hooks import Hook
from test_telemetry_output import _events, _visible_scalars
from test_trainer import tiny_config

ONSET = 18


def faulty_config(mode: str, steps: int = 30):
  """The tiny recipe with a 50x learning-rate spike from step ONSET on."""
  config = tiny_config(**{'train.steps': steps, 'train.eval_every': steps,
                          'train.ckpt_every': 4, 'train.keep_checkpoints': 10,
                          'rollout.prompts_per_step': 8, 'monitor.mode': mode,
                          'monitor.warmup': 10})
  config.faults = [{'type': 'lr_spike', 'onset_step': ONSET, 'strength': 50.0}]
  return config


def metrics_records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def incidents(workdir):
  path = os.path.join(workdir, 'incidents.jsonl')
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_lr_spike_is_detected_within_10_steps_in_warn_mode(tmp_path):
  summary = trainer.run(faulty_config('warn'), str(tmp_path))
  found = [e for e in incidents(str(tmp_path)) if e['kind'] == 'incident']
  assert found, 'no incident for a 50x learning-rate spike'
  first = min(found, key=lambda e: e['step'])
  assert ONSET <= first['step'] < ONSET + 10, first
  assert first['severity'] == 'critical'
  assert first['fault_class'] in ('gradient_explosion', 'kl_explosion', 'entropy_explosion',
                                  'reward_collapse', 'length_blowup'), first
  assert abs(first['onset_step'] - ONSET) <= 3, first
  assert summary['incidents'] == len(found)
  # warn mode reports but never intervenes, and the evidence reaches every sink.
  assert not [e for e in incidents(str(tmp_path)) if e['kind'] == 'action']
  with open(os.path.join(str(tmp_path), 'metrics.jsonl')) as f:
    kinds = {json.loads(line)['kind'] for line in f}
  assert 'incident' in kinds
  with open(os.path.join(str(tmp_path), 'incidents.md')) as f:
    assert first['fault_class'] in f.read()


def test_halt_mode_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  # The workdir comes before the checkpoints it holds (it followed 'may carry the fault', as
  # if the fault were in the directory).
  with pytest.raises(trainer.TrainingError, match=(
      rf'^halted at step \d+ by the failure monitor: .*; in {re.escape(str(tmp_path))}: last '
      r'checkpoint before the onset \(step \d+\): step \d+(; checkpoint\(s\) [\d, ]+ from after '
      r'it may carry the fault; to resume from step \d+ instead \(e.g. with a lower '
      r'--config.optim.lr\), first: python -m tools.checkpoint rewind \S+ --step \d+)?; see '
      r'.*incidents.jsonl$')):
    trainer.run(faulty_config('halt'), str(tmp_path))
  steps = sorted(int(d) for d in os.listdir(tmp_path / 'checkpoints') if d.isdigit())
  found = [e for e in incidents(str(tmp_path)) if e['kind'] == 'incident']
  first = min(e['step'] for e in found)
  assert steps and max(steps) < first      # nothing saved from the faulty steps after detection
  # A halted run keeps what explains it: the monitor's report and the plot of the steps it ran
  # (no summary.json: it did not finish).
  with open(tmp_path / 'incidents.md') as f:
    assert found[0]['fault_class'] in f.read()
  assert (tmp_path / 'run.png').stat().st_size > 0
  assert not (tmp_path / 'summary.json').exists()


def overflow_config(mode: str, keep: int = 2, strength: float = 1e30, **overrides):
  """The tiny recipe, 10 steps, checkpoints every 2, with a 1e30x learning rate at step 5
  only: the parameters overflow at step 5 while its loss and gradient stay finite (at 1e14x
  they stay finite and huge, and the losses after are NaN)."""
  config = tiny_config(**{'train.steps': 10, 'train.eval_every': 100, 'train.ckpt_every': 2,
                          'train.keep_checkpoints': keep, 'rollout.prompts_per_step': 8,
                          'monitor.mode': mode, **overrides})
  config.faults = [{'type': 'lr_spike', 'onset_step': 5, 'strength': strength,
                    'duration': 1}]
  return config


def checkpoint_steps(workdir):
  return sorted(int(d) for d in os.listdir(workdir / 'checkpoints') if d.isdigit())


@pytest.mark.parametrize('mode', ['off', 'warn', 'halt', 'auto'])
def test_non_finite_parameters_stop_the_run_and_keep_the_good_checkpoint(tmp_path, mode):
  """A 1e30x learning rate for one step makes the parameters infinite while the loss stays
  finite: the run stops there (was: it trained on, every update skipped, exit 0, and retention
  deleted the last good checkpoint for infinite ones). halt: the monitor's nonfinite_params
  incident stops it. auto: its remediation restores step 4 with the learning rate x 0.1, but
  1e29x overflows again on the replayed step 5; that incident arrives while the first action
  is watched, so nothing restores and the run stops as without the monitor, saying why (its
  line used to read as if auto had not been on)."""
  config = overflow_config(mode)
  message = ('halted at step 5 by the failure monitor: nan_loss \\(signature nonfinite_params; '
             r'mode halt\); in .*: last checkpoint before the onset \(step 5\): step 4'
             if mode == 'halt' else
             r'parameters are no longer finite after step 5.*last good checkpoint \(step 4\)')
  if mode == 'auto':
    message = message.replace('.*', r'.*; monitor.mode=auto did not restore: its '
                              r'restore_and_lower_lr for nonfinite_params \(since step 5\) is '
                              r'being watched until step 15; stopped with the ')
  with pytest.raises(trainer.TrainingError, match=message) as stopped:
    trainer.run(config, str(tmp_path))
  assert checkpoint_steps(tmp_path) == [2, 4]
  logged = metrics_records(tmp_path)
  # Why it stopped is in the log (was only on stderr: api.open_run's messages lacked it).
  assert {'step': 5, 'kind': 'message', 'text': str(stopped.value)} in logged
  train = [r for r in logged if r['kind'] == 'train']
  assert train[-1]['step'] == 5 and train[-1]['param_norm'] in ('Infinity', 'NaN')   # the cause
  if mode in ('halt', 'auto'):   # (+ nan_loss: the step's 2nd update reads the broken params)
    found = [(e['step'], e['signature']) for e in incidents(str(tmp_path))
             if e['kind'] == 'incident']
    assert found == [(5, 'nonfinite_params'), (5, 'nan_loss')] * (2 if mode == 'auto' else 1)


def test_auto_mode_without_a_checkpoint_before_non_finite_parameters_stops(tmp_path):
  """auto, parameters broken at step 1: no checkpoint precedes it, nothing is restored, and
  the run stops there as in the other modes (it must never train on from them)."""
  config = overflow_config('auto', **{'train.steps': 3, 'monitor.lr_factor': 1e-30})
  config.faults[0]['onset_step'] = 1
  with pytest.raises(trainer.TrainingError,
                     match=r'parameters are no longer finite after step 1.*before its first '
                           r'checkpoint'):
    trainer.run(config, str(tmp_path))
  assert not os.path.isdir(tmp_path / 'checkpoints') or not checkpoint_steps(tmp_path)
  actions = [e for e in incidents(str(tmp_path)) if e['kind'] == 'action']
  assert [(a['action'], a['restore_before']) for a in actions] == [('restore_and_lower_lr', 1)]



def test_a_streak_of_skipped_updates_stops_a_monitored_run(tmp_path):
  """warn: a 1e14x learning rate at step 5 leaves the parameters finite but huge (param_norm
  ~7e12), so from its second update on every loss and gradient is NaN and every update is
  skipped. The monitor reports it and the run used to go on to its end, learning nothing, and
  exit 0; it now stops after monitor.max_skipped_steps (5) such steps in a row, naming the last
  checkpoint from before them. The message counts the updates skipped: step 5's first one
  (of the recipe's 2 per step) was applied, the one that made the parameters huge (it used to
  say 'every update was skipped')."""
  config = overflow_config('warn', keep=10, strength=1e14, **{'train.steps': 14})
  with pytest.raises(trainer.TrainingError,
                     match=r'^5 steps in a row \(steps 5-9\) had a non-finite loss and grad_norm, '
                           r'so 9 of their 10 updates were skipped \(config.monitor.'
                           r'max_skipped_steps=5\); stopped; the latest checkpoint from before '
                           r'step 5: step 4, in '):
    trainer.run(config, str(tmp_path))
  with open(tmp_path / 'metrics.jsonl') as f:
    train = [json.loads(line) for line in f if '"kind": "train"' in line]
  assert [r['step'] for r in train] == list(range(1, 10))
  assert all(r['loss'] == 'NaN' and r['update_skipped'] > 0 for r in train[4:])
  assert [r['update_skipped'] for r in train[3:]] == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]
  assert checkpoint_steps(tmp_path) == [2, 4, 6, 8]
  streak = [e for e in incidents(str(tmp_path)) if e.get('signature') == 'skipped_streak']
  assert [(e['step'], e['onset_step']) for e in streak] == [(9, 5)]   # reported; warn: no action


def test_auto_mode_restores_from_before_a_streak_of_skipped_updates(tmp_path):
  """auto: the streak of the test above (steps 5-9, 1e14x learning rate at step 5) is repaired
  as non-finite parameters are (it used to stop the run as in warn): incident skipped_streak,
  the checkpoint of step 4 restored, the learning rate lowered, the run going on to its end.
  monitor.lr_factor=1e-14 makes the replayed step 5 run at the recipe's learning rate (see
  test_auto_mode_restores_parameters_that_are_no_longer_finite)."""
  config = overflow_config('auto', keep=10, strength=1e14,
                           **{'train.steps': 12, 'monitor.lr_factor': 1e-14,
                              'monitor.watch_steps': 3})
  summary = trainer.run(config, str(tmp_path))
  assert summary['steps'] == 12 and (tmp_path / 'summary.json').exists()
  log = incidents(str(tmp_path))
  found = [(e['step'], e['onset_step'], e['signature']) for e in log if e['kind'] == 'incident']
  assert found[:2] == [(5, 5, 'nan_loss'), (9, 5, 'skipped_streak')], found
  actions = [e for e in log if e['kind'] == 'action']
  assert [a['action'] for a in actions[:2]] == ['skip_batch', 'restore_and_lower_lr']
  assert actions[1]['restore_before'] == 5
  assert actions[1]['controls']['lr_scale'] == pytest.approx(1e-14)
  rows = metrics_records(tmp_path)
  assert any('restored the checkpoint of step 4' in r['text'] for r in rows
             if r['kind'] == 'message')
  train = [r for r in rows if r['kind'] == 'train']
  assert [r['step'] for r in train][:10] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 5]
  assert all(isinstance(r['loss'], float) for r in train[9:])   # finite from the replay on


def test_auto_mode_stops_when_the_restored_streak_comes_back_during_the_watch(tmp_path):
  """auto with the default lr_factor 0.1: the replay from step 4 at 1e13x overflows again and
  skips steps 5-9 anew. The streak restarts from checkpoint 4's count (0; it would stop at the
  replayed step 5 as 6 steps if the abandoned steps counted), and this time the restore's
  action is still watched: no second restore, the run stops as in the other modes, saying why."""
  config = overflow_config('auto', keep=10, strength=1e14, **{'train.steps': 14})
  with pytest.raises(trainer.TrainingError,
                     match=r'^5 steps in a row \(steps 5-9\) had a non-finite loss and grad_norm, '
                           r'so 9 of their 10 updates.*max_skipped_steps=5\); monitor.mode=auto '
                           r'did not restore: its restore_and_lower_lr for skipped_streak '
                           r'\(since step 5\) is being watched until step 15; stopped; .*'
                           r'before step 5: step 4, in '):
    trainer.run(config, str(tmp_path))
  rows = metrics_records(tmp_path)
  assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                 5, 6, 7, 8, 9]
  log = incidents(str(tmp_path))
  assert [(e['step'], e['signature']) for e in log if e.get('signature') == 'skipped_streak'
          ] == [(9, 'skipped_streak')] * 2
  assert [a['action'] for a in log if a['kind'] == 'action'] == ['skip_batch',
                                                                 'restore_and_lower_lr']


def test_a_rewind_restarts_the_skipped_streak_from_its_checkpoint(tmp_path):
  """auto: steps 5-8 skip their update (1e14x learning rate at step 5: huge parameters, NaN
  after), then reward_collapse restores the checkpoint of step 4 and the steps run again. The
  streak is that of the trajectory the run continues (0 at step 4), not the abandoned steps'
  added to the redo's: the redo stops after 6 skipped steps of its own, 5-10, naming step 4
  (was: after 3, as 'steps 2-7', with no checkpoint before step 2)."""
  config = overflow_config('auto', keep=10, strength=1e14,
                           **{'train.steps': 30, 'monitor.warmup': 3,
                              'monitor.max_skipped_steps': 6})
  with pytest.raises(trainer.TrainingError,
                     match=r'^6 steps in a row \(steps 5-10\) had a non-finite loss and '
                           r'grad_norm.*the latest checkpoint from before step 5: step 4, in '):
    trainer.run(config, str(tmp_path))
  rows = metrics_records(tmp_path)
  assert any('restored the checkpoint of step 4' in r['text'] for r in rows
             if r['kind'] == 'message')
  assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3, 4, 5, 6, 7, 8,
                                                                 5, 6, 7, 8, 9, 10]


def test_a_resumed_run_carries_on_the_skipped_streak(tmp_path):
  """warn: steps 5-7 skip their update (1e14x learning rate at step 5) and the run ends at
  step 7, its checkpoint holding the huge parameters. Raising train.steps resumes it: the
  streak goes on from 3 and stops the run at step 9 naming step 4, the checkpoint from before
  it (was: counted from 0 again, stopped at step 12 naming step 7, whose parameters are the
  broken ones)."""
  config = overflow_config('warn', keep=10, strength=1e14, **{'train.steps': 7})
  trainer.run(config, str(tmp_path))
  config = overflow_config('warn', keep=10, strength=1e14, **{'train.steps': 14})
  with pytest.raises(trainer.TrainingError,
                     match=r'^5 steps in a row \(steps 5-9\) had a non-finite loss and '
                           r'grad_norm.*the latest checkpoint from before step 5: step 4, in '):
    trainer.run(config, str(tmp_path))


@pytest.mark.filterwarnings('ignore:Sharding info not provided')   # orbax, reading to numpy
def test_auto_mode_restores_parameters_that_are_no_longer_finite(tmp_path):
  """auto: the step whose update overflows the parameters (1e30x learning rate at step 5) is
  undone: the checkpoint of step 4 is restored, the learning rate lowered, and the run goes on
  to its end with finite parameters (was: stopped at step 5 as in the other modes).

  No learning-rate factor of 0.1 (the default) can undo a spike big enough to overflow the
  parameters in one step: 1e29x overflows too (the test above). monitor.lr_factor=1e-30 makes
  the replayed step 5 run at exactly the recipe's learning rate (1e30 x 1e-30), so the test
  checks the mechanism: the incident at step 5, the restore, the replay, nothing of the broken
  step saved, the run finishing. Later steps train at lr x 1e-30 (in effect frozen)."""
  config = overflow_config('auto', keep=10, **{'monitor.lr_factor': 1e-30,
                                               'monitor.watch_steps': 3})
  summary = trainer.run(config, str(tmp_path))
  assert summary['steps'] == 10 and (tmp_path / 'summary.json').exists()
  log = incidents(str(tmp_path))
  # The recipe's second update of step 5 reads the broken parameters: its gradient is NaN too.
  found = [(e['step'], e['signature']) for e in log if e['kind'] == 'incident']
  assert found == [(5, 'nonfinite_params'), (5, 'nan_loss')]
  actions = [e for e in log if e['kind'] == 'action']
  assert actions[0]['action'] == 'restore_and_lower_lr' and actions[0]['restore_before'] == 5
  assert actions[0]['controls']['lr_scale'] == pytest.approx(1e-30)
  rows = metrics_records(tmp_path)
  messages = [r['text'] for r in rows if r['kind'] == 'message']
  assert any('restored the checkpoint of step 4' in m for m in messages), messages
  train = [r for r in rows if r['kind'] == 'train']
  assert [r['step'] for r in train] == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10]
  assert train[4]['param_norm'] in ('Infinity', 'NaN')   # the first try of step 5
  assert all(isinstance(r['param_norm'], float) for r in train[5:])   # finite from the replay on
  # Every checkpoint holds finite parameters (none was written from the broken step 5).
  assert checkpoint_steps(tmp_path) == [2, 4, 6, 8, 10]
  for step in checkpoint_steps(tmp_path):
    state = ocp.PyTreeCheckpointer().restore(str(tmp_path / 'checkpoints' / str(step) / 'state'))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state['params'])), step


def test_auto_mode_does_not_count_a_restore_without_a_checkpoint(tmp_path):
  """auto with no checkpoint before the end (train.ckpt_every 100): the learning-rate fault's
  remediation decides restores that find nothing to restore. The run goes on as before (the
  action's controls apply from the current step), and none of them counts against the
  remediator's max_restores: the final checkpoint's remediator state says 0 (it said 2)."""
  config = faulty_config('auto')
  config.train.ckpt_every = 100
  trainer.run(config, str(tmp_path))
  restoring = [e for e in incidents(str(tmp_path))
               if e['kind'] == 'action' and e['restore_before'] is not None]
  assert restoring, 'no restore decided'
  with open(tmp_path / 'metrics.jsonl') as f:
    missed = [r for r in map(json.loads, f) if r['kind'] == 'message'
              and r['text'].startswith('remediation: no checkpoint before the onset (step ')
              and '(none saved yet); a smaller train.ckpt_every or a larger '
                  'train.keep_checkpoints keeps one' in r['text']]
  assert len(missed) == len(restoring)
  assert checkpoint_steps(tmp_path) == [30]
  with open(tmp_path / 'checkpoints' / '30' / 'meta' / 'metadata') as f:
    assert json.load(f)['remediator']['restores'] == 0


class Rewinds(Hook):

  def __init__(self):
    self.steps = []

  def on_rewind(self, step):
    self.steps.append(step)


def test_auto_mode_restores_before_onset_and_lowers_the_lr(tmp_path):
  rewinds, config = Rewinds(), faulty_config('auto')
  config.telemetry.tensorboard = True
  summary = trainer.run(config, str(tmp_path), hooks_extra=(rewinds,))
  actions = [e for e in incidents(str(tmp_path)) if e['kind'] == 'action']
  assert actions, 'auto mode took no action'
  act = actions[0]
  assert act['restore_before'] is not None and act['restore_before'] <= ONSET + 3
  assert act['controls']['lr_scale'] < 1.0
  with open(os.path.join(str(tmp_path), 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  messages = [r['text'] for r in rows if r['kind'] == 'message']
  restored = [int(m.split('restored the checkpoint of step ')[1].split()[0])
              for m in messages if 'restored the checkpoint of step' in m]
  assert restored and rewinds.steps == restored   # each rewind told to the hooks (TensorBoard)
  train_steps = [r['step'] for r in rows if r['kind'] == 'train']
  assert train_steps != sorted(train_steps)   # the run rewound and replayed steps
  # TensorBoard shows each step once, the redone steps with the redo's values.
  shown = _visible_scalars(_events(str(tmp_path / 'tb')))['reward/mean']
  last = {r['step']: r['reward/mean'] for r in rows if r['kind'] == 'train'}
  assert [s for s, _ in shown] == sorted(last)
  assert [v for _, v in shown] == pytest.approx([last[s] for s in sorted(last)], rel=1e-6)
  assert summary['steps'] == 30 and 'final_greedy_acc' in summary

