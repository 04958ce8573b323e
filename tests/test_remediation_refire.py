"""Verdicts of auto remediation: a watched signature that fires again during its own watch (the
replay after the restore re-detects the same fault) is judged by that watch's verdict, not queued
as a new incident; a verdict that keeps an action it could not escalate says so."""
import pytest

from rft_jax.monitor.remediation import Controls, Remediator
from rft_jax.telemetry.console import describe_incident


def incident(score=5.0, onset=20, signature='gradient_explosion', remediation='lower_lr'):
  return {'signature': signature, 'fault_class': signature, 'severity': 'critical',
          'remediation': remediation, 'onset_step': onset, 'score': score}


def test_a_kept_action_is_not_applied_again_for_its_own_refired_incident():
  r = Remediator('auto', Controls(), watch_steps=5)
  for s in range(10, 20):
    r.on_step(s, {}, 0.8)
  assert r.on_incident(incident(), 22).restore_before == 20
  for s in range(20, 25):                  # the replay re-detects the fault at step 22
    if s == 22:
      assert r.on_incident(incident(score=4.0), 22) is None
    r.on_step(s, {'gradient_explosion': 4.0}, 0.8)
  # The score fell and the reward held: kept, and nothing more (it used to restore again).
  assert r.on_step(25, {'gradient_explosion': 2.0}, 0.8) is None
  verdict = [e for e in r.drain_log() if e['kind'] == 'verdict'][-1]
  assert verdict['helped']
  assert r.on_step(26, {'gradient_explosion': 2.0}, 0.8) is None
  assert r.restores == 1 and r.controls.lr_scale == pytest.approx(0.1)


def test_escalations_stay_capped_when_the_fault_refires_in_each_replay():
  """README: an action is applied once more on top at most twice (max_escalations)."""
  r = Remediator('auto', Controls(), watch_steps=3, max_escalations=2)
  for s in range(14, 20):
    r.on_step(s, {}, 0.8)
  r.on_incident(incident(), 22)
  actions = []
  for _ in range(3):                       # each replay re-fires, the reward stays low
    for s in range(20, 23):
      r.on_incident(incident(score=4.0), s)
      r.on_step(s, {'gradient_explosion': 4.0}, 0.3)
    d = r.on_step(23, {'gradient_explosion': 4.0}, 0.3)
    actions.append(d and d.action)
  # Kept after the second escalation; the re-fire of the last replay is not a third one.
  assert actions == ['escalate_lower_lr', 'escalate_lower_lr', None], actions
  assert r.on_step(24, {'gradient_explosion': 4.0}, 0.3) is None
  assert r.restores == 3 and r.controls.lr_scale == pytest.approx(0.001)


def test_a_verdict_that_keeps_an_action_without_escalating_says_so():
  """After the last escalation (or with restores used up) a verdict whose reward has not
  recovered keeps the action; its line used to read like an undone one ('did not help')."""
  r = Remediator('auto', Controls(), watch_steps=3, max_escalations=1)
  for s in range(14, 20):
    r.on_step(s, {}, 0.8)
  r.on_incident(incident(), 22)
  decisions = []
  for _ in range(2):
    for s in range(20, 23):
      r.on_step(s, {'gradient_explosion': 4.0}, 0.3)
    decisions.append(r.on_step(23, {'gradient_explosion': 4.0}, 0.3))
  assert decisions[0].action == 'escalate_lower_lr' and decisions[1] is None
  lines = [describe_incident(e['step'], e) for e in r.drain_log() if e['kind'] == 'verdict']
  assert 'did not help: reward/mean has not recovered (score' in lines[0], lines[0]
  assert ('verdict on lower_lr (escalated 1x) for gradient_explosion: did not help: reward/mean '
          'has not recovered; kept (no escalation left) (score 5 -> 4') in lines[1], lines[1]
  assert r.controls.lr_scale == pytest.approx(0.01)


def test_why_auto_did_not_restore_is_said_for_an_incident_that_cannot_wait():
  """Non-finite parameters and a skipped streak stop the run when auto does not restore; the
  error line says why (runs.check_finite's `why`): a watched action, restores used up, an
  undone action; nothing when the restore was tried this step and found no checkpoint (the
  trainer said so) or outside auto."""
  assert Remediator('warn', Controls()).why_no_restore('nonfinite_params', 5) == ''
  r = Remediator('auto', Controls(), watch_steps=3, max_restores=1)
  assert r.why_no_restore('nonfinite_params', 5) == ''
  r.on_incident(incident(onset=5), 7)
  r.restore_missed(7)
  assert r.why_no_restore('nonfinite_params', 7) == ''   # no checkpoint: said at the rewind
  assert r.why_no_restore('nonfinite_params', 8) == (
      'monitor.mode=auto did not restore: its lower_lr for gradient_explosion (since step 5) '
      'is being watched until step 10')
  r.watches, r.restores = [], 1
  assert r.why_no_restore('nonfinite_params', 8).endswith('its 1 restores are used up')
  r.restores, r.undone = 0, {'skipped_streak'}
  assert r.why_no_restore('skipped_streak', 8).endswith(
      'its action for skipped_streak was undone before')
