"""The remediation policy (host-side, pure Python): modes, undo, escalation."""
import pytest

from rft_jax.monitor.remediation import Controls, Remediator, apply_action
from rft_jax.telemetry.console import describe_incident


def incident(score=5.0, onset=20, severity='critical', remediation='lower_lr',
             signature='gradient_explosion'):
  return {'signature': signature, 'fault_class': signature,
          'severity': severity, 'remediation': remediation, 'onset_step': onset, 'score': score}


def feed_health(r, steps, value):
  for s in steps:
    r.on_step(s, {}, value)


def test_modes():
  assert Remediator('warn', Controls()).on_incident(incident(), 22) is None
  assert Remediator('auto', Controls()).on_incident(incident(severity='warn'), 22) is None
  assert Remediator('halt', Controls()).on_incident(incident(), 22).halt
  assert Remediator('auto', Controls()).on_incident(incident(remediation='halt'), 22).halt
  with pytest.raises(ValueError, match='monitor mode'):
    Remediator('panic', Controls())


def test_apply_action():
  c = Controls(lr_scale=1.0, kl_coef=0.0, temperature=1.0)
  assert apply_action('lower_lr', c).lr_scale == pytest.approx(0.1)
  assert apply_action('raise_kl_coef', c).kl_coef == pytest.approx(0.05)
  assert apply_action('raise_kl_coef', Controls(kl_coef=0.1)).kl_coef == pytest.approx(0.2)
  assert apply_action('raise_temperature', c).temperature == pytest.approx(1.25)
  assert apply_action('warn_only', c) == c


def test_action_restores_before_onset_and_is_kept_when_it_helped():
  r = Remediator('auto', Controls(), watch_steps=5)
  feed_health(r, range(10, 20), 0.8)
  d = r.on_incident(incident(score=5.0, onset=20), 22)
  assert d.action == 'lower_lr' and d.restore_before == 20
  assert r.controls.lr_scale == pytest.approx(0.1)
  assert r.on_incident(incident(), 23) is None          # one action at a time
  feed_health(r, range(16, 24), 0.8)                    # the replay after the restore
  assert r.on_step(25, {'gradient_explosion': 0.0}, 0.8) is None
  verdicts = [e for e in r.drain_log() if e['kind'] == 'verdict']
  assert verdicts[-1]['helped'] and r.controls.lr_scale == pytest.approx(0.1)


def test_action_is_undone_when_the_score_did_not_fall():
  r = Remediator('auto', Controls(), watch_steps=5)
  r.on_incident(incident(score=5.0), 22)
  feed_health(r, range(22, 25), None)                   # on_step runs every step
  d = r.on_step(25, {'gradient_explosion': 7.0}, None)
  assert d.action == 'undo_lower_lr' and r.controls.lr_scale == 1.0


def test_late_detection_is_judged_after_the_replay_and_not_retried():
  """Detected 12 steps after onset with watch_steps 10: the window would end (onset + 10)
  before the step that acts; the verdict waits for the replay to pass the detecting step
  (test_remediation_verdict.py). A fault that persists after the restore re-fires the same
  signature: no second restore (it used to restore and replay forever)."""
  r = Remediator('auto', Controls(), watch_steps=10)
  d = r.on_incident(incident(score=2.0, onset=27), 39)
  assert d.restore_before == 27 and r.on_step(39, {'gradient_explosion': 2.0}, 0.5) is None
  assert not [e for e in r.drain_log() if e['kind'] == 'verdict']   # not judged yet
  feed_health(r, range(26, 40), 0.5)                                # the replay
  d = r.on_step(40, {'gradient_explosion': 2.0}, 0.5)
  assert d.action == 'undo_lower_lr' and r.controls.lr_scale == 1.0
  assert r.on_incident(incident(score=2.0, onset=27), 39) is None   # reported only


def test_restores_are_capped_per_run():
  r = Remediator('auto', Controls(), watch_steps=2, max_restores=2)
  for k in range(3):
    sig = dict(incident(score=5.0, onset=10 * k + 10), signature=f'sig{k}')
    d = r.on_incident(sig, 10 * k + 11)
    if k < 2:
      assert d.restore_before == 10 * k + 10
      feed_health(r, range(10 * k + 10, 10 * k + 13), 0.8)   # judged (kept or undone)
    else:
      assert d is None   # out of restores
  assert r.restores == 2


def test_escalates_while_reward_stays_below_its_pre_onset_level():
  r = Remediator('auto', Controls(), watch_steps=5, max_escalations=2)
  feed_health(r, range(10, 20), 0.8)
  r.on_incident(incident(score=5.0, onset=20), 22)
  feed_health(r, range(16, 25), 0.5)                    # score fell but reward did not recover
  d = r.on_step(25, {'gradient_explosion': 0.0}, 0.5)
  assert d.action == 'escalate_lower_lr' and d.restore_before == 20
  assert r.controls.lr_scale == pytest.approx(0.01)
  feed_health(r, range(16, 25), 0.5)
  assert r.on_step(25, {}, 0.5).action == 'escalate_lower_lr'
  feed_health(r, range(16, 25), 0.5)
  assert r.on_step(25, {}, 0.5) is None                 # at most max_escalations
  assert r.controls.lr_scale == pytest.approx(0.001)
  # The console names the escalated action and which half of the verdict failed.
  lines = [describe_incident(e['step'], e) for e in r.drain_log() if e['kind'] == 'verdict']
  assert lines[0].endswith(
      'verdict on lower_lr for gradient_explosion: did not help: reward/mean has not recovered '
      '(score 5 -> 0, reward/mean 0.8 -> 0.5)'), lines[0]
  assert 'verdict on lower_lr (escalated 1x) for gradient_explosion' in lines[1], lines[1]


def test_an_escalated_reference_reset_resets_the_reference_again():
  """The escalation restores the checkpoint before the onset, which predates the first reset:
  the decision must reset the reference again (else the trainer goes on from the initial one,
  and an escalated reset_reference would undo itself)."""
  r = Remediator('auto', Controls(), watch_steps=5)
  feed_health(r, range(10, 20), 0.8)
  first = r.on_incident(incident(remediation='reset_reference', signature='reward_hacking'), 22)
  assert first.reset_reference and first.restore_before == 20
  feed_health(r, range(16, 25), 0.5)                    # score fell but reward did not recover
  d = r.on_step(25, {'reward_hacking': 0.0}, 0.5)
  assert d.action == 'escalate_reset_reference' and d.restore_before == 20
  assert d.reset_reference and d.escalation and not first.escalation


def test_an_undone_reference_reset_says_so():
  r = Remediator('auto', Controls(), watch_steps=5)
  feed_health(r, range(10, 20), 0.8)
  r.on_incident(incident(remediation='reset_reference', signature='reward_hacking'), 22)
  feed_health(r, range(16, 25), 0.8)
  d = r.on_step(25, {'reward_hacking': 6.0}, 0.8)        # the score did not fall
  assert d.action == 'undo_reset_reference' and d.undo_reference_reset
  assert d.restore_before is None and not d.reset_reference


def test_verdict_line_of_an_undone_action():
  r = Remediator('auto', Controls(), watch_steps=5)
  feed_health(r, range(10, 20), 0.8)
  r.on_incident(incident(score=5.0, onset=20), 22)
  feed_health(r, range(16, 25), 0.8)
  assert r.on_step(25, {'gradient_explosion': 6.0}, 0.8).action == 'undo_lower_lr'
  verdict = [e for e in r.drain_log() if e['kind'] == 'verdict'][0]
  assert 'lower_lr for gradient_explosion: did not help: the score did not fall' in (
      describe_incident(25, verdict))


def test_state_survives_a_checkpoint_round_trip():
  """A run resumed mid-watch (state through JSON, as in the checkpoint's meta) reaches the same
  verdicts and controls as the uninterrupted one."""
  import json  # pylint: disable=g-import-not-at-top

  def prefix(r):
    feed_health(r, range(10, 20), 0.8)
    r.on_incident(incident(score=5.0, onset=20), 22)
    feed_health(r, range(16, 23), 0.5)
    r.drain_log()

  def rest(r):
    out = []
    for s in range(23, 40):
      d = r.on_step(s, {'gradient_explosion': 0.0}, 0.5)
      out.append((s, d and d.action, r.controls.as_dict()))
    return out, [e for e in r.drain_log() if e['kind'] == 'verdict']

  straight = Remediator('auto', Controls(), watch_steps=5, max_escalations=2)
  prefix(straight)
  saved = json.loads(json.dumps(straight.state_dict()))
  resumed = Remediator('auto', Controls(), watch_steps=5, max_escalations=2)
  resumed.load_state_dict(saved)
  assert resumed.watches == straight.watches and resumed.controls == straight.controls
  got, want = rest(resumed), rest(straight)
  assert got == want
  assert any(action and action.startswith('escalate') for _, action, _ in want[0])


def test_an_incident_during_a_watch_is_acted_on_when_the_watch_ends():
  """A critical incident that fires while another action is watched is not dropped: it waits
  and gets its own action once the watch ends, if its signature is still active. A no-op action
  (skip_batch for a NaN loss) opens no watch, so it blocks nothing."""
  r = Remediator('auto', Controls(), watch_steps=5)
  feed_health(r, range(5, 13), 0.8)
  nan = incident(signature='nan_loss', remediation='skip_batch', onset=13, score=100.0)
  d = r.on_incident(nan, 13)
  assert d.action == 'skip_batch' and d.restore_before is None and not r.watches
  d = r.on_incident(incident(score=5.0, onset=14), 16)          # gradient_explosion: lower_lr
  assert d.action == 'lower_lr' and d.restore_before == 14
  collapse = incident(signature='reward_collapse', remediation='restore_and_lower_lr',
                      onset=15, score=3.0)
  assert r.on_incident(collapse, 17) is None                    # waits for the watch
  feed_health(r, range(10, 19), 0.3)
  d = r.on_step(19, {'gradient_explosion': 0.0, 'reward_collapse': 2.0}, 0.3)
  assert d is not None and d.action == 'escalate_lower_lr'      # the watch's own verdict first
  feed_health(r, range(10, 19), 0.8)
  d = r.on_step(24, {'gradient_explosion': 0.0, 'reward_collapse': 2.0}, 0.8)
  assert d is not None and d.action == 'restore_and_lower_lr' and d.restore_before == 15
  # One that has gone quiet by then is dropped.
  r2 = Remediator('auto', Controls(), watch_steps=5)
  r2.on_incident(incident(score=5.0, onset=14), 16)
  r2.on_incident(collapse, 17)
  assert r2.on_step(17, {'gradient_explosion': 5.0, 'reward_collapse': 3.0}, None) is None
  assert r2.on_step(22, {'gradient_explosion': 0.0, 'reward_collapse': 0.0}, None) is None
  assert not r2.deferred and not r2.watches


def test_a_halt_names_the_checkpoints_from_before_the_onset():
  """Halting at step 17 for a fault since step 15: checkpoint 15 already holds the faulty
  update, so the message points at 10 (it used to call 15 'the last good checkpoint')."""
  from rft_jax import incidents   # pylint: disable=g-import-not-at-top
  d = Remediator('halt', Controls()).on_incident(incident(onset=15), 17)
  assert d.halt and d.onset == 15 and d.restore_before is None   # a halt restores nothing
  assert incidents.halt_checkpoints([5, 10, 15], d.onset) == (
      'last checkpoint before the onset (step 15): step 10; checkpoint(s) 15 from after it may '
      'carry the fault')
  assert incidents.halt_checkpoints([], 3) == 'no checkpoint before the onset (step 3)'


def test_non_finite_parameters_are_restored_or_left_to_stop_the_run(tmp_path):
  """Non-finite parameters (param_norm Inf; here with the NaN gradient of a second update that
  read them, so nan_loss's skip_batch fires on the same step): auto restores the checkpoint
  before the step with the learning rate lowered, whatever order the incidents come in. During
  a watch the incident waits like any other: the trainer then stops the run (check_finite),
  since nothing restored. halt names the signature, as the fault class (nan_loss) alone would
  describe a loss that was finite."""
  import jax   # pylint: disable=g-import-not-at-top
  from rft_jax import incidents   # pylint: disable=g-import-not-at-top
  from rft_jax.monitor import monitor as monlib   # pylint: disable=g-import-not-at-top
  from rft_jax.monitor.detectors import MonitorConfig   # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry.hooks import Hook   # pylint: disable=g-import-not-at-top
  cfg = MonitorConfig(warmup=3)
  _, alarms = monlib.monitor_update(monlib.init_monitor(cfg), {
      'loss': 0.4, 'grad_norm': float('nan'), 'param_norm': float('inf')}, cfg)
  alarms = jax.device_get(alarms)
  r = Remediator('auto', Controls(), watch_steps=5)
  log = incidents.IncidentLog(str(tmp_path), 0)
  d = incidents.handle_alarms(alarms, 7, r, Hook(), log)
  assert [e.get('signature') for e in log.entries if e['kind'] == 'incident'] == [
      'nonfinite_params', 'nan_loss']
  assert d.action == 'restore_and_lower_lr' and d.restore_before == 7
  assert d.controls.lr_scale == pytest.approx(0.1)
  # The replayed step overflows again while that action is watched: nothing to execute.
  assert incidents.handle_alarms(alarms, 7, r, Hook(), log) is None
  # A no-op decision taken first does not hide the restore (incidents._weightier).
  skip = Remediator('auto', Controls()).on_incident(
      incident(signature='nan_loss', remediation='skip_batch', onset=7, score=100.0), 7)
  restore = Remediator('auto', Controls()).on_incident(
      incident(signature='nonfinite_params', remediation='restore_and_lower_lr', onset=7,
               score=100.0), 7)
  assert incidents._weightier(skip, restore) is restore   # pylint: disable=protected-access
  assert incidents._weightier(restore, skip) is restore   # pylint: disable=protected-access
  assert incidents._weightier(None, skip) is skip   # pylint: disable=protected-access
  params = dict(incident(signature='nonfinite_params', onset=7), fault_class='nan_loss')
  assert Remediator('halt', Controls()).on_incident(params, 7).reason == (
      'nan_loss (signature nonfinite_params; mode halt)')


class _NoCheckpoints:
  """A checkpointer without any checkpoint (incidents.rewind only asks for its steps)."""

  def all_steps(self):
    return []


class _Messages:
  def __init__(self):
    self.messages = []

  def on_message(self, text):
    self.messages.append(text)


def test_a_missed_restore_names_the_onset_the_latest_checkpoint_and_the_keys():
  """The line names the onset, the latest checkpoint there was (none before the onset, or it
  would have been restored) and the config keys that would have kept one."""
  from rft_jax import incidents   # pylint: disable=g-import-not-at-top
  hooks = _Messages()
  r = Remediator('auto', Controls(), watch_steps=2, max_restores=1)
  class Late:   # pylint: disable=missing-class-docstring
    def all_steps(self):
      return [8, 10]
  assert incidents.rewind(Late(), 7, None, None, None, None, None, {}, hooks, r, step=11) is None
  assert hooks.messages == [
      'remediation: no checkpoint before the onset (step 7) to restore (the latest is step 10); '
      'a smaller train.ckpt_every or a larger train.keep_checkpoints keeps one']


def test_a_restore_that_finds_no_checkpoint_is_not_counted():
  """A restore the trainer cannot do (no checkpoint before the onset) does not use up one of
  max_restores (it used to count): with max_restores=1, a later incident still gets its
  restore. The rest of the decision stands (lowered LR, watch), as before."""
  from rft_jax import incidents   # pylint: disable=g-import-not-at-top
  r = Remediator('auto', Controls(), watch_steps=2, max_restores=1)
  d = r.on_incident(incident(score=5.0, onset=3), 4)
  assert d.restore_before == 3 and r.restores == 1
  hooks = _Messages()
  assert incidents.rewind(_NoCheckpoints(), d.restore_before, None, None, None, None, None, {},
                          hooks, r, step=4) is None
  assert hooks.messages == [
      'remediation: no checkpoint before the onset (step 3) to restore (none saved yet); a '
      'smaller train.ckpt_every or a larger train.keep_checkpoints keeps one']
  assert r.restores == 0 and r.controls.lr_scale == pytest.approx(0.1) and r.watches
  # Nothing replayed: the run goes on from step 4, so the watch covers steps 5-6 (was: the
  # onset's window, steps 4-5, judged on one step taken under the action).
  feed_health(r, range(4, 6), 0.8)
  assert r.watches and r.watches[0].until == 6
  feed_health(r, range(6, 7), 0.8)                      # the watch ends (kept)
  assert not r.watches
  d = r.on_incident(dict(incident(score=5.0, onset=8), signature='kl_explosion',
                         remediation='raise_kl_coef'), 9)
  assert d is not None and d.restore_before == 8 and r.restores == 1
  r.restore_missed(9)
  assert r.restores == 0
  r.restore_missed(9)                                   # never below 0
  assert r.restores == 0


def test_a_streak_of_skipped_steps_is_an_incident_that_auto_restores_from_before(tmp_path):
  """monitor.max_skipped_steps steps in a row with skipped updates: the incident skipped_streak
  (onset: the streak's first step) gets restore_and_lower_lr in auto, as nonfinite_params does,
  under the same rules: no restore while another action is watched, none once restores are
  used up. Other modes decide no restore (the trainer then stops the run)."""
  from rft_jax import incidents   # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry.hooks import Hook   # pylint: disable=g-import-not-at-top
  log = incidents.IncidentLog(str(tmp_path), 0)
  r = Remediator('auto', Controls(), watch_steps=3, max_restores=1)
  d = incidents.handle_streak(5, 5, 9, r, Hook(), log)
  assert d.action == 'restore_and_lower_lr' and d.restore_before == 5
  assert d.controls.lr_scale == pytest.approx(0.1) and not d.halt
  found = [e for e in log.entries if e['kind'] == 'incident']
  assert [(e['step'], e['onset_step'], e['signature'], e['fault_class'], e['score'])
          for e in found] == [(9, 5, 'skipped_streak', 'nan_loss', 1.0)]
  assert [e['action'] for e in log.entries if e['kind'] == 'action'] == ['restore_and_lower_lr']
  assert describe_incident(9, found[0]).startswith(
      'step 9: INCIDENT nan_loss (skipped_streak) [critical] since step 5, score 1 '
      '(invariant/nonfinite 5 (limit 5))')
  assert incidents.handle_streak(5, 5, 9, r, Hook(), log) is None   # during the watch
  feed_health(r, range(5, 9), None)
  assert incidents.handle_streak(6, 5, 12, r, Hook(), log) is None  # out of restores
  assert incidents.handle_streak(5, 5, 9, Remediator('warn', Controls()), Hook(), log) is None
  assert incidents.handle_streak(5, 5, 9, Remediator('halt', Controls()), Hook(), log).halt


def test_the_skipped_streak_counts_steps_and_updates_and_round_trips_through_meta():
  """Steps with a non-finite loss or gradient in a row, and how many of their updates were
  skipped ('update_skipped', the fraction of a step's updates); a finite step ends the streak;
  checkpoint meta carries both (meta from before the update count: not counted)."""
  from rft_jax import incidents, runs   # pylint: disable=g-import-not-at-top
  streak = incidents.SkippedStreak({}, updates=4)
  assert streak.observe('loss', 0.25) == 1 and streak.observe('loss and grad_norm', 1.0) == 2
  assert streak.skipped == 5
  meta = {}
  streak.save(meta)
  again = incidents.SkippedStreak(meta, updates=4)
  assert (again.steps, again.skipped) == (2, 5)
  assert again.observe('', 0.0) == 0 and again.skipped == 0
  old = incidents.SkippedStreak({'skipped_streak': 3}, updates=4)
  assert old.observe('loss', 1.0) == 4 and old.skipped is None

  class Ckpt:
    def all_steps(self):
      return [2, 4, 6]

  with pytest.raises(runs.TrainingError, match=r'^2 steps in a row \(steps 6-7\) had a '
                     r'non-finite loss, so 5 of their 8 updates were skipped \(config.monitor.'
                     r'max_skipped_steps=2\); stopped; the latest checkpoint from before step 6:'
                     r' step 4, in wd$'):
    runs.check_skipped_streak(2, 2, 'loss', 7, Ckpt(), 'wd', 5, 4)
  with pytest.raises(runs.TrainingError, match=r'loss, so every update was skipped \('):
    runs.check_skipped_streak(2, 2, 'loss', 7, Ckpt(), 'wd', 2, 1)
  with pytest.raises(runs.TrainingError, match=r'loss, so their updates were skipped, all or '):
    runs.check_skipped_streak(4, 2, 'loss', 7, Ckpt(), 'wd', None, 4)
  runs.check_skipped_streak(1, 2, 'loss', 7, Ckpt(), 'wd', 4, 4)   # below the limit


def test_an_action_line_gives_its_controls_rounded_and_a_halt_none():
  """An escalated lower_lr printed {'lr_scale': 0.010000000000000002, ...}, the dict's repr of
  0.1 * 0.1, in the console and incidents.md; a halt printed controls it never goes on with."""
  r = Remediator('auto', Controls(kl_coef=0.02), watch_steps=3)
  r.on_incident(incident(score=2.0, onset=5), 7)
  action = r.drain_log()[0]
  action['controls'] = apply_action('lower_lr', Controls(**action['controls'])).as_dict()
  assert action['controls']['lr_scale'] == 0.1 * 0.1 != 0.01
  assert describe_incident(7, action) == (
      'step 7: remediation lower_lr: gradient_explosion since step 5 -> '
      'lr_scale 0.01, kl_coef 0.02, temperature 1')
  halt = Remediator('halt', Controls()).on_incident(incident(score=2.0, onset=5), 7)
  assert halt.halt
  line = describe_incident(7, {'kind': 'action', 'action': 'halt', 'reason': halt.reason,
                               'controls': halt.controls.as_dict()})
  assert line == 'step 7: remediation halt: gradient_explosion (mode halt)', line
