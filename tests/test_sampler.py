"""Tests for rft_jax.sampling.sampler against full (uncached) forward passes and plain-python
references for the logit filters."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from rft_jax.models import ModelConfig, create, forward
from rft_jax.sampling import sampler as samplerlib
from rft_jax.sampling.sampler import (SamplingConfig, choose, filter_logits, inverse_cdf_draw,
                                     make_sampler)
from rft_jax.sampling.text import decode_completions
import model_fixtures
from model_fixtures import randomize

PAD, EOS = 0, 1
CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  tie_word_embeddings=False)
P, T = 6, 10


def with_eos_bias(pure, beta):
  return model_fixtures.with_eos_bias(pure, beta, EOS)


@pytest.fixture(scope='module')
def model():
  graphdef, state = create(CFG, seed=0)
  base = randomize(nnx.to_pure_dict(state), seed=1)
  fwd = jax.jit(lambda params, tok, m: forward(graphdef, params, tok, m))
  return graphdef, base, fwd


@pytest.fixture(scope='module')
def prompts():
  rng = np.random.RandomState(0)
  b = 16
  pads = np.arange(b) % 4                                 # 0..3 left pads
  tokens = rng.randint(2, CFG.vocab_size, size=(b, P)).astype(np.int32)
  mask = (np.arange(P)[None] >= pads[:, None]).astype(np.int32)
  return np.where(mask == 1, tokens, PAD).astype(np.int32), mask


_SAMPLERS = {}


def sampler(graphdef, group_size=1, **kw):
  """One jitted sampler per configuration, shared between tests (compiles are the cost)."""
  cfg = SamplingConfig(**{'max_new_tokens': T, 'eos_id': EOS, 'pad_id': PAD, **kw})
  key = (id(graphdef), cfg, group_size)
  if key not in _SAMPLERS:
    _SAMPLERS[key] = make_sampler(graphdef, CFG, cfg, group_size=group_size)
  return _SAMPLERS[key]


def full_logp(fwd, params, rollout):
  """Completion-step logits [B,T,V] from one uncached forward over prompt + completion."""
  tokens = np.concatenate([np.asarray(rollout.prompt_tokens_bp), np.asarray(rollout.tokens_bt)], 1)
  mask = np.concatenate([np.asarray(rollout.prompt_mask_bp), np.asarray(rollout.mask_bt)], 1)
  p = rollout.prompt_tokens_bp.shape[1]
  logits = np.asarray(fwd(params, tokens, mask), np.float64)
  return logits[:, p - 1:-1]                              # position p-1+j predicts token j


def np_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def gather(x_btv, tok_bt):
  return np.take_along_axis(x_btv, np.asarray(tok_bt)[..., None], axis=-1)[..., 0]


def check_eos_layout(rollout):
  """mask = 1 up to and including the first EOS, 0 after; pad tokens and 0 logp after it."""
  tokens, mask = np.asarray(rollout.tokens_bt), np.asarray(rollout.mask_bt)
  logp, trunc = np.asarray(rollout.logp_bt), np.asarray(rollout.truncated_b)
  n_eos = 0
  for b in range(tokens.shape[0]):
    eos = [j for j in range(T) if tokens[b, j] == EOS]
    end = eos[0] + 1 if eos else T
    n_eos += bool(eos)
    np.testing.assert_array_equal(mask[b], [1] * end + [0] * (T - end))
    assert (tokens[b, end:] == PAD).all()
    assert (logp[b, end:] == 0.0).all()
    assert bool(trunc[b]) == (not eos)
    assert int(rollout.lengths_b[b]) == end
  return n_eos


# ----------------------------------------------------------------------------
# Log-probs and tokens against the uncached forward pass.


def test_logp_matches_forward_at_temperature_1(model, prompts):
  graphdef, base, fwd = model
  params = with_eos_bias(base, 1.0)
  out = sampler(graphdef)(params, *prompts, jax.random.key(0))
  n_eos = check_eos_layout(out)
  assert 0 < n_eos < out.tokens_bt.shape[0]              # both EOS-ended and truncated rows
  want = gather(np_log_softmax(full_logp(fwd, params, out)), out.tokens_bt)
  m = np.asarray(out.mask_bt) == 1
  np.testing.assert_allclose(np.asarray(out.logp_bt)[m], want[m], atol=1e-4)
  np.testing.assert_array_equal(np.asarray(out.prompt_tokens_bp), prompts[0])


def test_logp_matches_tempered_forward(model, prompts):
  graphdef, base, fwd = model
  params = with_eos_bias(base, 1.0)
  out = sampler(graphdef, temperature=0.7)(params, *prompts, jax.random.key(1))
  check_eos_layout(out)
  logits = full_logp(fwd, params, out)
  want = gather(np_log_softmax(logits / 0.7), out.tokens_bt)
  untempered = gather(np_log_softmax(logits), out.tokens_bt)
  m = np.asarray(out.mask_bt) == 1
  np.testing.assert_allclose(np.asarray(out.logp_bt)[m], want[m], atol=1e-4)
  assert np.abs(untempered[m] - want[m]).max() > 1e-2   # the temperature is visible


def test_logp_with_top_k_top_p_is_the_filtered_distribution(model, prompts):
  graphdef, base, fwd = model
  params = with_eos_bias(base, 1.0)
  k, top_p, temp = 6, 0.8, 0.9
  out = sampler(graphdef, temperature=temp, top_k=k, top_p=top_p)(params, *prompts,
                                                                  jax.random.key(2))
  check_eos_layout(out)
  logits = full_logp(fwd, params, out) / temp
  tokens, mask = np.asarray(out.tokens_bt), np.asarray(out.mask_bt)
  logp = np.asarray(out.logp_bt)
  for b in range(tokens.shape[0]):
    for j in range(T):
      if not mask[b, j]:
        continue
      keep = ref_keep(logits[b, j], k, top_p)
      assert keep[tokens[b, j]], (b, j)
      z = np.where(keep, logits[b, j], -np.inf)
      want = z[tokens[b, j]] - np.log(np.exp(z - z.max()).sum()) - z.max()
      assert abs(logp[b, j] - want) < 1e-4


def test_grouped_windowed_logp_matches_forward(prompts):
  """Groups of 3 rows decode after their prompt's shared cache (the attention prefix) with a
  Mistral sliding window shorter than prompt + completion: log-probs = the uncached pass's."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(CFG, sliding_window=5)
  graphdef, state = create(cfg, seed=0)
  params = with_eos_bias(randomize(nnx.to_pure_dict(state), seed=2), 1.0)
  scfg = SamplingConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD, temperature=1.0)
  out = make_sampler(graphdef, cfg, scfg, group_size=3)(params, prompts[0][:5], prompts[1][:5],
                                                         jax.random.key(4))
  check_eos_layout(out)
  fwd = jax.jit(lambda w, tok, m: forward(graphdef, w, tok, m))
  want = gather(np_log_softmax(full_logp(fwd, params, out)), out.tokens_bt)
  m = np.asarray(out.mask_bt) == 1
  np.testing.assert_allclose(np.asarray(out.logp_bt)[m], want[m], atol=1e-4)
  assert len({tuple(r) for r in np.asarray(out.tokens_bt)[:3]}) > 1   # the group's draws differ


def test_greedy_is_stepwise_argmax(model, prompts):
  graphdef, base, fwd = model
  params = with_eos_bias(base, 1.0)
  out = sampler(graphdef, temperature=0.0)(params, *prompts, jax.random.key(3))
  check_eos_layout(out)
  logits = full_logp(fwd, params, out)
  m = np.asarray(out.mask_bt) == 1
  np.testing.assert_array_equal(np.asarray(out.tokens_bt)[m], logits.argmax(-1)[m])
  # The greedy logp is under the untempered model distribution.
  want = gather(np_log_softmax(logits), out.tokens_bt)
  np.testing.assert_allclose(np.asarray(out.logp_bt)[m], want[m], atol=1e-4)
  # Greedy ignores the rng.
  again = sampler(graphdef, temperature=0.0)(params, *prompts, jax.random.key(99))
  np.testing.assert_array_equal(np.asarray(again.tokens_bt), np.asarray(out.tokens_bt))


def test_forced_eos_and_no_eos(model, prompts):
  graphdef, base, _ = model
  fn = sampler(graphdef, temperature=0.0)
  b = prompts[0].shape[0]
  out = fn(with_eos_bias(base, 100.0), *prompts, jax.random.key(0))
  # EOS first: everything after is pad and masked out (the loop also exits early).
  np.testing.assert_array_equal(np.asarray(out.tokens_bt),
                                np.array([[EOS] + [PAD] * (T - 1)] * b))
  np.testing.assert_array_equal(np.asarray(out.mask_bt), np.array([[1] + [0] * (T - 1)] * b))
  assert not np.asarray(out.truncated_b).any()
  np.testing.assert_allclose(np.asarray(out.logp_bt), 0.0, atol=1e-5)   # log p(EOS) ~ 0
  out = fn(with_eos_bias(base, -100.0), *prompts, jax.random.key(0))
  assert (np.asarray(out.tokens_bt) != EOS).all()
  np.testing.assert_array_equal(np.asarray(out.mask_bt), np.ones((b, T)))
  assert np.asarray(out.truncated_b).all()


# ----------------------------------------------------------------------------
# Filters.


def ref_keep(logits, top_k, top_p):
  """Plain-python top-k then nucleus (renormalised over the top-k survivors)."""
  v = len(logits)
  order = sorted(range(v), key=lambda i: -float(logits[i]))
  keep = set(order[:top_k]) if top_k > 0 else set(order)
  if top_p < 1.0:
    zs = [float(logits[i]) for i in order if i in keep]
    mx = max(zs)
    total = sum(math.exp(z - mx) for z in zs)
    cum, nucleus = 0.0, set()
    for i in order:
      if i not in keep:
        continue
      if cum < top_p:                                     # the crossing token is kept
        nucleus.add(i)
      cum += math.exp(float(logits[i]) - mx) / total
    keep = nucleus
  return np.array([i in keep for i in range(v)])


@pytest.mark.parametrize('top_k,top_p', [(0, 0.9), (5, 1.0), (1, 1.0), (4, 0.7), (0, 0.3),
                                         (10, 0.95), (0, 1.0)])
def test_filter_logits_against_reference(top_k, top_p):
  rng = np.random.RandomState(top_k * 100 + int(top_p * 100))
  logits = (2.0 * rng.randn(40, 16)).astype(np.float32)
  got = np.asarray(filter_logits(jnp.asarray(logits), top_k, top_p))
  neg = np.finfo(np.float32).min
  for b in range(logits.shape[0]):
    keep = ref_keep(logits[b], top_k, top_p)
    np.testing.assert_array_equal(got[b] > neg, keep)
    np.testing.assert_array_equal(got[b][keep], logits[b][keep])   # survivors unchanged
    assert (got[b][~keep] == neg).all()


@pytest.mark.parametrize('top_p,kept', [(0.3, [0]), (0.5001, [0, 1]), (0.6, [0, 1]),
                                        (0.79, [0, 1]), (0.81, [0, 1, 2]), (0.99, [0, 1, 2, 3])])
def test_top_p_keeps_the_crossing_token(top_p, kept):
  probs = np.array([0.5, 0.3, 0.15, 0.05])
  perm = np.array([2, 0, 3, 1])                           # not in sorted order
  logits = np.log(probs[perm]).astype(np.float32)[None]
  got = np.asarray(filter_logits(jnp.asarray(logits), 0, top_p))[0]
  kept_positions = sorted(int(np.where(perm == i)[0][0]) for i in kept)
  assert sorted(np.where(got > np.finfo(np.float32).min)[0].tolist()) == kept_positions


def test_choose_logp_and_support():
  rng = np.random.RandomState(7)
  logits = (2.0 * rng.randn(64, 12)).astype(np.float32)
  cfg = SamplingConfig(max_new_tokens=1, eos_id=EOS, pad_id=PAD, temperature=0.5, top_k=5,
                       top_p=0.9)
  tok, logp = choose(jnp.asarray(logits), jax.random.key(0), cfg)
  tok, logp = np.asarray(tok), np.asarray(logp)
  for b in range(64):
    z = logits[b].astype(np.float64) / 0.5
    keep = ref_keep(z, 5, 0.9)
    assert keep[tok[b]]
    zk = np.where(keep, z, -np.inf)
    assert abs(logp[b] - np_log_softmax(zk)[tok[b]]) < 1e-4


def test_inverse_cdf_draw_against_python_reference():
  """The first token whose cumulative mass exceeds u * total, as a plain loop; zero-mass tokens
  (filtered to the dtype's minimum, as filter_logits does) never come out, even at u -> 1."""
  rng = np.random.RandomState(3)
  logits = (2.0 * rng.randn(32, 10)).astype(np.float32)
  logits[:, -3:] = np.finfo(np.float32).min              # the tail removed, as top-k would
  logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
  u = rng.rand(32).astype(np.float32)
  u[:4] = [0.0, np.nextafter(np.float32(1), np.float32(0)), 0.5, 1.0]   # the edges (1.0 too)
  got = np.asarray(inverse_cdf_draw(jnp.asarray(logp), jnp.asarray(u)))
  for b in range(32):
    p = np.exp(logp[b].astype(np.float64))
    cdf = np.cumsum(p)
    ref = next((v for v in range(10) if cdf[v] > u[b] * cdf[-1]), int(np.argmax(p)))
    assert p[got[b]] > 0, (b, got[b])
    if abs(cdf[ref] - u[b] * cdf[-1]) > 1e-5:   # away from a float tie with the reference
      assert got[b] == ref, (b, got[b], ref, u[b])


# ----------------------------------------------------------------------------
# Distribution and group layout.


def test_token_frequencies_match_softmax(model):
  graphdef, base, fwd = model
  params = base
  prompt = np.array([[0, 5, 9, 3, 17, 4], [12, 12, 8, 30, 2, 7]], np.int32)
  mask = np.array([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int32)
  g = 2048
  cfg = SamplingConfig(max_new_tokens=1, eos_id=EOS, pad_id=PAD, temperature=1.0)
  out = make_sampler(graphdef, CFG, cfg, group_size=g)(params, prompt, mask, jax.random.key(5))
  # Group layout: rows [i*G, (i+1)*G) carry prompt i.
  pt, pm = np.asarray(out.prompt_tokens_bp), np.asarray(out.prompt_mask_bp)
  assert pt.shape == (2 * g, P)
  for i in range(2):
    assert (pt[i * g:(i + 1) * g] == prompt[i]).all()
    assert (pm[i * g:(i + 1) * g] == mask[i]).all()
  logits = np.asarray(fwd(params, prompt, mask), np.float64)[:, -1]
  probs = np.exp(np_log_softmax(logits))
  assert probs.max() > 0.1 and probs.min() < 0.01         # clearly non-uniform
  tokens = np.asarray(out.tokens_bt)[:, 0]
  for i in range(2):
    counts = np.bincount(tokens[i * g:(i + 1) * g], minlength=CFG.vocab_size)
    expected = probs[i] * g
    # Pool the rare tokens into one bin so every bin expects >= 5.
    rare = expected < 5
    obs, exp = counts[~rare], expected[~rare]
    if rare.any():
      obs, exp = np.append(obs, counts[rare].sum()), np.append(exp, expected[rare].sum())
    chi2 = ((obs - exp) ** 2 / exp).sum()
    assert stats.chi2.sf(chi2, len(obs) - 1) > 1e-3, (chi2, len(obs))
    # Token-wise: within 5 standard errors.
    se = np.sqrt(probs[i] * (1 - probs[i]) / g)
    assert (np.abs(counts / g - probs[i]) < 5 * se + 1e-3).all()
  # Distinct rows of one group get different random draws.
  assert len(np.unique(tokens[:g])) > 5


def test_greedy_groups_repeat_the_ungrouped_result(model, prompts):
  graphdef, base, _ = model
  params = with_eos_bias(base, 1.0)
  tok, mask = prompts[0][:4], prompts[1][:4]
  grouped = sampler(graphdef, group_size=3, temperature=0.0)(params, tok, mask,
                                                              jax.random.key(0))
  single = sampler(graphdef, temperature=0.0)(params, prompts[0], prompts[1], jax.random.key(0))
  got = np.asarray(grouped.tokens_bt).reshape(4, 3, T)
  want = np.asarray(single.tokens_bt)[:4]
  for g in range(3):
    np.testing.assert_array_equal(got[:, g], want)
  np.testing.assert_array_equal(np.asarray(grouped.prompt_tokens_bp),
                                np.repeat(tok, 3, axis=0))


def test_decode_after_prefill_jitted_apart_is_the_sampler(model, prompts):
  """prefill and decode as two programs (how tools.bench times decode) give the sampler's
  rollout."""
  graphdef, base, _ = model
  params = with_eos_bias(base, 1.0)
  tok, mask = prompts[0][:4], prompts[1][:4]
  rng = jax.random.key(3)
  cfg = SamplingConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD)
  prefilled = jax.jit(lambda p, t, m: samplerlib.prefill(
      graphdef, p, t, m, model_cfg=CFG, max_new_tokens=T, group_size=2))(params, tok, mask)
  got = jax.jit(lambda p, t, m, r, *pre: samplerlib.decode(
      graphdef, p, t, m, r, *pre, model_cfg=CFG, cfg=cfg, group_size=2))(
          params, tok, mask, rng, *prefilled)
  want = sampler(graphdef, group_size=2)(params, tok, mask, rng)
  np.testing.assert_array_equal(np.asarray(got.tokens_bt), np.asarray(want.tokens_bt))
  np.testing.assert_array_equal(np.asarray(got.mask_bt), np.asarray(want.mask_bt))
  np.testing.assert_allclose(np.asarray(got.logp_bt), np.asarray(want.logp_bt), atol=1e-5)
  assert 0 < np.asarray(got.mask_bt).sum() < 8 * T   # some rows stopped early, some sampled


def test_stop_ids_end_a_completion_like_eos(model, prompts):
  """A further stop id (generation_config.json's eos_token_id list) ends a row as EOS does: the
  mask keeps it, the row is not truncated, the text drops it. Without it the row runs on."""
  graphdef, base, _ = model
  stop = EOS + 1   # forced at once by the same bias trick, on another id
  params = model_fixtures.with_eos_bias(base, 100.0, stop)
  tokens, mask = prompts
  rng = jax.random.key(0)
  stopped = sampler(graphdef, temperature=1.0, stop_ids=(stop,))(params, tokens, mask, rng)
  np.testing.assert_array_equal(np.asarray(stopped.tokens_bt)[:, 0], stop)
  np.testing.assert_array_equal(np.asarray(stopped.mask_bt).sum(axis=1), 1)
  assert not np.asarray(stopped.truncated_b).any()
  running = sampler(graphdef, temperature=1.0)(params, tokens, mask, rng)
  assert np.asarray(running.truncated_b).all() and np.asarray(running.mask_bt).sum() == (
      tokens.shape[0] * T)

  class Tok:   # decode_completions drops every stop id
    eos_id, stop_ids = EOS, (EOS, stop)
    decode = staticmethod(lambda ids: ' '.join(map(str, ids)))
  assert decode_completions(Tok, [[5, stop, 0]], [[1, 1, 0]]) == ['5']
