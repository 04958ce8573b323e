"""Training-loop hooks: the one interface every telemetry consumer implements.

The trainer owns the loop and calls a single `Hook` (usually a `HookList`) at
fixed points. Sinks (console, JSONL, TensorBoard) and the failure monitor are
all hooks, so adding a consumer never touches the trainer.

Call order for one run::

  on_start(step, total_steps, config_summary)   # once; step = resume step or 0
  on_step(step, metrics)                         # after every optimiser step
  on_eval(step, results)                         # whenever evaluation runs
  on_message(text)                               # any time: notices, warnings
  on_step_message(step, text)                    # a notice about `step` (the step it names)
  on_rewind(step)                                # a remediation restored step's checkpoint
  on_stop(text)                                  # the run ends early: the exception's line
  on_end(summary)                                # once, if the run finishes
  close()                                        # always (also after a crash)

`step` is the 1-based number of completed optimiser steps: the first
`on_step` of a fresh run has step 1; `on_start` of a fresh run has step 0.
Metric names are '/'-separated ('reward/mean', 'eval/greedy_acc') and values
are host floats (they may be NaN or +-inf).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class Hook:
  """Base class: every method is a no-op, so subclasses override only what they need."""

  def on_start(self, step: int, total_steps: int,
               config_summary: Mapping[str, str]) -> None:
    """Called once before the first step.

    Args:
      step: completed steps at start (0 for a fresh run, N after resuming).
      total_steps: the step number the run will stop at.
      config_summary: a few human-readable config entries ('algo': 'grpo').
    """

  def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
    """Called after optimiser step `step` with that step's training metrics."""

  def on_eval(self, step: int, results: Mapping[str, float]) -> None:
    """Called with evaluation results ('eval/greedy_acc': 0.41) at `step`."""

  def on_message(self, text: str) -> None:
    """Called with a free-form notice ('resumed from step 50', a warning)."""

  def on_step_message(self, step: int, text: str) -> None:
    """A notice about step `step` ('step 7: verifier ... left 2 of 16 samples unscored'), said
    while that step runs (before its on_step): the logs record it at `step`, not at the last
    completed step. Default: on_message(text), so a hook overriding only that still gets it."""
    self.on_message(text)

  def on_stop(self, text: str) -> None:
    """Called when the run ends early, with the line of the exception it then raises: a stop
    request (SIGTERM, Ctrl-C) after its checkpoint (Preempted), or an RL run's TrainingError (a
    monitor halt, non-finite values, failed rewards, bad input data). Default: on_message(text)."""
    self.on_message(text)

  def on_incident(self, step: int, incident: Mapping[str, Any]) -> None:
    """Called when the failure monitor reports an incident or remediation takes an action.

    incident: JSON-friendly dict with at least 'kind' ('incident' or 'action') and, for
    incidents, 'fault_class', 'severity', 'onset_step', 'score' and 'evidence'.
    """

  def on_rewind(self, step: int) -> None:
    """Called when remediation (monitor.mode='auto') restored the checkpoint of `step`.

    The steps after `step` already reported belong to an abandoned trajectory; they are run
    again, and their `on_step` / `on_eval` calls come a second time with new values.
    """

  def on_end(self, summary: Mapping[str, Any]) -> None:
    """Called once when the run finishes, with a flat summary dict."""

  def close(self) -> None:
    """Releases resources (files, writers, live displays). Safe to call twice."""


class HookList(Hook):
  """Fans every call out to a list of hooks, in list order."""

  def __init__(self, hooks: Iterable[Hook] = ()):
    self.hooks: list[Hook] = list(hooks)

  def append(self, hook: Hook) -> None:
    """Adds `hook`; it receives calls after the hooks already present."""
    self.hooks.append(hook)

  def __len__(self) -> int:
    return len(self.hooks)

  def __iter__(self):
    return iter(self.hooks)

  def on_start(self, step, total_steps, config_summary):
    for hook in self.hooks:
      hook.on_start(step, total_steps, config_summary)

  def on_step(self, step, metrics):
    for hook in self.hooks:
      hook.on_step(step, metrics)

  def on_eval(self, step, results):
    for hook in self.hooks:
      hook.on_eval(step, results)

  def on_message(self, text):
    for hook in self.hooks:
      hook.on_message(text)

  def on_step_message(self, step, text):
    for hook in self.hooks:
      hook.on_step_message(step, text)

  def on_stop(self, text):
    for hook in self.hooks:
      hook.on_stop(text)

  def on_incident(self, step, incident):
    for hook in self.hooks:
      hook.on_incident(step, incident)

  def on_rewind(self, step):
    for hook in self.hooks:
      hook.on_rewind(step)

  def on_end(self, summary):
    for hook in self.hooks:
      hook.on_end(summary)

  def close(self):
    """Closes every hook, even if one raises; re-raises the first error."""
    first_error = None
    for hook in self.hooks:
      try:
        hook.close()
      except Exception as e:  # pylint: disable=broad-except
        if first_error is None:
          first_error = e
    if first_error is not None:
      raise first_error


class Recorder(Hook):
  """A telemetry hook keeping every event in memory, as metrics.jsonl records
  ({'step', 'kind', ...}); api.Run uses it where config.telemetry.jsonl is off."""

  def __init__(self):
    self.records: list[dict[str, Any]] = []
    self._step = 0

  def on_start(self, step, total_steps, config_summary):
    self._step = step
    self.records.append({'step': step, 'kind': 'start', 'total_steps': total_steps,
                         'config': dict(config_summary)})

  def on_step(self, step, metrics):
    self._step = step
    self.records.append({'step': step, 'kind': 'train', **metrics})

  def on_eval(self, step, results):
    self.records.append({'step': step, 'kind': 'eval', **results})

  def on_message(self, text):
    self.records.append({'step': self._step, 'kind': 'message', 'text': str(text)})

  def on_step_message(self, step, text):
    self.records.append({'step': int(step), 'kind': 'message', 'text': str(text)})

  def on_incident(self, step, incident):
    self.records.append({**incident, 'step': step, 'kind': incident.get('kind', 'incident')})

  def on_end(self, summary):
    self.records.append({'step': self._step, 'kind': 'end', **summary})
