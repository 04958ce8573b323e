"""Remediation policy: what to do about an incident, and whether it helped. Host-side, no JAX.

The trainer owns execution (restoring checkpoints, rebuilding the sampler); this module only
decides. Modes (config.monitor.mode):

  off    the monitor does not run
  warn   incidents are reported (console, metrics.jsonl, incidents.jsonl); training continues
  halt   a critical incident stops the run; the last good checkpoint is kept
  auto   a critical incident triggers one targeted action: restore the last checkpoint taken
         before the incident's onset, change one control (below), then watch `watch_steps`
         steps. Verdict at the end of the watch:
           - the incident's score has not fallen: the action is undone;
           - it fell but the run's health (the mean of `health_metric` over the watch) is still
             below its level before the onset (by more than `health_tol`): the action was too
             weak for the fault (e.g. a persistent learning-rate fault); it is applied once
             more on top and the checkpoint before the onset is restored again, at most
             `max_escalations` times;
           - otherwise it helped and is kept.
         The watch ends at onset + watch_steps, but never before the step after the one that
         detected the incident (window_end): the replay after a restore runs the steps from
         the onset again, and a late detection (step 5 for an onset at 3, watch_steps 1) was
         judged at step 4 of the replay, where even the faulty run had not fired yet: its
         score was 0, so it always 'fell', and the reward of a step under the fault decided
         escalations. An escalation's watch ends at the same step as the first one.
         A signature whose action was undone gets no second action (it is still reported),
         and at most `max_restores` checkpoint restores happen per run: a fault that persists
         after a restore would otherwise be detected, restored and replayed forever (one the
         trainer could not do, no checkpoint preceding the onset, is not counted:
         restore_missed). The incident of a kept action gets none either: an incident of the
         same fault class whose onset is at or before the end of that watch (the replay, or
         a look-alike signature such as kl_explosion_with_clipping for kl_explosion, detecting
         the same fault again) is reported only; only escalation stacks an action on itself.
         One action is watched at a time: a critical incident that fires meanwhile waits, and
         is acted on when the watch ends if its signature is still active (one of the watched
         fault class, as a replay re-detects its fault, is left to that watch's verdict:
         kept, escalated or undone, not acted on once more). Actions that
         change nothing (skip_batch, warn_only) are recorded but not watched, so they block
         nothing.
         The health metric (health_metric below) is the verifier correctness the trainer logs,
         `reward/<primary verifier>/mean`, not the reward the trainer learns from: a fault in
         the reward pipeline (a scale, a sign, an added term) corrupts `reward/mean` itself, so
         judging recovery on it read 'helped' on a reward 100x its level. `health_tol` (0.05)
         is then 5 points of the fraction of correct answers, whatever the reward weights; a
         run without a verifier falls back to `reward/mean`, in reward units.
         Non-finite parameters (signature nonfinite_params) get restore_and_lower_lr like any
         restoring action. Whenever that restore does not happen at once (another action is
         being watched, restores used up, the action was undone before or kept for the same
         incident, no checkpoint before the onset) the trainer stops the run
         (runs.check_finite): a deferred incident is fine for drifting signals, but no step
         may train on from broken parameters. A streak
         of monitor.max_skipped_steps steps whose update(s) a non-finite loss or gradient
         skipped (signature skipped_streak, which the trainer reports in every mode) gets the
         same action and the same rules: restored from before the streak, or else the run
         stops (runs.check_skipped_streak), as it does in the other modes.

Controls are run-time knobs (TrainState.controls and the sampler temperature):
  lower_lr          lr_scale *= lr_factor (0.1)
  raise_kl_coef     kl_coef = max(kl_coef * 2, min_kl_coef)
  raise_temperature temperature *= 1.25
  reset_reference   the reference policy becomes the restored policy (undone: back to the one
                    before)
  skip_batch        nothing beyond the on-device skip of non-finite updates
  halt              stop the run (e.g. a credit-assignment bug: no knob fixes code)
  warn_only         report only
"""
import dataclasses
import math
from typing import Any

RESTORING_ACTIONS = ('lower_lr', 'raise_kl_coef', 'raise_temperature', 'reset_reference',
                     'restore_and_lower_lr')


def health_metric(primary: str | None) -> str:
  """The metric whose recovery verdicts judge: the primary verifier's mean (the trainer logs
  `reward/<name>/mean` per verifier), which faults between the verifiers and the trainer leave
  intact; `reward/mean` when there is no verifier to name (see the module doc)."""
  return f'reward/{primary}/mean' if primary else 'reward/mean'


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
  strictly below this (None = no restore). onset: the incident's onset step (a halt's message
  names the checkpoints from before it)."""
  action: str
  controls: Controls
  restore_before: int | None = None
  onset: int | None = None
  reset_reference: bool = False
  undo_reference_reset: bool = False   # the reference goes back to the one before the reset
  halt: bool = False
  reason: str = ''

  @property
  def escalation(self) -> bool:
    """The action applied once more on top of a watched one (see on_step)."""
    return self.action.startswith('escalate_')


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
  """An action under observation until step `until` (see the module doc for the verdict)."""
  signature: str
  action: str
  score_at_action: float
  controls_before: Controls
  until: int
  onset: int
  health_before: float | None
  escalations: int = 0
  fresh: bool = True   # taken during this step: judged from the next on_step call on
  fault_class: str = ''   # the incident's ('' in checkpoints from before: the signature)
  detected: int | None = None   # the step that took the action (None: from an older checkpoint)

  @property
  def incident_class(self) -> str:
    return self.fault_class or self.signature


def _incident_class(incident: dict) -> str:
  return incident.get('fault_class') or incident['signature']


class Remediator:
  """Turns incidents into Decisions according to the mode, and judges past actions."""

  def __init__(self, mode: str, controls: Controls, watch_steps: int = 10,
               lr_factor: float = 0.1, health_tol: float = 0.05, max_escalations: int = 2,
               max_restores: int = 4, health_metric: str = 'reward/mean'):
    if mode not in ('off', 'warn', 'halt', 'auto'):
      raise ValueError(f"monitor mode {mode!r}: expected off, warn, halt or auto")
    self.mode = mode
    self.controls = controls
    self.watch_steps = watch_steps
    self.lr_factor = lr_factor
    self.health_tol = health_tol
    self.max_escalations = max_escalations
    self.max_restores = max_restores
    self.health_metric = health_metric   # the name of what `health` is (on_step)
    self.restores = 0                # checkpoint restores done so far
    self.undone: set[str] = set()    # signatures whose action did not help
    self.kept: dict[str, int] = {}   # fault class -> end of the watch of its kept action
    self.health: dict[int, float] = {}   # step -> health_metric's value, latest pass
    self.watches: list[Watch] = []
    self.deferred: list[dict[str, Any]] = []   # incidents that fired while a watch was open
    self.log: list[dict[str, Any]] = []   # decisions and verdicts not yet handed out
    self.missed: int | None = None   # the step of the latest restore that found no checkpoint

  def state_dict(self) -> dict[str, Any]:
    """JSON-friendly state (controls, watched actions, health history) for checkpoints."""
    return {'controls': self.controls.as_dict(),
            'watches': [dataclasses.asdict(w) for w in self.watches],
            'deferred': list(self.deferred),
            'health': {str(s): v for s, v in self.health.items()},
            'health_metric': self.health_metric,
            'restores': self.restores, 'undone': sorted(self.undone), 'kept': dict(self.kept)}

  def load_state_dict(self, d: dict[str, Any]) -> None:
    """Restores state_dict()'s output: a resumed run judges pending actions as if uninterrupted.
    A history of another metric (a checkpoint from before verdicts judged the verifier's
    correctness: reward/mean) is dropped, so no verdict compares one metric with the other."""
    self.controls = Controls(**d['controls'])
    self.watches = [Watch(**{**w, 'controls_before': Controls(**w['controls_before'])})
                    for w in d['watches']]
    self.health = {int(s): float(v) for s, v in d['health'].items()}
    if d.get('health_metric', 'reward/mean') != self.health_metric:
      self.health = {}
      self.watches = [dataclasses.replace(w, health_before=None) for w in self.watches]
    self.deferred = list(d.get('deferred', ()))
    self.restores, self.undone = int(d.get('restores', 0)), set(d.get('undone', ()))
    self.kept = {str(k): int(v) for k, v in d.get('kept', {}).items()}

  def restore_missed(self, step: int) -> None:
    """The trainer found no checkpoint before the restore_before of the decision just taken
    (or escalated) at `step`: nothing was restored, so it does not count against max_restores.
    The rest of the decision stands (its controls, its watch), but the run goes on from `step`
    rather than replaying from the onset, so the watch (one at a time: the last) ends
    `watch_steps` after `step`, not after the onset."""
    self.restores = max(0, self.restores - 1)
    self.missed = step   # why_no_restore: the trainer's message said why
    if self.watches:
      self.watches[-1] = dataclasses.replace(self.watches[-1],
                                             until=max(self.watches[-1].until,
                                                       step + self.watch_steps))

  def why_no_restore(self, signature: str, step: int) -> str:
    """Why mode auto did not restore for an incident of `signature` that cannot wait
    (nonfinite_params, skipped_streak: the trainer then stops the run), for its error line;
    '' when nothing here stood in the way (no checkpoint before the onset at `step`: the trainer
    said so when it looked)."""
    if self.mode != 'auto' or self.missed == step:
      return ''
    if self.watches:
      w = self.watches[-1]
      return (f'monitor.mode=auto did not restore: its {w.action} for {w.signature} (since '
              f'step {w.onset}) is being watched until step {w.until}')
    if self.restores >= self.max_restores:
      return f'monitor.mode=auto did not restore: its {self.max_restores} restores are used up'
    if signature in self.undone:
      return f'monitor.mode=auto did not restore: its action for {signature} was undone before'
    return ''

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
      why = f'mode {self.mode}'   # + the signature where it says more (nonfinite_params)
      if incident.get('signature', incident['fault_class']) != incident['fault_class']:
        why = f"signature {incident['signature']}; {why}"
      return self._record(step, Decision('halt', self.controls, halt=True,
                                         onset=int(incident['onset_step']),
                                         reason=f"{incident['fault_class']} ({why})"))
    if self.watches:   # one action at a time: this one waits for the watched one's verdict
      watched = {w.incident_class for w in self.watches}   # a re-fire is that verdict's
      waiting = [i['signature'] for i in self.deferred]
      if _incident_class(incident) not in watched and incident['signature'] not in waiting:
        self.deferred.append(incident)
      return None
    action = incident['remediation']
    if action in ('skip_batch', 'warn_only'):   # nothing to judge: recorded, not watched
      return self._record(step, Decision(action, self.controls,
                                         reason=f"{incident['fault_class']} since step "
                                                f"{incident['onset_step']}"))
    restoring = action in RESTORING_ACTIONS
    if (incident['signature'] in self.undone or self.kept_before(incident) or
        (restoring and self.restores >= self.max_restores)):
      return None      # tried and undone, already kept for it, or out of restores: reported
    before = self.controls
    self.controls = apply_action(action, before, self.lr_factor)
    restore = incident['onset_step'] if restoring else None
    self.restores += restoring
    onset = int(incident['onset_step'])
    resume_from = onset if restore is not None else step   # where the watched run restarts
    self.watches.append(Watch(incident['signature'], action, float(incident['score']), before,
                              self.window_end(resume_from, step), onset,
                              self._health_before(onset), fault_class=_incident_class(incident),
                              detected=step))
    return self._record(step, Decision(
        action, self.controls, restore_before=restore,
        reset_reference=action == 'reset_reference',
        reason=f"{incident['fault_class']} since step {onset}"))

  def window_end(self, resume_from: int, detected: int | None) -> int:
    """The step of the verdict on an action taken at step `detected` whose run restarts at
    `resume_from` (the onset after a restore, else `detected`): watch_steps steps on, but
    never before the step after the detecting one (see the module doc)."""
    end = resume_from + self.watch_steps
    return end if detected is None else max(end, detected + 1)

  def kept_before(self, incident: dict) -> bool:
    """Whether `incident` is the one a kept action was for: its fault class, with an onset at
    or before the end of that action's watch (see the module doc)."""
    end = self.kept.get(_incident_class(incident))
    return end is not None and int(incident['onset_step']) <= end

  def _health_before(self, onset: int) -> float | None:
    vals = [v for s, v in self.health.items() if onset - self.watch_steps <= s < onset]
    return sum(vals) / len(vals) if vals else None

  def _health_over(self, start: int, end: int) -> float | None:
    vals = [v for s, v in self.health.items() if start < s <= end]
    return sum(vals) / len(vals) if vals else None

  def on_step(self, step: int, scores: dict[str, float],
              health: float | None = None) -> Decision | None:
    """Judges watched actions whose window has ended (see the module doc).

    scores: the current score of every signature (0 when inactive). health: this step's value
    of health_metric, remembered per step (a rewound step overwrites its old value; a NaN, a
    verifier that failed on every sample, is not remembered). Called at every step, after that
    step's on_incident calls.
    """
    if health is not None and math.isfinite(health):
      self.health[step] = float(health)
    due = [w for w in self.watches if step >= w.until and not w.fresh]
    self.watches = [w for w in self.watches if w not in due]
    decision = None
    for w in due:
      now = float(scores.get(w.signature, 0.0))
      fell = now < w.score_at_action
      health_now = self._health_over(step - self.watch_steps, step)
      recovered = (w.health_before is None or health_now is None or
                   health_now >= w.health_before - self.health_tol)
      escalate = (fell and not recovered and w.escalations < self.max_escalations
                  and self.restores < self.max_restores)
      self.log.append({'step': step, 'kind': 'verdict', 'signature': w.signature,
                       'action': w.action, 'score_at_action': w.score_at_action,
                       'score_now': now, 'health_metric': self.health_metric,
                       'health_before': w.health_before,
                       'health_now': health_now, 'helped': fell and recovered,
                       'score_fell': fell, 'escalations': w.escalations,
                       'kept': fell and not escalate})
      if w.action in ('skip_batch', 'warn_only'):
        continue
      if fell and not escalate:
        self.kept[w.incident_class] = max(w.until, self.kept.get(w.incident_class, w.until))
      if not fell:
        self.undone.add(w.signature)
        self.controls = w.controls_before
        decision = self._record(step, Decision(f'undo_{w.action}', self.controls,
                                               undo_reference_reset=w.action == 'reset_reference',
                                               reason=f'{w.signature} score did not fall'))
      elif escalate:
        self.restores += 1
        self.controls = apply_action(w.action, self.controls, self.lr_factor)
        self.watches.append(dataclasses.replace(
            w, until=self.window_end(w.onset, w.detected), escalations=w.escalations + 1))
        decision = self._record(step, Decision(   # the restore undoes a reset: reset again
            f'escalate_{w.action}', self.controls, restore_before=w.onset,
            reset_reference=w.action == 'reset_reference',
            reason=(f'{w.signature}: {self.health_metric} {health_now:.3f} still below '
                    f'{w.health_before:.3f} before the onset')))
    self.watches = [dataclasses.replace(w, fresh=False) for w in self.watches]
    while decision is None and not self.watches and self.deferred:
      incident = self.deferred.pop(0)
      if scores.get(incident['signature'], 0.0) > 0:   # still active: its turn now
        decision = self.on_incident(incident, step)
    return decision

  def _record(self, step: int, d: Decision) -> Decision:
    self.log.append({'step': step, 'kind': 'action', 'action': d.action,
                     'controls': d.controls.as_dict(), 'restore_before': d.restore_before,
                     'reason': d.reason})
    return d
