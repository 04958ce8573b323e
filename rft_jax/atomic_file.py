"""Writing a run's file whole or not at all: into `<path>.tmp`, then renamed over `path`.

A reader (a resume, `api.open_run`, a user's viewer) never sees half a file, and a write that
fails (a full disk) keeps the earlier file as it was and leaves no `.tmp` behind.
"""
import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
  """Yields the temporary path to write; once the block ends without an error it replaces
  `path` (os.replace, atomic within a file system). Whatever happens, the temporary is gone."""
  tmp = os.fspath(path) + '.tmp'
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    with contextlib.suppress(OSError):
      os.remove(tmp)
