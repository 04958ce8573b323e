"""A failed orbax checkpoint write (or read) said in one line, and the noise around it muted.

Used by rft_jax/checkpoint.py. On a full disk orbax raises a ValueError whose first line can hold
a whole tensorstore spec; around it come absl ERROR records with each writer thread's traceback,
asyncio's 'Task exception was never retrieved' for each failed write task, and tensorstore's
callbacks into orbax's closed event loop ('RuntimeError: Event loop is closed', through
sys.unraisablehook): thousands of lines on the console, for one fact. `describe` says the fact;
`Quiet` mutes the rest, during each save and, once one failed, until the Checkpointer closes.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import re
import sys
import traceback
import warnings

_ORBAX = f'{os.sep}orbax{os.sep}'
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)|\[Errno (\d+)\]")   # tensorstore's, Python's
_LOGGERS = ('absl', 'orbax', 'asyncio')


def _chain(e: BaseException | None) -> list[BaseException]:
  """e, its cause (or context), that one's, ... (each once)."""
  chain = []
  while e is not None and e not in chain:
    chain.append(e)
    e = e.__cause__ or e.__context__
  return chain


@contextlib.contextmanager
def _unawaited_coroutines_ignored():
  """A failed write's coroutines, collected unstarted, warn 'never awaited': not news."""
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', r"coroutine '.*' was never awaited", RuntimeWarning)
    yield


def describe(e: BaseException, where: str) -> tuple[str, int | None]:
  """What a failed write comes down to, in one short line, and its errno when known.

  An OSError in the exception chain, else an OS error code or 'No space left on device' in its
  text, is said plainly with the file (or `where`); a bare RESOURCE_EXHAUSTED as running out of
  space; anything else as its type and first 200 characters.
  """
  chain = _chain(e)
  for x in chain:
    if isinstance(x, OSError) and x.errno:
      return f'{x.strerror or os.strerror(x.errno)} ({x.filename or where})', x.errno
  text = ' '.join(str(x) for x in chain)
  code = _OS_ERROR_CODE.search(text)
  if code:
    number = int(code.group(1) or code.group(2))
    return f'{os.strerror(number)} ({where})', number
  if 'No space left on device' in text:
    return f'{os.strerror(errno.ENOSPC)} ({where})', errno.ENOSPC
  if 'RESOURCE_EXHAUSTED' in text:
    return f'out of disk space or quota: RESOURCE_EXHAUSTED ({where})', None
  first = ' '.join(str(chain[0]).split())
  return f'{type(chain[0]).__name__}: {first[:200]}{"..." if len(first) > 200 else ""}', None


class CheckpointReadError(OSError):
  """An item of a checkpoint is missing or cannot be read; the checkpoint is left in place.
  strerror: what is wrong (one line), filename: the item's directory."""


def read_error(e: BaseException, item: str, what: str) -> CheckpointReadError:
  """The one-line error of a failed restore `e` of a checkpoint item: '<what> is missing' when
  its directory `item` is, else '<what> cannot be read (<describe(e)>)'; filename=item."""
  if not os.path.isdir(item):
    return CheckpointReadError(errno.ENOENT, f'{what} is missing', item)
  reason, number = describe(e, item)
  return CheckpointReadError(number or errno.EIO, f'{what} cannot be read ({reason})', item)


class _OrbaxErrorRecords(logging.Filter):
  """Drops ERROR records logged by orbax, or about its writes (their exception raised through
  orbax's code, or 'orbax' in the message: asyncio's reports of orbax's futures)."""

  def filter(self, record):
    if record.levelno != logging.ERROR:
      return True
    files = [record.pathname or '']
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
      files.append(tb.tb_frame.f_code.co_filename)
      tb = tb.tb_next
    return not (any(_ORBAX in f for f in files) or 'orbax' in record.getMessage())


def _orbax_noise(unraisable) -> bool:
  """A tensorstore callback into the event loop of an orbax write or read that already failed,
  or one of its read coroutines collected with that read's error."""
  if (isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == 'Event loop is closed'):
    return True
  code = getattr(unraisable.object, 'cr_code', None)
  return code is not None and _ORBAX in code.co_filename


class Quiet:
  """Mutes orbax's noise during each save and restore and, once one failed, until `close`
  (orbax's threads and tensorstore's writes and reads of a failed one go on failing, and
  logging, after it returned): its error records (absl and asyncio logging), the 'Event loop is
  closed' callbacks and its read coroutines collected with their error (sys.unraisablehook)."""

  def __init__(self):
    self.failed = False
    self._records = _OrbaxErrorRecords()
    self._hook = self._previous = None

  def _start(self) -> None:
    if self._hook is not None:
      return
    previous = sys.unraisablehook

    def hook(unraisable):
      if not _orbax_noise(unraisable):
        previous(unraisable)
    self._hook, self._previous = hook, previous
    sys.unraisablehook = hook
    for name in _LOGGERS:
      logging.getLogger(name).addFilter(self._records)

  def _stop(self) -> None:
    if self._hook is None:
      return
    for name in _LOGGERS:
      logging.getLogger(name).removeFilter(self._records)
    if sys.unraisablehook is self._hook:
      sys.unraisablehook = self._previous
    self._hook = self._previous = None

  def save(self):
    """Around one save (orbax's save and wait)."""
    return self._around((OSError, ValueError))

  def restore(self):
    """Around one restore: a truncated or altered file fails orbax's reads, whose tasks then
    print a traceback each ('Event loop is closed', thousands of lines for one checkpoint)."""
    return self._around(Exception)

  @contextlib.contextmanager
  def _around(self, errors):
    self._start()
    try:
      with _unawaited_coroutines_ignored():
        try:
          yield
        except errors as e:
          self.failed = True
          _release(e)
          raise
    finally:
      if not self.failed:
        self._stop()

  def close(self) -> None:
    """After orbax closed (its threads joined): collects what is left, unmutes."""
    if self.failed:
      with _unawaited_coroutines_ignored():
        gc.collect()
    self._stop()


def _release(e: BaseException) -> None:
  """Frees what a failed write keeps alive through `e` (orbax's threads hold it: its frames hold
  the failed asyncio tasks, which log their errors when collected, at any later time): clears
  the frames of its tracebacks and collects, now that it is muted."""
  for x in _chain(e):
    traceback.clear_frames(x.__traceback__)
  gc.collect()
