"""Small checkpoint helpers shared by the checkpoint tests (test_checkpoint.py,
test_checkpoint_failures.py, test_checkpoint_partial.py, test_reference_reset.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rft_jax.algorithms.train_state import TrainState


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


# What orbax raises when tensorstore's write hits a full disk: the first line holds the spec.
TENSORSTORE_FULL = ('RESOURCE_EXHAUSTED: Error writing "params/w" in OCDBT database: '
                    '{"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": "file:///ckpts/'
                    '2.orbax-checkpoint-tmp/state/"}, "metadata": {"chunks": [16, 8]}}\n'
                    'Failed to write 8192 bytes to file 4: No space left on device '
                    "[os_error_code='28']")
