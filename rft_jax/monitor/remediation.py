"""Remediation policy: what to do about an incident, and whether it helped. Host-side, no JAX.

The trainer owns execution (restoring checkpoints, rebuilding the sampler); this module only
decides. Modes (config.monitor.mode):

  off    the monitor does not run
  warn   incidents are reported (console, metrics.jsonl, incidents.jsonl); training continues
  halt   a critical incident stops the run; the last good checkpoint is kept
  auto   a critical incident triggers one targeted action: restore the last checkpoint taken
         before the incident's onset, change one control (below), then watch `watch_steps`
         steps; if the incident's score has not fallen by then, the action is undone

Controls are run-time knobs (TrainState.controls and the sampler temperature):
  lower_lr          lr_scale *= lr_factor (0.1)
  raise_kl_coef     kl_coef = max(kl_coef * 2, min_kl_coef)
  raise_temperature temperature *= 1.25
  reset_reference   the reference policy becomes the restored policy
  skip_batch        nothing beyond the on-device skip of non-finite updates
  halt              stop the run (e.g. a credit-assignment bug: no knob fixes code)
  warn_only         report only
"""
import dataclasses
from typing import Any

RESTORING_ACTIONS = ('lower_lr', 'raise_kl_coef', 'raise_temperature', 'reset_reference',
                     'restore_and_lower_lr')


@dataclasses.dataclass
class Controls:
  """The knobs remediation may turn; JSON-friendly so run metadata can checkpoint them."""
  lr_scale: float = 1.0
  kl_coef: float = 0.0
  temperature: float = 1.0

  def as_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Decision:
  """What the trainer must do now. restore_before: restore the latest checkpoint with a step
  strictly below this (None = no restore)."""
  action: str
  controls: Controls
  restore_before: int | None = None
  reset_reference: bool = False
  halt: bool = False
  reason: str = ''


def apply_action(action: str, c: Controls, lr_factor: float = 0.1,
                 min_kl_coef: float = 0.05) -> Controls:
  """The controls after one action (pure)."""
  if action in ('lower_lr', 'restore_and_lower_lr'):
    return dataclasses.replace(c, lr_scale=c.lr_scale * lr_factor)
  if action == 'raise_kl_coef':
    return dataclasses.replace(c, kl_coef=max(c.kl_coef * 2.0, min_kl_coef))
  if action == 'raise_temperature':
    return dataclasses.replace(c, temperature=c.temperature * 1.25)
  return c


@dataclasses.dataclass
class Watch:
  """An action under observation: undone if the incident's score has not fallen by `until`."""
  signature: str
  action: str
  score_at_action: float
  controls_before: Controls
  until: int


class Remediator:
  """Turns incidents into Decisions according to the mode, and judges past actions."""

  def __init__(self, mode: str, controls: Controls, watch_steps: int = 10,
               lr_factor: float = 0.1):
    if mode not in ('off', 'warn', 'halt', 'auto'):
      raise ValueError(f"monitor mode {mode!r}: expected off, warn, halt or auto")
    self.mode = mode
    self.controls = controls
    self.watch_steps = watch_steps
    self.lr_factor = lr_factor
    self.watches: list[Watch] = []
    self.log: list[dict[str, Any]] = []   # decisions and verdicts not yet handed out

  def drain_log(self) -> list[dict[str, Any]]:
    """Decisions and verdicts since the last call (for incidents.jsonl and the hooks)."""
    out, self.log = self.log, []
    return out

  def on_incident(self, incident: dict, step: int) -> Decision | None:
    """Decision for a newly fired incident, or None when nothing is to be done."""
    critical = incident.get('severity') == 'critical'
    if self.mode in ('off', 'warn') or not critical:
      return None
    if self.mode == 'halt' or incident['remediation'] == 'halt':
      return self._record(step, Decision('halt', self.controls, halt=True,
                                         reason=f"{incident['fault_class']} (mode {self.mode})"))
    if any(w.signature == incident['signature'] for w in self.watches):
      return None      # an action for this signature is already being watched
    action = incident['remediation']
    before = self.controls
    self.controls = apply_action(action, before, self.lr_factor)
    restore = incident['onset_step'] if action in RESTORING_ACTIONS else None
    self.watches.append(Watch(incident['signature'], action, float(incident['score']), before,
                              step + self.watch_steps))
    return self._record(step, Decision(
        action, self.controls, restore_before=restore,
        reset_reference=action == 'reset_reference',
        reason=f"{incident['fault_class']} since step {incident['onset_step']}"))

  def on_step(self, step: int, scores: dict[str, float]) -> Decision | None:
    """Judges watched actions whose window has ended; returns an 'undo' Decision if one failed.

    scores: the current score of every signature (0 when inactive).
    """
    due = [w for w in self.watches if step >= w.until]
    self.watches = [w for w in self.watches if step < w.until]
    decision = None
    for w in due:
      now = float(scores.get(w.signature, 0.0))
      helped = now < w.score_at_action
      self.log.append({'step': step, 'kind': 'verdict', 'signature': w.signature,
                       'action': w.action, 'score_at_action': w.score_at_action,
                       'score_now': now, 'helped': helped})
      if not helped and w.action not in ('skip_batch', 'warn_only'):
        self.controls = w.controls_before
        decision = self._record(step, Decision(f'undo_{w.action}', self.controls,
                                               reason=f'{w.signature} score did not fall'))
    return decision

  def _record(self, step: int, d: Decision) -> Decision:
    self.log.append({'step': step, 'kind': 'action', 'action': d.action,
                     'controls': d.controls.as_dict(), 'restore_before': d.restore_before,
                     'reason': d.reason})
    return d
