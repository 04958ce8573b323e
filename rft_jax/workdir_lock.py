"""One run at a time in a workdir: an exclusive `flock` on the directory itself.

Two invocations of the same command in one workdir (a second terminal, a job started twice)
would otherwise both train, write the same checkpoints and interleave `metrics.jsonl`; the
second one died later on a raw OSError from a checkpoint the first had removed. The lock is
taken before anything in the workdir is read and released when the process ends, however it
ends (`kill -9` too: the kernel drops it). Only process 0 of a multi-process (`jax.distributed`)
run takes it: the others share its workdir.
"""
import contextlib
import fcntl
import os
from typing import Iterator


class WorkdirBusy(Exception):
  """Another process holds the workdir's lock; the message is one line."""


@contextlib.contextmanager
def held(workdir: str, take: bool = True) -> Iterator[None]:
  """Holds an exclusive lock on directory `workdir` (which must exist) for the block.

  Raises WorkdirBusy at once, without waiting, when another open file holds it. take=False (a
  process other than 0) or a file system without flock on directories: no lock.
  """
  if not take:
    yield
    return
  fd = os.open(workdir, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise WorkdirBusy(
          f'--workdir={workdir} is in use by another rft_jax run (a second invocation of the '
          'command?); wait for it to end, or stop it, then run the command again; or use '
          'another --workdir') from None
    except OSError:   # no flock here (some network file systems): run unlocked
      pass
    yield
  finally:
    os.close(fd)   # closing the only descriptor releases the lock
