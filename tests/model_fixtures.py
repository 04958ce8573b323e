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


# A one-layer model and a batch of 8 rows (groups of 2 sharing a prompt of 3 tokens, 5 completion
# tokens of lengths 5, 1, 3, 4, 2, 5, 0, 3; the last row unscored) for the loss and step tests.
TINY_B, TINY_P, TINY_T = 8, 3, 5


def tiny_model_config():
  from rft_jax.models import ModelConfig  # pylint: disable=g-import-not-at-top
  return ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                     tie_word_embeddings=False)


def tiny_batch(prompt_mask_bp=None):
  """-> (graphdef, params, ref_params, rollout, rewards [B], valid [B], rng): params are the
  seed-0 init plus N(0, 0.3^2) noise, ref_params those plus N(0, 0.05^2); prompt_mask_bp [B, P]
  defaults to all ones; rng (np.random.RandomState(6), after the draws here) for more draws."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from rft_jax.models import create  # pylint: disable=g-import-not-at-top
  from rft_jax.sampling.sampler import Rollout  # pylint: disable=g-import-not-at-top
  b, p, t = TINY_B, TINY_P, TINY_T
  graphdef, state = create(tiny_model_config(), seed=0)
  rng = np.random.RandomState(6)
  noise = lambda tree, scale: jax.tree.map(
      lambda x: x + scale * jnp.asarray(rng.randn(*x.shape), jnp.float32), tree)
  params = noise(nnx.to_pure_dict(state), 0.3)
  ref_params = noise(params, 0.05)
  lengths = np.array([5, 1, 3, 4, 2, 5, 0, 3])
  mask_bt = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  rollout = Rollout(
      # Groups of 2 rows share their prompt (the sampler's layout, algo.shared_prompt).
      prompt_tokens_bp=jnp.asarray(np.repeat(rng.randint(2, 16, (b // 2, p)), 2, axis=0),
                                   jnp.int32),
      prompt_mask_bp=jnp.asarray(np.ones((b, p)) if prompt_mask_bp is None else prompt_mask_bp,
                                 jnp.int32),
      tokens_bt=jnp.asarray(rng.randint(2, 16, (b, t)) * mask_bt, jnp.int32),
      logp_bt=jnp.zeros((b, t), jnp.float32), mask_bt=jnp.asarray(mask_bt),
      truncated_b=jnp.asarray(lengths == t))
  rewards = jnp.array([1.0, 0.0, 0.5, 0.5, 0.0, 1.0, 0.3, 0.9])
  valid = jnp.array([True] * 7 + [False])
  return graphdef, params, ref_params, rollout, rewards, valid, rng
