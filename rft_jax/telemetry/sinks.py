"""Telemetry sinks: console progress, a JSONL log, TensorBoard scalars.

Each sink is a `Hook`; `make_sinks` bundles the usual set into a `HookList`.

JSONL format (one object per line, flushed as it is written)::

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

import functools
import importlib
import io
import json
import logging
import math
import numbers
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rft_jax.telemetry.console import (DEFAULT_CONSOLE_KEYS, ConsoleSink,  # noqa: F401
                                      describe_incident, format_summary_value, format_value)
from rft_jax.telemetry.hooks import Hook, HookList
from rft_jax.telemetry.tb_guard import EventFileGuard

_NONFINITE_TO_JSON = {'nan': 'NaN', 'inf': 'Infinity', '-inf': '-Infinity'}
_JSON_TO_NONFINITE = {'NaN': math.nan, 'Infinity': math.inf,
                      '-Infinity': -math.inf}
_TEXT_FIELDS = ('kind', 'text')  # string fields never decoded as numbers
_TB_TAG_INVALID = re.compile(r'[^-/\w.]')   # what a TensorBoard tag cannot hold (tensorboardX)


# ----------------------------------------------------------------------------
# JSONL.


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


class JsonlSink(Hook):
  """Appends one JSON object per event to `path`, flushing every line.

  With `resume_step > 0`, lines logged after step `resume_step` by an earlier
  (crashed) run are dropped first, so the resumed run does not duplicate them;
  with `resume_step == 0` (nothing to resume) the file starts empty.

  A failed write (a full disk) raises an OSError naming the file, once: the file is then closed
  and later records are dropped, so the error is not raised again over the one that stopped the
  run, and closing prints nothing.
  """

  def __init__(self, path: str | os.PathLike, resume_step: int = 0):
    self.path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    if resume_step > 0 and os.path.exists(self.path):
      self._truncate_after(resume_step)
    self._step = resume_step
    self._failed = False   # a write failed (raised once, naming the file)
    # A fresh start (no checkpoint to resume from) replaces what a run that died before its
    # first checkpoint wrote: those steps run again.
    self._file: io.TextIOBase | None = open(self.path, 'a' if resume_step > 0 else 'w',
                                            encoding='utf-8')

  def _truncate_after(self, step: int) -> None:
    """Atomically rewrites the file keeping valid records with step <= `step`."""
    tmp = self.path + '.tmp'
    with open(self.path, encoding='utf-8') as src, \
         open(tmp, 'w', encoding='utf-8') as dst:
      for line in src:
        record = _decode_line(line)
        if record is not None and record.get('step', 0) <= step:
          dst.write(line if line.endswith('\n') else line + '\n')
      dst.flush()
      os.fsync(dst.fileno())
    os.replace(tmp, self.path)

  def write(self, step: int, kind: str, fields: Mapping[str, Any]) -> None:
    """Writes {"step", "kind", **fields} as one line and flushes it."""
    if self._failed:
      return   # the file failed (raised once): later records are dropped
    if self._file is None:
      raise ValueError(f'JsonlSink({self.path!r}) is closed')
    record = {'step': int(step), 'kind': kind}
    for key, value in fields.items():
      if key not in record:
        record[str(key)] = _to_json(value)
    try:
      self._file.write(json.dumps(record, allow_nan=False) + '\n')
      self._file.flush()
    except OSError as e:   # a full disk: name the file (the write itself names none)
      self._failed = True
      self._close_quietly()   # else close (or the garbage collector) retries the failed flush
      raise OSError(e.errno, e.strerror, self.path) from None

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

  def on_incident(self, step, incident):
    self.write(step, str(incident.get('kind', 'incident')),
               {k: v for k, v in incident.items() if k not in ('kind', 'step')})

  def on_end(self, summary):
    self.write(self._step, 'end', summary)

  def _close_quietly(self) -> None:
    file, self._file = self._file, None
    try:
      file.close()   # closes the descriptor even when the flush of what is left fails
    except OSError:
      pass

  def close(self):
    if self._file is not None:
      self._file.close()
      self._file = None


# ----------------------------------------------------------------------------
# TensorBoard.


class _RefuseTorchToTensorboardX:
  """A meta-path finder that refuses `import torch` when tensorboardX asks, and only then.

  tensorboardX's writer module imports torch where it is installed (Colab, or beside HF
  transformers) only to name `torch.Tensor` in type hints, and converts a torch tensor with a
  lazy import of its own; skipping it took a 3-step tiny run from 6.7 to 5.8-6.0 s here. The finder
  looks for a tensorboardX frame on the importing thread's stack, so torch stays importable for
  everyone else, in any thread, at any time.
  """

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name.partition('.')[0] != 'torch':
      return None
    frame = sys._getframe(1)   # pylint: disable=protected-access
    while frame is not None:
      if frame.f_globals.get('__name__', '').startswith('tensorboardX'):
        raise ImportError('torch is not imported for tensorboardX (rft_jax.telemetry.sinks)')
      frame = frame.f_back
    return None


def _summary_writer_class():
  """tensorboardX.SummaryWriter, imported without torch unless torch is already imported."""
  if 'tensorboardX' in sys.modules or 'torch' in sys.modules:
    return importlib.import_module('tensorboardX').SummaryWriter
  finder = _RefuseTorchToTensorboardX()
  sys.meta_path.insert(0, finder)
  try:
    return importlib.import_module('tensorboardX').SummaryWriter
  except ImportError:
    pass   # a tensorboardX that needs torch after all (or none at all): imported as usual below
  finally:
    sys.meta_path.remove(finder)
  return importlib.import_module('tensorboardX').SummaryWriter


@functools.lru_cache(maxsize=None)   # a few hundred metric names, each step
def tensorboard_tag(name: str) -> str:
  """The TensorBoard tag of a metric name. A tag holds letters, digits and '_-./' only: '@'
  becomes '_at_' ('eval/mean@8_acc' -> 'eval/mean_at_8_acc'), any other such character '_', and
  leading '/' are dropped (tensorboardX would turn '@' into '_' itself, logging each tag)."""
  return _TB_TAG_INVALID.sub('_', name.replace('@', '_at_')).lstrip('/')


class TensorBoardSink(Hook):
  """Writes every numeric metric as a TensorBoard scalar under its own name (`tensorboard_tag`:
  'eval/mean@8_acc' is 'eval/mean_at_8_acc').

  Messages, the config summary and the end summary go to the TEXT tab. With
  `resume_step > 0`, TensorBoard hides events an earlier run wrote after
  that step (tensorboardX `purge_step`); after a remediation rewind (`on_rewind`)
  it hides those of the abandoned steps the same way.

  A failed write of the event file (a full disk) is raised as an OSError naming the file by the
  next call, once; later events are dropped, and `close` neither raises nor prints
  (tb_guard.EventFileGuard: tensorboardX alone would hang the run).
  """

  def __init__(self, logdir: str | os.PathLike, resume_step: int = 0,
               flush_secs: int = 30):
    # Imported here so the console/JSONL sinks work without tensorboardX.
    SummaryWriter = _summary_writer_class()   # pylint: disable=invalid-name
    # NaN and inf are written as they are (TensorBoard plots them). tensorboardX would also log
    # 'NaN or Inf found in input tensor.' for each one without naming the metric; some metrics
    # are NaN by design (the credit correlations of a step where every group's rewards are
    # equal, monitor/credit.py), and a NaN loss is reported by the trainer and the monitor.
    logging.getLogger('tensorboardX.x2num').setLevel(logging.ERROR)
    self.logdir = os.fspath(logdir)
    self._step = resume_step
    self._writer = SummaryWriter(
        logdir=self.logdir, flush_secs=flush_secs,
        purge_step=resume_step + 1)   # hides events a crashed run logged after resume_step
    self._guard = EventFileGuard(self._writer, self.logdir)
    self._failed = False   # the event file's error was raised: later events are dropped

  def _writable(self) -> bool:
    """Whether to write; raises the event file's write error (naming it) the first time."""
    if self._failed:
      return False
    error = self._guard.failure()
    if error is not None:
      self._failed = True
      raise error
    return True

  def _scalars(self, step: int, values: Mapping[str, Any]) -> None:
    if not self._writable():
      return
    for name, value in values.items():
      if isinstance(value, numbers.Real) and not isinstance(value, bool):
        self._writer.add_scalar(tensorboard_tag(name), float(value), step)

  def on_start(self, step, total_steps, config_summary):
    self._step = step
    if config_summary and self._writable():
      rows = '\n'.join(f'| {k} | {v} |' for k, v in config_summary.items())
      self._writer.add_text('config', '| key | value |\n|---|---|\n' + rows, step)

  def on_step(self, step, metrics):
    self._step = step
    self._scalars(step, metrics)

  def on_eval(self, step, results):
    self._scalars(step, results)

  def on_message(self, text):
    if self._writable():
      self._writer.add_text('messages', str(text), self._step)

  def on_incident(self, step, incident):
    if self._writable():
      self._writer.add_text('incidents', describe_incident(step, incident), step)

  def on_rewind(self, step):
    """A SessionLog START at step + 1, as tensorboardX writes for `purge_step`: TensorBoard
    then drops the events logged before it with a step after `step` (the abandoned ones)."""
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._step = step
    if not self._writable():
      return
    self._writer.file_writer.add_event(event_pb2.Event(
        step=step + 1, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def on_end(self, summary):
    if not self._writable():
      return
    lines = '\n'.join(f'- {k}: {format_summary_value(str(k), v)}'
                      for k, v in summary.items())
    self._writer.add_text('summary', lines, self._step)
    self._writer.flush()
    self._writable()   # the flush's error, if it failed

  def close(self):
    """Flushes and closes the event file. Never raises nor prints an I/O error (the run may be
    stopping for another one); on_end's flush has reported it."""
    if self._writer is not None:
      writer, self._writer = self._writer, None
      writer.flush()
      writer.close()


# ----------------------------------------------------------------------------


class WandbSink(Hook):
  """Weights & Biases: scalars per step and eval, incidents and the summary (optional)."""

  def __init__(self, project: str, run_name: str, workdir: str, resume_step: int = 0):
    import wandb  # pylint: disable=g-import-not-at-top  (optional dependency)
    self._wandb = wandb
    self._run = wandb.init(project=project, name=run_name, dir=workdir, resume='allow')
    self._resume_step = resume_step

  def _scalars(self, step, values):
    self._run.log({k: float(v) for k, v in values.items()
                   if isinstance(v, numbers.Real) and not isinstance(v, bool)}, step=step)

  def on_step(self, step, metrics):
    self._scalars(step, metrics)

  def on_eval(self, step, results):
    self._scalars(step, results)

  def on_incident(self, step, incident):
    self._run.log({'incidents': describe_incident(step, incident)}, step=step)

  def on_end(self, summary):
    self._run.summary.update(dict(summary))

  def close(self):
    self._run.finish()


def make_sinks(workdir: str | os.PathLike, *, console: bool = True,
               jsonl: bool = True, tensorboard: bool = True,
               total_steps: int = 0, resume_step: int = 0,
               console_keys: Sequence[tuple[str, str]] = DEFAULT_CONSOLE_KEYS,
               wandb_project: str = '', run_name: str = '') -> HookList:
  """The standard sinks for a run: console, workdir/metrics.jsonl, workdir/tb."""
  workdir = os.fspath(workdir)
  hooks = HookList()
  if console:
    hooks.append(ConsoleSink(keys=console_keys, total_steps=total_steps))
  if jsonl:
    hooks.append(JsonlSink(os.path.join(workdir, 'metrics.jsonl'),
                           resume_step=resume_step))
  if tensorboard:
    hooks.append(TensorBoardSink(os.path.join(workdir, 'tb'),
                                 resume_step=resume_step))
  if wandb_project:
    hooks.append(WandbSink(wandb_project, run_name or os.path.basename(workdir), workdir,
                           resume_step=resume_step))
  return hooks
