"""Reading a run's records (metrics.jsonl, `sinks.read_jsonl`) as the run ended up: no plotting,
no JAX, so `rft_jax.api` and the tools can use it without importing matplotlib.

metrics.jsonl is append-only. After an `auto` remediation restores a checkpoint, it holds the
abandoned steps and then the same steps again (the redo). Two views of one log:
  the full log          every record in file order: incidents, actions and verdicts, and every
                        step that ran, abandoned ones included (what the live monitor saw,
                        compute that was spent);
  the final trajectory  `final_trajectory`: the train and eval records of the steps the run's
                        result comes from, one per step (the last logged), in step order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

_Record = TypeVar('_Record', bound=Mapping[str, Any])
# The kinds of metrics.jsonl's records (sinks.JsonlSink; incidents.jsonl holds the middle three).
RECORD_KINDS = ('start', 'train', 'eval', 'message', 'incident', 'action', 'verdict', 'end')
MONITOR_KINDS = ('incident', 'action', 'verdict')


def drop_abandoned(records: Iterable[_Record],
                   logs: Callable[[_Record], Collection[str]]) -> list[_Record]:
  """The records of the final trajectory, in step order (stable: records of one step keep their
  file order). The one rule that `final_trajectory` and `monitor.formats.last_per_step` share.

  `records` come in file order, and `logs(record)` names what a record logs (its metric names,
  or its kind), which one run of a step logs once. A record that logs a name already logged by
  a kept record of its step or of a later one comes from a redo (the run went back: an `auto`
  remediation restored a checkpoint, or a resume started from an earlier one): the kept records
  of its step and later ones were abandoned, and are dropped before it is kept. So a redo is
  seen whether its first step is below the last abandoned one or equal to it, and the abandoned
  steps a redo has not reached yet are dropped too. A record that logs nothing never starts one.
  """
  kept: list[_Record] = []
  latest: dict[str, float] = {}   # name -> the highest step a kept record logged it at
  for record in records:
    step = record.get('step', 0)
    names = logs(record)
    if any(latest.get(name, -math.inf) >= step for name in names):
      kept = [r for r in kept if r.get('step', 0) < step]
      latest = {}
      for r in kept:
        for name in logs(r):
          latest[name] = max(latest.get(name, -math.inf), r.get('step', 0))
    kept.append(record)
    for name in names:
      latest[name] = max(latest.get(name, -math.inf), step)
  return sorted(kept, key=lambda r: r.get('step', 0))


def _train_kind(record: Mapping[str, Any]) -> tuple[str, ...]:
  return ('train',) if record.get('kind') == 'train' else ()


def final_trajectory(records: Sequence[_Record]) -> list[_Record]:
  """The train and eval records of the run's final trajectory, in step order.

  A train record whose step is not past the last train step starts a redo, and what was logged
  before it for that step or a later one is dropped (`drop_abandoned`, a train record logging
  'train'). So of several records of one step the last is kept, and abandoned steps the redo
  has not reached yet (a run halted or killed during the redo) are dropped too. Other kinds of
  records (start, incidents, actions, messages, end) are not returned. The records themselves
  are returned (not copies), so a caller may match them with their position in `records`.

  E.g. train 1..6, eval 4, eval 6, train 5..8, eval 8 -> train 1..8 (5 and 6 the redone ones),
  eval 4 and eval 8.
  """
  return drop_abandoned((r for r in records if r.get('kind') in ('train', 'eval')),
                        _train_kind)
