"""Telemetry output as a reader sees it: TensorBoard and run.png after a remediation rewind."""

import glob
import os

from tensorboardX.proto import event_pb2

from rft_jax.telemetry import hooks as hooks_lib
from rft_jax.telemetry import plot as plot_lib
from rft_jax.telemetry import sinks
from test_telemetry import REPO, _read_tfrecords


def _events(logdir):
  """Every event of the logdir's event files, in file order."""
  paths = sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents*')))
  return [event_pb2.Event.FromString(p) for path in paths for p in _read_tfrecords(path)]


def _visible_scalars(events):
  """{tag: [(step, value)]} as TensorBoard shows them: a SessionLog START at step s discards
  the events read before it whose step is s or later (tensorboard's EventAccumulator purge)."""
  scalars = {}
  for event in events:
    if event.HasField('session_log') and event.session_log.status == event_pb2.SessionLog.START:
      scalars = {tag: [(s, v) for s, v in points if s < event.step]
                 for tag, points in scalars.items()}
    for value in event.summary.value:
      if value.HasField('simple_value'):
        scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


def _rewound_run(tmp_path):
  """Steps 1..10 (reward 1.0), a rewind to the checkpoint of step 5, steps 6..12 (reward 2.0)."""
  logdir = str(tmp_path / 'tb')
  sink = sinks.TensorBoardSink(logdir)
  sink.on_start(0, 12, {})
  for step in range(1, 11):
    sink.on_step(step, {'reward/mean': 1.0})
  sink.on_rewind(5)
  for step in range(6, 13):
    sink.on_step(step, {'reward/mean': 2.0})
  sink.close()
  return _events(logdir)


def test_tensorboard_rewind_writes_a_session_start_after_the_restored_step(tmp_path):
  events = _rewound_run(tmp_path)
  starts = [i for i, e in enumerate(events) if e.HasField('session_log')
            and e.session_log.status == event_pb2.SessionLog.START]
  assert [events[i].step for i in starts] == [1, 6]   # the writer's purge_step, the rewind's
  steps = [(e.step, e.summary.value[0].simple_value) for e in events[starts[1] + 1:]
           if e.summary.value]
  assert steps == [(s, 2.0) for s in range(6, 13)]    # only the redo comes after it
  assert _visible_scalars(events)['reward/mean'] == (
      [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in range(6, 13)])


def test_on_rewind_is_a_noop_hook_and_fans_out():
  hooks_lib.Hook().on_rewind(3)
  seen = []

  class Rewinds(hooks_lib.Hook):

    def on_rewind(self, step):
      seen.append(step)

  hooks_lib.HookList([Rewinds(), hooks_lib.Hook(), Rewinds()]).on_rewind(7)
  assert seen == [7, 7]


def _train(step, value):
  return {'step': step, 'kind': 'train', 'reward/mean': value}


def test_final_trajectory_keeps_the_redone_steps_in_step_order():
  records = ([{'step': 0, 'kind': 'start'}, {'step': 0, 'kind': 'eval', 'eval/base_acc': 0.1}]
             + [_train(s, 1.0) for s in range(1, 11)]
             + [{'step': 8, 'kind': 'eval', 'eval/greedy_acc': 0.2},
                {'step': 10, 'kind': 'incident', 'fault_class': 'kl_explosion'},
                {'step': 10, 'kind': 'message', 'text': 'restored'}]
             + [_train(s, 2.0) for s in range(6, 13)]
             + [{'step': 12, 'kind': 'eval', 'eval/greedy_acc': 0.3}])
  final = plot_lib.final_trajectory(records)
  assert [(r['kind'], r['step']) for r in final] == (
      [('eval', 0)] + [('train', s) for s in range(1, 13)] + [('eval', 12)])
  assert [r['reward/mean'] for r in final if r['kind'] == 'train'] == [1.0] * 5 + [2.0] * 7
  # A redo that has not reached the abandoned steps yet: those are dropped too.
  partial = [_train(s, 1.0) for s in range(1, 11)] + [_train(s, 2.0) for s in (6, 7, 8)]
  assert [(r['step'], r['reward/mean']) for r in plot_lib.final_trajectory(partial)] == (
      [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in (6, 7, 8)])
  # Two rewinds, the second to before the first's restore point.
  twice = ([_train(s, 1.0) for s in range(1, 9)] + [_train(s, 2.0) for s in range(5, 10)]
           + [_train(s, 3.0) for s in range(3, 11)])
  assert [(r['step'], r['reward/mean']) for r in plot_lib.final_trajectory(twice)] == (
      [(1, 1.0), (2, 1.0)] + [(s, 3.0) for s in range(3, 11)])


def test_plot_run_draws_the_final_trajectory(tmp_path, monkeypatch):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  for step in range(1, 11):
    sink.on_step(step, {'reward/mean': 1.0})
  sink.on_incident(10, {'kind': 'incident', 'fault_class': 'kl_explosion', 'onset_step': 6})
  for step in range(6, 13):
    sink.on_step(step, {'reward/mean': 2.0})
  sink.close()
  drawn = {}
  monkeypatch.setattr(plot_lib, 'plot_records',
                      lambda train, png, **kw: drawn.update(train=train, **kw))
  plot_lib.plot_run(path, tmp_path / 'run.png')
  assert [(r['step'], r['reward/mean']) for r in drawn['train']] == (
      [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in range(6, 13)])
  assert [i['step'] for i in drawn['incidents']] == [10]   # what caused the rewind stays marked


# ----------------------------------------------------------------------------
# TensorBoard tags.


def test_tensorboard_tag_of_mean_at_k_is_the_one_the_readme_names(tmp_path, caplog):
  """'@' cannot be in a TensorBoard tag: the sink writes the tag the README documents, so
  tensorboardX renames nothing (and logs nothing)."""
  logdir = str(tmp_path / 'tb')
  sink = sinks.TensorBoardSink(logdir)
  with caplog.at_level('INFO', logger='tensorboardX'):
    sink.on_eval(0, {'eval/base_mean@8_acc': 0.25})
    sink.on_eval(3, {'eval/greedy_acc': 0.75, 'eval/mean@8_acc': 0.5})
    sink.close()
  assert not [r for r in caplog.records if 'illegal' in r.getMessage()], caplog.text
  tags = {v.tag: (e.step, v.simple_value) for e in _events(logdir) for v in e.summary.value}
  assert tags == {'eval/base_mean_at_8_acc': (0, 0.25), 'eval/greedy_acc': (3, 0.75),
                  'eval/mean_at_8_acc': (3, 0.5)}
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    row = [l for l in f if l.startswith('| `eval/greedy_acc`, `eval/mean@<k>_acc`')]
  assert len(row) == 1 and '`eval/mean_at_<k>_acc`' in row[0], row
  assert sinks.tensorboard_tag('/a b@c') == 'a_b_at_c'
