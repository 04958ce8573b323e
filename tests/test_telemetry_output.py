"""Telemetry output as a reader sees it after a remediation rewind: TensorBoard, run.png and the
final trajectory (records.final_trajectory, monitor.formats.last_per_step)."""

import glob
import io
import os
import subprocess
import sys

import pytest
from rich.console import Console
from tensorboardX.proto import event_pb2

from rft_jax.monitor import formats
from rft_jax.telemetry import hooks as hooks_lib
from rft_jax.telemetry import plot as plot_lib
from rft_jax.telemetry import records as records_lib
from rft_jax.telemetry import sinks
from test_telemetry_tensorboard import REPO, _read_tfrecords


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
  final = records_lib.final_trajectory(records)
  assert [(r['kind'], r['step']) for r in final] == (
      [('eval', 0)] + [('train', s) for s in range(1, 13)] + [('eval', 12)])
  assert [r['reward/mean'] for r in final if r['kind'] == 'train'] == [1.0] * 5 + [2.0] * 7
  # A redo that has not reached the abandoned steps yet: those are dropped too.
  partial = [_train(s, 1.0) for s in range(1, 11)] + [_train(s, 2.0) for s in (6, 7, 8)]
  assert [(r['step'], r['reward/mean']) for r in records_lib.final_trajectory(partial)] == (
      [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in (6, 7, 8)])
  # Two rewinds, the second to before the first's restore point.
  twice = ([_train(s, 1.0) for s in range(1, 9)] + [_train(s, 2.0) for s in range(5, 10)]
           + [_train(s, 3.0) for s in range(3, 11)])
  assert [(r['step'], r['reward/mean']) for r in records_lib.final_trajectory(twice)] == (
      [(1, 1.0), (2, 1.0)] + [(s, 3.0) for s in range(3, 11)])


def test_a_redo_from_the_last_abandoned_step_replaces_it_whole(tmp_path):
  """An auto restore to the checkpoint just before the alarm's step: the redo starts at the
  last abandoned step. Its record replaces the abandoned one (a key only the abandoned record
  had, here the non-finite-check metric of the faulty step, used to survive the merge), as the
  final trajectory of the run's other readers (`records.final_trajectory`) has it."""
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  for step in range(1, 7):
    sink.on_step(step, {'kl': 0.1 * step, 'reward/mean': 0.5})
  sink.on_step(7, {'kl': 9.0, 'reward/mean': 0.0, 'invariant/nonfinite': 1.0})
  sink.on_incident(7, {'kind': 'incident', 'fault_class': 'kl_explosion', 'onset_step': 7})
  sink.on_message('remediation: restored the checkpoint of step 6 (before onset at step 7)')
  for step in (7, 8):
    sink.on_step(step, {'kl': 0.07, 'reward/mean': 0.6})
  sink.close()
  steps = formats.last_per_step(formats.load_run(path))
  assert [r['step'] for r in steps] == list(range(1, 9))
  assert steps[6] == {'step': 7, 'kl': 0.07, 'reward/mean': 0.6}
  final = records_lib.final_trajectory(sinks.read_jsonl(path))
  assert [{k: v for k, v in r.items() if k != 'kind'} for r in final] == steps
  # The same for a foreign log, and for a redo of the one step logged (a rerun, no steps after).
  log = [{'step': 1, 'kl': 0.1}, {'step': 2, 'kl': 0.2, 'grad_norm': 50.0},
         {'step': 2, 'kl': 0.02}, {'step': 3, 'kl': 0.03}]
  assert formats.last_per_step(log) == [{'step': 1, 'kl': 0.1}, {'step': 2, 'kl': 0.02},
                                        {'step': 3, 'kl': 0.03}]


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


def test_a_plot_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
  """A full disk while run.png is drawn (a resumed run's end) used to leave a truncated (or
  empty) run.png in place of the earlier plot."""
  import errno  # pylint: disable=g-import-not-at-top
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  png = tmp_path / 'run.png'
  train = [{'step': s, 'reward/mean': 1.0} for s in (1, 2)]
  plot_lib.plot_records(train, png)
  before = png.read_bytes()

  def full_disk(self, path, **kwargs):
    del self, kwargs
    with open(path, 'wb') as f:
      f.write(before[:10])
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(figure.Figure, 'savefig', full_disk)
  with pytest.raises(OSError, match='No space left'):
    plot_lib.plot_records(train, png)
  assert png.read_bytes() == before
  assert os.listdir(tmp_path) == ['run.png']


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


# ----------------------------------------------------------------------------
# Console.


def _long_lines():
  """A message, config summary, metric values and an incident, each well over 80 columns."""
  message = ' '.join(f'word{i}' for i in range(30))
  config = {'recipe': 'grpo_arith', 'workdir': '/runs/' + 'a_long_directory_name/' * 4}
  incident = {'kind': 'incident', 'fault_class': 'gradient_explosion', 'severity': 'critical',
              'onset_step': 3, 'score': 9.5, 'remediation': 'restore_and_lower_lr',
              'evidence': [{'signal': 'grad_norm', 'direction': 'up', 'score': 9.5}]}
  return message, config, incident


def test_console_does_not_wrap_lines_when_not_a_terminal():
  """rich wraps at the console width, 80 columns where the output is a pipe or a file."""
  buf = io.StringIO()
  console = Console(file=buf, width=80)
  assert not console.is_terminal
  message, config, incident = _long_lines()
  sink = sinks.ConsoleSink(console=console, keys=[(f'metric/{i}', f'label_{i}') for i in range(8)])
  sink.on_start(0, 2, config)
  sink.on_step(1, {f'metric/{i}': 0.125 * i for i in range(8)})
  sink.on_message(message)
  sink.on_eval(2, {f'eval/mean@{k}_acc': 0.5 for k in range(1, 9)})
  sink.on_incident(2, incident)
  lines = buf.getvalue().splitlines()
  assert '  '.join(f'{k}={v}' for k, v in config.items()) in lines
  step_line = [l for l in lines if l.startswith('step 1/2')]
  assert len(step_line) == 1 and 'label_7 0.875  (' in step_line[0], lines
  assert message in lines
  assert 'eval @ step 2:  ' + '  '.join(f'mean@{k}_acc 50.0%' for k in range(1, 9)) in lines
  assert sinks.describe_incident(2, incident) in lines
  assert max(len(l) for l in lines) > 150


def test_console_does_not_wrap_lines_piped_to_another_process(tmp_path):
  """The default console (stdout) of `make run | cat`: a long message is one line."""
  message, config, incident = _long_lines()
  code = f"""
from rft_jax.telemetry import sinks
sink = sinks.ConsoleSink()
sink.on_start(0, 2, {config!r})
sink.on_message({message!r})
sink.on_incident(1, {incident!r})
"""
  env = {k: v for k, v in os.environ.items()
         if k not in ('COLUMNS', 'FORCE_COLOR', 'TTY_COMPATIBLE', 'TTY_INTERACTIVE')}
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                       env=dict(env, PYTHONPATH=REPO), timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == ['  '.join(f'{k}={v}' for k, v in config.items()), message,
                                     sinks.describe_incident(1, incident)]


def test_console_of_a_complete_run_prints_no_step_line():
  """A second invocation of a finished run starts at its last step and trains nothing: the
  console prints the message and the summary, not 'step 6/6' again."""
  buf = io.StringIO()
  sink = sinks.ConsoleSink(console=Console(file=buf, width=120))
  sink.on_start(6, 6, {})
  sink.on_message('run already complete (6/6 steps)')
  sink.on_end({'steps': 6})
  sink.close()
  out = buf.getvalue()
  assert 'run already complete' in out and 'run summary' in out
  assert not [l for l in out.splitlines() if l.startswith('step ')], out
  # A resumed run prints its own steps, the last one once.
  buf = io.StringIO()
  sink = sinks.ConsoleSink(console=Console(file=buf, width=120))
  sink.on_start(4, 6, {})
  for step in (5, 6):
    sink.on_step(step, {'reward/mean': 0.5})
  sink.on_end({'steps': 6})
  assert [l.split('  ')[0] for l in buf.getvalue().splitlines() if l.startswith('step ')] == [
      'step 5/6', 'step 6/6']


def test_console_start_line_leaves_out_empty_values():
  """The full recipe's variant is '' (recorded in the log, where tools.scaling reads it): the
  console's start line leaves it out rather than print 'variant=' with nothing after it."""
  buf = io.StringIO()
  sink = sinks.ConsoleSink(console=Console(file=buf, width=120))
  sink.on_start(0, 6, {'recipe': 'grpo_arith', 'variant': '', 'params': '1,000'})
  sink.on_start(0, 6, {'recipe': 'grpo_arith', 'variant': 'tiny'})
  out = buf.getvalue()
  assert 'recipe=grpo_arith  params=1,000' in out and 'variant=tiny' in out, out
  assert 'variant= ' not in out and not out.rstrip().endswith('variant='), out


def test_finish_run_without_jsonl_says_why_there_is_no_plot(tmp_path):
  """run.png is drawn from metrics.jsonl: with telemetry.jsonl off there is none, and the run
  says so instead of skipping it silently."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from rft_jax import api, runs  # pylint: disable=g-import-not-at-top

  class Ckpt:
    closed = False

    def close(self):
      Ckpt.closed = True

  config = ml_collections.ConfigDict({'name': 'x', 'telemetry': {'plot': True, 'jsonl': False}})
  recorder = api.Recorder()
  runs.finish_run(config, str(tmp_path), {'steps': 1}, recorder, Ckpt())
  assert not os.path.exists(tmp_path / 'run.png') and Ckpt.closed
  assert (tmp_path / 'summary.json').exists()
  messages = [r['text'] for r in recorder.records if r['kind'] == 'message']
  assert messages == ['run.png not drawn: it is drawn from metrics.jsonl, and '
                      'config.telemetry.jsonl is off']


def test_a_closed_stdout_quiets_the_console_and_the_run_goes_on():
  """`python -m rft_jax.main ... | head`, or a `tee` that died: rich ended the process with
  SystemExit(1) at the first line printed after the reader went away, saying nothing (a run
  stopped between checkpoints). Now one line on stderr; the sink's later calls go on."""
  code = """
import sys, time
from rft_jax.telemetry import sinks
sink = sinks.ConsoleSink()
sink.on_start(0, 400, {'recipe': 'x'})
for step in range(1, 401):
  time.sleep(0.005)
  sink.on_step(step, {'reward/mean': 1.0})
  sink.on_message('m' * 200)
sink.on_end({'steps': 400})
print('the run went on', file=sys.stderr)
"""
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
  proc.stdout.close()   # the reader goes away before (most of) the output
  err = proc.stderr.read()
  assert proc.wait(timeout=120) == 0, err[-2000:]
  assert err.splitlines() == ['warning: the console output is closed (broken pipe); the run goes '
                              'on without it', 'the run went on']


def test_a_closed_pipe_for_stdout_and_stderr_both_does_not_end_the_run(tmp_path):
  """`python -m rft_jax.main ... 2>&1 | head` (or `|& tee` that died): stderr is the same closed
  pipe, so the warning line itself raised BrokenPipeError out of the console sink and the run
  ended (exit 1) at the first step line after the reader went away. Both outputs now go quiet."""
  done = tmp_path / 'done'
  code = f"""
import sys, time
from rft_jax.telemetry import sinks
sink = sinks.ConsoleSink()
sink.on_start(0, 400, {{'recipe': 'x'}})
for step in range(1, 401):
  time.sleep(0.005)
  sink.on_step(step, {{'reward/mean': 1.0}})
  sink.on_message('m' * 200)
  if step % 50 == 0:
    print('a warning on stderr', file=sys.stderr, flush=True)
sink.on_end({{'steps': 400}})
open({str(done)!r}, 'w').write('the run went on')
"""
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=REPO))
  proc.stdout.close()   # the one reader of both goes away
  assert proc.wait(timeout=120) == 0
  assert done.read_text() == 'the run went on'


def test_a_note_about_a_step_is_recorded_at_that_step(tmp_path):
  """on_step_message(step, text), said while step 3 runs (after on_step(2)), is recorded at
  step 3 in metrics.jsonl and the Recorder (it was recorded at the last completed step); a hook
  overriding only on_message still gets the text."""
  class OnlyMessages(hooks_lib.Hook):
    def __init__(self):
      self.texts = []

    def on_message(self, text):
      self.texts.append(text)

  path = tmp_path / 'metrics.jsonl'
  recorder, plain = hooks_lib.Recorder(), OnlyMessages()
  hooks = hooks_lib.HookList([sinks.JsonlSink(path), recorder, plain])
  hooks.on_start(0, 5, {})
  hooks.on_step(2, {'kl': 0.1})
  hooks.on_step_message(3, "step 3: verifier 'v' left 2 of 16 samples unscored")
  hooks.on_message('a note about no step')
  hooks.close()
  for records in (sinks.read_jsonl(path, kind='message'),
                  [r for r in recorder.records if r['kind'] == 'message']):
    assert [(r['step'], r['text'][:6]) for r in records] == [(3, 'step 3'), (2, 'a note')]
  assert plain.texts == ["step 3: verifier 'v' left 2 of 16 samples unscored",
                         'a note about no step']
