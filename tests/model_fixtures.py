"""Shared tiny-model helpers for the model, sampler and algorithm tests."""
import jax
import jax.numpy as jnp
import numpy as np


def randomize(pure, seed):
  """Replaces every leaf with O(1)-scale random values so that each weight matters.

  Freshly initialised norms are all ones and biases all zeros, which would hide mistakes in the
  way they are applied; kernels are N(0, 1/fan_in) so activations stay O(1).
  """
  rng = np.random.RandomState(seed)

  def one(path, x):
    name = path[-1].key
    shape = x.shape
    if name == 'weight':
      v = 1.0 + 0.3 * rng.randn(*shape)
    elif name == 'bias':
      v = 0.3 * rng.randn(*shape)
    elif name == 'kernel':
      v = rng.randn(*shape) / np.sqrt(shape[0])
    elif name == 'embedding':
      v = rng.randn(*shape)
    else:
      raise AssertionError(f'unexpected leaf {path}')
    return jnp.asarray(v, jnp.float32)

  return jax.tree_util.tree_map_with_path(one, pure)


def with_eos_bias(pure, beta, eos_id):
  """Gives EOS a logit beta * y0 with y0 > 0 at every position.

  Hidden dim 0 holds the constant 3 in every embedding and no layer writes to it, so after the
  final norm it is positive; only EOS reads it in lm_head. beta=1 makes EOS ~12% per step,
  beta=+100 forces EOS at once, beta=-100 forbids it.
  """
  p = jax.tree.map(np.array, pure)
  p['embed_tokens']['embedding'][:, 0] = 3.0
  for layer in p['layers'].values():
    layer['self_attn']['o_proj']['kernel'][:, 0] = 0.0
    layer['mlp']['down_proj']['kernel'][:, 0] = 0.0
  p['norm']['weight'][0] = 1.0
  p['lm_head']['kernel'][0, :] = 0.0
  p['lm_head']['kernel'][0, eos_id] = beta
  return jax.tree.map(jnp.asarray, p)


def np_log_softmax(x):
  """log_softmax over the last axis in float64 NumPy (a reference for the JAX code)."""
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))
