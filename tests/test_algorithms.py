"""Tests for the GRPO step of rft_jax.algorithms on a tiny model: batch preparation against the
model's forward, the GRPO loss against a numpy re-computation and finite differences, micro-batch
invariance of the accumulated gradient, and a learning-signal check of one train step. The pieces
against hand-worked values are in test_algorithm_hand_values.py."""
import functools
import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rft_jax.algorithms import grpo
from rft_jax.algorithms import train_state as ts
from rft_jax.algorithms.advantages import grpo as grpo_adv
from rft_jax.models import ModelConfig, create, forward
from rft_jax.sampling.sampler import SamplingConfig, make_sampler
import model_fixtures
from model_fixtures import np_log_softmax, randomize

# ----------------------------------------------------------------------------
# The GRPO step on a tiny model.

PAD, EOS = 0, 1
CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  tie_word_embeddings=False)
B, P, T, G = 8, 5, 6, 4
ALGO = grpo.GRPOConfig(kl_coef=0.1, clip_eps=0.2, group_size=G)


def with_eos_bias(pure):
  """EOS gets a positive logit bonus (~12%/step) so completion lengths vary."""
  return model_fixtures.with_eos_bias(pure, 1.0, EOS)


def perturb(params, seed, scale):
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda x: x + scale * jnp.asarray(rng.randn(*x.shape), jnp.float32), params)


@pytest.fixture(scope='module')
def setup():
  graphdef, state = create(CFG, seed=0)
  params = with_eos_bias(randomize(nnx.to_pure_dict(state), seed=1))
  ref_params = perturb(params, seed=2, scale=0.05)
  rng = np.random.RandomState(3)
  prompts = rng.randint(2, CFG.vocab_size, size=(B // G, P)).astype(np.int32)
  pmask = np.ones((B // G, P), np.int32)
  pmask[1, :2] = 0
  prompts = np.where(pmask == 1, prompts, PAD)
  scfg = SamplingConfig(max_new_tokens=T, eos_id=EOS, pad_id=PAD, temperature=1.0)
  rollout = make_sampler(graphdef, CFG, scfg, group_size=G)(params, prompts, pmask,
                                                          jax.random.key(0))
  lengths = np.asarray(rollout.mask_bt).sum(-1)
  assert len(set(lengths.tolist())) > 2, lengths       # varied lengths -> uneven token counts
  rewards = jnp.array([1.0, 0.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.2])
  valid = jnp.array([True] * 6 + [False, True])
  prep = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=ALGO))
  batch, metrics = prep(params, ref_params, rollout, rewards, valid)
  fwd = jax.jit(lambda p, tok, m: forward(graphdef, p, tok, m))
  return SimpleNamespace(graphdef=graphdef, params=params, ref_params=ref_params,
                         rollout=rollout, rewards=rewards, valid=valid, batch=batch,
                         metrics=metrics, fwd=fwd, prep=prep)


def np_seq_logp(s, params, tokens, mask):
  """log pi(token_{l+1} | <= l) from an uncached forward, in float64 numpy."""
  lsm = np_log_softmax(np.asarray(s.fwd(params, tokens, mask))[:, :-1])
  return np.take_along_axis(lsm, np.asarray(tokens)[:, 1:, None], axis=-1)[..., 0]


def test_prepare_batch(setup):
  s = setup
  r, batch = s.rollout, s.batch
  tokens = np.concatenate([np.asarray(r.prompt_tokens_bp), np.asarray(r.tokens_bt)], 1)
  mask = np.concatenate([np.asarray(r.prompt_mask_bp), np.asarray(r.mask_bt)], 1)
  np.testing.assert_array_equal(np.asarray(batch['tokens']), tokens)
  np.testing.assert_array_equal(np.asarray(batch['mask']), mask)
  # loss_mask is the completion mask shifted to l = P-1+j, zero on prompts and invalid rows.
  want_lm = np.zeros((B, P + T - 1))
  want_lm[:, P - 1:] = np.asarray(r.mask_bt) * np.asarray(s.valid)[:, None]
  np.testing.assert_array_equal(np.asarray(batch['loss_mask']), want_lm)
  assert want_lm[6].sum() == 0 and want_lm.sum() > 0
  # old_logp / ref_logp: trainer log-probs at the sampling / reference params.
  old = np_seq_logp(s, s.params, tokens, mask)
  ref = np_seq_logp(s, s.ref_params, tokens, mask)
  lm = want_lm == 1
  np.testing.assert_allclose(np.asarray(batch['old_logp'])[lm], old[lm], atol=1e-4)
  np.testing.assert_allclose(np.asarray(batch['ref_logp'])[lm], ref[lm], atol=1e-4)
  assert np.abs(old[lm] - ref[lm]).max() > 1e-3          # the reference really differs
  # At temperature 1 the sampler's log-probs are the trainer's (up to numerics).
  samp = np.asarray(r.logp_bt)
  m = np.asarray(r.mask_bt) == 1
  np.testing.assert_allclose(np.asarray(batch['old_logp'])[:, P - 1:][m], samp[m], atol=1e-4)
  assert float(s.metrics['mismatch/logp_abs_diff']) < 1e-4
  np.testing.assert_allclose(np.asarray(batch['adv']),
                             np.asarray(grpo_adv(s.rewards, s.valid, G)), rtol=1e-6)


def test_prepare_batch_without_kl_reuses_old_logp(setup):
  s = setup
  algo = grpo.GRPOConfig(kl_coef=0.0, group_size=G)
  prep = jax.jit(functools.partial(grpo.prepare_batch, graphdef=s.graphdef, algo=algo))
  batch, _ = prep(s.params, None, s.rollout, s.rewards, s.valid)
  np.testing.assert_array_equal(np.asarray(batch['ref_logp']), np.asarray(batch['old_logp']))


def training_batch(s):
  """The prepared batch with old_logp taken at slightly different params (ratios != 1, a few
  tokens clipped) so every branch of the loss is exercised."""
  old_params = perturb(s.params, seed=4, scale=0.03)
  batch, _ = s.prep(old_params, s.ref_params, s.rollout, s.rewards, s.valid)
  return batch


def test_loss_fn_matches_numpy(setup):
  s = setup
  batch = training_batch(s)
  loss_sum, (count, sums) = jax.jit(functools.partial(grpo.loss_fn, graphdef=s.graphdef,
                                                      algo=ALGO))(s.params, batch)
  lm = np.asarray(batch['loss_mask'], np.float64)
  logp = np_seq_logp(s, s.params, batch['tokens'], batch['mask'])
  old = np.asarray(batch['old_logp'], np.float64)
  ref = np.asarray(batch['ref_logp'], np.float64)
  adv = np.asarray(batch['adv'], np.float64)[:, None]
  ratio = np.exp(logp - old)
  pg = -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)
  kl = np.exp(ref - logp) - (ref - logp) - 1
  assert ((ratio > 1.2) | (ratio < 0.8))[lm == 1].any()   # some tokens are clipped
  np.testing.assert_allclose(float(count), lm.sum())
  np.testing.assert_allclose(float(loss_sum), ((pg + 0.1 * kl) * lm).sum(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(sums['pg_loss']), (pg * lm).sum(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(sums['kl']), (kl * lm).sum(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(sums['ratio/mean']), (ratio * lm).sum(), rtol=1e-4)


@pytest.fixture(scope='module')
def accumulated(setup):
  """(batch, {n: accumulate_grads with n micro-batches}, jitted global mean loss).

  accumulate_grads with n=1 is checked against finite differences; n=2, 4 against n=1.
  """
  s = setup
  batch = training_batch(s)
  fn = functools.partial(grpo.loss_fn, graphdef=s.graphdef, algo=ALGO)
  out = {}
  for n in [1, 2, 4]:
    acc = jax.jit(lambda p, b, n=n: ts.accumulate_grads(fn, p, b, n))
    out[n] = acc(s.params, batch)

  def mean_loss(p, b):
    total, (count, _) = fn(p, b)
    return total / count

  return batch, out, jax.jit(mean_loss)


def test_loss_gradient_finite_differences(setup, accumulated):
  s = setup
  batch, out, mean_loss = accumulated
  grads = out[1][0]
  value = lambda p: mean_loss(p, batch)
  rng = np.random.RandomState(5)
  leaves, treedef = jax.tree.flatten(s.params)
  paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(s.params)[0]]
  directions = []
  # (a) a random unit direction over all parameters.
  d = [rng.randn(*x.shape) for x in leaves]
  norm = math.sqrt(sum((x * x).sum() for x in d))
  directions.append([x / norm for x in d])
  # (b) one attention kernel only, (c) one scalar of the MLP and (d) the final norm weights.
  for name in ["[0]['self_attn']['q_proj']['kernel']", "[0]['mlp']['up_proj']['kernel']",
               "['norm']['weight']"]:
    i = next(j for j, p in enumerate(paths) if p.endswith(name))
    d = [np.zeros(x.shape) for x in leaves]
    if 'up_proj' in name:
      d[i][3, 5] = 1.0
    else:
      d[i] = rng.randn(*leaves[i].shape)
      d[i] /= np.linalg.norm(d[i])
    directions.append(d)
  g_leaves = jax.tree.leaves(grads)
  for d in directions:
    analytic = sum(float((np.asarray(g, np.float64) * x).sum()) for g, x in zip(g_leaves, d))
    h = 3e-3
    plus = treedef.unflatten([x + h * jnp.asarray(v, jnp.float32) for x, v in zip(leaves, d)])
    minus = treedef.unflatten([x - h * jnp.asarray(v, jnp.float32) for x, v in zip(leaves, d)])
    numeric = (float(value(plus)) - float(value(minus))) / (2 * h)
    assert abs(analytic) > 1e-4
    assert abs(analytic - numeric) < 2e-2 * abs(analytic) + 3e-5, (analytic, numeric)


def test_microbatch_invariance(setup, accumulated):
  s = setup
  batch, out, mean_loss = accumulated
  # Micro-batches hold different token counts (lengths vary, row 6 is invalid).
  counts = np.asarray(batch['loss_mask']).reshape(4, 2, -1).sum((1, 2))
  assert len(set(counts.tolist())) > 1, counts
  want = out[1][0]   # one micro-batch: checked against finite differences above
  for n in [2, 4]:
    grads, metrics = out[n]
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                                 atol=1e-6 * float(np.abs(w).max()) + 1e-9)
    for k in metrics:
      np.testing.assert_allclose(float(metrics[k]), float(out[1][1][k]), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(out[1][1]['loss']), float(mean_loss(s.params, batch)),
                             rtol=1e-5)


OPTIM = SimpleNamespace(lr=1e-3, warmup_steps=1, grad_clip=1.0, b1=0.9, b2=0.999,
                        weight_decay=0.0)


@pytest.fixture(scope='module')
def train(setup):
  """(jitted train_step with 2 micro-batches, a fresh TrainState at the setup params)."""
  s = setup
  algo = grpo.GRPOConfig(kl_coef=ALGO.kl_coef, clip_eps=ALGO.clip_eps, group_size=G,
                         microbatches=2)
  tx, schedule = ts.make_optimizer(OPTIM), ts.lr_schedule(OPTIM)
  step = jax.jit(functools.partial(grpo.train_step, graphdef=s.graphdef, algo=algo, tx=tx,
                                   schedule=schedule))
  state = ts.TrainState(step=jnp.int32(0), params=s.params, opt_state=tx.init(s.params))
  return step, state


def test_train_step_metrics_match_accumulated(accumulated, train):
  batch, out, _ = accumulated
  step, state = train
  state, metrics = step(state, batch)
  grads, acc_metrics = out[1]
  for k, v in acc_metrics.items():
    np.testing.assert_allclose(float(metrics[k]), float(v), rtol=1e-5, atol=1e-7)
  gnorm = math.sqrt(sum(float((np.asarray(g, np.float64) ** 2).sum())
                        for g in jax.tree.leaves(grads)))
  np.testing.assert_allclose(float(metrics['grad_norm']), gnorm, rtol=1e-5)
  np.testing.assert_allclose(float(metrics['clip_frac']),
                             float(acc_metrics['clip_frac/low']) +
                             float(acc_metrics['clip_frac/high']), rtol=1e-6)
  assert int(state.step) == 1
  assert float(metrics['lr']) == 0.0                      # warm-up: schedule(0) = 0


def test_train_step_raises_logp_of_rewarded_completion(setup, train):
  """Row 0 has the only positive advantage in its group; a few steps raise its log-prob.

  A fresh state with warmup_steps=1 spends its first update at lr 0 (see lr_schedule), so two
  updates are taken.
  """
  s = setup
  step, state = train
  batch = s.batch   # old_logp at the current params: ratio 1 at the first step
  assert float(batch['adv'][0]) > 0 and float(batch['adv'][1]) < 0
  lm = np.asarray(batch['loss_mask'])

  def row_logp(params):
    return (np_seq_logp(s, params, batch['tokens'], batch['mask']) * lm).sum(-1)

  before = row_logp(s.params)
  for _ in range(2):
    state, _ = step(state, batch)
  after = row_logp(state.params)
  assert after[0] > before[0] + 1e-3, (before[0], after[0])
  assert after[1] < before[1], (before[1], after[1])     # the negative-advantage sibling falls
