"""Tests for the policy losses of the GRPO-family suite (PPO-clip with asymmetric and dual clip,
GSPO, CISPO), the loss aggregations and the exactness of (sum, count) accumulation over
micro-batches, the KL pieces and the DPO losses, against hand-worked values or NumPy /
Python-loop references written here."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rft_jax.algorithms import dpo, grpo, losses, registry
from rft_jax.algorithms import train_state as ts


def _rows(ratios, adv, old=-1.3):
  """One token per row ([B, L=1]) so each token has its own advantage."""
  old_bl = np.full((len(ratios), 1), old, np.float32)
  logp = (old_bl + np.log(np.asarray(ratios))[:, None]).astype(np.float32)
  return (jnp.asarray(logp), jnp.asarray(old_bl), jnp.asarray(adv, jnp.float32),
          jnp.ones((len(ratios), 1), jnp.float32))


def test_ppo_clip_asymmetric_bounds_and_dual_clip_hand_values():
  ratios = [1.25, 1.35, 0.7, 0.85, 4.0, 2.0]
  adv = [1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
  lp, old, a, m = _rows(ratios, adv)
  # Bounds [0.8, 1.28]:
  #   A=+1: r=1.25 -> -1.25 ; r=1.35 -> -1.28 (clip_high)
  #   A=-1: r=0.7 -> -min(-0.7, -0.8) = 0.8 (clip_low) ; r=0.85 -> 0.85
  #         r=4 -> -min(-4, -1.28) = 4, dual c=3: min(4, 3) = 3 (dual) ; r=2 -> 2 (< 3)
  loss, st = losses.ppo_clip(lp, old, a, m, clip_eps_low=0.2, clip_eps_high=0.28, clip_c=3.0)
  np.testing.assert_allclose(loss[:, 0], [-1.25, -1.28, 0.8, 0.85, 3.0, 2.0], rtol=1e-5)
  np.testing.assert_array_equal(st['clip_high'][:, 0], [0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(st['clip_low'][:, 0], [0, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(st['clip_dual'][:, 0], [0, 0, 0, 0, 1, 0])
  g = jax.grad(lambda x: losses.ppo_clip(x, old, a, m, clip_eps_low=0.2, clip_eps_high=0.28,
                                         clip_c=3.0)[0].sum())(lp)
  # d/dlogp = -r A on the unclipped branch, 0 on any active bound (incl. the dual one).
  want = -np.array(ratios) * np.array(adv) * np.array([1, 0, 0, 1, 0, 1])
  np.testing.assert_allclose(g[:, 0], want, rtol=1e-5, atol=1e-7)
  # Without the options ppo_clip is the symmetric clip (clip_eps): r=1.25 is then clipped.
  loss0, st0 = losses.ppo_clip(lp, old, a, m, clip_eps=0.2)
  np.testing.assert_allclose(loss0[:, 0], [-1.2, -1.2, 0.8, 0.85, 4.0, 2.0], rtol=1e-5)
  assert 'clip_dual' not in st0


def _seq_batch(seed=2, b=5, l=7):
  rng = np.random.RandomState(seed)
  old = (rng.randn(b, l) * 0.5 - 2.0).astype(np.float32)
  logp = (old + rng.randn(b, l) * 0.05).astype(np.float32)
  mask = np.zeros((b, l), np.float32)
  for i, (s, e) in enumerate([(1, 7), (2, 4), (1, 2), (0, 0), (3, 7)][:b]):
    mask[i, s:e] = 1.0   # row 3 is padding only
  adv = np.array([1.0, -2.0, 0.5, 3.0, -0.7], np.float32)[:b]
  return logp, old, adv, mask


def test_gspo_matches_sequence_level_objective():
  logp, old, adv, mask = _seq_batch()
  lo, hi = 1 - 0.01, 1 + 0.015
  seq_ratio = [math.exp(((logp[i] - old[i]) * mask[i]).sum() / max(mask[i].sum(), 1))
               for i in range(len(adv))]
  loss, st = losses.gspo(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                         jnp.asarray(mask), clip_eps_low=0.01, clip_eps_high=0.015)
  for i, s in enumerate(seq_ratio):
    want = -min(s * adv[i], min(max(s, lo), hi) * adv[i])
    np.testing.assert_allclose(np.asarray(loss)[i], want, rtol=1e-5)   # same on every token
    np.testing.assert_allclose(np.asarray(st['ratio'])[i], s, rtol=1e-5)
    assert np.all(np.asarray(st['clip_high'])[i] == float(s > hi and adv[i] > 0))
    assert np.all(np.asarray(st['clip_low'])[i] == float(s < lo and adv[i] < 0))
  assert np.asarray(st['clip_high']).any() or np.asarray(st['clip_low']).any()

  # Gradient: GSPO-token + seq_mean_token_mean == the sequence objective written directly.
  def token_form(x):
    l_bl, _ = losses.gspo(x, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                          clip_eps_low=0.01, clip_eps_high=0.015)
    s, c = losses.seq_mean_token_mean(l_bl, jnp.asarray(mask))
    return s / c

  def sequence_form(x):
    m = jnp.asarray(mask)
    s = jnp.exp(((x - old) * m).sum(-1) / jnp.maximum(m.sum(-1), 1))
    a = jnp.asarray(adv)
    per_seq = -jnp.minimum(s * a, jnp.clip(s, lo, hi) * a)
    has = m.sum(-1) > 0
    return jnp.where(has, per_seq, 0).sum() / has.sum()

  both = jax.jit(lambda x: [jax.value_and_grad(f)(x) for f in (token_form, sequence_form)])
  (v_tok, g_tok), (v_seq, g_seq) = both(jnp.asarray(logp))
  np.testing.assert_allclose(v_tok, v_seq, rtol=1e-5)
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-4, atol=1e-7)
  assert np.abs(np.asarray(g_tok)).max() > 1e-3


def test_gspo_token_with_per_token_advantages_and_dual_clip_matches_loops():
  """GSPO-token (Zheng et al. 2025, eq. 13-14) with an advantage per token, as REINFORCE++ or
  PPO's GAE give it: token t of sequence i has value -min(s_i A_it, clip(s_i) A_it) (dual clip:
  at most -c A_it for A_it < 0) and, under seq_mean_token_mean, the gradient
  -s_i A_it / (|y_i| N_seq) w.r.t. its own log-prob when unclipped, 0 when clipped: sg(s_i)
  carries no gradient to the sequence's other tokens. Plain loops."""
  logp, old, _, mask = _seq_batch(seed=4)
  rng = np.random.RandomState(7)
  adv = (rng.randn(*mask.shape) * 1.5).astype(np.float32)
  eps_lo, eps_hi, c = 0.01, 0.015, 1.005
  lo, hi = 1 - eps_lo, 1 + eps_hi
  rows = [i for i in range(mask.shape[0]) if mask[i].sum()]
  want_v, want_g, kinds = 0.0, np.zeros_like(logp, np.float64), set()
  for i in rows:
    toks = [t for t in range(mask.shape[1]) if mask[i, t]]
    s = math.exp(sum(float(logp[i, t]) - float(old[i, t]) for t in toks) / len(toks))
    for t in toks:
      a = float(adv[i, t])
      value = -min(s * a, min(max(s, lo), hi) * a)
      grad = -s * a if s * a <= min(max(s, lo), hi) * a else 0.0
      kinds.add('clipped' if grad == 0.0 else 'free')
      if a < 0 and value > -c * a:
        value, grad = -c * a, 0.0
        kinds.add('dual')
      want_v += value / (len(toks) * len(rows))
      want_g[i, t] = grad / (len(toks) * len(rows))

  def mean_loss(x):
    l_bl, _ = losses.gspo(x, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                          clip_eps_low=eps_lo, clip_eps_high=eps_hi, clip_c=c)
    total, count = losses.seq_mean_token_mean(l_bl, jnp.asarray(mask))
    return total / count

  value, grad = jax.jit(jax.value_and_grad(mean_loss))(jnp.asarray(logp))
  np.testing.assert_allclose(float(value), want_v, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_g, rtol=1e-4, atol=1e-8)
  assert kinds == {'clipped', 'free', 'dual'}, kinds   # every branch is exercised


def test_cispo_values_gradient_and_stats():
  ratios = [1.5, 1.1, 0.5, 0.95]
  adv = [2.0, -1.0, 1.0, -3.0]
  lp, old, a, m = _rows(ratios, adv)
  loss, st = losses.cispo(lp, old, a, m, clip_eps_low=0.2, clip_eps_high=0.28)
  w = np.clip(ratios, 0.8, 1.28)       # [1.28, 1.1, 0.8, 0.95]
  np.testing.assert_allclose(loss[:, 0], -w * np.array(adv) * np.asarray(lp)[:, 0], rtol=1e-5)
  np.testing.assert_array_equal(st['clip_high'][:, 0], [1, 0, 0, 0])
  np.testing.assert_array_equal(st['clip_low'][:, 0], [0, 0, 1, 0])
  # Every token keeps a gradient, even the clipped ones: d/dlogp = -w A.
  g = jax.grad(lambda x: losses.cispo(x, old, a, m, clip_eps_low=0.2,
                                      clip_eps_high=0.28)[0].sum())(lp)
  np.testing.assert_allclose(g[:, 0], -w * np.array(adv), rtol=1e-5)


def test_all_losses_share_one_signature_and_stats():
  logp, old, adv, mask = _seq_batch()
  args = tuple(map(jnp.asarray, (logp, old, adv, mask)))
  opts = grpo.GRPOConfig(clip_eps_low=0.1, clip_eps_high=0.2).loss_options()
  for name in registry.names()['loss']:
    loss, st = registry.get_loss(name)(*args, **opts)
    assert loss.shape == logp.shape and {'clip_low', 'clip_high', 'ratio'} <= set(st), name
    # Per-token advantages [B, L] broadcast the same as per-sequence ones.
    loss2, _ = registry.get_loss(name)(args[0], args[1], jnp.broadcast_to(args[2][:, None],
                                                                          logp.shape),
                                       args[3], **opts)
    np.testing.assert_allclose(loss2, loss, rtol=1e-6, err_msg=name)


# ----------------------------------------------------------------------------
# Aggregations and micro-batch exactness.


def ref_agg(name, x, m, norm_len):
  seqs = [(float((x[i] * m[i]).sum()), float(m[i].sum())) for i in range(len(x))]
  seqs = [(s, n) for s, n in seqs if n > 0]
  if name == 'token_mean':
    return sum(s for s, _ in seqs) / sum(n for _, n in seqs)
  if name == 'seq_mean_token_mean':
    return sum(s / n for s, n in seqs) / len(seqs)
  if name == 'seq_mean_token_sum':
    return sum(s for s, _ in seqs) / len(seqs)
  if name == 'seq_mean_token_sum_norm':
    return sum(s for s, _ in seqs) / norm_len / len(seqs)
  raise KeyError(name)


AGGS = ['token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'seq_mean_token_sum_norm']


def test_every_registered_aggregation_is_tested():
  assert set(registry.names()['loss_agg']) == set(AGGS)


@pytest.mark.parametrize('name', AGGS)
def test_aggregation_matches_python_loop(name):
  x, _, _, m = _seq_batch(seed=3)
  s, c = registry.get_loss_agg(name)(jnp.asarray(x), jnp.asarray(m), norm_len=10)
  np.testing.assert_allclose(float(s) / float(c), ref_agg(name, x, m, 10), rtol=1e-5)
  assert float(c) == (m.sum() if name == 'token_mean' else 4.0)   # the padding row: no count


def test_seq_mean_token_sum_norm_hand_value():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
  s, c = losses.seq_mean_token_sum_norm(x, m, norm_len=4)
  assert float(s) == (3 + 11) / 4 and float(c) == 2.0
  s, _ = losses.seq_mean_token_sum_norm(x, m)   # default: the row length L = 3
  np.testing.assert_allclose(float(s), 14 / 3, rtol=1e-6)


def _toy_problem(b=8, l=6, v=5, seed=4):
  """A linear softmax 'policy' over fixed features: logp_bl = log_softmax(f_blv * w_v)[tok]."""
  rng = np.random.RandomState(seed)
  feats = jnp.asarray(rng.randn(b, l, v), jnp.float32)
  tok = jnp.asarray(rng.randint(0, v, (b, l)))
  params = {'w': jnp.asarray(rng.randn(v), jnp.float32)}
  mask = np.zeros((b, l), np.float32)
  for i, n in enumerate([6, 1, 3, 0, 5, 2, 6, 4][:b]):
    mask[i, l - n:] = 1.0
  batch = {'feats': feats, 'tok': tok, 'mask': jnp.asarray(mask),
           'old': jnp.asarray(rng.randn(b, l) * 0.1 - 1.6, jnp.float32),
           'ref': jnp.asarray(rng.randn(b, l) * 0.1 - 1.6, jnp.float32),
           'adv': jnp.asarray(rng.randn(b), jnp.float32)}
  return params, batch


def _toy_loss(params, mb, *, loss, agg, kl_coef=0.1):
  lsm = jax.nn.log_softmax(mb['feats'] * params['w'], -1)
  logp = jnp.take_along_axis(lsm, mb['tok'][..., None], -1)[..., 0]
  pg, _ = registry.get_loss(loss)(logp, mb['old'], mb['adv'], mb['mask'], clip_eps=0.05)
  per_tok = pg + kl_coef * losses.kl_penalty(logp, mb['ref'], 'k3')
  s, c = registry.get_loss_agg(agg)(per_tok, mb['mask'], norm_len=6)
  return s, (c, {'loss': jax.lax.stop_gradient(s)})


@pytest.mark.parametrize('loss,agg', [('gspo', a) for a in AGGS] +
                         [('ppo_clip', 'token_mean'), ('cispo', 'seq_mean_token_mean')])
def test_microbatch_accumulation_is_exact(loss, agg):
  """1 vs 4 micro-batches (uneven token and sequence counts, one empty row) give the same loss
  and gradient: every aggregation is a row-wise sum over a row-wise count, and every loss is
  row-local (GSPO's ratio is per row). A mean of the micro-batch means (the naive alternative)
  differs, so the test can tell them apart."""
  params, batch = _toy_problem()
  fn = functools.partial(_toy_loss, loss=loss, agg=agg)

  @jax.jit
  def run(params, batch):
    mbs = ts.split_microbatches(batch, 4)
    per_mb = jax.vmap(lambda mb: fn(params, mb))(mbs)
    naive = jnp.mean(per_mb[0] / per_mb[1][0])
    s, (c, _) = fn(params, batch)
    return (ts.accumulate_grads(fn, params, batch, 1), ts.accumulate_grads(fn, params, batch, 4),
            s / c, naive)

  (g1, m1), (g4, m4), direct, naive = run(params, batch)
  np.testing.assert_allclose(g4['w'], g1['w'], rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(m4['loss'], m1['loss'], rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(m1['loss'], direct, rtol=1e-6)
  assert abs(float(naive) - float(m1['loss'])) > 1e-4 * max(abs(float(m1['loss'])), 1e-3)


# ----------------------------------------------------------------------------
# KL.


def test_k3_gradient_is_analytic():
  rng = np.random.RandomState(5)
  logp = jnp.asarray(rng.randn(3, 4) - 2.0, jnp.float32)
  ref = jnp.asarray(rng.randn(3, 4) - 2.0, jnp.float32)
  g = jax.grad(lambda x: losses.kl_penalty(x, ref, 'k3').sum())(logp)
  np.testing.assert_allclose(g, 1.0 - np.exp(np.asarray(ref, np.float64) - np.asarray(logp)),
                             rtol=1e-5, atol=1e-6)
  # k2's gradient is -(ref - logp), k1's is 1.
  g2 = jax.grad(lambda x: losses.kl_penalty(x, ref, 'k2').sum())(logp)
  np.testing.assert_allclose(g2, -(np.asarray(ref) - np.asarray(logp)), rtol=1e-5, atol=1e-6)
  g1 = jax.grad(lambda x: losses.kl_penalty(x, ref, 'k1').sum())(logp)
  assert np.all(np.asarray(g1) == 1.0)


def test_adaptive_kl_coef_hand_values():
  f = functools.partial(losses.adaptive_kl_coef, target=0.1, horizon=100.0, n_steps=10.0)
  np.testing.assert_allclose(f(0.5, 0.11), 0.5 * (1 + 0.1 * 0.1), rtol=1e-6)   # e = 0.1
  np.testing.assert_allclose(f(0.5, 1.0), 0.5 * (1 + 0.2 * 0.1), rtol=1e-6)    # e clipped 0.2
  np.testing.assert_allclose(f(0.5, 0.0), 0.5 * (1 - 0.2 * 0.1), rtol=1e-6)    # e clipped -0.2
  np.testing.assert_allclose(f(0.5, 0.1), 0.5, rtol=1e-6)


# ----------------------------------------------------------------------------
# DPO.


def test_dpo_losses_hand_values():
  # Pair 0: h = (-1 - -2) - (-3 - -2.5) = 1 + 0.5 = 1.5 ; pair 1: h = (-4 + 3) - (-1 + 2) = -2.
  pc, pr = jnp.array([-1.0, -4.0]), jnp.array([-3.0, -1.0])
  rc, rr = jnp.array([-2.0, -3.0]), jnp.array([-2.5, -2.0])
  beta = 0.5
  sig = lambda z: 1.0 / (1.0 + math.exp(-z))
  loss, st = dpo.dpo_loss(pc, pr, rc, rr, beta=beta)
  np.testing.assert_allclose(loss, [-math.log(sig(0.75)), -math.log(sig(-1.0))], rtol=1e-6)
  loss, _ = dpo.dpo_loss(pc, pr, rc, rr, beta=beta, label_smoothing=0.1)
  np.testing.assert_allclose(loss, [-0.9 * math.log(sig(0.75)) - 0.1 * math.log(sig(-0.75)),
                                    -0.9 * math.log(sig(-1.0)) - 0.1 * math.log(sig(1.0))],
                             rtol=1e-6)
  loss, _ = dpo.dpo_loss(pc, pr, rc, rr, beta=beta, loss_type='ipo')   # (h - 1)^2
  np.testing.assert_allclose(loss, [0.25, 9.0], rtol=1e-6)
  loss, _ = dpo.dpo_loss(pc, pr, rc, rr, beta=beta, loss_type='hinge')  # max(0, 1 - h/2)
  np.testing.assert_allclose(loss, [0.25, 2.0], rtol=1e-6)
  np.testing.assert_allclose(st['rewards/chosen'], [0.5, -0.5], rtol=1e-6)
  np.testing.assert_allclose(st['rewards/rejected'], [-0.25, 0.5], rtol=1e-6)
  np.testing.assert_allclose(st['rewards/margins'], [0.75, -1.0], rtol=1e-6)
  np.testing.assert_array_equal(st['rewards/accuracies'], [1.0, 0.0])
  # d loss / d logp_chosen = -beta * sigmoid(-beta h) for sigmoid DPO.
  g = jax.grad(lambda x: dpo.dpo_loss(x, pr, rc, rr, beta=beta)[0].sum())(pc)
  np.testing.assert_allclose(g, [-beta * sig(-0.75), -beta * sig(1.0)], rtol=1e-5)
  with pytest.raises(ValueError, match='known: sigmoid, ipo, hinge'):
    dpo.dpo_loss(pc, pr, rc, rr, loss_type='kto')

