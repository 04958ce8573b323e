"""Console output: a rich progress bar (plain lines when not a terminal), eval lines, incident
lines and the end-of-run summary table."""

from __future__ import annotations

import importlib.util
import math
import numbers
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress,
                           SpinnerColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from rft_jax.telemetry.hooks import Hook

DEFAULT_CONSOLE_KEYS = (('reward/mean', 'reward'), ('kl', 'kl'),
                        ('entropy', 'entropy'), ('response/len_mean', 'len'))


class RunConsole(Console):
  """A rich Console that outlives a closed stdout (`... | head`, a `tee` that died): rich's
  default ends the process (SystemExit(1), and nothing said) at the first line printed after
  the reader went away, which stopped a run between checkpoints. Here the console goes quiet
  with one line on stderr and the run goes on (its records still go to metrics.jsonl). When
  stderr went with it (`2>&1 | head`), that line cannot be written either: stderr goes quiet
  too, so that neither this line nor a later warning ends the run."""

  def on_broken_pipe(self) -> None:
    self.quiet = True
    _to_devnull(self.file)   # later writes and the exit's flush go nowhere instead of failing
    try:
      print('warning: the console output is closed (broken pipe); the run goes on without it',
            file=sys.stderr, flush=True)
    except OSError:   # the same closed pipe
      _to_devnull(sys.stderr)


def _to_devnull(file) -> None:
  """Points `file`'s descriptor at os.devnull (nothing for a file without one)."""
  try:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
      os.dup2(devnull, file.fileno())
    finally:
      os.close(devnull)
  except (OSError, ValueError, AttributeError):   # a file with no descriptor
    pass


def format_value(value: Any) -> str:
  """Formats a metric compactly: 3 significant digits, no exponent for big numbers."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return str(value)
  if isinstance(value, numbers.Integral):
    return str(int(value))
  value = float(value)
  if not math.isfinite(value):
    return str(value)  # 'nan', 'inf', '-inf'
  if abs(value) >= 1000:
    return f'{value:.0f}'
  return f'{value:.3g}'


def format_summary_value(key: str, value: Any) -> str:
  """Like `format_value`, but fractions whose key contains 'acc' become percentages, and
  'incidents' None (the failure monitor did not run) reads 'monitor off'."""
  if key == 'incidents' and value is None:
    return 'monitor off'
  if ('acc' in key and isinstance(value, numbers.Real)
      and not isinstance(value, (bool, numbers.Integral))
      and math.isfinite(float(value))):
    return f'{100.0 * float(value):.1f}%'
  return format_value(value)


# ----------------------------------------------------------------------------
# Console.


def live_display(console: Console) -> bool:
  """Whether `console` can show a live progress bar: a terminal, or Jupyter/Colab with
  ipywidgets (rich draws its live display in an ipywidgets Output; without ipywidgets it shows
  nothing but a warning, so plain progress lines are printed instead)."""
  if console.is_jupyter:
    return importlib.util.find_spec('ipywidgets') is not None
  return console.is_terminal


class ConsoleSink(Hook):
  """Live progress bar on a terminal; a plain line every ~5% of the run otherwise.

  Eval results and messages are printed above the bar; `on_end` prints a
  summary table. Missing metric keys are skipped and NaN prints as 'nan'.
  Where the output is not a terminal (a pipe, a file, CI logs) a line is never
  wrapped: rich would wrap it at 80 columns there.
  """

  def __init__(self, keys: Sequence[tuple[str, str]] = DEFAULT_CONSOLE_KEYS,
               console: Console | None = None, total_steps: int = 0):
    """Args:
      keys: (metric name, short label) pairs shown with each step.
      console: where to print; defaults to a rich Console on stdout.
      total_steps: fallback total if `on_step` arrives without `on_start`.
    """
    self.keys = tuple(keys)
    self.console = console if console is not None else RunConsole()
    self.total_steps = total_steps
    self._live = live_display(self.console)
    self._soft_wrap = not (self.console.is_terminal or self.console.is_jupyter)
    self._progress: Progress | None = None
    self._task = None
    self._started = False
    self._t0 = time.monotonic()
    self._start_step = 0
    self._last_step = 0
    self._last_printed = -1
    self._last_values = ''

  def on_start(self, step, total_steps, config_summary):
    self.total_steps = total_steps
    self._t0 = time.monotonic()
    self._start_step = self._last_step = step
    self._last_printed = step   # a complete run's second invocation prints no step line
    self._started = True
    if config_summary:
      # (an empty value, e.g. the full recipe's variant '', is left out)
      self._print('  '.join(f'{k}={v}' for k, v in config_summary.items() if v != ''))
    if self._live:
      self._progress = Progress(
          SpinnerColumn(), TextColumn('[bold]train'), BarColumn(),
          MofNCompleteColumn(), TextColumn('steps'), TimeElapsedColumn(), TextColumn('<'),
          TimeRemainingColumn(), TextColumn('{task.fields[values]}'),
          console=self.console, transient=False)
      self._task = self._progress.add_task(
          'train', total=max(total_steps, 1), completed=step, values='')
      self._progress.start()

  def _values_text(self, metrics: Mapping[str, float]) -> str:
    parts = [f'{label} {format_value(metrics[key])}'
             for key, label in self.keys if key in metrics]
    return '  '.join(parts)

  def _step_line(self, step: int) -> str:
    elapsed = time.monotonic() - self._t0
    values = f'  {self._last_values}' if self._last_values else ''
    return f'step {step}/{self.total_steps}{values}  ({elapsed:.1f} s)'

  def on_step(self, step, metrics):
    if not self._started:
      self.on_start(step - 1, max(self.total_steps, step), {})
    self._last_step = step
    self._last_values = self._values_text(metrics)
    if self._progress is not None:
      self._progress.update(self._task, completed=step, values=self._last_values)
      return
    every = max(1, self.total_steps // 20)
    if (step % every == 0 or step >= self.total_steps
        or step == self._start_step + 1):
      self._print_step_line(step)

  def _print(self, text: str) -> None:
    """Prints `text` as it is: no markup, no highlighting, unwrapped unless on a terminal."""
    self.console.print(text, markup=False, highlight=False, soft_wrap=self._soft_wrap)

  def _print_step_line(self, step: int) -> None:
    self._print(self._step_line(step))
    self._last_printed = step

  def on_eval(self, step, results):
    parts = [f'{key.removeprefix("eval/")} {format_summary_value(key, value)}'
             for key, value in results.items()]
    self._print(f'eval @ step {step}:  ' + '  '.join(parts))

  def on_message(self, text):
    self._print(str(text))

  def on_stop(self, text):
    """Not printed: the command line prints the exception's line (Preempted, TrainingError),
    the same text."""

  def on_incident(self, step, incident):
    self._print(describe_incident(step, incident))

  def _stop_progress(self) -> None:
    if self._progress is not None:
      self._progress.stop()
      self._progress = None

  def on_end(self, summary):
    self._stop_progress()
    if not self._live and self._started and self._last_printed != self._last_step:
      self._print_step_line(self._last_step)
    table = Table(title='run summary', show_header=True)
    table.add_column('metric')
    table.add_column('value', justify='right')
    for key, value in summary.items():
      table.add_row(str(key), format_summary_value(str(key), value))
    self.console.print(table)

  def close(self):
    self._stop_progress()


def incident_name(incident: Mapping[str, Any]) -> str:
  """An incident's fault class, with its signature in brackets where that differs
  ('kl_explosion (kl_explosion_with_clipping)'): the live console and tools.monitor_replay."""
  name = str(incident.get('fault_class'))
  if incident.get('signature') not in (None, name):
    name += f" ({incident['signature']})"
  return name


def evidence_text(item: Mapping[str, Any]) -> str:
  """One item of an incident's evidence: 'kl up 1.6', the score of a signal that moved; a
  'not_up' gate as the test it passed, 'reward/correct/mean not up (up-score 0.38 < 0.5)': the
  signal's up score (CUSUM) below monitor's not_up_max, which a signal rising above its
  baseline may also pass (incidents logged before the limit was recorded: without '< limit');
  an exact check (invariant/*) as its value and the limit it passed,
  'invariant/reward_out_of_range 1 (limit 0)': its score is the same for every violation
  (monitor.invariant_score, 100)."""
  signal, direction = item.get('signal', '?'), item.get('direction', '')
  score = format_value(item.get('score'))
  if str(signal).startswith('invariant/'):   # an exact check: its value, not its fixed score
    limit = item.get('limit')
    bound = '' if limit is None else f' (limit {format_value(limit)})'
    return f"{signal} {format_value(item.get('value'))}{bound}"
  if direction != 'not_up':
    return f'{signal} {direction} {score}'
  limit = item.get('limit')
  bound = '' if limit is None else f' < {format_value(limit)}'
  return f'{signal} not up (up-score {score}{bound})'


def controls_text(controls: Any) -> str:
  """A remediation's controls as 'lr_scale 0.01, kl_coef 0.02, temperature 1' (format_value:
  the dict's repr showed 0.1 * 0.1 as 0.010000000000000002)."""
  if not isinstance(controls, Mapping):
    return str(controls)
  return ', '.join(f'{name} {format_value(value)}' for name, value in controls.items())


def describe_incident(step: int, incident: Mapping[str, Any]) -> str:
  """One line for a monitor incident or remediation action."""
  kind = incident.get('kind', 'incident')
  if kind == 'verdict':
    action = incident.get('action')
    if incident.get('escalations'):
      action = f"{action} (escalated {incident['escalations']}x)"
    metric = incident.get('health_metric')   # absent in entries from before it was logged
    outcome = ('helped' if incident.get('helped') else
               f"did not help: {metric or 'the reward'} has not recovered"
               if incident.get('score_fell') else 'did not help: the score did not fall')
    if incident.get('kept') and not incident.get('helped'):   # escalations or restores used up
      outcome += '; kept (no escalation left)'
    return (f"step {step}: verdict on {action} for {incident.get('signature')}: {outcome} (score "
            f"{format_value(incident.get('score_at_action'))} -> "
            f"{format_value(incident.get('score_now'))}, {metric or 'reward'} "
            f"{format_value(incident.get('health_before'))} -> "
            f"{format_value(incident.get('health_now'))})")
  if kind != 'incident':
    line = f"step {step}: remediation {incident.get('action')}: {incident.get('reason', '')}"
    if incident.get('action') == 'halt':   # the run stops: no controls to go on with
      return line
    return f"{line} -> {controls_text(incident.get('controls', ''))}"
  evidence = ', '.join(map(evidence_text, incident.get('evidence', [])[:3]))
  return (f"step {step}: INCIDENT {incident_name(incident)} [{incident.get('severity')}] "
          f"since step {incident.get('onset_step')}, score {format_value(incident.get('score'))}"
          f" ({evidence}); suggested: {incident.get('remediation')}")
