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
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

_Record = TypeVar('_Record', bound=Mapping[str, Any])


def final_trajectory(records: Sequence[_Record]) -> list[_Record]:
  """The train and eval records of the run's final trajectory, in step order.

  A train record whose step is not past the last train step starts a redo, and what was logged
  before it for that step or a later one is dropped. So of several records of one step the last
  is kept, and abandoned steps the redo has not reached yet (a run halted or killed during the
  redo) are dropped too. Other kinds of records (start, incidents, actions, messages, end) are
  not returned. The records themselves are returned (not copies), so a caller may match them
  with their position in `records`.

  E.g. train 1..6, eval 4, eval 6, train 5..8, eval 8 -> train 1..8 (5 and 6 the redone ones),
  eval 4 and eval 8.
  """
  kept: list[_Record] = []
  last_train = -math.inf
  for record in records:
    kind, step = record.get('kind'), record.get('step', 0)
    if kind not in ('train', 'eval'):
      continue
    if kind == 'train':
      if step <= last_train:
        kept = [r for r in kept if r.get('step', 0) < step]
      last_train = step
    kept.append(record)
  return sorted(kept, key=lambda r: r.get('step', 0))   # stable: eval after train of a step
