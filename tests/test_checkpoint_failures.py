"""Tests for rft_jax.checkpoint's crash safety: damaged or unverified checkpoints (quarantined,
reported), interrupted deletes, retention of verified checkpoints only, too little disk, failing
and full-disk writes said in one plain line, and the failed-save policy (go on with a good
checkpoint, else stop; the final and stop checkpoints must be saved)."""
import gc
import json
import logging
import os
import shutil
import sys
import types

import ml_collections
import pytest

from checkpoint_fixtures import TENSORSTORE_FULL, assert_trees_equal, make_params, make_state
from rft_jax import checkpoint
from rft_jax import checkpoint_errors
from rft_jax.checkpoint import Checkpointer


def _save_steps(directory, steps, keep=3):
  ckpt = Checkpointer(directory, keep=keep)
  states = {s: make_state(s, steps=s) for s in steps}
  for s, st in states.items():
    ckpt.save(s, st, {'step': s}, {'m': s})
  ckpt.close()
  return states


def _largest_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs
           if f != checkpoint.MANIFEST]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize('damage', ['truncate', 'flip_byte', 'delete_file'])
def test_a_damaged_checkpoint_is_quarantined_and_the_previous_one_used(tmp_path, damage):
  d = str(tmp_path / 'ckpts')
  states = _save_steps(d, [1, 2])
  step_dir = os.path.join(d, '2')
  victim = _largest_file(step_dir)
  if damage == 'truncate':
    with open(victim, 'r+b') as f:
      f.truncate(os.path.getsize(victim) // 2)
  elif damage == 'flip_byte':
    with open(victim, 'r+b') as f:
      f.seek(os.path.getsize(victim) // 2)
      b = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([b[0] ^ 0xFF]))
  else:
    os.remove(victim)
  ckpt = Checkpointer(d, keep=3)
  assert ckpt.all_steps() == [1]
  assert len(ckpt.problems) == 1 and ckpt.problems[0].startswith('checkpoint 2 is unusable (')
  assert not os.path.exists(step_dir)
  assert len(os.listdir(d + '.quarantine')) == 1       # kept for inspection, never loaded
  restored, data, _, _ = ckpt.restore(1, states[2])
  assert_trees_equal(restored, states[1])
  assert data == {'step': 1}
  # The run goes on: step 2 can be written again.
  ckpt.save(2, states[2], {'step': 2}, {})
  assert ckpt.all_steps() == [1, 2]
  ckpt.close()


def test_a_checkpoint_without_manifest_is_used_and_reported_unverified(tmp_path):
  d = str(tmp_path / 'ckpts')
  states = _save_steps(d, [1, 2])
  os.remove(os.path.join(d, '2', checkpoint.MANIFEST))
  ckpt = Checkpointer(d, keep=3)
  assert ckpt.all_steps() == [1, 2]
  assert ckpt.problems == ['checkpoint 2 has no manifest: complete per orbax but not verified']
  restored, _, _, _ = ckpt.restore(2, states[1])
  assert_trees_equal(restored, states[2])
  # The run goes on from it: the next save sizes itself from the unverified checkpoint's files
  # (a kill between orbax's rename and the manifest once made this save fail).
  ckpt.save(3, states[2], {'step': 3}, {})
  assert ckpt.all_steps() == [1, 2, 3]
  assert checkpoint.verify(os.path.join(d, '3')) is None
  ckpt.close()


def test_an_interrupted_delete_is_finished_not_loaded(tmp_path):
  d = str(tmp_path / 'ckpts')
  _save_steps(d, [1, 2])
  os.replace(os.path.join(d, '1'), os.path.join(d, '1.deleting'))   # killed mid-delete
  ckpt = Checkpointer(d, keep=3)
  assert ckpt.all_steps() == [2] and ckpt.problems == []
  assert sorted(os.listdir(d)) == ['2']
  ckpt.close()


def test_retention_counts_only_verified_checkpoints(tmp_path):
  d = str(tmp_path / 'ckpts')
  _save_steps(d, [1, 2, 3, 4], keep=2)
  assert sorted(n for n in os.listdir(d)) == ['3', '4']


def test_too_little_disk_refuses_to_save_and_keeps_the_old(tmp_path, monkeypatch):
  d = str(tmp_path / 'ckpts')
  ckpt = Checkpointer(d, keep=2)
  ckpt.save(1, make_state(1, steps=1), {}, {})
  usage = shutil.disk_usage(d)
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage',
                      lambda p: usage._replace(free=1000))
  with pytest.raises(checkpoint.CheckpointSaveError, match=r'0 MiB free in .*ckpts, a '
                     r'checkpoint needs about \d+ MiB'):
    ckpt.save(2, make_state(2, steps=2), {}, {})
  assert ckpt.all_steps() == [1] and sorted(os.listdir(d)) == ['1']
  ckpt.close()


def test_the_space_asked_for_a_checkpoint_counts_the_items_it_writes(tmp_path):
  """need = the latest checkpoint's bytes (its manifest), less its params items the next one
  leaves out, plus the in-memory bytes of the params items the next one adds (the left-out ones
  were counted too: one params' worth too many once a reset's undo was no longer watched). Hand
  numbers: manifests of chosen sizes; make_params holds 664 float32, 2,656 bytes."""
  d = str(tmp_path / 'ckpts')
  ckpt = Checkpointer(d, keep=3)
  state, params = make_state(1, steps=1), make_params(1)
  before = checkpoint.BEFORE_RESET
  ckpt.save(1, state, {}, {}, reference=params, reference_before_reset=params)
  assert checkpoint.tree_nbytes(params) == 2656
  manifest = os.path.join(d, '1', checkpoint.MANIFEST)

  def latest_holds(files):
    with open(manifest, 'w') as f:
      json.dump({'step': 1, 'files': {name: [size, 0] for name, size in files.items()}}, f)

  base = {'state/a': 4000, 'state/b': 1000, 'data/d': 20, 'meta/m': 30, '_METADATA': 50}
  latest_holds({**base, 'reference/a': 2000, 'reference/b': 700, f'{before}/a': 2700})
  needed = ckpt._needed_bytes  # pylint: disable=protected-access
  assert needed({'state': state, 'reference': params, before: params}) == 5100 + 2700 + 2700
  assert needed({'state': state, 'reference': params, before: None}) == 5100 + 2700   # was 10500
  assert needed({'state': state, 'reference': None, before: None}) == 5100   # was 10500
  latest_holds(base)
  assert needed({'state': state, 'reference': params, before: None}) == 5100 + 2656
  assert needed({'state': state, 'reference': params, before: params}) == 5100 + 2 * 2656
  ckpt.close()


def test_a_failing_write_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
  d = str(tmp_path / 'ckpts')
  ckpt = Checkpointer(d, keep=2)
  ckpt.save(1, make_state(1, steps=1), {}, {})

  def no_space(*args, **kwargs):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(checkpoint, 'file_digests', no_space)   # fails after orbax wrote step 2
  with pytest.raises(checkpoint.CheckpointSaveError, match='No space left on device'):
    ckpt.save(2, make_state(2, steps=2), {}, {})
  assert ckpt.all_steps() == [1] and sorted(os.listdir(d)) == ['1']
  ckpt.close()


def test_a_write_failing_on_a_full_disk_is_one_plain_line_without_orbax_tracebacks(
    tmp_path, monkeypatch, caplog, capfd):
  """Orbax logged every thread's traceback (1,000+ lines), asyncio its failed tasks, and the
  message carried the first line of orbax's error, a whole tensorstore spec. Now: one line,
  'No space left on device (<dir>)', and nothing on the console, then or later."""
  # orbax's module where its writer threads size each array before writing it
  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=C0415
  from rft_jax import runs  # pylint: disable=g-import-not-at-top
  d = str(tmp_path / 'ckpts')
  ckpt = Checkpointer(d, keep=2)
  ckpt.save(1, make_state(1, steps=1), {}, {})
  unraisable = []
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)

  def full_disk(arr):   # every array orbax writes fails as on a full disk
    raise ValueError(TENSORSTORE_FULL)
  hooks = _Messages()
  config = ml_collections.ConfigDict({'train': {'min_good_checkpoints': 1, 'steps': 10}})
  with caplog.at_level('INFO'):
    with monkeypatch.context() as patch:
      patch.setattr(serialization, 'estimate_write_memory_footprint', full_disk)
      with pytest.raises(checkpoint.CheckpointSaveError) as info:
        ckpt.save(2, make_state(2, steps=2), {}, {})
      assert not runs.save_checkpoint(config, ckpt, 3, make_state(3, steps=3), {}, {}, hooks)
    # After it returned, tensorstore's writes of the failed save may still call into orbax's
    # closed event loop, and asyncio report orbax's futures: muted until close.
    late = RuntimeError('Event loop is closed')
    sys.unraisablehook(types.SimpleNamespace(exc_type=RuntimeError, exc_value=late,
                                             exc_traceback=None, err_msg=None, object=None))
    logging.getLogger('asyncio').error("Future exception was never retrieved\nfuture: <Future "
                                       "exception=ValueError('/ckpts/4.orbax-checkpoint-tmp')>")
    assert ckpt.save(4, make_state(4, steps=4), {}, {}) is None   # a later save works
    ckpt.close()
    gc.collect()   # what orbax's failed writes left alive would log now
  assert str(info.value) == f'No space left on device ({d})' and info.value.errno == 28
  assert hooks.lines == [f'checkpoint at step 3 NOT saved: No space left on device ({d}); '
                         'training goes on with 1 good checkpoint(s), the latest at step 1']
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[:2000]
  assert capfd.readouterr() == ('', '') and unraisable == []
  assert ckpt.all_steps() == [1, 4]
  # Closing ended the muting.
  assert [logging.getLogger(n).filters for n in ('absl', 'orbax', 'asyncio')] == [[], [], []]
  assert sys.unraisablehook == unraisable.append


@pytest.mark.parametrize('error,reason', [
    (OSError(5, 'Input/output error', '/d/2/x'), 'Input/output error (/d/2/x)'),
    (ValueError("UNKNOWN: write failed [os_error_code='122']"), 'Disk quota exceeded (/d)'),
    (ValueError('RESOURCE_EXHAUSTED: quota\nmore'), 'out of disk space or quota: '
     'RESOURCE_EXHAUSTED (/d)'),
    (ValueError('x' * 300 + '\nsecond line'), 'ValueError: ' + 'x' * 200 + '...'),
])
def test_a_failed_write_is_said_in_a_few_words(error, reason):
  assert checkpoint_errors.describe(error, '/d')[0] == reason


class _Messages:
  def __init__(self):
    self.lines = []

  def on_message(self, text):
    self.lines.append(text)


def test_failed_save_policy_goes_on_with_a_good_checkpoint_else_stops(tmp_path, monkeypatch):
  from rft_jax import runs  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({'train': {'min_good_checkpoints': 1, 'steps': 10}})
  ckpt = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  hooks = _Messages()
  usage = shutil.disk_usage(str(tmp_path))
  full = lambda p: usage._replace(free=0)
  # No good checkpoint yet and the disk is full: the run must stop, saying why.
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', full)
  with pytest.raises(runs.TrainingError, match=r'checkpoint at step 1 not saved: .*only 0 good '
                     r'checkpoint\(s\).*min_good_checkpoints=1'):
    runs.save_checkpoint(config, ckpt, 1, make_state(1, steps=1), {}, {}, hooks)
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', lambda p: usage)
  assert runs.save_checkpoint(config, ckpt, 2, make_state(2, steps=2), {}, {}, hooks)
  # One good checkpoint: a failed save is reported and training goes on.
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', full)
  assert not runs.save_checkpoint(config, ckpt, 3, make_state(3, steps=3), {}, {}, hooks)
  assert len(hooks.lines) == 1
  assert hooks.lines[0].startswith('checkpoint at step 3 NOT saved: 0 MiB free')
  assert hooks.lines[0].endswith(
      'training goes on with 1 good checkpoint(s), the latest at step 2')
  assert ckpt.all_steps() == [2]
  # The final step's checkpoint, or a stop request's, holds what was trained: it must be saved.
  with pytest.raises(runs.TrainingError, match=r'^the final checkpoint \(step 10\) was not saved: '
                     r'.*latest good checkpoint: step 2\)'):
    runs.save_checkpoint(config, ckpt, 10, make_state(10, steps=10), {}, {}, hooks)
  with pytest.raises(runs.TrainingError, match=r'^the stop checkpoint \(step 4\) was not saved'):
    runs.save_checkpoint(config, ckpt, 4, make_state(4, steps=4), {}, {}, hooks, stopping=True)
  ckpt.close()


def test_a_failed_save_says_what_the_same_command_does_next(tmp_path, monkeypatch):
  """With no good checkpoint there is nothing to resume from: the command starts over."""
  from rft_jax import runs  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({'train': {'min_good_checkpoints': 1, 'steps': 2}})
  ckpt = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  usage = shutil.disk_usage(str(tmp_path))
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', lambda p: usage._replace(free=0))
  for step in (1, 2):   # the first checkpoint, then the final one
    with pytest.raises(runs.TrainingError) as e:
      runs.save_checkpoint(config, ckpt, step, make_state(step, steps=step), {}, {}, _Messages())
    assert str(e.value).endswith(
        'free space and run the same command to start the run over (no checkpoint yet)')
  ckpt.close()
