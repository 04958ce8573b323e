"""The reference policy across remediation's resets, their escalation and undo, in live runs
(scripted decisions: see also test_monitor_live.py)."""
import os

from rft_jax import incidents as incidents_lib
from rft_jax import trainer
from rft_jax.monitor.remediation import Decision
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
