"""The reference policy across remediation's resets, their escalation and undo, in live runs
(scripted decisions; the monitor deciding them itself: test_monitor_live.py)."""
import os

import pytest

from rft_jax import incidents as incidents_lib
from rft_jax import trainer
from rft_jax.monitor.remediation import Decision
from rft_jax.telemetry.hooks import Hook
from test_trainer import tiny_config


def _scripted(monkeypatch, plan):
  """incidents.handle_alarms reports as usual, and returns the decision planned for the step."""
  real = incidents_lib.handle_alarms

  def scripted(alarms, step, remediator, *args, **kw):
    real(alarms, step, remediator, *args, **kw)
    todo = plan.pop(step, None)
    return None if todo is None else Decision(todo.pop('action'), remediator.controls, **todo)

  monkeypatch.setattr(incidents_lib, 'handle_alarms', scripted)


def test_undoing_an_escalated_reset_goes_back_to_the_reference_before_the_first(tmp_path,
                                                                                 monkeypatch):
  """reset_reference at step 6 (restores step 4: the reference becomes that policy, saved with
  the replay's checkpoint 6), escalated at step 8 (restores checkpoint 6, which holds the first
  reset's reference, and resets again), then undone at step 9: the reference goes back to the
  initial policy, as the controls go back to those before the first action, so the checkpoints
  from step 10 on hold no reset reference. (The escalation had taken the first reset's
  reference for the one to put back, so the undo kept the first reset.)"""
  config = tiny_config(**{'train.steps': 12, 'train.eval_every': 12, 'train.ckpt_every': 2,
                          'train.keep_checkpoints': 10, 'monitor.mode': 'auto'})
  plan = {6: dict(action='reset_reference', restore_before=5, reset_reference=True),
          8: dict(action='escalate_reset_reference', restore_before=7, reset_reference=True),
          9: dict(action='undo_reset_reference', undo_reference_reset=True)}
  _scripted(monkeypatch, plan)
  trainer.run(config, str(tmp_path))
  assert not plan, f'decisions not reached: {plan}'
  has_ref = {s: os.path.isdir(tmp_path / 'checkpoints' / str(s) / 'reference')
             for s in (4, 6, 8, 10, 12)}
  assert has_ref == {4: False, 6: True, 8: True, 10: False, 12: False}


class StepMetrics(Hook):
  """Every train record in the order logged (a rewind logs the replayed steps again)."""

  def __init__(self):
    self.rows = []

  def on_step(self, step, metrics):
    self.rows.append((step, dict(metrics)))


def test_a_rewind_past_a_reference_reset_goes_back_to_the_initial_reference(tmp_path,
                                                                             monkeypatch):
  """A reset_reference decision at step 6 (restores step 4, the reference becomes that policy),
  then a restore at step 9 to step 2, a checkpoint from before the reset: the replayed step 3
  must score KL against the initial policy, as its first run did and as a resume from step 2
  would. (The reference had stayed the reset one in memory while the next checkpoint saved
  none.)"""
  config = tiny_config(**{'train.steps': 10, 'train.eval_every': 10, 'train.ckpt_every': 2,
                          'train.keep_checkpoints': 10, 'monitor.mode': 'auto'})
  plan = {6: dict(action='reset_reference', restore_before=5, reset_reference=True),
          9: dict(action='lower_lr', restore_before=3)}
  _scripted(monkeypatch, plan)
  seen = StepMetrics()
  trainer.run(config, str(tmp_path), hooks_extra=(seen,))
  assert not plan, f'decisions not reached: {plan}'
  kl3 = [m['kl'] for s, m in seen.rows if s == 3]
  assert len(kl3) == 2, [s for s, _ in seen.rows]   # step 3's first run and its replay
  assert kl3[0] > 0
  assert kl3[1] == pytest.approx(kl3[0], rel=1e-5)
  kl5 = [m['kl'] for s, m in seen.rows if s == 5]   # first run, after the reset, after rewind
  # After the reset the step starts from its reference (KL 0 before the step's first update;
  # 'kl' is the last update's).
  assert len(kl5) == 3 and kl5[1] < 0.5 * kl5[0]
  assert kl5[2] == pytest.approx(kl5[0], rel=1e-5)


def test_an_undone_reference_reset_goes_back_to_the_reference_before_it(tmp_path, monkeypatch):
  """A reset_reference decision at step 6 (restores step 4; the reference becomes that policy,
  saved with the checkpoints after it), undone at step 8: the steps after score KL against the
  initial policy again, and the checkpoints from step 8 on hold no reset reference."""
  config = tiny_config(**{'train.steps': 10, 'train.eval_every': 10, 'train.ckpt_every': 2,
                          'train.keep_checkpoints': 10, 'monitor.mode': 'auto'})
  plan = {6: dict(action='reset_reference', restore_before=5, reset_reference=True),
          8: dict(action='undo_reset_reference', undo_reference_reset=True)}
  _scripted(monkeypatch, plan)
  trainer.run(config, str(tmp_path), hooks_extra=(StepMetrics(),))
  assert not plan, f'decisions not reached: {plan}'
  has_ref = {s: os.path.isdir(tmp_path / 'checkpoints' / str(s) / 'reference')
             for s in (4, 6, 8, 10)}
  assert has_ref == {4: False, 6: True, 8: False, 10: False}
