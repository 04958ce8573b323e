"""Tests for rft_jax.checkpoint: TrainState + JSON round trips, retention, standalone params,
restoring into given shardings, a reset reference, and checkpoints from older versions (new
state started afresh). Damaged checkpoints and failed writes are in
test_checkpoint_failures.py."""

import os

import jax
import jax.numpy as jnp
import pytest

from checkpoint_fixtures import assert_trees_equal, make_params, make_state
from rft_jax.algorithms.train_state import TrainState
from rft_jax.checkpoint import Checkpointer, load_params, save_params


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
      'checkpoint 3: the saved monitor state does not fit this run (monitor.warmup changed, or '
      'an rft_jax with other signals wrote it); starting it afresh']
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
  assert ckpt.problems[0].startswith('checkpoint 3: the saved monitor state does not fit this '
                                     'run (monitor.warmup changed, or '), ckpt.problems
  ckpt.close()
