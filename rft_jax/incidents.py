"""Host side of the failure monitor in an RL run: newly fired incidents are logged
(workdir/incidents.jsonl, the hooks) and handed to the remediation policy
(rft_jax/monitor/remediation.py), whose decision rft_jax/trainer.py executes."""
import json
import os

import jax
import numpy as np

from rft_jax.monitor import monitor as monlib
from rft_jax.monitor.remediation import Remediator
from rft_jax.monitor.signatures import SIGNATURES
from rft_jax.telemetry import sinks


class IncidentLog:
  """workdir/incidents.jsonl (every incident and action) and the end-of-run report."""

  def __init__(self, workdir: str, resume_step: int):
    self.path = os.path.join(workdir, 'incidents.jsonl')
    self.primary = jax.process_index() == 0   # only process 0 writes; all keep the entries
    self.entries = []
    if os.path.exists(self.path):
      with open(self.path) as f:
        self.entries = [e for e in map(json.loads, f) if e['step'] <= resume_step]
      self._rewrite()

  def add(self, entry: dict) -> None:
    self.entries.append(entry)
    if not self.primary:
      return
    with open(self.path, 'a') as f:
      f.write(json.dumps(entry) + '\n')

  def _rewrite(self) -> None:
    if not self.primary:
      return
    with open(self.path + '.tmp', 'w') as f:
      f.writelines(json.dumps(e) + '\n' for e in self.entries)
    os.replace(self.path + '.tmp', self.path)

  def report(self) -> str:
    """Human-readable summary of incidents and actions (also written to incidents.md)."""
    incidents = [e for e in self.entries if e['kind'] == 'incident']
    lines = [f'{len(incidents)} incident(s)']
    for e in self.entries:
      if e['kind'] == 'incident':
        ev = ', '.join(f"{x['signal']} {x['direction']}" for x in e.get('evidence', [])[:3])
        lines.append(f"- step {e['step']}: {e['fault_class']} [{e['severity']}] since step "
                     f"{e['onset_step']} (score {e['score']:.2f}; {ev}); "
                     f"suggested {e['remediation']}")
      else:
        lines.append('  - ' + sinks.describe_incident(e['step'], e))
    return '\n'.join(lines)


def halt_checkpoints(steps: list[int], onset: int | None) -> str:
  """Which checkpoints a halt leaves, told apart by the fault's onset: those at or after it may
  already carry the fault."""
  before = [s for s in steps if onset is None or s < onset]
  after = [s for s in steps if onset is not None and s >= onset]
  text = (f'last checkpoint before the onset (step {onset}): step {before[-1]}' if before
          else f'no checkpoint before the onset (step {onset})')
  if after:
    text += f'; checkpoint(s) {", ".join(map(str, after))} from after it may carry the fault'
  return text


def handle_alarms(alarms, step, remediator: Remediator, hooks, incident_log: IncidentLog,
                  health: float | None = None):
  """Reports newly fired incidents, asks the remediator what to do, judges past actions.

  Returns the Decision to execute (at most one per step), or None: of several, a halt before
  a restore before the rest (a no-op such as skip_batch must not hide the restore that
  non-finite parameters need), else the first.
  """
  decision = None
  for incident in monlib.incidents_from_alarms(alarms, step):
    entry = {'kind': 'incident', **incident}
    incident_log.add(entry)
    hooks.on_incident(step, entry)
    decision = _weightier(decision, remediator.on_incident(incident, step))
  active = np.asarray(alarms.active)
  scores = {s.name: float(alarms.score[k]) if active[k] else 0.0
            for k, s in enumerate(SIGNATURES)}
  decision = _weightier(decision, remediator.on_step(step, scores, health))
  for entry in remediator.drain_log():
    incident_log.add(entry)
    hooks.on_incident(step, entry)
  return decision


def _weightier(a, b):
  """Of two decisions (None = none), the one the trainer must execute: halt > restore > other;
  the earlier one on a tie."""
  rank = lambda d: -1 if d is None else 2 * d.halt + (d.restore_before is not None)
  return b if rank(b) > rank(a) else a
