"""Pure-function view of the NNX model: split once, merge inside jitted code.

`params` is an `nnx.State` (a pytree of float32 arrays with logical-axis metadata); optax and
orbax treat it like any pytree.
"""
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from rft_jax.models import llama
from rft_jax.models.llama import Cache, ModelConfig, Transformer


def create(cfg: ModelConfig, seed: int = 0):
  """Randomly initialised model -> (graphdef, params).

  Built with eager sharding off so it works outside a mesh; place params with
  `jax.device_put(params, shardings)` afterwards (rft_jax.parallel).
  """
  with jax.set_mesh(None), nnx.use_eager_sharding(False):
    model = Transformer(cfg, nnx.Rngs(seed))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, params


def abstract_params(cfg: ModelConfig):
  """(graphdef, params of ShapeDtypeStructs) without allocating or computing anything.

  Built once per config (tracing the model's init takes ~0.06 s for the issue-11 model, and a
  run's set-up asks 3-5 times: the HF tensor names, the checks, the params' shardings); each
  call gets its own State, so a caller that changes its copy changes no other."""
  try:
    graphdef, params = _abstract_split(cfg)
  except TypeError:   # an unhashable field (e.g. a list in rope_scaling): not cached
    graphdef, params = _abstract_split.__wrapped__(cfg)
  return graphdef, jax.tree.map(lambda x: x, params)


@functools.lru_cache(maxsize=16)
def _abstract_split(cfg: ModelConfig):
  # No mesh in context either: flax would attach the logical names as mesh axes (the trainer
  # traces under jax.set_mesh; params are placed by rft_jax/parallel rules instead).
  with jax.set_mesh(None), nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))
  return nnx.split(model, nnx.Param)


def positions_from_mask(mask_bt: jax.Array) -> jax.Array:
  """Position ids for left-padded rows: positions_bt = max(cumsum(mask_bt) - 1, 0)."""
  return jnp.maximum(jnp.cumsum(mask_bt, axis=-1) - 1, 0).astype(jnp.int32)


def forward(graphdef, params, tokens_bt: jax.Array, mask_bt: jax.Array,
            logits_from: int = 0) -> jax.Array:
  """Full causal forward pass without a cache -> logits [B,T,V] (float32).

  mask_bt [B,T] is 1 on real tokens (left and right padding allowed); pad keys are never attended.
  logits_from > 0 (static): the LM head runs on positions >= logits_from only -> [B,T-from,V].
  """
  model = nnx.merge(graphdef, params)
  if logits_from:
    h_bte, _ = model.hidden(tokens_bt, positions_from_mask(mask_bt), mask_bt.astype(bool))
    return model.logits(h_bte[:, logits_from:])
  logits, _ = model(tokens_bt, positions_from_mask(mask_bt), mask_bt.astype(bool))
  return logits


def forward_completions(graphdef, params, tokens_bs: jax.Array, mask_bs: jax.Array,
                        prompt_len: int, group_size: int) -> jax.Array:
  """forward(..., logits_from=P - 1)[:, :-1] -> logits [B, T, V] at the positions that predict
  the completion tokens (T = S - P), running each group's prompt through the model once
  (hidden_completions, then the LM head)."""
  model = nnx.merge(graphdef, params)
  return model.logits(hidden_completions(graphdef, params, tokens_bs, mask_bs, prompt_len,
                                         group_size))


def hidden_completions(graphdef, params, tokens_bs: jax.Array, mask_bs: jax.Array,
                       prompt_len: int, group_size: int) -> jax.Array:
  """The final normed hidden states [B, T, E] at positions P - 1 .. S - 2 (those that predict the
  T = S - P completion tokens), running each group's prompt through the model once.

  Rows [g*K, (g+1)*K) (K = group_size) must share their first P = prompt_len slots, tokens and
  mask: the sampler's group layout (sampling/sampler.make_sampler). The G = B / K prompts [G, P]
  run through the model writing a KV cache; the completions [B, T] then run with that cache as
  their shared prefix (llama.Attention's prefix: never repeated over the group), each query
  seeing the prompt's real slots and its own causal slots, as in the full pass. The prompt's
  last position (which predicts completion token 0) is computed once per group and repeated.
  Same values as Transformer.hidden up to float rounding; the prompt's projections and MLP cost
  G * P tokens instead of B * P. Gradients reach the prompt's activations through the prefix
  attention (summed over the group). Layers run unrolled and without remat.
  """
  model = nnx.merge(graphdef, params)
  b, s = tokens_bs.shape
  p, k, t = prompt_len, group_size, s - prompt_len
  prompt_mask_gp = mask_bs[::k, :p]
  cache = init_cache(model.cfg, b // k, p)
  h_gpe, cache = model.hidden(tokens_bs[::k, :p], positions_from_mask(prompt_mask_gp),
                              prompt_mask_gp.astype(bool), cache, 0)
  first_b1e = jnp.repeat(h_gpe[:, -1:], k, axis=0)
  if t == 1:
    return first_b1e
  # Completion tokens 0 .. T-2 predict tokens 1 .. T-1.
  h_bte, _ = model.hidden(tokens_bs[:, p:s - 1], positions_from_mask(mask_bs)[:, p:s - 1],
                          mask_bs[:, p:s - 1].astype(bool),
                          prefix=(cache, prompt_mask_gp.astype(bool)))
  return jnp.concatenate([first_b1e, h_bte], axis=1)


def forward_cached(graphdef, params, tokens_bt, positions_bt, kv_valid_bs, cache: Cache,
                   cache_index, rope_bt=None, prefix=None):
  """Forward T new tokens written into cache slots [cache_index, cache_index + T).

  kv_valid_bs [B,S] marks valid key slots (including the T being written). rope_bt: optional
  precomputed `rope_tables(cfg, positions_bt)` (positions_bt is then unused). prefix: an
  optional shared prompt cache (cache of [Z,K,P,D], valid_zp [Z,P]) before every row's own
  slots (llama.Transformer.hidden). Returns (logits [B,T,V], updated cache).
  """
  model = nnx.merge(graphdef, params)
  return model(tokens_bt, positions_bt, kv_valid_bs, cache, cache_index, rope_bt, prefix)


def rope_tables(cfg: ModelConfig, positions_bt: jax.Array):
  """(cos, sin) [B,T,1,D] of the rotary angles at positions_bt (llama.rope_tables)."""
  return llama.rope_tables(positions_bt, llama.rope_inv_freq(cfg))


def init_cache(cfg: ModelConfig, batch: int, length: int) -> Cache:
  """Zeroed KV cache: per layer {'k','v'} of shape [B, K, S=length, D] in the compute dtype.

  Heads before slots: decoding's attention dots then read the cache as it lies (with [B,S,K,D]
  XLA CPU copied the whole cache into that layout at every decode step)."""
  shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
  return [{'k': jnp.zeros(shape, cfg.compute_dtype), 'v': jnp.zeros(shape, cfg.compute_dtype)}
          for _ in range(cfg.num_hidden_layers)]
