"""The failure monitor inside live training runs: detection, halt and auto remediation."""
import json
import os

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
  with pytest.raises(trainer.TrainingError, match='halted at step'):
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


@pytest.mark.parametrize('mode', ['off', 'warn'])
def test_non_finite_parameters_stop_the_run_and_keep_the_good_checkpoint(tmp_path, mode):
  """A 1e30x learning rate for one step makes the parameters infinite while the loss stays
  finite: the run stops there (was: it trained on, every update skipped, exit 0, and retention
  deleted the last good checkpoint for infinite ones)."""
  config = tiny_config(**{'train.steps': 10, 'train.eval_every': 100, 'train.ckpt_every': 2,
                          'train.keep_checkpoints': 2, 'rollout.prompts_per_step': 8,
                          'monitor.mode': mode})
  config.faults = [{'type': 'lr_spike', 'onset_step': 5, 'strength': 1e30, 'duration': 1}]
  with pytest.raises(trainer.TrainingError,
                     match='parameters are no longer finite after step 5.*last good checkpoint '
                           r'\(step 4\)'):
    trainer.run(config, str(tmp_path))
  steps = sorted(int(d) for d in os.listdir(tmp_path / 'checkpoints') if d.isdigit())
  assert steps == [2, 4]
  with open(tmp_path / 'metrics.jsonl') as f:
    logged = [json.loads(line) for line in f]
  train = [r for r in logged if r['kind'] == 'train']
  assert train[-1]['step'] == 5 and train[-1]['param_norm'] in ('Infinity', 'NaN')   # the cause


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
