"""FaultBench rescored under other monitor knobs, from the runs an earlier invocation kept.

  python -m tools.faultbench --replay SRC --out DIR [--set KNOB=VALUE ...]

In warn mode the monitor does not change training, so the telemetry of a kept run is what a run
with other knobs would log: replaying the monitor (tools.monitor_replay.replay, the trainer's
jitted update) over SRC/runs/<name>/metrics.jsonl with the run's own knobs (its config.json)
overridden by --set gives the incidents that run would have raised, in seconds instead of a
rerun. Each warn-mode record of SRC/results.jsonl gets those incidents (and `monitor`: its
run's --set knobs, then these); auto-mode records are left out (the monitor's actions changed
their training, so another monitor would have trained another run), as are records whose run
failed (`error`).
"""
from __future__ import annotations

import json
import os
from typing import Any

# The fields of an incident a results.jsonl record keeps (tools/faultbench_score.py's input).
INCIDENT_KEYS = ('step', 'onset_step', 'fault_class', 'signature', 'severity')


def read_records(src: str) -> list[dict[str, Any]]:
  """SRC/results.jsonl's records; ValueError (one line naming the file) when it is missing."""
  path = os.path.join(src, 'results.jsonl')
  if not os.path.isfile(path):
    raise ValueError(f'no {path} (--replay names the --out of an earlier invocation)')
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def replayable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The records a replay can rescore: warn mode, run without error."""
  return [r for r in records if r['mode'] == 'warn' and r.get('error') is None]


def replay_records(src: str, records: list[dict[str, Any]],
                   overrides: dict[str, Any]) -> list[dict[str, Any]]:
  """Each record (replayable) with the incidents of the monitor replayed over its kept run
  SRC/runs/<name>/, knobs = the run's config.json's monitor section + `overrides`.

  Raises ValueError (one line naming the run's file) for a run whose metrics.jsonl is gone or
  unreadable, or whose config.json holds a bad knob.
  """
  from rft_jax.monitor import formats, knobs  # pylint: disable=g-import-not-at-top
  from tools import monitor_replay  # pylint: disable=g-import-not-at-top
  out = []
  for r in records:
    run_dir = os.path.join(src, 'runs', r['name'])
    metrics = os.path.join(run_dir, 'metrics.jsonl')
    try:
      if not os.path.isfile(os.path.join(run_dir, 'config.json')):
        raise FileNotFoundError(f'{run_dir}/config.json: no such file (the run\'s knobs)')
      cfg = knobs.monitor_config(monitor_replay.run_monitor_section(run_dir), **overrides)
      logged = formats.load_run(metrics, 'rft_jax')
    except (FileNotFoundError, ValueError) as e:
      raise ValueError(f'run {r["name"]}: {e}') from None
    incidents = monitor_replay.replay(logged, cfg)
    new = {**r, 'incidents': [{k: i.get(k) for k in INCIDENT_KEYS} for i in incidents]}
    knob_values = {**r.get('monitor', {}), **overrides}   # the run's --set, then these
    new.pop('monitor', None)
    if knob_values:
      new['monitor'] = knob_values
    out.append(new)
  return out
