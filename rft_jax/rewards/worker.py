"""A reward worker process, and how verifiers travel to it (runner.py starts and feeds it).

The parent sends each verifier once, cloudpickled (pickle_for_workers), at start-up; then one
chunk (completions, answers, timeout_s, use_alarm, offset) per call, answered with
scoring.score_chunk's (values, status, first errors); None ends the worker.
"""
import pickle
import resource
import signal
import sys

import cloudpickle

from rft_jax.rewards.scoring import score_chunk

READY = 'ready'   # a worker's first message: its verifiers loaded


def _init_worker(memory_mb: int = 0):
  # Ctrl-C, and SIGTERM from `timeout`, SLURM's scancel or systemd, go to the whole process
  # group: the parent decides what happens to the workers. It finishes the step (which needs
  # them), checkpoints and ends them; were they to die first, the step would read as a reward
  # failure. A worker whose parent is gone reads EOF on its pipe and exits.
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
  if memory_mb:   # address space the verifiers may add on top of the worker's own
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = _address_space_bytes() + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY
                                            else min(soft, hard), hard))


def _address_space_bytes() -> int:
  """This process's current virtual memory size (VmSize), in bytes."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmSize:'):
        return int(line.split()[1]) * 1024
  return 0


def worker_main(conn, fn_blobs: list[tuple[str, bytes]], memory_mb: int) -> None:
  """A worker process: scores the chunks its pipe brings until None or the parent goes away.
  fn_blobs: [(name, cloudpickle of the verifier)], loaded (importing the verifiers' modules)
  before the memory limit, which is on what the verifiers allocate beyond that."""
  fns = [(name, pickle.loads(blob)) for name, blob in fn_blobs]
  _init_worker(memory_mb)
  conn.send(READY)
  while True:
    try:
      task = conn.recv()
    except (EOFError, OSError):   # The parent is gone.
      return
    if task is None:
      return
    conn.send(score_chunk(fns, *task))


def importable_by_name(module_name: str) -> bool:
  """Whether a fresh process could import `module_name`: its top-level package is found by
  the import system's finders (sys.path, an editable install's finder), not only present in
  this process's sys.modules."""
  top = module_name.partition('.')[0]
  for finder in sys.meta_path:   # classes (PathFinder) and instances
    find_spec = getattr(finder, 'find_spec', None)
    try:
      if find_spec is not None and find_spec(top, None) is not None:
        return True
    except Exception:  # pylint: disable=broad-exception-caught  (a finder's own failure)
      continue
  return False


def pickle_for_workers(fn) -> bytes:
  """cloudpickle of a verifier for the workers: by module and name where a worker can import
  the module, by value where it cannot. A recipe file loaded from its path (absl names its
  module `config_config`) is in this process's sys.modules only; its verifiers went by name,
  and every worker died at start-up (ModuleNotFoundError)."""
  module = sys.modules.get(getattr(fn, '__module__', None) or '')
  if module is not None and module.__name__ != '__main__' and not importable_by_name(
      module.__name__):
    cloudpickle.register_pickle_by_value(module)
  return cloudpickle.dumps(fn)
