"""Tests for rft_jax.models: a float64 numpy reference forward pass, KV-cache decode parity,
padding invariance and the parameter count."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rft_jax.models import ModelConfig, create, forward, forward_cached, init_cache
from rft_jax.models import forward_completions
from rft_jax.models import abstract_params, positions_from_mask
from model_fixtures import randomize

BASE = ModelConfig(vocab_size=32, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)

VARIANTS = {
    'tied': BASE,
    'untied_bias': dataclasses.replace(BASE, tie_word_embeddings=False, attention_bias=True),
}


# ----------------------------------------------------------------------------
# Independent numpy reference (float64), written from the HF Llama/Qwen2 definitions.


def _np(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def ref_rms_norm(x, w, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def ref_rope(x_bthd, pos_bt, theta):
  d = x_bthd.shape[-1]
  inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)   # [D/2]
  freqs = pos_bt[..., None].astype(np.float64) * inv_freq              # [B,T,D/2]
  emb = np.concatenate([freqs, freqs], axis=-1)[:, :, None, :]         # [B,T,1,D]
  half = d // 2
  rot = np.concatenate([-x_bthd[..., half:], x_bthd[..., :half]], axis=-1)
  return x_bthd * np.cos(emb) + rot * np.sin(emb)


def ref_linear(x, p):
  y = x @ p['kernel']
  if 'bias' in p:
    y = y + p['bias']
  return y


def ref_forward(cfg, pure, tokens_bt, mask_bt):
  """Logits [B,T,V]; only positions with mask 1 are meaningful."""
  w = _np(pure)
  tokens_bt = np.asarray(tokens_bt)
  mask_bt = np.asarray(mask_bt).astype(bool)
  b, t = tokens_bt.shape
  h, k, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
  rep = h // k
  # Left-padded rows: the first real token is position 0.
  pos_bt = np.maximum(np.cumsum(mask_bt, axis=-1) - 1, 0)
  x = w['embed_tokens']['embedding'][tokens_bt]                        # [B,T,E]
  causal = np.tril(np.ones((t, t), bool))
  for i in range(cfg.num_hidden_layers):
    lw = w['layers'][i]
    a = lw['self_attn']
    hn = ref_rms_norm(x, lw['input_layernorm']['weight'], cfg.rms_norm_eps)
    q = ref_rope(ref_linear(hn, a['q_proj']).reshape(b, t, h, d), pos_bt, cfg.rope_theta)
    kk = ref_rope(ref_linear(hn, a['k_proj']).reshape(b, t, k, d), pos_bt, cfg.rope_theta)
    v = ref_linear(hn, a['v_proj']).reshape(b, t, k, d)
    out = np.zeros((b, t, h, d))
    for bi in range(b):
      for hi in range(h):
        kv = hi // rep                                 # HF repeat_kv: head hi uses kv head hi//rep
        s = q[bi, :, hi] @ kk[bi, :, kv].T / np.sqrt(d)   # [T,S]
        allowed = causal & mask_bt[bi][None, :]
        s = np.where(allowed, s, -np.inf)
        for ti in range(t):
          if not allowed[ti].any():
            continue                                   # a pad query: its output is irrelevant
          p = np.exp(s[ti] - s[ti].max())
          p = p / p.sum()
          out[bi, ti, hi] = p @ v[bi, :, kv]
    x = x + ref_linear(out.reshape(b, t, h * d), a['o_proj'])
    hn = ref_rms_norm(x, lw['post_attention_layernorm']['weight'], cfg.rms_norm_eps)
    m = lw['mlp']
    g = ref_linear(hn, m['gate_proj'])
    silu = g / (1.0 + np.exp(-g))
    x = x + ref_linear(silu * ref_linear(hn, m['up_proj']), m['down_proj'])
  x = ref_rms_norm(x, w['norm']['weight'], cfg.rms_norm_eps)
  if cfg.tie_word_embeddings:
    return x @ w['embed_tokens']['embedding'].T
  return x @ w['lm_head']['kernel']


# ----------------------------------------------------------------------------
# Fixtures.


@pytest.fixture(scope='module', params=list(VARIANTS))
def model(request):
  cfg = VARIANTS[request.param]
  graphdef, state = create(cfg, seed=1)
  pure = randomize(nnx.to_pure_dict(state), seed=2)
  fwd = jax.jit(lambda params, tok, m: forward(graphdef, params, tok, m))
  return cfg, graphdef, state, pure, fwd


def left_padded_batch(rng, vocab, pads, length):
  b = len(pads)
  tokens = rng.randint(2, vocab, size=(b, length)).astype(np.int32)
  mask = np.ones((b, length), np.int32)
  for i, n in enumerate(pads):
    mask[i, :n] = 0
    tokens[i, :n] = 0
  return tokens, mask


# ----------------------------------------------------------------------------
# Reference parity.


def test_forward_matches_numpy_reference(model):
  cfg, _, _, pure, fwd = model
  rng = np.random.RandomState(0)
  tokens, mask = left_padded_batch(rng, cfg.vocab_size, pads=[0, 3, 5], length=9)
  got = np.asarray(fwd(pure, tokens, mask))
  want = ref_forward(cfg, pure, tokens, mask)
  assert got.shape == (3, 9, cfg.vocab_size) and got.dtype == np.float32
  real = mask.astype(bool)
  # The logits are O(1..10): a real mismatch in any component would be far above 1e-4.
  assert np.abs(want[real]).max() > 1.0
  np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=1e-4)


def test_nnx_state_and_pure_dict_params_agree(model):
  cfg, graphdef, state, pure, _ = model
  nnx.replace_by_pure_dict(state, pure)   # state now holds the randomised values too
  tokens, mask = left_padded_batch(np.random.RandomState(1), cfg.vocab_size, [0, 2], 6)
  fwd = jax.jit(lambda params: forward(graphdef, params, tokens, mask))
  a, b = np.asarray(fwd(state)), np.asarray(fwd(pure))
  np.testing.assert_array_equal(a, b)


def test_positions_from_mask():
  mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 0, 0]], np.int32)
  want = np.array([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0], [0, 1, 2, 2, 2]])
  np.testing.assert_array_equal(np.asarray(positions_from_mask(jnp.asarray(mask))), want)


# ----------------------------------------------------------------------------
# Padding invariance.


def test_left_padding_does_not_change_logits(model):
  cfg, _, _, pure, fwd = model
  rng = np.random.RandomState(3)
  seq = rng.randint(2, cfg.vocab_size, size=6).astype(np.int32)
  n = len(seq)
  rows, masks = [], []
  for pad in [0, 1, 4]:                                 # same sequence, different left pads
    rows.append(np.concatenate([np.full(pad, 0, np.int32), seq, np.zeros(4 - pad, np.int32)]))
    masks.append(np.concatenate([np.zeros(pad, np.int32), np.ones(n, np.int32),
                                 np.zeros(4 - pad, np.int32)]))
  tokens, mask = np.stack(rows), np.stack(masks)
  logits = np.asarray(fwd(pure, tokens, mask))
  alone = np.asarray(fwd(pure, seq[None], np.ones((1, n), np.int32)))[0]
  for i, pad in enumerate([0, 1, 4]):
    # Pads on the left, and (for rows 0, 1) right pads after the sequence too.
    np.testing.assert_allclose(logits[i, pad:pad + n], alone, atol=1e-5, rtol=1e-5)
  # Different pad token ids under the mask do not matter either.
  tokens2 = np.where(mask == 1, tokens, 7)
  np.testing.assert_allclose(np.asarray(fwd(pure, tokens2, mask))[mask == 1], logits[mask == 1],
                             atol=1e-6)


# ----------------------------------------------------------------------------
# KV cache.


def test_cached_decode_matches_full_forward(model):
  cfg, graphdef, _, pure, fwd = model
  rng = np.random.RandomState(4)
  pads, p, n_new = [0, 2, 5], 7, 5
  prompt, prompt_mask = left_padded_batch(rng, cfg.vocab_size, pads, p)
  new = rng.randint(2, cfg.vocab_size, size=(3, n_new)).astype(np.int32)
  b = len(pads)
  s = p + n_new
  kv_valid = np.concatenate([prompt_mask.astype(bool), np.ones((b, n_new), bool)], axis=1)
  prompt_len = prompt_mask.sum(-1)

  step = jax.jit(lambda params, tok, pos, cache, idx: forward_cached(
      graphdef, params, tok, pos, jnp.asarray(kv_valid), cache, idx))
  cache = init_cache(cfg, b, s)
  assert len(cache) == cfg.num_hidden_layers
  assert cache[0]['k'].shape == (b, cfg.num_key_value_heads, s, cfg.head_dim)
  prefill, cache = step(pure, prompt, positions_from_mask(jnp.asarray(prompt_mask)), cache, 0)
  decoded = []
  for i in range(n_new):
    logits, cache = step(pure, new[:, i:i + 1], jnp.asarray(prompt_len + i)[:, None], cache,
                         p + i)
    decoded.append(np.asarray(logits)[:, 0])
  decoded = np.stack(decoded, axis=1)                   # logits after each new token

  full_tokens = np.concatenate([prompt, new], axis=1)
  full_mask = np.concatenate([prompt_mask, np.ones((b, n_new), np.int32)], axis=1)
  full = np.asarray(fwd(pure, full_tokens, full_mask))
  real = prompt_mask.astype(bool)
  np.testing.assert_allclose(np.asarray(prefill)[real], full[:, :p][real], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(decoded, full[:, p:], atol=1e-5, rtol=1e-5)
  # And both against the reference.
  want = ref_forward(cfg, pure, full_tokens, full_mask)
  np.testing.assert_allclose(decoded, want[:, p:], atol=1e-4, rtol=1e-4)


def test_multi_token_cached_chunk_matches_full_forward(model):
  """Writing several tokens at once at a nonzero cache index (chunked prefill)."""
  cfg, graphdef, _, pure, fwd = model
  rng = np.random.RandomState(5)
  prompt, prompt_mask = left_padded_batch(rng, cfg.vocab_size, [1, 3], 5)
  new = rng.randint(2, cfg.vocab_size, size=(2, 3)).astype(np.int32)
  kv_valid = jnp.asarray(np.concatenate([prompt_mask.astype(bool), np.ones((2, 3), bool)], 1))
  step = jax.jit(lambda params, tok, pos, cache, idx: forward_cached(
      graphdef, params, tok, pos, kv_valid, cache, idx))
  cache = init_cache(cfg, 2, 8)
  _, cache = step(pure, prompt, positions_from_mask(jnp.asarray(prompt_mask)), cache, 0)
  pos = prompt_mask.sum(-1)[:, None] + np.arange(3)[None]
  logits, _ = step(pure, new, jnp.asarray(pos), cache, 5)
  full = np.asarray(fwd(pure, np.concatenate([prompt, new], 1),
                        np.concatenate([prompt_mask, np.ones((2, 3), np.int32)], 1)))
  np.testing.assert_allclose(np.asarray(logits), full[:, 5:], atol=1e-5, rtol=1e-5)


# Every pair of (model variant, completion length, window) once: 4 cases instead of 8 (~40 s of
# compile saved), each option still met with each of the others.
@pytest.mark.parametrize('model,t,window', [('tied', 5, None), ('tied', 1, 6),
                                            ('untied_bias', 5, 6), ('untied_bias', 1, None)],
                         indirect=['model'])
def test_shared_prompt_pass_matches_full_forward(model, window, t):
  """forward_completions (each group's prompt run once) = forward's completion-position logits,
  and the gradients of a loss on them agree: left-padded prompts of different lengths,
  right-padded completions, GQA, tied/untied with bias, a sliding window, a one-token
  completion."""
  cfg, graphdef, _, pure, _ = model
  if window is not None:
    cfg = dataclasses.replace(cfg, sliding_window=window)
    graphdef, _ = create(cfg, seed=1)
  rng = np.random.RandomState(6)
  g, k, p = 3, 4, 7
  prompt, prompt_mask = left_padded_batch(rng, cfg.vocab_size, [0, 2, 5], p)
  lengths = rng.randint(0, t + 1, g * k)
  comp_mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  comp = rng.randint(2, cfg.vocab_size, (g * k, t)).astype(np.int32) * comp_mask
  tokens = np.concatenate([np.repeat(prompt, k, 0), comp], 1)
  mask = np.concatenate([np.repeat(prompt_mask, k, 0), comp_mask], 1)

  full = lambda w: forward(graphdef, w, tokens, mask, logits_from=p - 1)[:, :-1]
  shared = lambda w: forward_completions(graphdef, w, tokens, mask, p, k)
  want, got = jax.jit(full)(pure), jax.jit(shared)(pure)
  assert got.shape == (g * k, t, cfg.vocab_size)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)

  weights = jnp.asarray(rng.randn(g * k, t, cfg.vocab_size), jnp.float32) * comp_mask[..., None]
  loss = lambda fn: jax.grad(lambda w: jnp.sum(jax.nn.log_softmax(fn(w)) * weights))
  g_full, g_shared = jax.jit(loss(full))(pure), jax.jit(loss(shared))(pure)
  for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_shared)):
    np.testing.assert_allclose(b, a, atol=1e-4, rtol=1e-4)
  assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g_full)) > 1e-2   # not vacuous


# ----------------------------------------------------------------------------
# Parameter count.


@pytest.mark.parametrize('tie,bias', [(True, False), (False, False), (True, True), (False, True)])
def test_num_params_counts_leaves(tie, bias):
  cfg = dataclasses.replace(BASE, tie_word_embeddings=tie, attention_bias=bias)
  _, abstract = abstract_params(cfg)
  counted = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.to_pure_dict(abstract)))
  assert cfg.num_params() == counted


def test_num_params_hand_value():
  # E=48, F=64, L=2, H*D=64, K*D=32, V=32, tied, no bias:
  #   attn = 48*64 + 2*48*32 + 64*48 = 9216; mlp = 3*48*64 = 9216; norms = 2*48
  #   layer = 18528; emb = 32*48 = 1536; final norm = 48 -> 2*18528 + 1536 + 48 = 38640
  assert BASE.num_params() == 38640
