"""The reference policy across remediation's resets, their escalation and undo, in live runs
(scripted decisions; the monitor deciding them itself: test_monitor_live.py)."""
import gc
import json
import logging
import os
import shutil
import types

import jax
import numpy as np
import pytest
from flax import nnx

from rft_jax import api, checkpoint, components, main, run_memory, trainer
from rft_jax import incidents as incidents_lib
from rft_jax.algorithms import ppo
from rft_jax.models import functional as lm
from rft_jax.monitor.remediation import Decision, Watch
from rft_jax.telemetry.hooks import Hook
from checkpoint_fixtures import assert_trees_equal, make_params, make_state
from test_trainer import tiny_config, train_rows


def _scripted(monkeypatch, plan):
  """incidents.handle_alarms reports as usual, and returns the decision planned for the step.
  The remediator watches a planned reset as it would its own (until its undo, or until the
  next planned reset: the earlier one was kept), so the run keeps what an undo puts back."""
  real = incidents_lib.handle_alarms

  def scripted(alarms, step, remediator, *args, **kw):
    real(alarms, step, remediator, *args, **kw)
    todo = plan.pop(step, None)
    if todo is None:
      return None
    action = todo.pop('action')
    if action in ('reset_reference', 'undo_reset_reference'):
      remediator.watches = [w for w in remediator.watches if w.action != 'reset_reference']
    if action == 'reset_reference':   # judged by the plan, never by the remediator (until)
      remediator.watches.append(Watch('scripted', action, 1.0, remediator.controls,
                                      until=10 ** 6, onset=step, health_before=None))
    return Decision(action, remediator.controls, **todo)

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
  """Every train record in the order logged (a rewind logs the replayed steps again), and the
  messages."""

  def __init__(self):
    self.rows, self.messages = [], []

  def on_step(self, step, metrics):
    self.rows.append((step, dict(metrics)))

  def on_message(self, text):
    self.messages.append(text)


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


class ParamCopies(Hook):
  """How many params' worth of distinct device buffers shaped like the model's params are
  alive at the end of each step (aliases of one buffer, e.g. orbax's views of the arrays it
  saved, count once), leaving out those alive before the run: an earlier test's in the same
  process (held here, so that no new buffer can reuse their addresses)."""

  def __init__(self, config):
    _, abstract = lm.abstract_params(components.model_config(config))
    leaves = jax.tree.leaves(nnx.to_pure_dict(abstract))
    self.kinds = {(tuple(x.shape), x.dtype) for x in leaves}
    self.nbytes = sum(x.size * x.dtype.itemsize for x in leaves)
    self.copies = {}
    gc.collect()
    self.before = {x.unsafe_buffer_pointer(): x for x in self._shaped()}

  def _shaped(self):
    return [x for x in jax.live_arrays() if (x.shape, x.dtype) in self.kinds]

  def on_step(self, step, metrics):
    live = {x.unsafe_buffer_pointer(): x.nbytes for x in self._shaped()}
    self.copies[step] = sum(n for p, n in live.items() if p not in self.before) / self.nbytes


def _holds(workdir, steps):
  """{step: (has a reset reference, has the reference an undo puts back, meta's record of
  the latter)} of a run's checkpoints."""
  out = {}
  for s in steps:
    d = workdir / 'checkpoints' / str(s)
    with open(d / 'meta' / 'metadata') as f:
      kind = json.load(f).get('reference_before_reset')
    out[s] = ((d / 'reference').is_dir(), (d / 'reference_before_reset').is_dir(), kind)
  return out


def test_a_run_resumed_between_a_second_reset_and_its_undo_puts_back_the_first(tmp_path,
                                                                              monkeypatch,
                                                                              capsys):
  """Resets at steps 3 and 5 (the first kept: the second's undo must put back the reference
  of step 3), undone at step 7. Stopped after step 6 and resumed, the run scores the same KL
  and reward as an uninterrupted one: checkpoint 6 holds the step-3 reference for the undo;
  checkpoint 4 records that the reference before its reset was the initial policy (rebuilt,
  not saved), and the checkpoints after the undo hold no such copy. (The resumed run had put
  back the initial policy: the reference from before the reset was only in memory.) A
  checkpoint 6 as an older rft_jax wrote it (neither) still resumes, and the undo then puts
  back the initial policy, said in one line; one whose item is missing stops in one line."""
  plan = lambda: {3: dict(action='reset_reference', reset_reference=True),
                  5: dict(action='reset_reference', reset_reference=True),
                  7: dict(action='undo_reset_reference', undo_reference_reset=True)}
  config = lambda steps: tiny_config(**{'train.steps': steps, 'train.eval_every': 10,
                                        'train.ckpt_every': 2, 'train.keep_checkpoints': 10,
                                        'monitor.mode': 'auto'})
  full, split = tmp_path / 'full', tmp_path / 'split'
  full_plan, split_plan = plan(), plan()
  _scripted(monkeypatch, full_plan)
  copies = ParamCopies(config(10))
  trainer.run(config(10), str(full), hooks_extra=(copies,))
  monkeypatch.undo()
  _scripted(monkeypatch, split_plan)
  trainer.run(config(6), str(split))
  assert list(split_plan) == [7]
  old = tmp_path / 'old'
  shutil.copytree(split, old)
  trainer.run(config(10), str(split))
  assert not full_plan and not split_plan
  a, b = train_rows(str(full)), train_rows(str(split))
  assert sorted(b) == list(range(1, 11))
  for s in range(1, 11):
    for k in ('kl', 'reward/mean', 'loss'):
      np.testing.assert_allclose(b[s][k], a[s][k], rtol=1e-6, atol=1e-7, err_msg=f'{k} {s}')
  expected = {2: (False, False, None), 4: (True, False, 'initial'), 6: (True, True, 'saved'),
              8: (True, False, None), 10: (True, False, None)}
  for run in (full, split):
    assert _holds(run, expected) == expected, run
  with open(split / 'checkpoints' / '6' / 'rft_manifest.json') as f:   # verified like the rest
    assert any(p.startswith('reference_before_reset/') for p in json.load(f)['files'])
  # The memory estimate's persistent part is what the run holds at most: params, AdamW's mu and
  # nu, the initial policy, and from step 5 to the undo both reset references (6 params' worth).
  est = run_memory.check_memory(types.SimpleNamespace(
      model_cfg=components.model_config(config(10)), mesh=(1, 1, 1)), config(10),
      ppo.algo_config(config(10), use_reference=True))
  assert est.persistent == 6 * est.params == 6 * copies.nbytes
  assert copies.copies == {1: 4, 2: 4, 3: 4, 4: 5, 5: 5, 6: 6, 7: 6, 8: 5, 9: 5, 10: 5}

  # Checkpoint 6 unverified (no manifest) and its item gone: the command says so in one line
  # naming the item's directory and what to do, exit 1, checkpoint 6 left in place (was: orbax's
  # KeyError; then main.py's line for a failed write, 'with its last good checkpoint kept').
  broken = tmp_path / 'broken'
  shutil.copytree(old, broken)
  os.remove(broken / 'checkpoints' / '6' / checkpoint.MANIFEST)
  shutil.rmtree(broken / 'checkpoints' / '6' / 'reference_before_reset')
  monkeypatch.setattr(api, 'run_config', lambda _, workdir: trainer.run(config(8), workdir))
  status = main.main(['main', '--config', 'configs/grpo_arith.py:tiny', '--workdir', str(broken)])
  err = capsys.readouterr().err.strip()
  assert status == 1 and err == (
      "error: checkpoint 6's reference_before_reset item (the reference an undo of the watched "
      f"reference reset puts back) is missing: {broken}/checkpoints/6/reference_before_reset; "
      f'the checkpoint is left in place: put that back, or move {broken}/checkpoints/6 aside to '
      'resume from the checkpoint before it, and run the same command'), err
  assert sorted(os.listdir(broken / 'checkpoints')) == ['2', '4', '6']
  # The checkpointer was closed: orbax's logging is not left muted (Quiet's filters).
  assert [logging.getLogger(n).filters for n in ('absl', 'orbax', 'asyncio')] == [[], [], []]

  six = old / 'checkpoints' / '6'   # as an older rft_jax wrote it: no item, no meta key
  shutil.rmtree(six / 'reference_before_reset')
  with open(six / 'meta' / 'metadata') as f:
    meta = json.load(f)
  with open(six / 'meta' / 'metadata', 'w') as f:
    json.dump({k: v for k, v in meta.items() if k != 'reference_before_reset'}, f)
  with open(six / 'rft_manifest.json', 'w') as f:
    json.dump({'step': 6, 'files': checkpoint.file_digests(str(six))}, f)
  _scripted(monkeypatch, {7: dict(action='undo_reset_reference', undo_reference_reset=True)})
  seen = StepMetrics()
  trainer.run(config(8), str(old), hooks_extra=(seen,))
  warned = [m for m in seen.messages if 'reference from before the watched reference' in m]
  assert len(warned) == 1 and 'initial policy' in warned[0], seen.messages
  assert _holds(old, [8]) == {8: (False, False, None)}   # the initial policy: nothing saved


def test_the_reference_before_a_reset_round_trips_verified_and_sized(tmp_path):
  """Checkpointer: the reference_before_reset item restores exactly, is in the manifest (a
  damaged file in it quarantines the checkpoint), and the free space asked for the next
  checkpoint counts the params items the latest one lacks."""
  d = str(tmp_path / 'ckpts')
  ckpt = checkpoint.Checkpointer(d, keep=3)
  state, ref, before = make_state(0, steps=1), make_params(7), make_params(8)
  ckpt.save(1, state, {}, {})
  needed = ckpt._needed_bytes  # pylint: disable=protected-access
  items = {'state': state, 'reference': ref, checkpoint.BEFORE_RESET: before}
  assert needed(items) == needed({'state': state}) + 2 * checkpoint.tree_nbytes(ref)
  ckpt.save(2, state, {}, {}, reference=ref, reference_before_reset=before)
  assert_trees_equal(ckpt.restore_reference_before_reset(2, make_params(0)), before)
  ckpt.close()
  item = os.path.join(d, '2', checkpoint.BEFORE_RESET)
  name = max((os.path.join(r, n) for r, _, ns in os.walk(item) for n in ns), key=os.path.getsize)
  with open(name, 'r+b') as f:
    f.write(b'\xff' * 8)
  ckpt = checkpoint.Checkpointer(d, keep=3)
  assert ckpt.all_steps() == [1]
  assert 'checkpoint 2 is unusable' in ckpt.problems[0], ckpt.problems
  ckpt.close()


@pytest.mark.parametrize('damage', ['delete', 'truncate'])
def test_a_reference_before_reset_that_cannot_be_read_is_one_line_naming_it(tmp_path, damage):
  """In a checkpoint without a manifest (not verified at open: the process died before it, or
  an older rft_jax), a missing or truncated reference_before_reset item raises one line naming
  the item's directory and what is wrong, an OSError the command line reports with the last
  good checkpoint kept (was: orbax's KeyError or tensorstore's ValueError, raw). The checkpoint
  stays in place."""
  d = str(tmp_path / 'ckpts')
  ckpt = checkpoint.Checkpointer(d, keep=3)
  ckpt.save(2, make_state(0, steps=1), {}, {}, reference_before_reset=make_params(8))
  ckpt.close()
  os.remove(os.path.join(d, '2', checkpoint.MANIFEST))
  item = os.path.join(d, '2', checkpoint.BEFORE_RESET)
  if damage == 'delete':
    shutil.rmtree(item)
  else:
    for root, _, names in os.walk(item):
      for name in names:
        os.truncate(os.path.join(root, name), 10)
  ckpt = checkpoint.Checkpointer(d, keep=3)
  with pytest.raises(checkpoint.CheckpointReadError) as info:
    ckpt.restore_reference_before_reset(2, make_params(0))
  e = info.value
  assert isinstance(e, OSError) and e.filename == item, e
  what = ("checkpoint 2's reference_before_reset item (the reference an undo of the watched "
          'reference reset puts back) ')
  if damage == 'delete':
    assert e.strerror == what + 'is missing'
  else:
    assert e.strerror.startswith(what + 'cannot be read (JSONDecodeError: '), e.strerror
  assert '\n' not in str(e), str(e)
  assert ckpt.all_steps() == [2] and os.path.isdir(os.path.join(d, '2'))
  ckpt.close()
