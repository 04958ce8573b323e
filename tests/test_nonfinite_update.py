"""A non-finite gradient skips the update on device: params and optimizer state are unchanged,
the skip is reported, and the next finite update proceeds as if the bad batch never came."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rft_jax.algorithms import train_state as ts


def _setup():
  cfg = ml_collections.ConfigDict({'lr': 1e-2, 'warmup_steps': 0, 'b1': 0.9, 'b2': 0.99,
                                   'weight_decay': 0.1, 'grad_clip': 1.0})
  tx, schedule = ts.make_optimizer(cfg), ts.lr_schedule(cfg)
  params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(3)}
  state = ts.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
  return state, tx, schedule


def test_nan_and_inf_gradients_leave_the_state_unchanged():
  state, tx, schedule = _setup()
  good = {'w': jnp.full((2, 3), 0.5), 'b': jnp.full(3, -0.25)}
  state, _ = ts.apply_gradients(state, good, tx, schedule)
  for bad_value in (jnp.nan, jnp.inf):
    bad = {'w': good['w'].at[1, 2].set(bad_value), 'b': good['b']}
    new, stats = ts.apply_gradients(state, bad, tx, schedule)
    assert float(stats['update_skipped']) == 1.0 and float(stats['update_norm']) == 0.0
    assert not np.isfinite(float(stats['grad_norm']))
    for a, b in zip(jax.tree.leaves((new.params, new.opt_state)),
                    jax.tree.leaves((state.params, state.opt_state))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(new.step) == int(state.step) + 1
  # After a skipped step, a finite one gives exactly what it would have without the bad batch.
  skipped, _ = ts.apply_gradients(state, {'w': good['w'] * jnp.nan, 'b': good['b']}, tx,
                                  schedule)
  after_skip, stats = ts.apply_gradients(skipped, good, tx, schedule)
  direct, _ = ts.apply_gradients(state, good, tx, schedule)
  assert float(stats['update_skipped']) == 0.0
  for a, b in zip(jax.tree.leaves(after_skip.params), jax.tree.leaves(direct.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_non_finite_update_from_finite_gradients_is_skipped_too():
  """lr_scale = inf (or an inf learning rate, whose warm-up gives 0 * inf = NaN): the gradient is
  finite but the update is not; it used to be applied, turning every parameter into NaN."""
  state, tx, schedule = _setup()
  state = state.replace(controls={'lr_scale': jnp.float32(jnp.inf)})
  good = {'w': jnp.full((2, 3), 0.5), 'b': jnp.full(3, -0.25)}
  new, stats = ts.apply_gradients(state, good, tx, schedule)
  assert np.isfinite(float(stats['grad_norm'])) and float(stats['update_skipped']) == 1.0
  for a, b in zip(jax.tree.leaves((new.params, new.opt_state)),
                  jax.tree.leaves((state.params, state.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_update_skipped_of_a_step_counts_all_its_updates():
  """Several updates per step (algo.updates_per_batch epochs, PPO's mini-batches within each):
  'update_skipped' is the fraction of the step's updates skipped, over every epoch (it was the
  last epoch's alone, so a step whose first update was skipped read 0, and one whose last was
  read 1: 'every update was skipped'). The other metrics stay the last epoch's."""
  from rft_jax.algorithms import step_fns   # pylint: disable=g-import-not-at-top
  calls = []

  def train_step(state, batch):
    calls.append(batch)
    skipped = jnp.float32([1.0, 0.0, 0.5][state])   # epoch 3: half its mini-batches skipped
    return state + 1, {'update_skipped': skipped, 'critic/update_skipped': 1.0 - skipped,
                       'loss': jnp.float32(state)}

  state, metrics = step_fns.train_epochs(train_step, 0, 'batch', 3)
  assert state == 3 and calls == ['batch'] * 3
  assert float(metrics['update_skipped']) == pytest.approx(0.5)
  assert float(metrics['critic/update_skipped']) == pytest.approx(0.5)
  assert float(metrics['loss']) == 2.0
  state, metrics = step_fns.train_epochs(train_step, 1, 'batch', 1)
  assert state == 2 and float(metrics['update_skipped']) == 0.0
