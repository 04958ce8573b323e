"""When auto remediation judges an action, and what a re-detection of its incident gets.

A past walk (a healthy tiny run, monitor.mode='auto', watch_steps=1, warmup=2) ended with
kl_coef 0.4: a false kl_explosion, onset 3, detected at step 5, restored checkpoint 2; the
replay judged it at step 4 (onset + watch_steps), before the step that had detected it, where
its score was 0 (it 'fell') and the reward of one low step decided two escalations; then the
replay re-detected it at step 5 and, the action being kept, took a fourth raise_kl_coef.
"""
import json

import pytest

from rft_jax.monitor.remediation import Controls, Remediator

KL0 = 0.02   # the recipe's kl_coef: raise_kl_coef makes it 0.05, then 0.1, 0.2, 0.4


def kl_incident(onset=3, score=1.57, signature='kl_explosion'):
  return {'signature': signature, 'fault_class': 'kl_explosion', 'severity': 'critical',
          'remediation': 'raise_kl_coef', 'onset_step': onset, 'score': score}


def simulate(r, steps, fires, score, health, ckpt_every=2):
  """Drives `r` as rft_jax/trainer.py does: per step the incidents that fire, then on_step;
  a decision's restore rewinds to the latest checkpoint (every `ckpt_every` steps) before its
  step. fires: step -> incidents (on every pass: the replay re-detects them); score(step) of
  kl_explosion; health(step). -> [(step, verdict entry)] in order."""
  step, verdicts = 0, []
  while step < steps:
    step += 1
    decisions = [r.on_incident(inc, step) for inc in fires.get(step, ())]
    decisions.append(r.on_step(step, {'kl_explosion': score(step)}, health(step)))
    verdicts += [(step, e) for e in r.drain_log() if e['kind'] == 'verdict']
    restore = [d.restore_before for d in decisions if d is not None and d.restore_before]
    if restore:
      step = max(s for s in range(0, step + 1, ckpt_every) if s < restore[0])
  return verdicts


def test_the_walks_healthy_run_takes_one_action_not_four():
  """The walk's timeline: the same false alarm fires at step 5 on every pass, with one low
  reward at step 4. The action is judged at step 6, after the detecting step, and kept; the
  re-detections (step 5 of the replay, a look-alike signature at step 9 with the same onset)
  get no second action. The old code ended at kl_coef 0.4 after 4 restores."""
  r = Remediator('auto', Controls(kl_coef=KL0), watch_steps=1)
  fires = {5: [kl_incident()], 9: [kl_incident(score=1.06,
                                               signature='kl_explosion_with_clipping')]}
  verdicts = simulate(r, 12, fires, score=lambda s: 1.5 if s in (5, 6) else 0.0,
                      health=lambda s: 0.41 if s == 4 else 0.66)
  assert [s for s, _ in verdicts] == [6]
  assert verdicts[0][1]['kept'] and verdicts[0][1]['score_now'] == pytest.approx(1.5)
  assert r.controls.kl_coef == pytest.approx(0.05) and r.restores == 1


def test_a_late_detection_is_judged_after_its_detecting_step():
  """Onset 3, detected at 5, watch_steps 1: no verdict during the replay of steps 3-5 (the old
  window, onset + 1, ended at step 4); it comes at step 6."""
  r = Remediator('auto', Controls(kl_coef=KL0), watch_steps=1)
  for s in (1, 2):
    r.on_step(s, {}, 0.66)
  d = r.on_incident(kl_incident(), 5)
  assert d.restore_before == 3 and r.watches[0].until == 6
  assert r.on_step(5, {'kl_explosion': 1.57}, 0.66) is None
  for s in (3, 4, 5):                                   # the replay from checkpoint 2
    assert r.on_step(s, {'kl_explosion': 0.0}, 0.41) is None
    assert not [e for e in r.drain_log() if e['kind'] == 'verdict'], s
  assert r.on_step(6, {'kl_explosion': 0.0}, 0.66) is None
  verdicts = [e for e in r.drain_log() if e['kind'] == 'verdict']
  assert len(verdicts) == 1 and verdicts[0]['helped'] and verdicts[0]['health_now'] == 0.66


def test_a_timely_detection_keeps_its_window_of_watch_steps_after_the_onset():
  """Detected at the onset's step: the window still ends onset + watch_steps."""
  r = Remediator('auto', Controls(), watch_steps=5)
  r.on_incident(kl_incident(onset=20), 20)
  assert r.watches[0].until == 25
  assert r.window_end(20, 22) == 25 and r.window_end(20, 30) == 31
  assert r.window_end(20, None) == 25   # a watch from an older checkpoint: as before


def test_an_escalation_is_judged_at_the_same_step_as_the_first_verdict():
  """The first verdict (step 6) escalates: the restore replays from checkpoint 2 again, and
  the escalated action is judged at step 6 too, not at step 4 (onset + watch_steps)."""
  r = Remediator('auto', Controls(kl_coef=KL0), watch_steps=1)
  for s in (1, 2):
    r.on_step(s, {}, 0.8)
  r.on_incident(kl_incident(), 5)
  for s in (3, 4, 5):
    r.on_step(s, {'kl_explosion': 1.0}, 0.5)
  d = r.on_step(6, {'kl_explosion': 1.0}, 0.5)          # fell, not recovered
  assert d.action == 'escalate_raise_kl_coef' and d.restore_before == 3
  assert r.watches[0].until == 6
  for s in (3, 4, 5):
    assert r.on_step(s, {'kl_explosion': 1.0}, 0.5) is None
  assert r.on_step(6, {'kl_explosion': 0.0}, 0.8) is None   # recovered: kept
  assert r.controls.kl_coef == pytest.approx(0.1) and not r.watches


def test_the_incident_of_a_kept_action_gets_no_second_one():
  """Kept at step 6 (window end): a re-fire of the same fault class with an onset at or
  before 6 is that incident again (reported only), whichever look-alike signature fires; one
  that began after the watch is a new incident and gets its action."""
  r = Remediator('auto', Controls(kl_coef=KL0), watch_steps=1)
  r.on_incident(kl_incident(), 5)
  for s in (3, 4, 5, 6):
    r.on_step(s, {'kl_explosion': 0.0}, None)
  assert r.kept == {'kl_explosion': 6}
  assert r.on_incident(kl_incident(score=1.52), 7) is None
  assert r.on_incident(kl_incident(onset=6, signature='kl_explosion_with_clipping'), 9) is None
  assert r.controls.kl_coef == pytest.approx(0.05) and not r.watches and r.restores == 1
  d = r.on_incident(kl_incident(onset=7), 9)
  assert d is not None and d.action == 'raise_kl_coef' and d.restore_before == 7
  assert r.controls.kl_coef == pytest.approx(0.1)


def test_a_look_alike_during_the_watch_is_left_to_its_verdict():
  """kl_explosion_with_clipping fires while kl_explosion's action is watched: the same fault,
  left to that verdict (it used to wait, and get a second raise_kl_coef after a kept one).
  An incident of another fault class still waits for its turn."""
  r = Remediator('auto', Controls(kl_coef=KL0), watch_steps=1)
  r.on_incident(kl_incident(), 5)
  assert r.on_incident(kl_incident(signature='kl_explosion_with_clipping'), 5) is None
  entropy = {'signature': 'entropy_collapse', 'fault_class': 'entropy_collapse',
             'severity': 'critical', 'remediation': 'raise_temperature', 'onset_step': 4,
             'score': 3.0}
  assert r.on_incident(entropy, 5) is None
  assert [i['signature'] for i in r.deferred] == ['entropy_collapse']
  for s in (3, 4, 5):
    r.on_step(s, {}, None)
  d = r.on_step(6, {'kl_explosion_with_clipping': 1.0, 'entropy_collapse': 3.0}, None)
  assert d is not None and d.action == 'raise_temperature'   # not a second raise_kl_coef
  assert r.controls.kl_coef == pytest.approx(0.05)


def test_kept_incidents_and_detecting_steps_survive_a_checkpoint():
  r = Remediator('auto', Controls(kl_coef=KL0), watch_steps=1)
  r.on_incident(kl_incident(), 5)
  for s in (3, 4, 5, 6):
    r.on_step(s, {}, None)
  r.on_incident(kl_incident(onset=8, signature='kl_explosion_with_clipping'), 10)
  saved = json.loads(json.dumps(r.state_dict()))
  resumed = Remediator('auto', Controls(), watch_steps=1)
  resumed.load_state_dict(saved)
  assert resumed.kept == {'kl_explosion': 6} and resumed.watches == r.watches
  assert resumed.watches[0].detected == 10 and resumed.watches[0].until == 11
  old = dict(saved, kept=None)   # a checkpoint from before: no 'kept', watches without fields
  del old['kept']
  old['watches'] = [{k: v for k, v in w.items() if k not in ('fault_class', 'detected')}
                    for w in saved['watches']]
  resumed.load_state_dict(old)
  assert resumed.kept == {} and resumed.watches[0].incident_class == 'kl_explosion_with_clipping'
