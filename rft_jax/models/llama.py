"""A decoder-only LM of the Llama / Qwen2 / Mistral family in Flax NNX.

RMSNorm, rotary position embeddings (HF "rotate_half" layout), grouped-query attention, SwiGLU MLP,
optional q/k/v bias (Qwen2) and optional tied input/output embeddings. Module and parameter names
follow the HF checkpoints (`embed_tokens`, `layers[i].self_attn.q_proj`, `mlp.gate_proj`, ...), so
a loader maps `model.layers.3.self_attn.q_proj.weight` to `layers[3].self_attn.q_proj.kernel`
(transposed: HF stores [out, in], NNX [in, out]).

Shapes use the letters: B batch, T query tokens, S key slots (= T without a cache, = the cache
length with one), H query heads, K key/value heads, G = H // K, D head dim, E hidden size,
F MLP size, V vocab.

Every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv_heads`, `mlp`); the
parallel package maps them onto the ('data', 'fsdp', 'tensor') mesh. Activations are constrained
by logical name too (rules.constrain; a no-op unless traced under `jax.set_mesh(mesh)`): the
residual stream [B,T,E] as ('batch', -, -), the MLP hidden [B,T,F] as ('batch', -, 'mlp'), the
KV cache [B,K,S,D] as ('batch', 'kv_heads', -, -) and the logits [B,T,V] as ('batch', -, 'vocab').

Numerics follow transformers' Llama/Qwen2/Mistral: attention logits scaled by 1/sqrt(D) and
softmaxed in float32; RMSNorm normalises in float32, casts back to the activation dtype and then
multiplies by its weight (so bf16 runs round where HF rounds); rotary angles are computed in
float32. Optional llama3 rope scaling (Llama 3.1+) and a Mistral sliding window are exact.
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rft_jax.parallel.rules import constrain

Cache = list[dict[str, jax.Array]]   # one {'k': [B,K,S,D], 'v': [B,K,S,D]} per layer


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture hyper-parameters; field names follow HF `config.json`."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  max_position_embeddings: int = 2048
  dtype: str = 'float32'
  # HF `rope_scaling` as sorted (key, value) pairs (hashable); None = plain rope. Only
  # rope_type 'llama3' (factor, low_freq_factor, high_freq_factor,
  # original_max_position_embeddings) is implemented.
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  sliding_window: int | None = None   # Mistral: query slot q sees key slots s with q - W < s <= q
  # Rematerialisation of each decoder layer in the full (training) forward pass: 'none' keeps
  # every activation for the backward pass; 'full' keeps only each layer's input and recomputes
  # the rest; 'dots' also keeps matmul outputs; 'dots_no_batch' keeps those without a batch
  # dimension (weights-like). A run-time option, not an architecture field (not in config.json).
  remat: str = 'none'
  # The full (training) forward pass as one lax.scan over the layers' stacked parameters instead
  # of an unrolled loop: compile time independent of depth. The stack is built inside the step
  # (one transient copy of the layer weights); decoding with a KV cache stays unrolled.
  scan_layers: bool = False

  @classmethod
  def from_dict(cls, d: Any) -> 'ModelConfig':
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(d).items() if k in fields})

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def num_params(self) -> int:
    e, f, l = self.hidden_size, self.intermediate_size, self.num_hidden_layers
    q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
    attn = e * q + 2 * e * kv + q * e + (q + 2 * kv if self.attention_bias else 0)
    layer = attn + 3 * e * f + 2 * e
    emb = self.vocab_size * e * (1 if self.tie_word_embeddings else 2)
    return l * layer + emb + e


class Linear(nnx.Linear):
  """nnx.Linear on the rows of x [..., din] flattened to one matrix [N, din] (same maths).

  The weight gradient is then a plain [din, N] @ [N, dout] matmul. On [B, T, din] inputs it
  contracts two dims, which XLA CPU canonicalises with a strided, transposing copy of the
  [B*T, dout] output gradient: measured at 40% of the MLP's backward pass (tools/bench).
  """

  def __call__(self, inputs, out_sharding=None):
    lead = inputs.shape[:-1]
    y = super().__call__(inputs.reshape(-1, inputs.shape[-1]), out_sharding=out_sharding)
    return y.reshape(*lead, y.shape[-1])


def _dense(rngs, din, dout, axes, *, bias=False, dtype=jnp.float32):
  init = nnx.with_partitioning(nnx.initializers.normal(0.02), axes)
  return Linear(din, dout, use_bias=bias, kernel_init=init,
                bias_init=nnx.with_partitioning(nnx.initializers.zeros, axes[1:]),
                dtype=dtype, param_dtype=jnp.float32, rngs=rngs)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

  def __init__(self, dim: int, eps: float):
    self.eps = eps
    self.weight = nnx.Param(nnx.with_partitioning(nnx.initializers.ones, ('embed',))(
        jax.random.key(0), (dim,), jnp.float32))

  def __call__(self, x):
    """As HF: the weight multiplies after the cast back to x.dtype (same result in float32)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.weight[...].astype(x.dtype) * y.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
  """Rotary inverse frequencies [D/2] (float32), as transformers' rope init functions.

  Plain: inv_freq_j = theta^(-2j/D). llama3 (transformers `_compute_llama3_parameters`), with
  wavelen_j = 2*pi / inv_freq_j, L = original_max_position_embeddings, f = factor:
    wavelen_j < L / high_freq_factor  -> inv_freq_j                     (high frequencies kept)
    wavelen_j > L / low_freq_factor   -> inv_freq_j / f                 (low frequencies scaled)
    otherwise, s = (L / wavelen_j - low_freq_factor) / (high_freq_factor - low_freq_factor):
                                      -> (1 - s) * inv_freq_j / f + s * inv_freq_j
  """
  d = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  if cfg.rope_scaling is None:
    return inv_freq
  rs = dict(cfg.rope_scaling)
  if rs.get('rope_type') != 'llama3':
    raise ValueError(f'rope_scaling rope_type={rs.get("rope_type")!r}: only llama3 is implemented')
  factor, low, high = rs['factor'], rs['low_freq_factor'], rs['high_freq_factor']
  old_len = rs['original_max_position_embeddings']
  wavelen = 2 * jnp.pi / inv_freq
  scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  is_medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
  return jnp.where(is_medium, smoothed, scaled)


def rope_tables(positions_bt: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B,T,1,D] float32 of angle_btj = position_bt * inv_freq_j, duplicated over the two
  halves of D (HF layout). Computed once per forward pass and shared by every layer's q and k."""
  angle = positions_bt.astype(jnp.float32)[..., None] * inv_freq            # [B,T,D/2]
  angle = jnp.concatenate([angle, angle], axis=-1)[:, :, None, :]          # [B,T,1,D]
  return jnp.cos(angle), jnp.sin(angle)


def rope(x_btnd: jax.Array, rope_bt: tuple[jax.Array, jax.Array]) -> jax.Array:
  """Rotary embedding, HF layout: x*cos + rotate_half(x)*sin, (cos, sin) from `rope_tables`."""
  cos_bt1d, sin_bt1d = rope_bt
  d = x_btnd.shape[-1]
  x = x_btnd.astype(jnp.float32)
  x1, x2 = x[..., : d // 2], x[..., d // 2:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x * cos_bt1d + rotated * sin_bt1d).astype(x_btnd.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with an optional external KV cache."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    e, h, k, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    dt = cfg.compute_dtype
    self.cfg = cfg
    self.q_proj = _dense(rngs, e, h * d, ('embed', 'heads'), bias=cfg.attention_bias, dtype=dt)
    self.k_proj = _dense(rngs, e, k * d, ('embed', 'kv_heads'), bias=cfg.attention_bias, dtype=dt)
    self.v_proj = _dense(rngs, e, k * d, ('embed', 'kv_heads'), bias=cfg.attention_bias, dtype=dt)
    self.o_proj = _dense(rngs, h * d, e, ('heads', 'embed'), dtype=dt)

  def __call__(self, x_bte, rope_bt, kv_valid_bs, cache, cache_index, prefix=None):
    """Returns (out [B,T,E], new layer cache or None). rope_bt: rope_tables of the positions.

    kv_valid_bs [B,S] marks key slots holding real tokens. Query t sits in slot q = cache_index + t
    and attends to slot s iff kv_valid[b,s] and s <= q (and q - W < s with a sliding window W,
    counted in slots as transformers does, pads included).

    prefix (optional): keys and values shared by groups of rows, (k_zkpd, v_zkpd, valid_zp) with
    B = Z * G (rows [z*G, (z+1)*G) share prefix z: a group's prompt). Its P slots come before the
    row's own slots (own slot s is slot P + s); every query sees the valid prefix slots (within
    the window). Scores for the prefix are one [G*T, D] x [D, P] product per (z, head): the
    prefix is never repeated over the group, in the forward pass, its gradient or the cache.
    """
    cfg = self.cfg
    b, t, _ = x_bte.shape
    h, k, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = rope(self.q_proj(x_bte).reshape(b, t, h, d), rope_bt)
    # Keys and values as [B,K,T,D], the cache's layout (init_cache): heads before slots.
    kk = rope(self.k_proj(x_bte).reshape(b, t, k, d), rope_bt).swapaxes(1, 2)
    v = self.v_proj(x_bte).reshape(b, t, k, d).swapaxes(1, 2)
    if cache is not None:
      kk = jax.lax.dynamic_update_slice_in_dim(cache['k'], kk.astype(cache['k'].dtype),
                                               cache_index, axis=2)
      v = jax.lax.dynamic_update_slice_in_dim(cache['v'], v.astype(cache['v'].dtype),
                                              cache_index, axis=2)
      kk = constrain(kk, ('batch', 'kv_heads', None, None))
      v = constrain(v, ('batch', 'kv_heads', None, None))
      cache = {'k': kk, 'v': v}
    s, g = kk.shape[2], h // k
    neg = jnp.finfo(jnp.float32).min
    q = q.reshape(b, t, k, g, d)
    scores = jnp.einsum('btkgd,bksd->bkgts', q, kk).astype(jnp.float32) / jnp.sqrt(d)
    slot_q, slot_k = cache_index + jnp.arange(t)[:, None], jnp.arange(s)[None, :]
    causal_ts = slot_k <= slot_q
    if cfg.sliding_window is not None:
      causal_ts &= slot_k > slot_q - cfg.sliding_window
    allowed = causal_ts[None] & kv_valid_bs[:, None, :]                       # [B,T,S]
    scores = jnp.where(allowed[:, None, None], scores, neg)
    if prefix is None:
      probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
      out = jnp.einsum('bkgts,bksd->btkgd', probs, v).reshape(b, t, h * d)
      return self.o_proj(out), cache
    pk, pv, pvalid_zp = prefix
    z, p = pk.shape[0], pk.shape[2]
    qz = q.reshape(z, b // z, t, k, g, d)
    pscores = jnp.einsum('zitkgd,zkpd->zikgtp', qz, pk).astype(jnp.float32) / jnp.sqrt(d)
    pallowed = pvalid_zp[:, None, None, None, None, :]                      # [Z,1,1,1,1,P]
    if cfg.sliding_window is not None:   # prefix slot j vs query slot P + slot_q
      pallowed = pallowed & (jnp.arange(p)[None, :] > p + slot_q - cfg.sliding_window)
    pscores = jnp.where(pallowed, pscores, neg).reshape(b, k, g, t, p)
    probs = jax.nn.softmax(jnp.concatenate([pscores, scores], axis=-1), axis=-1).astype(v.dtype)
    pprobs = probs[..., :p].reshape(z, b // z, k, g, t, p)
    out = (jnp.einsum('bkgts,bksd->btkgd', probs[..., p:], v)
           + jnp.einsum('zikgtp,zkpd->zitkgd', pprobs, pv).reshape(b, t, k, g, d))
    return self.o_proj(out.reshape(b, t, h * d)), cache


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    e, f, dt = cfg.hidden_size, cfg.intermediate_size, cfg.compute_dtype
    self.gate_proj = _dense(rngs, e, f, ('embed', 'mlp'), dtype=dt)
    self.up_proj = _dense(rngs, e, f, ('embed', 'mlp'), dtype=dt)
    self.down_proj = _dense(rngs, f, e, ('mlp', 'embed'), dtype=dt)

  def __call__(self, x):
    h_btf = constrain(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x), ('batch', None, 'mlp'))
    return self.down_proj(h_btf)


class DecoderLayer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    self.self_attn = Attention(cfg, rngs)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x, rope_bt, kv_valid_bs, cache, cache_index, prefix=None):
    a, cache = self.self_attn(self.input_layernorm(x), rope_bt, kv_valid_bs, cache,
                              cache_index, prefix)
    x = x + a
    return x + self.mlp(self.post_attention_layernorm(x)), cache


class Transformer(nnx.Module):
  """Token ids [B,T] -> logits [B,T,V] (float32)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed_tokens = nnx.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
        embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02), ('vocab', 'embed')),
        rngs=rngs)
    self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.num_hidden_layers)])
    self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    if not cfg.tie_word_embeddings:
      self.lm_head = _dense(rngs, cfg.hidden_size, cfg.vocab_size, ('embed', 'vocab'),
                            dtype=cfg.compute_dtype)

  def __call__(self, tokens_bt, positions_bt, kv_valid_bs, cache: Cache | None = None,
               cache_index=0, rope_bt=None, prefix=None):
    """-> (logits [B,T,V] float32, updated cache or None)."""
    h_bte, new_cache = self.hidden(tokens_bt, positions_bt, kv_valid_bs, cache, cache_index,
                                   rope_bt, prefix)
    return self.logits(h_bte), new_cache

  def hidden(self, tokens_bt, positions_bt, kv_valid_bs, cache: Cache | None = None,
             cache_index=0, rope_bt=None, prefix=None):
    """-> (final normed hidden states [B,T,E], updated cache or None): what the LM head and a
    value head (rft_jax/algorithms/critic.py) read. rope_bt: rope_tables(positions_bt, ...) when
    the caller has them already (the sampler computes every decode step's before its loop: XLA
    fuses cos and sin into each consumer, so inside the loop they were recomputed per layer).
    prefix: (per-layer cache [{'k','v'} of [Z,K,P,D]], valid_zp [Z,P]) of a prompt shared by
    groups of B / Z rows (Attention); kv_valid_bs then covers the rows' own slots only."""
    if jax.sharding.get_abstract_mesh().empty:
      x = self.embed_tokens(tokens_bt)
    else:   # FSDP: gather the table's E before the lookup (a lookup on E-sharded rows cannot
      # move to batch-sharded rows without replicating); V stays split over tensor
      table_ve = constrain(self.embed_tokens.embedding[...], ('vocab', None))
      x = jnp.take(table_ve, tokens_bt, axis=0).astype(self.cfg.compute_dtype)
    x = constrain(x, ('batch', None, None))
    if rope_bt is None:
      rope_bt = rope_tables(positions_bt, rope_inv_freq(self.cfg))
    if cache is None and self.cfg.scan_layers and prefix is None:
      return self.norm(_scan_layers(self.layers, x, rope_bt, kv_valid_bs,
                                    self.cfg.remat)), None
    new_cache = [] if cache is not None else None
    remat = cache is None and prefix is None and self.cfg.remat != 'none'   # (decoding: no
    # activations kept anyway; shared-prompt scoring runs unrolled without remat)
    for i, layer in enumerate(self.layers):
      if remat:
        x, c = _remat_layer(layer, x, rope_bt, kv_valid_bs, self.cfg.remat), None
      else:
        layer_prefix = None if prefix is None else (
            prefix[0][i]['k'], prefix[0][i]['v'], prefix[1])
        x, c = layer(x, rope_bt, kv_valid_bs, None if cache is None else cache[i],
                     cache_index, layer_prefix)
      x = constrain(x, ('batch', None, None))
      if cache is not None:
        new_cache.append(c)
    return self.norm(x), new_cache

  def logits(self, h_bte) -> jax.Array:
    """LM head: hidden states [B,T,E] -> logits [B,T,V] float32."""
    if self.cfg.tie_word_embeddings:
      logits = self.embed_tokens.attend(h_bte)
    else:
      logits = self.lm_head(h_bte)
    return constrain(logits.astype(jnp.float32), ('batch', None, 'vocab'))


REMAT_POLICIES = {
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _remat_layer(layer: DecoderLayer, x, rope_bt, kv_valid_bs, remat: str):
  """layer(x) (no cache) under jax.checkpoint with the named policy (ModelConfig.remat)."""
  def block(layer, x, rope_bt, kv_valid_bs):
    return layer(x, rope_bt, kv_valid_bs, None, 0)[0]
  return nnx.remat(block, policy=REMAT_POLICIES[remat])(layer, x, rope_bt, kv_valid_bs)


def _scan_layers(layers, x_bte, rope_bt, kv_valid_bs, remat: str):
  """x after every layer (no cache), as lax.scan over the layers' parameters stacked on a new
  leading axis [L, ...]; each layer under jax.checkpoint with the named policy unless 'none'.
  Same values as the unrolled loop (the layers share one graph definition)."""
  graphdef = nnx.graphdef(layers[0])
  stacked = jax.tree.map(lambda *ws: jnp.stack(ws), *[nnx.state(layer) for layer in layers])

  def apply(state, x):
    y, _ = nnx.merge(graphdef, state)(x, rope_bt, kv_valid_bs, None, 0)
    return constrain(y, ('batch', None, None))
  if remat != 'none':
    apply = jax.checkpoint(apply, policy=REMAT_POLICIES[remat])
  x_bte, _ = jax.lax.scan(lambda x, state: (apply(state, x), None), x_bte, stacked)
  return x_bte
