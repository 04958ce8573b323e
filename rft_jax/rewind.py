"""Rewinding a stopped run to one of its checkpoints (`python -m tools.checkpoint rewind`).

A run halted by the failure monitor keeps its checkpoints, and the same command resumes from the
latest, which may be from after the fault's onset. `rewind(workdir, step)` sets the checkpoints
after `step` aside, so the same command (with e.g. a lower --config.optim.lr) resumes exactly
from `step`. Nothing is deleted: into workdir/checkpoints.rewound/<step>-<unix time>/ go

  <s>/                   each checkpoint after `step`, moved
  summary.json           moved: the finished run's summary (the run trains again)
  incidents.md           moved: the report of the steps set aside (rewritten when the run stops)
  metrics.jsonl          copied: the resume drops its records after `step` (jsonl.JsonlSink)
  incidents.jsonl        copied: the resume keeps the entries checkpoint `step` counted
                         (incidents.read_entries)

The workdir's lock (rft_jax/workdir_lock.py) is held while moving: a running run is refused.
`python -m tools.checkpoint rewind RUN --undo` puts the latest set-aside back (rewind_undo.py).
"""
import contextlib
import os
import shutil
import time

from rft_jax import workdir_lock
from rft_jax.checkpoint_manifest import steps_on_disk, verify
from rft_jax.workdir_config import RUN_CONFIG, is_run_workdir

REWOUND = 'checkpoints.rewound'
MOVED = ('summary.json', 'incidents.md')
COPIED = ('metrics.jsonl', 'incidents.jsonl')


class RewindError(ValueError):
  """Bad input for a rewind (not a run, no such checkpoint, a run in use); one line."""


def command(workdir: str, step: int) -> str:
  """The command line that rewinds `workdir` to checkpoint `step`."""
  return f'python -m tools.checkpoint rewind {workdir} --step {step}'


def undo_command(workdir: str, name: str = '') -> str:
  """The command line that puts back the latest (or the named) rewind of `workdir`."""
  return f'python -m tools.checkpoint rewind {workdir} --undo' + (f' {name}' if name else '')


def check_run(workdir: str) -> None:
  """Raises RewindError unless `workdir` is a run directory (its config.json an rft_jax run's)."""
  if not os.path.isfile(os.path.join(workdir, RUN_CONFIG)) or not is_run_workdir(workdir):
    raise RewindError(f'{workdir} is not a run directory (no {RUN_CONFIG} of an rft_jax run)')


@contextlib.contextmanager
def locked(workdir: str, then: str):
  """Holds the lock of run directory `workdir` for the block; RewindError (one line, ending
  'then <then>') when it does not exist or a running rft_jax process holds the lock."""
  if not os.path.isdir(workdir):
    raise RewindError(f'{workdir} is not a run directory (no such directory)')
  try:
    with workdir_lock.held(workdir):
      yield
  except workdir_lock.WorkdirBusy:
    raise RewindError(f'{workdir} is in use by a running rft_jax process; stop it (or wait for '
                      f'it to end), then {then}') from None


def check(workdir: str, step: int) -> list[int]:
  """-> the checkpoint steps after `step` (those a rewind sets aside); raises RewindError when
  workdir is not a run directory, or `step` is not one of its checkpoints or is damaged."""
  check_run(workdir)
  directory = os.path.join(workdir, 'checkpoints')
  steps = steps_on_disk(directory)
  if step not in steps:
    raise RewindError(f'no checkpoint at step {step} in {directory} (there: '
                      f'{", ".join(map(str, steps)) or "none"})')
  problem = verify(os.path.join(directory, str(step)))
  if problem not in (None, 'no manifest'):   # unverified (no manifest) is resumed from as is
    raise RewindError(f'checkpoint {step} in {directory} is damaged ({problem}); a resume '
                      'would set it aside, not start from it')
  return [s for s in steps if s > step]


def new_directory(base: str) -> str:
  """Creates the first of base, base-1, base-2, ... that does not exist -> its path."""
  dest, k = base, 1
  while os.path.lexists(dest):
    dest, k = f'{base}-{k}', k + 1
  os.makedirs(dest)
  return dest


def rewind(workdir: str, step: int) -> str:
  """Sets aside what is after checkpoint `step` of the run in `workdir` (module doc) -> the one
  line saying what was done and what to run next. Raises RewindError (module doc)."""
  workdir = os.path.abspath(workdir)
  with locked(workdir, then='rewind'):
    later = check(workdir, step)
    if not later:   # a finished run's summary.json: the same command says it is complete
      finished = os.path.isfile(os.path.join(workdir, 'summary.json'))
      return (f'checkpoint {step} is already the latest in {workdir}: nothing set aside; '
              + ('the run finished there (summary.json): raise config.train.steps to train on'
                 if finished else 'run the same training command to resume from it'))
    dest = new_directory(os.path.join(workdir, REWOUND, f'{step}-{int(time.time())}'))
    for name in COPIED:   # before the checkpoints move: a copy cut short loses nothing
      if os.path.isfile(os.path.join(workdir, name)):
        shutil.copy2(os.path.join(workdir, name), os.path.join(dest, name))
    for s in reversed(later):   # newest first: one cut short leaves a run to rewind again
      os.replace(os.path.join(workdir, 'checkpoints', str(s)), os.path.join(dest, str(s)))
    for name in MOVED:
      if os.path.isfile(os.path.join(workdir, name)):
        os.replace(os.path.join(workdir, name), os.path.join(dest, name))
  return (f'rewound {workdir} to checkpoint {step}: checkpoint(s) '
          f'{", ".join(map(str, later))} moved to {dest}; run the same training command '
          f'(e.g. with a lower --config.optim.lr) to resume from step {step}; '
          f'{undo_command(workdir)} puts them back')
