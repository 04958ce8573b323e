"""Tests for rft_jax.checkpoint: TrainState + JSON round trips, retention, standalone params."""

import gc
import logging
import os
import shutil
import sys
import types

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rft_jax.algorithms.train_state import TrainState
from rft_jax import checkpoint
from rft_jax import checkpoint_errors
from rft_jax.checkpoint import Checkpointer, load_params, save_params


def make_params(seed):
  """A params pure dict in the nnx.to_pure_dict layout: int keys under 'layers'."""
  rng = np.random.RandomState(seed)
  f = lambda *shape: jnp.asarray(rng.randn(*shape), jnp.float32)
  return {
      'embed_tokens': {'embedding': f(16, 8)},
      'layers': {i: {'input_layernorm': {'weight': f(8)},
                     'self_attn': {'q_proj': {'kernel': f(8, 8), 'bias': f(8)}},
                     'mlp': {'up_proj': {'kernel': f(8, 12)}}} for i in range(3)},
      'norm': {'weight': f(8)},
  }


def make_state(seed, steps):
  """A TrainState after `steps` real adamw updates (non-trivial mu, nu and count)."""
  params = make_params(seed)
  tx = optax.adamw(1e-2, weight_decay=0.1)
  opt_state = tx.init(params)
  for k in range(steps):
    grads = jax.tree.map(lambda x, k=k: jnp.sin(x * (k + 1)), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
  return TrainState(step=jnp.int32(steps), params=params, opt_state=opt_state)


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)


def test_train_state_round_trip(tmp_path):
  state = make_state(0, steps=3)
  data = {'iterator': {'epoch': 2, 'index': [5, 7]}, 'name': 'arith'}
  meta = {'base_eval': {'eval/accuracy': 0.25}, 'wall_s': 12.5}
  ckpt = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  assert ckpt.latest_step() is None
  ckpt.save(3, state, data, meta)
  assert ckpt.latest_step() == 3
  like = make_state(1, steps=1)                            # same structure, other values
  restored, rdata, rmeta, ref = ckpt.restore(3, like)
  assert ref is None
  ckpt.close()
  assert isinstance(restored, TrainState)
  assert_trees_equal(restored, state)
  assert sorted(restored.params['layers']) == [0, 1, 2]    # int keys survive
  assert int(restored.step) == 3
  assert int(restored.opt_state[0].count) == 3
  assert rdata == data and rmeta == meta
  # A fresh Checkpointer on the same directory (a resumed run) sees and restores the same.
  again = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  assert again.latest_step() == 3
  restored2, rdata2, _, _ = again.restore(again.latest_step(), like)
  again.close()
  assert_trees_equal(restored2, state)
  assert rdata2 == data


def test_keep_retains_last_two(tmp_path):
  ckpt = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  states = {s: make_state(s, steps=s) for s in [1, 2, 3, 4]}
  for s, st in states.items():
    ckpt.save(s, st, {'step': s}, {'m': s * 10})
  assert ckpt.latest_step() == 4
  on_disk = sorted(int(n) for n in os.listdir(tmp_path / 'ckpts') if n.isdigit())
  assert on_disk == [3, 4]
  for s in [3, 4]:
    restored, data, meta, _ = ckpt.restore(s, states[1])
    assert_trees_equal(restored, states[s])
    assert data == {'step': s} and meta == {'m': s * 10}
  ckpt.close()


def test_save_load_params_round_trip(tmp_path):
  params = make_params(0)
  path = str(tmp_path / 'params')
  save_params(path, params)
  got = load_params(path, make_params(1))
  assert_trees_equal(got, params)
  # Saving again overwrites.
  other = make_params(2)
  save_params(path, other)
  assert_trees_equal(load_params(path, params), other)


def test_load_params_missing_path_raises(tmp_path):
  with pytest.raises(FileNotFoundError):
    load_params(str(tmp_path / 'nope'), make_params(0))


def test_restore_into_given_shardings(tmp_path):
  state = make_state(0, steps=2)
  ckpt = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  ckpt.save(2, state, {}, {})
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shardings = jax.tree.map(lambda _: sharding, state)
  restored, data, meta, _ = ckpt.restore(2, state, shardings)
  ckpt.close()
  assert_trees_equal(restored, state)
  assert all(x.sharding == sharding for x in jax.tree.leaves(restored))
  assert data == {} and meta == {}
  path = str(tmp_path / 'params')
  save_params(path, state.params)
  got = load_params(path, state.params, jax.tree.map(lambda _: sharding, state.params))
  assert_trees_equal(got, state.params)
  assert all(x.sharding == sharding for x in jax.tree.leaves(got))


# --- Crash safety: verification, quarantine, interrupted deletes, disk -----------------------

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


# What orbax raises when tensorstore's write hits a full disk: the first line holds the spec.
_TENSORSTORE_FULL = ('RESOURCE_EXHAUSTED: Error writing "params/w" in OCDBT database: '
                     '{"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": "file:///ckpts/'
                     '2.orbax-checkpoint-tmp/state/"}, "metadata": {"chunks": [16, 8]}}\n'
                     'Failed to write 8192 bytes to file 4: No space left on device '
                     "[os_error_code='28']")


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
    raise ValueError(_TENSORSTORE_FULL)
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


def test_a_reset_reference_round_trips(tmp_path):
  ckpt = Checkpointer(str(tmp_path / 'ckpts'), keep=2)
  state, ref = make_state(0, steps=1), make_params(7)
  ckpt.save(1, state, {}, {'a': 1}, reference=ref)
  ckpt.save(2, state, {}, {'a': 2})
  _, _, meta1, ref1 = ckpt.restore(1, state, like_reference=make_params(0))
  _, _, meta2, ref2 = ckpt.restore(2, state, like_reference=make_params(0))
  ckpt.close()
  assert meta1 == {'a': 1} and meta2 == {'a': 2}
  assert_trees_equal(ref1, ref)
  assert ref2 is None


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
  assert hooks.lines[0].endswith('training goes on with 1 good checkpoint(s), the latest at step 2')
  assert ckpt.all_steps() == [2]
  # The final step's checkpoint, or a stop request's, holds what was trained: it must be saved.
  with pytest.raises(runs.TrainingError, match=r'^the final checkpoint \(step 10\) was not saved: '
                     r'.*latest good checkpoint: step 2\)'):
    runs.save_checkpoint(config, ckpt, 10, make_state(10, steps=10), {}, {}, hooks)
  with pytest.raises(runs.TrainingError, match=r'^the stop checkpoint \(step 4\) was not saved'):
    runs.save_checkpoint(config, ckpt, 4, make_state(4, steps=4), {}, {}, hooks, stopping=True)
  ckpt.close()


def test_a_checkpoint_from_an_older_version_resumes_with_new_state_started_afresh(tmp_path):
  """A checkpoint written before TrainState gained a field (PPO's critic), and whose monitor
  statistics have another layout (signals added since), restores params, optimizer state and step
  exactly; the new field and the monitor start afresh, and both are reported."""
  d = str(tmp_path / 'ckpts')
  old = make_state(1, 3).replace(monitor={'mean': jnp.arange(4.0), 'count': jnp.int32(7)})
  ckpt = Checkpointer(d)
  ckpt.save(3, old, {'step': 3}, {})
  ckpt.close()
  like = make_state(2, 0).replace(monitor={'mean': jnp.zeros(6), 'count': jnp.int32(0)},
                                  critic={'w': jnp.ones(3)})
  ckpt = Checkpointer(d)
  restored, data, _, _ = ckpt.restore(3, like)
  assert_trees_equal((restored.step, restored.params, restored.opt_state),
                     (old.step, old.params, old.opt_state))
  assert_trees_equal((restored.monitor, restored.critic), (like.monitor, like.critic))
  assert data == {'step': 3}
  assert ckpt.problems == [
      'checkpoint 3 has no critic state (written by an older rft_jax): starting it afresh',
      'checkpoint 3: the saved monitor state does not fit this version (array shapes differ); '
      'starting it afresh']
  # Same layout: the monitor comes back as saved.
  ckpt.save(4, restored.replace(monitor=old.monitor), {'step': 4}, {})
  again, _, _, _ = ckpt.restore(4, make_state(2, 0).replace(monitor=like.monitor))
  assert_trees_equal(again.monitor, like.monitor)
  # A reader that wants less (tools/checkpoint export: no monitor) skips what it does not want.
  params_only, _, _, _ = ckpt.restore(4, make_state(2, 0))
  assert params_only.monitor is None
  assert_trees_equal(params_only.params, old.params)
  ckpt.close()


def test_a_monitor_from_before_the_parameter_check_is_started_afresh(tmp_path):
  """A checkpoint whose failure monitor predates invariant/param_nonfinite and signature
  nonfinite_params (one invariant and one signature fewer: its [I] and [K] arrays one shorter)
  resumes with params, optimizer state and step exact and a fresh monitor, reported."""
  from rft_jax.monitor import monitor as monlib   # pylint: disable=g-import-not-at-top
  cfg = monlib.MonitorConfig(warmup=3)
  fresh = monlib.init_monitor(cfg)
  older = fresh.replace(step=jnp.int32(3), invariant_run=fresh.invariant_run[:-1],
                        active=fresh.active[:-1], onset=fresh.onset[:-1],
                        fired_count=fresh.fired_count[:-1] + 1)
  ckpt = Checkpointer(str(tmp_path / 'ckpts'))
  ckpt.save(3, make_state(1, 3).replace(monitor=older), {'step': 3}, {})
  restored, _, _, _ = ckpt.restore(3, make_state(2, 0).replace(monitor=fresh))
  assert_trees_equal((restored.step, restored.params), (make_state(1, 3).step,
                                                        make_state(1, 3).params))
  assert_trees_equal(restored.monitor, fresh)
  assert ckpt.problems == ['checkpoint 3: the saved monitor state does not fit this version '
                           '(array shapes differ); starting it afresh']
  ckpt.close()
