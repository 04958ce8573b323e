"""A full disk under the telemetry sinks: one OSError naming the file, no hang, a quiet close."""

import errno
import gc
import glob
import os
import subprocess
import sys
import threading

import pytest

from rft_jax.telemetry import sinks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HANG_S = 120   # far beyond a working write: only a blocked call takes this long


class _FullDisk:
  """Stands in for the event file object: every write, flush and close fails with ENOSPC."""

  def write(self, data):
    raise OSError(errno.ENOSPC, 'No space left on device')

  flush = close = lambda self: self.write(b'')


def _fill_disk(sink):
  """From now on, tensorboardX's writes of the sink's event file fail as on a full disk."""
  events = sink._writer.file_writer.event_writer._ev_writer
  with events._lock:
    real, events._py_recordio_writer._writer = events._py_recordio_writer._writer, _FullDisk()
  real.close()
  return events._file_name


def _log_until_raises(sink, calls=1000):
  """on_step until the sink raises; returns (steps logged, the error or None)."""
  for step in range(1, calls + 1):
    try:
      sink.on_step(step, {'kl': 0.5, 'loss': 1.0})
    except OSError as e:
      return step, e
  return calls, None


def _in_thread(fn):
  """fn() in a daemon thread: (finished, its result); what it raises is raised here. A call
  that blocks forever leaves the thread behind and reports finished=False instead of hanging
  the test session."""
  out = {}

  def target():
    try:
      out['result'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      out['error'] = e
  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(_HANG_S)
  if 'error' in out:
    raise out['error']
  return not thread.is_alive(), out.get('result')


def test_a_full_disk_under_tensorboard_raises_naming_the_event_file_not_hangs(tmp_path):
  """tensorboardX's writer thread died on ENOSPC, and the 11th scalar then waited forever on its
  bounded queue. Now the next call raises the error, naming the event file."""
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'))
  path = _fill_disk(sink)
  finished, result = _in_thread(lambda: _log_until_raises(sink))
  assert finished, 'the sink blocked on the full disk'
  steps, error = result
  assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.filename == path
  assert path.startswith(str(tmp_path / 'tb' / 'events.out.tfevents.'))
  assert steps < 20
  # Raised once: later events are dropped, never waited on.
  finished, _ = _in_thread(lambda: [sink.on_step(s, {'kl': 0.5}) for s in range(50)])
  assert finished
  sink.on_message('x')
  sink.on_end({'steps': 50})
  sink.close()


def test_a_tensorboard_writer_thread_that_is_gone_is_an_error_not_a_hang(tmp_path):
  """However the writer thread ended (here: told to stop), a write raises instead of queuing
  onto a queue that nothing drains."""
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'))
  event_file = sink._writer.file_writer.event_writer
  event_file._worker._queue.put(event_file._worker._shutdown_signal)
  event_file._worker.join()
  finished, result = _in_thread(lambda: _log_until_raises(sink))
  assert finished, 'the sink blocked on a queue that nothing drains'
  error = result[1]
  assert isinstance(error, OSError)
  assert error.filename == event_file._ev_writer._file_name
  finished, _ = _in_thread(sink.close)
  assert finished


def test_a_tensorboard_sink_whose_disk_filled_closes_quietly(tmp_path, capfd):
  """No 'Exception in thread' from the writer thread, and close raises and prints nothing."""
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'))
  _fill_disk(sink)
  finished, result = _in_thread(lambda: _log_until_raises(sink, calls=15))
  assert finished, 'the sink blocked on the full disk'
  assert result[1] is not None and result[1].errno == errno.ENOSPC
  sink.on_end({'steps': 3})
  assert _in_thread(sink.close)[0], 'close blocked'
  gc.collect()
  out, err = capfd.readouterr()
  assert (out, err) == ('', '')


def test_a_tensorboard_sink_left_open_on_a_full_disk_exits_quietly(tmp_path):
  """A run stopped by the error does not close its sinks: tensorboardX's atexit flush of the
  broken file prints nothing either (in a fresh process)."""
  code = f"""
import errno
from rft_jax.telemetry import sinks
from test_full_disk import _fill_disk, _log_until_raises
sink = sinks.TensorBoardSink({str(tmp_path / 'tb')!r})
sink.on_step(0, {{'kl': 0.5}})
_fill_disk(sink)
_, error = _log_until_raises(sink, calls=15)
print(error.errno == errno.ENOSPC)
"""
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f'{REPO}/tests:{REPO}'), timeout=_HANG_S)
  assert (out.returncode, out.stdout, out.stderr) == (0, 'True\n', '')


def test_a_jsonl_sink_on_a_full_disk_raises_once_naming_the_file_and_closes_quietly(
    tmp_path, capfd):
  path = str(tmp_path / 'metrics.jsonl')
  sink = sinks.JsonlSink(path)
  sink.on_step(1, {'loss': 0.5})
  sink._file.close()
  sink._file = open('/dev/full', 'w', encoding='utf-8')   # every write: ENOSPC
  with pytest.raises(OSError) as info:
    sink.on_step(2, {'loss': 0.5})
  assert info.value.errno == errno.ENOSPC and info.value.filename == path
  sink.on_message('after the error')   # dropped, not raised again over the first error
  sink.on_end({'steps': 2})
  sink.close()
  gc.collect()
  assert capfd.readouterr() == ('', '')
  assert [r['step'] for r in sinks.read_jsonl(path)] == [1]


def test_tensorboard_scalars_still_round_trip_after_the_guard(tmp_path):
  logdir = str(tmp_path / 'tb')
  sink = sinks.TensorBoardSink(logdir)
  for step in range(1, 40):   # more than tensorboardX's queue holds
    sink.on_step(step, {'kl': 0.5})
  sink.on_end({'steps': 39})
  sink.close()
  from test_telemetry import _read_scalars   # pylint: disable=g-import-not-at-top
  assert [s for s, _ in _read_scalars(logdir)['kl']] == list(range(1, 40))
  assert len(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))) == 1
