"""The JSONL log (metrics.jsonl): `JsonlSink` writes it, `read_jsonl` reads it back.

One object per line, written as it comes::

  {"step": 0,  "kind": "start", "total_steps": 150, "config": {...}}
  {"step": 12, "kind": "train", "reward/mean": 0.5, "kl": 0.003, ...}
  {"step": 20, "kind": "eval", "eval/greedy_acc": 0.41}
  {"step": 20, "kind": "message", "text": "resumed from step 20"}
  {"step": 150, "kind": "end", "steps": 150, "wall_s": 812.4, ...}

Non-finite floats are written as the JSON strings "NaN", "Infinity" and
"-Infinity" (plain JSON has no such numbers; strings keep NaN and +-inf
apart, which null would not). `read_jsonl` turns them back into floats.
"""

from __future__ import annotations

import contextlib
import collections
import json
import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from rft_jax.telemetry.hooks import Hook

_NONFINITE_TO_JSON = {'nan': 'NaN', 'inf': 'Infinity', '-inf': '-Infinity'}
_JSON_TO_NONFINITE = {'NaN': math.nan, 'Infinity': math.inf,
                      '-Infinity': -math.inf}
_TEXT_FIELDS = ('kind', 'text')  # string fields never decoded as numbers
MAX_HELD_BYTES = 32 << 20   # records held in memory while the file cannot be written


class LostSteps:
  """A count of dropped events and the lowest and highest step among them (constant memory,
  however long the disk stays full)."""

  def __init__(self):
    self.count, self.lo, self.hi = 0, None, None

  def add(self, step: int, events: int = 1) -> None:
    self._extend(events, step, step)

  def merge(self, other: 'LostSteps') -> None:
    self._extend(other.count, other.lo, other.hi)

  def _extend(self, count: int, lo, hi) -> None:
    if count > 0:
      self.count += count
      self.lo = lo if self.lo is None else min(self.lo, lo)
      self.hi = hi if self.hi is None else max(self.hi, hi)

  def steps(self) -> str:
    """' (steps LO-HI)', or '' when nothing was lost."""
    return f' (steps {self.lo}-{self.hi})' if self.count else ''


def _to_json(value: Any) -> Any:
  """Converts `value` (numpy/jax scalars included) to JSON-safe Python."""
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    value = float(value)
    return value if math.isfinite(value) else _NONFINITE_TO_JSON[str(value)]
  if isinstance(value, Mapping):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_to_json(v) for v in value]
  if hasattr(value, 'item') and getattr(value, 'size', None) == 1:
    return _to_json(value.item())
  return str(value)


def _from_json(value: Any) -> Any:
  """Inverse of `_to_json` for the non-finite float markers."""
  if isinstance(value, str):
    return _JSON_TO_NONFINITE.get(value, value)
  if isinstance(value, dict):
    return {k: _from_json(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_from_json(v) for v in value]
  return value


def _decode_line(line: str) -> dict[str, Any] | None:
  """Parses one JSONL line; None for blank or torn (half-written) lines."""
  line = line.strip()
  if not line:
    return None
  try:
    record = json.loads(line)
  except json.JSONDecodeError:
    return None
  if not isinstance(record, dict):
    return None
  return {k: (v if k in _TEXT_FIELDS else _from_json(v))
          for k, v in record.items()}


def read_jsonl(path: str | os.PathLike,
               kind: str | None = None) -> list[dict[str, Any]]:
  """Reads a JsonlSink file; NaN/inf markers come back as floats.

  Args:
    path: the file.
    kind: keep only records of this kind ('train', 'eval', ...); None keeps all.
  Returns:
    The records in file order. Unparseable lines (a write torn by a crash)
    are skipped.
  """
  records = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      record = _decode_line(line)
      if record is not None and (kind is None or record.get('kind') == kind):
        records.append(record)
  return records


def warn(text: str) -> None:
  """The default way a sink reports a write error it goes on from: one line on stderr."""
  print(f'warning: {text}', file=sys.stderr, flush=True)


def _steps(first: int, last: int) -> str:
  return f'step {first}' if first == last else f'steps {first}-{last}'


class JsonlSink(Hook):
  """Appends one JSON object per event to `path`, each line written to the file as it comes.

  With `resume_step > 0`, lines logged after the checkpoint of step `resume_step` by an
  earlier (crashed) run are dropped first, so the resumed run does not duplicate them;
  with `resume_step == 0` (nothing to resume) the file starts empty.

  A failed write (a full disk) never stops the run: `report` (default: one line on stderr) gets
  one line naming the file and the error, and the records are then held in memory and tried
  again with each later one, in order; once a write succeeds they are all written and `report`
  gets a line saying so. Up to MAX_HELD_BYTES are held (the oldest go first): lost records leave
  a 'message' record in their place saying how many and which steps, and a line to `report`.
  Whatever close cannot write is reported the same way; close never raises an I/O error.
  """

  def __init__(self, path: str | os.PathLike, resume_step: int = 0,
               report: Callable[[str], None] | None = None):
    self.path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    if resume_step > 0 and os.path.exists(self.path):
      self._truncate_after(resume_step)
    self._step = resume_step
    self._report = report or warn
    self._held: collections.deque[tuple[int, bytes]] = collections.deque()  # (step, line)
    self._held_bytes = 0
    self._error: OSError | None = None   # the write error the held records wait out
    self._waited = 0                      # held records that went through a failed write
    self._late = 0                        # of these, how many were written since
    self._lost = LostSteps()              # records dropped (not noted in the file yet)
    self._lost_total = 0
    # A fresh start (no checkpoint to resume from) replaces what a run that died before its
    # first checkpoint wrote: those steps run again. Unbuffered: each line goes to the file
    # when written, so a failed write is seen at once; appending: a line is written at the end
    # once the torn tail of a failed one is cut off.
    self._file: Any = open(self.path, 'ab', buffering=0)
    if resume_step <= 0:
      self._file.truncate(0)
    self._size = self._file.seek(0, os.SEEK_END)   # where the last whole line ends

  def _truncate_after(self, step: int) -> None:
    """Atomically rewrites the file keeping the valid records logged before the checkpoint of
    `step` was saved (up to the last 'train' record of `step`: after an `auto` restore they
    include the abandoned steps above it and the incident that restored, which a resume
    during the replay used to drop) and those of steps <= `step` after it."""
    def records(src):   # the valid records, numbered (two passes: the file may be large)
      return ((i, line, r) for i, line in enumerate(src) if (r := _decode_line(line)) is not None)
    with open(self.path, encoding='utf-8') as src:
      saved = max((i for i, _, r in records(src)
                   if r.get('kind') == 'train' and r.get('step') == step), default=-1)
    tmp = self.path + '.tmp'
    with open(self.path, encoding='utf-8') as src, open(tmp, 'w', encoding='utf-8') as dst:
      for i, line, record in records(src):
        if i <= saved or record.get('step', 0) <= step:
          dst.write(line if line.endswith('\n') else line + '\n')
      dst.flush()
      os.fsync(dst.fileno())
    os.replace(tmp, self.path)

  def write(self, step: int, kind: str, fields: Mapping[str, Any]) -> None:
    """Writes {"step", "kind", **fields} as one line (or holds it while the file fails)."""
    if self._file is None:
      raise ValueError(f'JsonlSink({self.path!r}) is closed')
    record = {'step': int(step), 'kind': kind}
    for key, value in fields.items():
      if key not in record:
        record[str(key)] = _to_json(value)
    self._hold(int(step), record)
    self._write_held()

  def _hold(self, step: int, record: Mapping[str, Any]) -> None:
    line = (json.dumps(record, allow_nan=False) + '\n').encode('utf-8')
    self._held.append((step, line))
    self._held_bytes += len(line)
    while self._held_bytes > MAX_HELD_BYTES and len(self._held) > 1:
      lost_step, lost = self._held.popleft()
      self._held_bytes -= len(lost)
      self._waited -= self._waited > 0
      self._lost.add(lost_step)
      self._lost_total += 1

  def _write_held(self) -> bool:
    """Writes the held records in order; False (the error reported once) if one fails."""
    try:
      if self._error is not None:
        self._file.truncate(self._size)   # the part of a line a failed write left
      if self._lost.count:   # a note where the lost records were
        self._write_line(self._note_line())
        self._lost = LostSteps()
      while self._held:
        step, line = self._held[0]
        self._write_line(line)
        self._held.popleft()
        self._held_bytes -= len(line)
        if self._waited:
          self._waited -= 1
          self._late += 1
    except OSError as e:
      with contextlib.suppress(OSError):   # the torn part, now: a later write may tear it again
        self._file.truncate(self._size)
      self._waited = len(self._held)
      if self._error is None:
        self._error = OSError(e.errno, e.strerror or str(e), self.path)
        self._report(f'{self.path}: {self._error.strerror} (errno {e.errno}): metrics records '
                     'are held in memory and written once a write succeeds again; the run '
                     'goes on')
      return False
    if self._error is not None:
      lost = f', {self._lost_total} lost' if self._lost_total else ''
      self._report(f'{self.path}: written again after "{self._error.strerror}": '
                   f'{self._late} records held meanwhile are in it{lost}')
      self._error, self._late, self._lost_total = None, 0, 0
    return True

  def _write_line(self, line: bytes) -> None:
    view = memoryview(line)
    while view:
      written = self._file.write(view)
      if not written:
        raise OSError(0, 'nothing was written')
      view = view[written:]
    self._size += len(line)

  def _note_line(self) -> bytes:
    text = (f'{self._lost.count} records ({_steps(self._lost.lo, self._lost.hi)}) were '
            f'lost: {self._error.strerror if self._error else "write error"} writing this file')
    return (json.dumps({'step': self._lost.hi, 'kind': 'message', 'text': text}) + '\n'
            ).encode('utf-8')

  def on_start(self, step, total_steps, config_summary):
    self._step = step
    self.write(step, 'start', {'total_steps': total_steps,
                               'config': dict(config_summary)})

  def on_step(self, step, metrics):
    self._step = step
    self.write(step, 'train', metrics)

  def on_eval(self, step, results):
    self.write(step, 'eval', results)

  def on_message(self, text):
    self.write(self._step, 'message', {'text': str(text)})

  def on_step_message(self, step, text):
    self.write(step, 'message', {'text': str(text)})

  def on_incident(self, step, incident):
    self.write(step, str(incident.get('kind', 'incident')),
               {k: v for k, v in incident.items() if k not in ('kind', 'step')})

  def on_end(self, summary):
    self.write(self._step, 'end', summary)

  def close(self):
    """Tries the held records once more, then closes the file; reports (never raises) what
    could not be written."""
    if self._file is None:
      return
    if (self._held or self._lost.count) and not self._write_held():
      unwritten = LostSteps()
      unwritten.merge(self._lost)
      for step, _ in self._held:
        unwritten.add(step)
      where = _steps(unwritten.lo, unwritten.hi)
      self._report(f'{self.path}: {unwritten.count} records ({where}) '
                   f'not written at close: {self._error.strerror}')
    file, self._file = self._file, None
    try:
      file.close()
    except OSError:
      pass
