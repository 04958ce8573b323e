"""What auto remediation's verdicts judge recovery on: the primary verifier's correctness
(`reward/<name>/mean`), not `reward/mean`, which a reward-pipeline fault corrupts itself (under a
100x reward_scale fault a verdict read 'helped ... reward 0.558 -> 85'). The verdict line and
the escalation's reason name the metric."""
import json
import math

import pytest

from rft_jax import incidents as incidents_lib
from rft_jax import trainer
from rft_jax.monitor.remediation import Controls, Remediator, health_metric
from rft_jax.telemetry.console import describe_incident
from test_trainer import tiny_config

CORRECT = 'reward/correct/mean'


def incident(score=5.0, onset=20, signature='reward_hacking', remediation='reset_reference'):
  return {'signature': signature, 'fault_class': signature, 'severity': 'critical',
          'remediation': remediation, 'onset_step': onset, 'score': score}


def test_the_health_metric_is_the_primary_verifiers_mean():
  assert health_metric('correct') == CORRECT
  assert health_metric(None) == 'reward/mean'   # no verifier to name: the reward itself


def test_a_reward_scale_fault_is_judged_on_correctness_and_the_verdict_names_it():
  """The trainer feeds correctness, which fell from 0.8 to 0.5 under the fault, while the
  reward it learns from is 100x: the action's score fell, but the run has not recovered, so the
  action escalates; the line and the reason say which metric was judged."""
  r = Remediator('auto', Controls(), watch_steps=5, health_metric=CORRECT)
  for s in range(10, 20):
    r.on_step(s, {}, 0.8)
  r.on_incident(incident(), 22)
  for s in range(16, 25):
    r.on_step(s, {'reward_hacking': 0.0}, 0.5)
  d = r.on_step(25, {'reward_hacking': 0.0}, 0.5)
  assert d.action == 'escalate_reset_reference'
  assert d.reason == 'reward_hacking: reward/correct/mean 0.500 still below 0.800 before the onset'
  verdict = [e for e in r.drain_log() if e['kind'] == 'verdict'][0]
  assert verdict['health_metric'] == CORRECT and not verdict['helped']
  assert describe_incident(25, verdict).endswith(
      'did not help: reward/correct/mean has not recovered '
      '(score 5 -> 0, reward/correct/mean 0.8 -> 0.5)')


def test_a_verdict_line_from_before_the_metric_was_logged_still_reads():
  old = {'kind': 'verdict', 'action': 'lower_lr', 'signature': 'kl_explosion', 'helped': True,
         'score_fell': True, 'kept': True, 'score_at_action': 2.0, 'score_now': 0.0,
         'health_before': 0.5, 'health_now': 0.6}
  assert describe_incident(9, old).endswith('helped (score 2 -> 0, reward 0.5 -> 0.6)')


def test_a_nan_health_value_is_not_remembered():
  """A verifier that failed on every sample of a step has a NaN mean: one NaN would make every
  window's mean NaN, and a NaN comparison reads as 'not recovered'."""
  r = Remediator('auto', Controls(), watch_steps=5, health_metric=CORRECT)
  r.on_step(3, {}, math.nan)
  r.on_step(4, {}, 0.5)
  assert r.health == {4: 0.5}


def test_a_checkpoint_judged_on_another_metric_drops_its_history():
  """A resume from a checkpoint whose history is reward/mean (before this change) must not
  compare it with correctness: the history and the pending watch's level before the onset
  are dropped (the watch is then judged on its score alone)."""
  old = Remediator('auto', Controls(), watch_steps=5)
  for s in range(10, 20):
    old.on_step(s, {}, 85.0)
  old.on_incident(incident(), 22)
  saved = json.loads(json.dumps(old.state_dict()))
  del saved['health_metric']   # as written before the metric was saved
  new = Remediator('auto', Controls(), watch_steps=5, health_metric=CORRECT)
  new.load_state_dict(saved)
  assert new.health == {} and new.watches[0].health_before is None
  same = Remediator('auto', Controls(), watch_steps=5)
  same.load_state_dict(saved)
  assert same.health == old.health and same.watches == old.watches


def test_the_trainer_feeds_the_verifier_correctness_under_a_reward_scale_fault(tmp_path,
                                                                              monkeypatch):
  """A tiny run with rewards x100 from step 1: the health the remediator gets each step is the
  correctness (at most 1) the run logs as reward/correct/mean, not reward/mean (~100x)."""
  seen = []
  real = incidents_lib.handle_alarms

  def spy(alarms, step, remediator, *args, health=None, **kw):
    seen.append((step, remediator.health_metric, health))
    return real(alarms, step, remediator, *args, health=health, **kw)

  monkeypatch.setattr(incidents_lib, 'handle_alarms', spy)
  config = tiny_config(**{'train.steps': 2, 'train.eval_every': 2, 'train.ckpt_every': 2,
                          'monitor.mode': 'auto'})
  config.faults = [{'type': 'reward_scale', 'onset_step': 1, 'strength': 100.0}]
  trainer.run(config, str(tmp_path))
  rows = {}
  with open(tmp_path / 'metrics.jsonl') as f:
    for line in f:
      r = json.loads(line)
      if r.get('kind') == 'train':
        rows[r['step']] = r
  assert [s for s, _, _ in seen] == [1, 2]
  for step, metric, health in seen:
    assert metric == CORRECT
    assert health == pytest.approx(rows[step][CORRECT]) and 0.0 <= health <= 1.0
  assert any(r['reward/mean'] > 1.5 for r in rows.values())   # the fault is on
