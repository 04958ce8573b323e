"""Putting a rewind back (`python -m tools.checkpoint rewind RUN --undo [NAME]`).

A rewind to step N (rft_jax/rewind.py) set the run's checkpoints after N, its summary.json and
incidents.md aside in RUN/checkpoints.rewound/<N>-<unix time>/, with copies of metrics.jsonl and
incidents.jsonl. `undo(workdir)` moves the latest such set-aside (or the one named) back:

  <s>/                   each checkpoint, back into RUN/checkpoints (newest first)
  summary.json, incidents.md      back into RUN
  metrics.jsonl, incidents.jsonl  the copies replace RUN's: the logs match the checkpoints again

then removes the emptied set-aside directory (and checkpoints.rewound when it is left empty):
the run directory is as it was before the rewind. Refused (RewindError, one line, nothing moved)
when the run went on since the rewind (a checkpoint after N: two histories would mix), when its
checkpoint N is gone (a later rewind went further back: undo that one first), when there is
nothing to put back, when the run is in use, and when the set-aside is damaged or incomplete.

A resume that wrote no checkpoint after N may still have written summary.json, incidents.md or
log records: those files are not deleted but moved to checkpoints.rewound/<N>-<time>.replaced/.
"""
import filecmp
import os
import re

from rft_jax import jsonfile
from rft_jax.checkpoint_manifest import steps_on_disk, verify
from rft_jax.rewind import (COPIED, MOVED, REWOUND, RewindError, check_run, command, locked,
                            new_directory, undo_command)

_NAME = re.compile(r'(\d+)-(\d+)(?:-(\d+))?')   # <step>-<unix time>[-k], as rewind names it


def set_asides(workdir: str) -> list[str]:
  """The names of the set-aside rewinds in workdir/checkpoints.rewound, oldest first (by the
  time in the name, then the directory's modification time, then the -k suffix)."""
  base = os.path.join(workdir, REWOUND)
  names = [n for n in (os.listdir(base) if os.path.isdir(base) else [])
           if _NAME.fullmatch(n) and os.path.isdir(os.path.join(base, n))]

  def order(name):
    _, made, k = _NAME.fullmatch(name).groups()
    return int(made), os.stat(os.path.join(base, name)).st_mtime_ns, int(k or 0)
  return sorted(names, key=order)


def pick(workdir: str, name: str) -> str:
  """-> the set-aside directory to put back: the named one, else the latest; RewindError when
  there is none."""
  names = set_asides(workdir)
  where = os.path.join(workdir, REWOUND)
  if not names:
    raise RewindError(f'nothing to put back: no set-aside rewind in {where}')
  if name and name not in names:
    raise RewindError(f'no set-aside rewind {name} in {where} (there: {", ".join(names)})')
  return os.path.join(where, name or names[-1])


def check_set_aside(workdir: str, kept: str, step: int) -> list[int]:
  """-> the checkpoint steps in set-aside directory `kept` of a rewind to `step`; RewindError
  naming what is wrong when it is not what a rewind leaves: an entry a rewind never sets aside,
  no checkpoint or one not after `step`, a damaged checkpoint (its manifest), an unreadable
  summary.json, or no copy of a log that the run has."""
  steps = []
  for entry in sorted(os.listdir(kept)):
    path = os.path.join(kept, entry)
    if entry.isdigit() and os.path.isdir(path) and int(entry) > step:
      steps.append(int(entry))
    elif not (entry in MOVED + COPIED and os.path.isfile(path)):
      raise RewindError(f'{kept} is damaged: {entry} is nothing a rewind to step {step} sets '
                        'aside; put it back by hand, or remove that entry first')
  if not steps:
    raise RewindError(f'{kept} is incomplete: no checkpoint after step {step} in it (a rewind '
                      'cut short?); its files are left as they are')
  for s in steps:
    problem = verify(os.path.join(kept, str(s)))
    if problem not in (None, 'no manifest'):   # unverified: resumed from as is, as by rewind
      raise RewindError(f'{kept} is damaged: checkpoint {s} ({problem}); nothing put back')
  if os.path.isfile(os.path.join(kept, 'summary.json')):
    try:
      jsonfile.read_object(os.path.join(kept, 'summary.json'))
    except (OSError, ValueError) as e:
      raise RewindError(f'{kept} is damaged: {e}; nothing put back') from None
  for name in COPIED:
    if os.path.isfile(os.path.join(workdir, name)) and not os.path.isfile(
        os.path.join(kept, name)):
      raise RewindError(f'{kept} is incomplete: no copy of {name} (the run has one, which '
                        'would not match the checkpoints put back); nothing put back')
  return sorted(steps)


def check_run_state(workdir: str, kept: str, step: int) -> None:
  """RewindError unless checkpoint `step` is the latest of the run: one after it means the run
  went on since the rewind (its new checkpoints and the set-aside ones are two histories), none
  means a later rewind set it aside too (that one is put back first)."""
  name = os.path.basename(kept)
  directory = os.path.join(workdir, 'checkpoints')
  steps = steps_on_disk(directory)
  later = [s for s in steps if s > step]
  if later:
    raise RewindError(
        f'{workdir} went on after its rewind to step {step}: checkpoint(s) '
        f'{", ".join(map(str, later))} were written since, and putting {kept} back would mix '
        'two histories; nothing put back. To keep the new run, leave it (the set-aside stays); '
        f'to go back to the set-aside one: {command(workdir, step)}, then '
        f'{undo_command(workdir, name)}')
  if step not in steps:
    raise RewindError(
        f'checkpoint {step}, from which {kept} goes on, is not in {directory} (there: '
        f'{", ".join(map(str, steps)) or "none"}): a later rewind set it aside? put that one '
        f'back first ({undo_command(workdir)}); nothing put back')


def written_since(workdir: str, kept: str) -> list[str]:
  """The files of workdir that the undo would replace and that differ from what it puts back:
  summary.json and incidents.md (a rewind moved them away: a resume wrote these), and logs
  that differ from their set-aside copies (a resume appended to them)."""
  out = [n for n in MOVED if os.path.isfile(os.path.join(workdir, n))]
  for name in COPIED:
    here, copy = os.path.join(workdir, name), os.path.join(kept, name)
    if os.path.isfile(here) and os.path.isfile(copy) and not filecmp.cmp(here, copy, False):
      out.append(name)
  return out


def _move_aside(workdir: str, kept: str, names: list[str]) -> str:
  """Moves `names` of workdir into a new directory <kept>.replaced[-k] -> that directory."""
  dest = new_directory(f'{kept}.replaced')
  for name in names:
    os.replace(os.path.join(workdir, name), os.path.join(dest, name))
  return dest


def _put_back(workdir: str, kept: str, steps: list[int]) -> None:
  """Moves the set-aside files back: the logs first, then the checkpoints newest first (cut
  short, the run resumes from the latest set-aside one, with its logs), then summary.json and
  incidents.md; removes the emptied directories."""
  for name in COPIED:
    if os.path.isfile(os.path.join(kept, name)):
      os.replace(os.path.join(kept, name), os.path.join(workdir, name))
  for s in reversed(steps):
    os.replace(os.path.join(kept, str(s)), os.path.join(workdir, 'checkpoints', str(s)))
  for name in MOVED:
    if os.path.isfile(os.path.join(kept, name)):
      os.replace(os.path.join(kept, name), os.path.join(workdir, name))
  os.rmdir(kept)   # empty now (check_set_aside: nothing else was in it)
  base = os.path.dirname(kept)
  if not os.listdir(base):
    os.rmdir(base)


def undo(workdir: str, name: str = '') -> str:
  """Puts back the latest (or the named) set-aside rewind of the run in `workdir` (module doc)
  -> the one line saying what was done. Raises RewindError (module doc)."""
  workdir = os.path.abspath(workdir)
  with locked(workdir, then='undo the rewind'):
    check_run(workdir)
    kept = pick(workdir, name)
    step = int(_NAME.fullmatch(os.path.basename(kept))[1])
    check_run_state(workdir, kept, step)
    steps = check_set_aside(workdir, kept, step)
    replaced = written_since(workdir, kept)
    moved = _move_aside(workdir, kept, replaced) if replaced else ''
    finished = os.path.isfile(os.path.join(kept, 'summary.json'))
    _put_back(workdir, kept, steps)
  next_step = (f'the run finished at step {steps[-1]} (summary.json) as before' if finished else
               f'run the same training command to resume from step {steps[-1]}')
  since = (f'; {", ".join(replaced)} written since the rewind moved to {moved}' if replaced
           else '')
  return (f'put back the rewind of {workdir} to step {step}: checkpoint(s) '
          f'{", ".join(map(str, steps))} and the files set aside in {kept} are back; '
          f'{next_step}{since}')
