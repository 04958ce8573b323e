"""Tests for rft_jax.checkpoint: TrainState + JSON round trips, retention, standalone params."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rft_jax.algorithms.train_state import TrainState
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
  restored, rdata, rmeta = ckpt.restore(3, like)
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
  restored2, rdata2, _ = again.restore(again.latest_step(), like)
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
    restored, data, meta = ckpt.restore(s, states[1])
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
  restored, data, meta = ckpt.restore(2, state, shardings)
  ckpt.close()
  assert_trees_equal(restored, state)
  assert all(x.sharding == sharding for x in jax.tree.leaves(restored))
  assert data == {} and meta == {}
  path = str(tmp_path / 'params')
  save_params(path, state.params)
  got = load_params(path, state.params, jax.tree.map(lambda _: sharding, state.params))
  assert_trees_equal(got, state.params)
  assert all(x.sharding == sharding for x in jax.tree.leaves(got))
