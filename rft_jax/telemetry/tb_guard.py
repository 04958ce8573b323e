"""Keeps a failing disk from hanging a run in tensorboardX (used by sinks.TensorBoardSink).

tensorboardX (2.6) writes events on a daemon thread fed by a bounded queue (10 events). An
OSError there (ENOSPC) kills that thread with a traceback on stderr, nothing drains the queue
any more, and the 11th add_* blocks in Queue.put forever (SIGTERM cannot end it); at exit its
atexit hook flushes the broken file again and prints more tracebacks. `EventFileGuard` wraps one
SummaryWriter's event file so that

- the writer thread records the first I/O error and drops later events instead of dying (the
  events it drops are counted, with their lowest and highest step: `lost_steps`);
- a put onto the queue waits in bounded slices and gives up once the thread is gone;
- flush and close (the sink's, and tensorboardX's atexit hook) neither raise nor print.

The caller's thread raises the recorded error (`failure`), naming the event file.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
from typing import Any

from rft_jax.telemetry.jsonl import LostSteps

_WAIT_S = 1.0   # one slice of a wait on the event queue


class EventFileGuard:
  """Guards the event file of one tensorboardX SummaryWriter (see the module doc)."""

  def __init__(self, summary_writer: Any, logdir: str):
    self.path = logdir           # the event file, once known
    self.error: OSError | None = None
    self.lost_steps = LostSteps()   # the events dropped after the error
    self._file = getattr(getattr(summary_writer, 'file_writer', None), 'event_writer', None)
    events = getattr(self._file, '_ev_writer', None)                 # EventsWriter
    worker = getattr(self._file, '_worker', None)                    # _EventLoggerThread
    if events is None or worker is None or not hasattr(self._file, '_event_queue'):
      self._file = None          # a tensorboardX laid out otherwise: left as it is
      return
    self.path = getattr(events, '_file_name', logdir)
    # Instance attributes: the writer thread looks these methods up on every call.
    for name in ('write_event', 'flush', 'close'):
      setattr(events, name, self._caught(getattr(events, name)))
    self._file.add_event = self._put
    worker.stop = lambda: self._stop(worker)

  def _caught(self, method):
    """`method`, recording its OSError instead of raising it; a no-op once the file failed."""
    closing, writing = method.__name__ == 'close', method.__name__ == 'write_event'

    def call(*args, **kwargs):
      if self.error is not None and not closing:
        if writing:
          self.lost_steps.add(getattr(args[0], 'step', 0))
        return None
      try:
        return method(*args, **kwargs)
      except OSError as e:
        if self.error is None:
          self.error = OSError(e.errno, e.strerror or str(e), self.path)
        if writing:
          self.lost_steps.add(getattr(args[0], 'step', 0))
        return None
    return call

  def failure(self) -> OSError | None:
    """The event file's write error, if any. A writer thread that is gone without recording
    one (it failed before the guard was in place) counts as one too."""
    f = self._file
    if self.error is None and f is not None and not f._closed:  # pylint: disable=protected-access
      worker = f._worker                                        # pylint: disable=protected-access
      if worker is not None and not worker.is_alive():
        try:
          full = shutil.disk_usage(os.path.dirname(self.path) or '.').free == 0
        except OSError:
          full = False
        self.error = (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path) if full else
                      OSError(errno.EIO, 'the TensorBoard event writer stopped', self.path))
    return self.error

  def _put(self, event) -> None:
    """EventFileWriter.add_event without its unbounded wait: an event that cannot be queued
    once the writer failed is dropped (`failure` says why)."""
    f = self._file
    while not f._closed and self.failure() is None:   # pylint: disable=protected-access
      try:
        f._event_queue.put(event, timeout=_WAIT_S)      # pylint: disable=protected-access
        return
      except queue.Full:
        continue
    self.lost_steps.add(getattr(event, 'step', 0))

  def _stop(self, worker) -> None:
    """_EventLoggerThread.stop, which would wait forever to queue its stop signal for a
    thread that is gone."""
    signal = worker._shutdown_signal                    # pylint: disable=protected-access
    while worker.is_alive():
      try:
        worker._queue.put(signal, timeout=_WAIT_S)      # pylint: disable=protected-access
        break
      except queue.Full:
        continue
    worker.join()
