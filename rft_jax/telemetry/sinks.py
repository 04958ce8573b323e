"""Telemetry sinks: console progress, a JSONL log, TensorBoard scalars, W&B.

Each sink is a `Hook`; `make_sinks` bundles the usual set into a `HookList`. The JSONL log
(metrics.jsonl, its format, `read_jsonl`) is in rft_jax/telemetry/jsonl.py.

A sink whose file cannot be written (a full disk) never stops the run: it reports the error in
one line naming the file (`report`, default stderr), tries again later, and says what was lost.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import numbers
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rft_jax.telemetry.console import (DEFAULT_CONSOLE_KEYS, ConsoleSink,  # noqa: F401
                                      describe_incident, evidence_text,
                                      format_summary_value, format_value, incident_name)
from rft_jax.telemetry import jsonl
from rft_jax.telemetry.hooks import Hook, HookList
from rft_jax.telemetry.jsonl import JsonlSink, read_jsonl  # noqa: F401
from rft_jax.telemetry.jsonl import LostSteps
from rft_jax.telemetry.tb_guard import EventFileGuard

_MIN_FREE_BYTES = 1 << 20   # room a new event file wants after a failed one
_TB_TAG_INVALID = re.compile(r'[^-/\w.]')   # what a TensorBoard tag cannot hold (tensorboardX)


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

  A failed write of the event file (a full disk) never stops nor hangs the run
  (tb_guard.EventFileGuard: tensorboardX alone would hang it): `report` (default: one line on
  stderr) gets one line naming the file, and events are dropped from then on; every REOPEN_S
  seconds, while the disk has room, the next event tries a new event file in the same logdir
  (TensorBoard reads the files in turn), where a message names the steps whose events were
  lost, and `report` gets a line saying so. `close` neither raises nor prints.
  """

  REOPEN_S = 30.0   # how long after a failed event file the sink tries a new one

  def __init__(self, logdir: str | os.PathLike, resume_step: int = 0,
               flush_secs: int = 30, report: Callable[[str], None] | None = None):
    # NaN and inf are written as they are (TensorBoard plots them). tensorboardX would also log
    # 'NaN or Inf found in input tensor.' for each one without naming the metric; some metrics
    # are NaN by design (the credit correlations of a step where every group's rewards are
    # equal, monitor/credit.py), and a NaN loss is reported by the trainer and the monitor.
    logging.getLogger('tensorboardX.x2num').setLevel(logging.ERROR)
    self.logdir = os.fspath(logdir)
    self._flush_secs = flush_secs
    self._report = report or jsonl.warn
    self._step = resume_step
    self._error: OSError | None = None   # the failed event file's error (reported once)
    self._retry_at = 0.0                 # time.monotonic() of the next try of a new file
    self._lost = LostSteps()             # the events dropped since it failed
    self._rewound: int | None = None     # a rewind while no file was open
    self._files = 0                       # event files opened
    self._open(purge_step=resume_step + 1)   # hides events a crashed run logged after it

  def _open(self, purge_step: int | None = None) -> None:
    # Imported here so the console/JSONL sinks work without tensorboardX.
    SummaryWriter = _summary_writer_class()   # pylint: disable=invalid-name
    self._files += 1   # a new file after a failed one is never the failed one (its name holds
    # the time in seconds: opening it again would empty it)
    self._writer = SummaryWriter(logdir=self.logdir, flush_secs=self._flush_secs,
                                 purge_step=purge_step, filename_suffix=(
                                     f'.{self._files}' if self._files > 1 else ''))
    self._guard = EventFileGuard(self._writer, self.logdir)

  def _writable(self, step: int, events: int = 1) -> bool:
    """Whether to write `events` events of `step` now (else they are counted as lost)."""
    if self._writer is not None:
      error = self._guard.failure()
      if error is None:
        return True
      self._drop_writer(error)
    if time.monotonic() >= self._retry_at and self._reopen():
      return True
    self._lost.add(step, events)
    return False

  def _drop_writer(self, error: OSError) -> None:
    """Reports the event file's error (once) and closes it without waiting on it."""
    writer, self._writer = self._writer, None
    with contextlib.suppress(Exception):
      writer.close()   # quiet and quick: the guard drops what the failed file would get
    self._lost.merge(self._guard.lost_steps)
    if self._error is None:
      self._report(f'{error.filename}: {error.strerror} (errno {error.errno}): TensorBoard '
                   f'events are dropped and a new event file is tried every '
                   f'{self.REOPEN_S:.0f} s; the run goes on')
    self._error = error
    self._retry_at = time.monotonic() + self.REOPEN_S

  def _reopen(self) -> bool:
    """A new event file after the failed one, if the disk has room; True if it opened."""
    self._retry_at = time.monotonic() + self.REOPEN_S
    try:
      if shutil.disk_usage(self.logdir).free < _MIN_FREE_BYTES:
        return False
      self._open()
    except OSError:
      self._writer = None
      return False
    if self._rewound is not None:
      self._purge_after(self._rewound)
      self._rewound = None
    lost, error = self._lost, self._error
    what = f'{lost.count} events{lost.steps()}'
    self._writer.add_text('messages', f'{what} were not written: {error.strerror} writing '
                          f'{error.filename}', self._step)
    self._report(f'{self.logdir}: TensorBoard events go to {self._guard.path} after '
                 f'"{error.strerror}"; {what} were lost')
    self._lost, self._error = LostSteps(), None
    return True

  def _scalars(self, step: int, values: Mapping[str, Any]) -> None:
    values = {name: float(value) for name, value in values.items()
              if isinstance(value, numbers.Real) and not isinstance(value, bool)}
    if values and self._writable(step, len(values)):
      for name, value in values.items():
        self._writer.add_scalar(tensorboard_tag(name), value, step)

  def on_start(self, step, total_steps, config_summary):
    self._step = step
    if config_summary and self._writable(step):
      rows = '\n'.join(f'| {k} | {v} |' for k, v in config_summary.items())
      self._writer.add_text('config', '| key | value |\n|---|---|\n' + rows, step)

  def on_step(self, step, metrics):
    self._step = step
    self._scalars(step, metrics)

  def on_eval(self, step, results):
    self._scalars(step, results)

  def on_message(self, text):
    if self._writable(self._step):
      self._writer.add_text('messages', str(text), self._step)

  def on_step_message(self, step, text):
    if self._writable(step):
      self._writer.add_text('messages', str(text), step)

  def on_incident(self, step, incident):
    if self._writable(step):
      self._writer.add_text('incidents', describe_incident(step, incident), step)

  def on_rewind(self, step):
    """A SessionLog START at step + 1, as tensorboardX writes for `purge_step`: TensorBoard
    then drops the events logged before it with a step after `step` (the abandoned ones)."""
    self._step = step
    if self._writable(step):
      self._purge_after(step)
    else:   # written in the next event file
      self._rewound = step if self._rewound is None else min(self._rewound, step)

  def _purge_after(self, step: int) -> None:
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._writer.file_writer.add_event(event_pb2.Event(
        step=step + 1, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def on_end(self, summary):
    if not self._writable(self._step):
      return
    lines = '\n'.join(f'- {k}: {format_summary_value(str(k), v)}'
                      for k, v in summary.items())
    self._writer.add_text('summary', lines, self._step)
    self._writer.flush()
    self._writable(self._step, 0)   # the flush's error, if it failed: reported

  def close(self):
    """Flushes and closes the event file. Never raises nor prints an I/O error (the run may be
    stopping for another one); a write error it meets is reported through `report`."""
    if self._writer is not None:
      writer, self._writer = self._writer, None
      writer.flush()
      writer.close()
      error = self._guard.failure()
      if error is not None and self._error is None:
        self._report(f'{error.filename}: {error.strerror} (errno {error.errno}): the last '
                     'TensorBoard events were not written')
    if self._error is not None:   # failed, and no new file since
      lost = self._lost
      self._report(f'{self.logdir}: {lost.count} TensorBoard events{lost.steps()} were not '
                   f'written: {self._error.strerror}')
      self._error = None


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
  """The standard sinks for a run: console, workdir/metrics.jsonl, workdir/tb (and W&B).

  A sink that cannot be made (tb a file, W&B failing to start) closes those already made (the
  JSONL file, TensorBoard's writer thread and event file) before its error propagates as it was.
  """
  workdir = os.fspath(workdir)
  hooks = HookList()
  try:
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
  except BaseException:   # Ctrl-C too: nothing made here outlives the call
    with contextlib.suppress(Exception):   # the first error is the one to report
      hooks.close()
    raise
  return hooks
