"""A full disk under the telemetry sinks: one line naming the file, no hang, no stopped run, the
records written again once there is room (what could not be is said), a quiet close."""

import errno
import gc
import glob
import json
import os
import re
import subprocess
import sys
import threading

from rft_jax.telemetry import jsonl as jsonl_lib
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


def _log_until_reported(sink, reports, calls=1000):
  """on_step until the sink reports an error; returns the steps logged (none may raise)."""
  for step in range(1, calls + 1):
    sink.on_step(step, {'kl': 0.5, 'loss': 1.0})
    if reports:
      return step
  return calls


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


def test_a_full_disk_under_tensorboard_is_reported_once_naming_the_event_file_not_hangs(
    tmp_path):
  """tensorboardX's writer thread died on ENOSPC, and the 11th scalar then waited forever on its
  bounded queue. Now the sink reports the error in one line naming the event file, and the run
  goes on (it used to raise it, which stopped the run)."""
  reports = []
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'), report=reports.append)
  path = _fill_disk(sink)
  finished, steps = _in_thread(lambda: _log_until_reported(sink, reports))
  assert finished, 'the sink blocked on the full disk'
  assert len(reports) == 1 and reports[0].startswith(f'{path}: No space left on device')
  assert path.startswith(str(tmp_path / 'tb' / 'events.out.tfevents.'))
  assert steps < 20
  # Reported once: later events are dropped, never waited on.
  finished, _ = _in_thread(lambda: [sink.on_step(s, {'kl': 0.5}) for s in range(50)])
  assert finished
  sink.on_message('x')
  sink.on_end({'steps': 50})
  sink.close()
  assert len(reports) == 2 and 'TensorBoard events (steps ' in reports[1]   # what was lost


def test_what_a_sink_on_a_full_disk_drops_takes_constant_memory(tmp_path, monkeypatch):
  """A disk that stays full for a long run: the TensorBoard sink and the JSONL writer count what
  they drop (number, first and last step) instead of keeping one entry per event or record."""
  import tracemalloc  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jsonl_lib, 'MAX_HELD_BYTES', 200)
  reports = []
  tb = sinks.TensorBoardSink(str(tmp_path / 'tb'), report=reports.append)
  _fill_disk(tb)
  _log_until_reported(tb, reports)
  js = sinks.JsonlSink(str(tmp_path / 'metrics.jsonl'), report=reports.append)
  js._file = disk = _Disk(js._file)
  disk.full = True
  many = {f'm{i}': 0.5 for i in range(100)}
  tb.on_step(1000, many)
  js.on_step(1000, {'loss': 0.5})
  tracemalloc.start()
  before = tracemalloc.get_traced_memory()[0]
  for step in range(1001, 3001):   # 200,000 dropped events, ~2,000 dropped records
    tb.on_step(step, many)
    js.on_step(step, {'loss': 0.5})
  grown = tracemalloc.get_traced_memory()[0] - before
  tracemalloc.stop()
  assert grown < 200_000, grown   # a list of their steps alone: 1.6 MB
  tb.close()
  disk.full = False
  js.close()
  note = sinks.read_jsonl(str(tmp_path / 'metrics.jsonl'))[0]
  assert note['kind'] == 'message' and note['text'].startswith('1997 records (steps 1000-2996)')
  tb_report = [r for r in reports if 'TensorBoard events (steps ' in r]
  assert len(tb_report) == 1 and ': 200' in tb_report[0] and '(steps 1-3000)' in tb_report[0]


def test_a_tensorboard_sink_writes_a_new_event_file_once_a_write_can_succeed(tmp_path,
                                                                               monkeypatch):
  """After the failed file, the sink tries a new one (every REOPEN_S seconds; here at once):
  the later scalars are in it, and the report says how many events were lost."""
  monkeypatch.setattr(sinks.TensorBoardSink, 'REOPEN_S', 0.0)
  logdir, reports = str(tmp_path / 'tb'), []
  sink = sinks.TensorBoardSink(logdir, report=reports.append)
  sink.on_step(1, {'kl': 0.1})
  failed = _fill_disk(sink)
  finished, steps = _in_thread(lambda: _log_until_reported(sink, reports, calls=15))
  assert finished and len(reports) == 2, reports
  assert reports[0].startswith(f'{failed}: No space left on device (errno 28)')
  assert reports[1].startswith(f'{logdir}: TensorBoard events go to {logdir}/events.out.')
  assert re.search(r'"No space left on device"; \d+ events \(steps \d+-\d+\) were lost$',
                   reports[1]), reports[1]
  for step in range(steps + 1, steps + 5):
    sink.on_step(step, {'kl': 0.5})
  sink.close()
  assert len(reports) == 2
  files = sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*')))
  assert len(files) == 2 and failed in files
  from test_telemetry_tensorboard import _read_scalars   # pylint: disable=g-import-not-at-top
  kl = dict(_read_scalars(logdir)['kl'])
  assert all(kl[s] == 0.5 for s in range(steps + 1, steps + 5)), kl


def test_a_tensorboard_writer_thread_that_is_gone_is_an_error_not_a_hang(tmp_path):
  """However the writer thread ended (here: told to stop), a write reports an error instead of
  queuing onto a queue that nothing drains."""
  reports = []
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'), report=reports.append)
  event_file = sink._writer.file_writer.event_writer
  event_file._worker._queue.put(event_file._worker._shutdown_signal)
  event_file._worker.join()
  finished, _ = _in_thread(lambda: _log_until_reported(sink, reports))
  assert finished, 'the sink blocked on a queue that nothing drains'
  assert len(reports) == 1 and reports[0].startswith(event_file._ev_writer._file_name)
  finished, _ = _in_thread(sink.close)
  assert finished


def test_a_tensorboard_sink_whose_disk_filled_closes_quietly(tmp_path, capfd):
  """No 'Exception in thread' from the writer thread, and close raises and prints nothing (the
  report goes where `report` says)."""
  reports = []
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'), report=reports.append)
  _fill_disk(sink)
  finished, _ = _in_thread(lambda: _log_until_reported(sink, reports, calls=15))
  assert finished, 'the sink blocked on the full disk'
  assert reports and 'No space left on device (errno 28)' in reports[0]
  sink.on_end({'steps': 3})
  assert _in_thread(sink.close)[0], 'close blocked'
  gc.collect()
  out, err = capfd.readouterr()
  assert (out, err) == ('', '')


def test_a_tensorboard_sink_left_open_on_a_full_disk_exits_quietly(tmp_path):
  """A run whose sinks are not closed: tensorboardX's atexit flush of the broken file prints
  nothing either (in a fresh process); the report is the one line on stderr."""
  code = f"""
from rft_jax.telemetry import jsonl as jsonl_lib
from rft_jax.telemetry import sinks
from test_full_disk import _fill_disk, _log_until_reported
sink = sinks.TensorBoardSink({str(tmp_path / 'tb')!r})
sink.on_step(0, {{'kl': 0.5}})
_fill_disk(sink)
print(_log_until_reported(sink, [], calls=15) == 15)
"""
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f'{REPO}/tests:{REPO}'), timeout=_HANG_S)
  assert (out.returncode, out.stdout) == (0, 'True\n'), out.stderr
  [line] = out.stderr.splitlines()
  assert line.startswith(f'warning: {tmp_path}/tb/events.out.tfevents.')
  assert 'No space left on device (errno 28)' in line


class _Disk:
  """The sink's file on a disk that fills up: while `full`, a write puts down what still fits
  (`room` bytes: a torn line) and then fails with ENOSPC, as a real one does."""

  def __init__(self, file):
    self.file, self.full, self.room = file, False, 0

  def write(self, data):
    if self.full:
      if not self.room:
        raise OSError(errno.ENOSPC, 'No space left on device')
      n = self.file.write(bytes(data[:self.room]))
      self.room -= n
      return n
    return self.file.write(data)

  def truncate(self, size):
    return self.file.truncate(size)

  def close(self):
    self.file.close()


def test_a_jsonl_sink_on_a_full_disk_goes_on_and_writes_the_later_records(tmp_path, capfd):
  """The disk fills for a few steps, then has room again: one line names the file, nothing
  raises, the records of those steps (held meanwhile) and the later ones are in the file, and
  the torn part of a line is gone. (A failed write used to raise, which stopped the run, and
  every later record was dropped.)"""
  path, reports = str(tmp_path / 'metrics.jsonl'), []
  sink = sinks.JsonlSink(path, report=reports.append)
  sink.on_step(1, {'loss': 0.5})
  sink._file = disk = _Disk(sink._file)
  disk.full, disk.room = True, 7
  for step in (2, 3, 4):
    sink.on_step(step, {'loss': 0.5})
  sink.on_message('still full')
  assert len(reports) == 1
  assert reports[0].startswith(f'{path}: No space left on device (errno 28): ')
  disk.full = False
  sink.on_step(5, {'loss': 0.5})
  assert len(reports) == 2 and reports[1] == (f'{path}: written again after "No space left on '
                                              'device": 4 records held meanwhile are in it')
  sink.on_end({'steps': 5})
  sink.close()
  records = sinks.read_jsonl(path)
  assert [(r['kind'], r['step']) for r in records] == (
      [('train', s) for s in range(1, 5)] + [('message', 4), ('train', 5), ('end', 5)])
  with open(path, encoding='utf-8') as f:
    assert len(f.readlines()) == len(records)   # no torn line left behind
  gc.collect()
  assert capfd.readouterr() == ('', '')


def test_a_jsonl_sink_holds_what_it_can_and_notes_the_records_it_lost(tmp_path, monkeypatch):
  """Past MAX_HELD_BYTES the oldest held records go: a message in their place says how many and
  of which steps, and so does the report."""
  monkeypatch.setattr(jsonl_lib, 'MAX_HELD_BYTES', 200)   # about four train records
  path, reports = str(tmp_path / 'metrics.jsonl'), []
  sink = sinks.JsonlSink(path, report=reports.append)
  sink._file = disk = _Disk(sink._file)
  disk.full = True
  for step in range(1, 11):
    sink.on_step(step, {'loss': 0.5, 'kl': 0.25})
  disk.full = False
  sink.on_step(11, {'loss': 0.5, 'kl': 0.25})
  sink.close()
  records = sinks.read_jsonl(path)
  note = records[0]
  assert note['kind'] == 'message'
  lost = int(note['text'].split()[0])
  assert 0 < lost < 10 and note['step'] == lost
  assert note['text'] == (f'{lost} records (steps 1-{lost}) were lost: No space left on device '
                          'writing this file')
  assert [r['step'] for r in records[1:]] == list(range(lost + 1, 12))
  assert reports[1].endswith(f', {lost} lost')


def test_a_jsonl_sink_on_a_disk_that_stays_full_reports_what_close_could_not_write(
    tmp_path, capfd):
  """Nothing raises, the error is said once, and close says how many records were not
  written; what was written before the disk filled stays."""
  path = str(tmp_path / 'metrics.jsonl')
  sink = sinks.JsonlSink(path)   # reports on stderr
  sink.on_step(1, {'loss': 0.5})
  sink._file.close()
  sink._file = open('/dev/full', 'wb', buffering=0)   # every write: ENOSPC
  sink.on_step(2, {'loss': 0.5})
  sink.on_message('after the error')
  sink.on_end({'steps': 2})
  sink.close()
  sink.close()
  gc.collect()
  out, err = capfd.readouterr()
  assert out == '' and err.splitlines() == [
      f'warning: {path}: No space left on device (errno 28): metrics records are held in memory '
      'and written once a write succeeds again; the run goes on',
      f'warning: {path}: 3 records (step 2) not written at close: No space left on device']
  assert [r['step'] for r in sinks.read_jsonl(path)] == [1]


class _PagedDisk(_Disk):
  """A disk that allocates whole pages (tmpfs, ext4): cutting a torn line off frees no page, so
  the next write puts as much down again."""

  def truncate(self, size):
    self.room += self.file.seek(0, 2) - size
    return self.file.truncate(size)


def test_a_jsonl_sink_on_a_disk_that_stays_full_leaves_no_torn_line(tmp_path):
  """Each failed write is cut back to the last whole line at once, not at the next write (which
  on a real disk tore the line again, so a run ending on a full disk left a torn last line)."""
  path = str(tmp_path / 'metrics.jsonl')
  sink = sinks.JsonlSink(path, report=lambda text: None)
  sink.on_step(1, {'loss': 0.5})
  sink._file = disk = _PagedDisk(sink._file)
  disk.full, disk.room = True, 9
  for step in (2, 3):
    sink.on_step(step, {'loss': 0.5})
    with open(path, encoding='utf-8') as f:
      assert f.read().endswith('\n')
  sink.close()
  with open(path, encoding='utf-8') as f:
    assert [json.loads(line)['step'] for line in f] == [1]


def test_tensorboard_scalars_still_round_trip_after_the_guard(tmp_path):
  logdir = str(tmp_path / 'tb')
  sink = sinks.TensorBoardSink(logdir)
  for step in range(1, 40):   # more than tensorboardX's queue holds
    sink.on_step(step, {'kl': 0.5})
  sink.on_end({'steps': 39})
  sink.close()
  from test_telemetry_tensorboard import _read_scalars   # pylint: disable=g-import-not-at-top
  assert [s for s, _ in _read_scalars(logdir)['kl']] == list(range(1, 40))
  assert len(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))) == 1


def test_incidents_jsonl_on_a_full_disk_goes_on_and_is_written_again(tmp_path, monkeypatch,
                                                                     capfd):
  """incidents.jsonl used to raise the OSError, stopping the run on process 0 alone (the others
  would wait for it). Now: one line, the entries kept, the whole file written at the next entry
  that can be, or said at the end of the run if it still cannot."""
  import builtins  # pylint: disable=g-import-not-at-top
  from rft_jax import incidents  # pylint: disable=g-import-not-at-top
  full = {'on': False}

  def disk_open(path, mode='r', *args, **kwargs):
    if full['on'] and ('a' in mode or 'w' in mode):
      raise OSError(errno.ENOSPC, 'No space left on device', path)
    return builtins.open(path, mode, *args, **kwargs)

  monkeypatch.setattr(incidents, 'open', disk_open, raising=False)
  log = incidents.IncidentLog(str(tmp_path), 0)
  log.add({'step': 1, 'kind': 'incident'})
  full['on'] = True
  log.add({'step': 2, 'kind': 'incident'})
  log.add({'step': 3, 'kind': 'action'})
  log.retry(last=True)
  err = capfd.readouterr().err.strip().splitlines()
  assert len(err) == 2 and 'No space left on device (errno 28): incidents are kept' in err[0]
  assert err[1].endswith('incidents.jsonl: 3 entries not all written: No space left on device')
  full['on'] = False
  log.add({'step': 4, 'kind': 'verdict'})
  with open(log.path) as f:
    assert [json.loads(line)['step'] for line in f] == [1, 2, 3, 4]
  assert capfd.readouterr().err.strip().endswith(
      'written again after "No space left on device"')
