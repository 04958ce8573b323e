"""Tests for the GRPO-family suite: every advantage estimator, policy loss, aggregation, KL piece
and DPO loss against hand-worked values or plain NumPy / Python-loop references written here;
exactness of (sum, count) accumulation over micro-batches; the loss_fn options (entropy bonus,
KL in the reward, sequence-mean metrics); config validation of the algorithm choices."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import (cispo_arith, dapo_arith, dr_grpo_arith, grpo_arith, gspo_arith,
                     reinforce_pp_arith, rloo_arith)
from rft_jax import config as config_lib
from rft_jax.algorithms import advantages as adv_lib
from rft_jax.algorithms import dpo, grpo, losses, registry
from rft_jax.algorithms import train_state as ts
from rft_jax.models import ModelConfig, create
from rft_jax.sampling.sampler import Rollout
from flax import nnx

EPS = 1e-6

# Rewards of 3 groups of 4: group 0 has an invalid row, group 1 a single valid row, group 2 is
# all invalid; plus a group of equal rewards.
REWARDS = np.array([1.0, 0.0, 3.0, 5.0, 2.0, 7.0, 1.0, 4.0, 9.0, 9.0, 9.0, 9.0,
                    0.5, 0.5, 0.5, 0.5], np.float32)
VALID = np.array([1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1], bool)
G = 4


# ----------------------------------------------------------------------------
# Advantages: plain-Python references, one loop per estimator.


def _mean_std(xs):
  if not xs:
    return 0.0, 0.0
  m = sum(xs) / len(xs)
  return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _groups(r, v, g):
  for start in range(0, len(r), g):
    idx = list(range(start, start + g))
    yield idx, [float(r[i]) for i in idx if v[i]]


def ref_grpo(r, v, g, scale=True):
  out = [0.0] * len(r)
  for idx, vals in _groups(r, v, g):
    m, s = _mean_std(vals)
    for i in idx:
      if v[i]:
        out[i] = ((r[i] - m) / (s + EPS) if s > EPS else 0.0) if scale else r[i] - m
  return out


def ref_grpo_batch_norm(r, v, g):
  _, s = _mean_std([float(x) for x, ok in zip(r, v) if ok])
  out = [0.0] * len(r)
  for idx, vals in _groups(r, v, g):
    m, _ = _mean_std(vals)
    for i in idx:
      if v[i]:
        out[i] = (r[i] - m) / (s + EPS)
  return out


def ref_rloo(r, v, g):
  out = [0.0] * len(r)
  for idx, _ in _groups(r, v, g):
    for i in idx:
      others = [float(r[j]) for j in idx if j != i and v[j]]
      if v[i] and others:
        out[i] = r[i] - sum(others) / len(others)
  return out


def ref_reinforce_pp(r, v, g):
  m, s = _mean_std([float(x) for x, ok in zip(r, v) if ok])
  return [(x - m) / (s + EPS) if ok else 0.0 for x, ok in zip(r, v)]


def ref_reinforce_pp_baseline(r, v, g):
  centred = ref_grpo(r, v, g, scale=False)
  m, s = _mean_std([c for c, ok in zip(centred, v) if ok])
  return [(c - m) / (s + EPS) if ok else 0.0 for c, ok in zip(centred, v)]


def ref_token_returns(score, valid, mask, kl, kl_coef):
  """REINFORCE++'s token advantages by loops: G_t = s - kl_coef * sum_{i >= t} kl_i on the loss
  tokens of valid rows, whitened over all those tokens (population std)."""
  returns = {}
  for b in range(len(score)):
    if not valid[b]:
      continue
    tail = 0.0
    for t in reversed(range(len(mask[b]))):
      if mask[b][t]:
        tail += kl[b][t]
        returns[b, t] = score[b] - kl_coef * tail
  m, s = _mean_std(list(returns.values()))
  out = np.zeros(np.shape(mask))
  for (b, t), g_bt in returns.items():
    out[b, t] = (g_bt - m) / (s + EPS)
  return out


REFERENCES = {
    'grpo': ref_grpo, 'dr_grpo': functools.partial(ref_grpo, scale=False),
    'grpo_batch_norm': ref_grpo_batch_norm, 'rloo': ref_rloo, 'reinforce_pp': ref_reinforce_pp,
    'reinforce_pp_baseline': ref_reinforce_pp_baseline,
}


def test_every_registered_estimator_has_a_reference():
  assert set(registry.names()['advantage']) == set(REFERENCES)


@pytest.mark.parametrize('name', sorted(REFERENCES))
def test_advantage_matches_python_loop(name):
  got = np.asarray(registry.get_advantage(name)(jnp.asarray(REWARDS), jnp.asarray(VALID), G))
  want = REFERENCES[name](REWARDS.astype(np.float64), VALID, G)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(got[~VALID] == 0.0)
  assert np.abs(got).max() > 0.1   # the case is not degenerate


def test_advantage_hand_values():
  # One group of 3 valid rewards (1, 0, 3) and an invalid row: mean 4/3.
  r, v = jnp.array([1.0, 0.0, 3.0, 5.0]), jnp.array([True, True, True, False])
  rloo = registry.get_advantage('rloo')(r, v, 4)
  np.testing.assert_allclose(rloo, [1 - 1.5, 0 - 2.0, 3 - 0.5, 0.0], rtol=1e-6)
  dr = registry.get_advantage('dr_grpo')(r, v, 4)
  np.testing.assert_allclose(dr, [-1 / 3, -4 / 3, 5 / 3, 0.0], rtol=1e-6)
  # REINFORCE++ over two groups of 2: rewards (1, 0, 0, 0): batch mean 1/4, std sqrt(3)/4.
  rpp = registry.get_advantage('reinforce_pp')(jnp.array([1.0, 0.0, 0.0, 0.0]), jnp.ones(4, bool),
                                               2)
  s = math.sqrt(3) / 4
  np.testing.assert_allclose(rpp, [0.75 / (s + EPS)] + [-0.25 / (s + EPS)] * 3, rtol=1e-6)


def test_reinforce_pp_charges_each_token_the_kl_after_it():
  # Two completions of 3 tokens, reward 1 each, KL 0.5 on row 0's first and row 1's last token.
  # Returns to go: row 0 [0.5, 1, 1], row 1 [0.5, 0.5, 0.5]; over the 6 tokens mean 2/3 and
  # std sqrt(1/18), so A = [-1/sqrt(2), sqrt(2), sqrt(2)] and [-1/sqrt(2)] * 3. The sequence-sum
  # form (r - 0.5 for both rows) would give every token 0.
  kl = jnp.array([[0.5, 0.0, 0.0], [0.0, 0.0, 0.5]])
  adv = registry.get_advantage('reinforce_pp')(jnp.ones(2), jnp.ones(2, bool), 1,
                                               mask_bl=jnp.ones((2, 3)), kl_bl=kl, kl_coef=1.0)
  r2 = math.sqrt(2)
  np.testing.assert_allclose(adv, [[-1 / r2, r2, r2], [-1 / r2] * 3], rtol=1e-5)


@pytest.mark.parametrize('name', ['reinforce_pp', 'reinforce_pp_baseline'])
@pytest.mark.parametrize('with_kl', [False, True])
def test_reinforce_pp_token_advantages_match_python_loop(name, with_kl):
  rng = np.random.default_rng(3)
  n_rows, length = len(REWARDS), 7
  lengths = rng.integers(0, length - 2, n_rows)
  mask = ((np.arange(length)[None] >= 2) & (np.arange(length)[None] < 2 + lengths[:, None]))
  kl = rng.random((n_rows, length)) * 0.3 if with_kl else None
  got = np.asarray(registry.get_advantage(name)(
      jnp.asarray(REWARDS), jnp.asarray(VALID), G, mask_bl=jnp.asarray(mask, jnp.float32),
      kl_bl=None if kl is None else jnp.asarray(kl, jnp.float32), kl_coef=0.7))
  score = REWARDS.astype(np.float64)
  if name == 'reinforce_pp_baseline':
    score = np.asarray(ref_grpo(score, VALID, G, scale=False))
  want = ref_token_returns(score, VALID, mask, np.zeros(mask.shape) if kl is None else kl, 0.7)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.abs(got).max() > 0.1 and np.all(got[~mask] == 0.0)
  if not with_kl:   # each row's tokens share one value; longer rows weigh more in mean and std
    assert all(np.ptp(got[b][mask[b]]) < 1e-6 for b in range(n_rows) if mask[b].any())


def test_rloo_baseline_excludes_the_sample_itself():
  rng = np.random.RandomState(0)
  r = rng.randn(8).astype(np.float32)
  v = np.ones(8, bool)
  fn = registry.get_advantage('rloo')
  base = r - np.asarray(fn(jnp.asarray(r), jnp.asarray(v), 4))
  r2 = r.copy()
  r2[1] += 10.0
  base2 = r2 - np.asarray(fn(jnp.asarray(r2), jnp.asarray(v), 4))
  assert abs(base2[1] - base[1]) < 1e-5             # own baseline unchanged by own reward
  np.testing.assert_allclose(base2[[0, 2, 3]], base[[0, 2, 3]] + 10.0 / 3, rtol=1e-5)
  np.testing.assert_allclose(base2[4:], base[4:], rtol=1e-6)   # other group untouched
  # GRPO's baseline, by contrast, moves with the sample's own reward.
  gb = lambda x: x - np.asarray(registry.get_advantage('dr_grpo')(jnp.asarray(x), v, 4))
  assert abs(gb(r2)[1] - gb(r)[1] - 2.5) < 1e-5


def test_estimator_traits_match_config_and_group_means():
  r, v = jnp.asarray(REWARDS), jnp.asarray(VALID)
  # Token-level estimators get completions of 1-6 tokens (no KL: one value per row, at token 0).
  lengths = np.random.default_rng(4).integers(1, 7, len(REWARDS))
  mask = jnp.asarray(np.arange(6)[None] < lengths[:, None], jnp.float32)
  for name in registry.names()['advantage']:
    fn = registry.get_advantage(name)
    assert (fn.min_group_size == 1) == (name in config_lib.GROUP_FREE_ADVANTAGES), name
    adv = fn(r, v, G, mask_bl=mask)[:, 0] if fn.token_level else fn(r, v, G)
    mean_g, _, _ = adv_lib.group_stats(adv, v, G)
    if fn.zero_group_mean:
      assert np.abs(np.asarray(mean_g)).max() < 1e-5, name
    else:
      # the trait is not vacuous (REINFORCE++-baseline's token-weighted batch mean: ~0.01 here)
      assert np.abs(np.asarray(mean_g)).max() > 1e-3, name


def ref_gae(r, val, m, gamma, lam):
  b, t = r.shape
  adv = np.zeros((b, t))
  for i in range(b):
    last = 0.0
    for k in reversed(range(t)):
      if not m[i, k]:
        last = 0.0
        continue
      nv = val[i, k + 1] if k + 1 < t and m[i, k + 1] else 0.0
      nm = 1.0 if k + 1 < t and m[i, k + 1] else 0.0
      delta = r[i, k] + gamma * nv - val[i, k]
      last = delta + gamma * lam * nm * last
      adv[i, k] = last
  return adv, (adv + val) * m


def test_gae_matches_python_loop():
  rng = np.random.RandomState(1)
  r = rng.randn(3, 6).astype(np.float32)
  val = rng.randn(3, 6).astype(np.float32)
  m = np.zeros((3, 6), np.float32)
  m[0, :6], m[1, :3], m[2, :1] = 1, 1, 1
  adv, ret = adv_lib.gae(jnp.asarray(r), jnp.asarray(val), jnp.asarray(m), 0.9, 0.8)
  want_adv, want_ret = ref_gae(r.astype(np.float64), val.astype(np.float64), m, 0.9, 0.8)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-6)
  # gamma = lam = 1 with zero values: the advantage is the reward-to-go.
  adv1, _ = adv_lib.gae(jnp.asarray(r), jnp.zeros_like(jnp.asarray(r)), jnp.asarray(m), 1.0, 1.0)
  np.testing.assert_allclose(adv1[0], np.cumsum(r[0][::-1])[::-1], rtol=1e-5)


# ----------------------------------------------------------------------------
# Policy losses.


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


# ----------------------------------------------------------------------------
# grpo.prepare_batch / loss_fn options on a tiny model.

CFG = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                  tie_word_embeddings=False)
B, P, T = 8, 3, 5


@pytest.fixture(scope='module')
def tiny():
  graphdef, state = create(CFG, seed=0)
  params = nnx.to_pure_dict(state)
  rng = np.random.RandomState(6)
  noise = lambda scale: jax.tree.map(
      lambda x: x + scale * jnp.asarray(rng.randn(*x.shape), jnp.float32), params)
  params, ref_params = noise(0.3), None
  ref_params = jax.tree.map(lambda x: x + 0.05 * jnp.asarray(rng.randn(*x.shape), jnp.float32),
                            params)
  lengths = np.array([5, 1, 3, 4, 2, 5, 0, 3])
  mask_bt = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  rollout = Rollout(
      # groups of 2 rows share their prompt, as the sampler lays them out
      prompt_tokens_bp=jnp.asarray(np.repeat(rng.randint(2, 16, (B // 2, P)), 2, 0), jnp.int32),
      prompt_mask_bp=jnp.ones((B, P), jnp.int32),
      tokens_bt=jnp.asarray(rng.randint(2, 16, (B, T)) * mask_bt, jnp.int32),
      logp_bt=jnp.zeros((B, T), jnp.float32), mask_bt=jnp.asarray(mask_bt),
      truncated_b=jnp.asarray(lengths == T))
  rewards = jnp.array([1.0, 0.0, 0.5, 0.5, 0.0, 1.0, 0.3, 0.9])
  valid = jnp.array([True] * 7 + [False])
  return graphdef, params, ref_params, rollout, rewards, valid


def test_kl_in_reward_and_batch_baseline(tiny):
  graphdef, params, ref_params, rollout, rewards, valid = tiny
  algo = grpo.GRPOConfig(advantage='reinforce_pp', kl_in_reward=True, kl_coef=0.5, group_size=2)
  prep = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=algo))
  batch, metrics = prep(params, ref_params, rollout, rewards, valid)
  lm = np.asarray(batch['loss_mask'], np.float64)
  d = np.asarray(batch['ref_logp'], np.float64) - np.asarray(batch['old_logp'], np.float64)
  seq_kl = ((np.exp(d) - d - 1) * lm).sum(-1)                       # k3 summed per sequence
  assert seq_kl[:6].min() > 1e-4              # not vacuous (row 6 is empty, row 7 invalid)
  kl = (np.exp(d) - d - 1) * lm                                     # k3 per token
  want = ref_token_returns(np.asarray(rewards, np.float64), np.asarray(valid), lm, kl, 0.5)
  assert batch['adv'].shape == lm.shape   # per token: the KL as a return to go
  np.testing.assert_allclose(batch['adv'], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(metrics['kl_reward/seq_kl'], seq_kl[:7].mean(), rtol=1e-4)
  # A batch baseline has no zero group mean: the monitor's invariant is left out, not violated.
  assert 'invariant/group_adv_mean_max' not in metrics
  # The loss then carries no KL term: loss == pg_loss.
  loss_sum, (_, sums) = jax.jit(functools.partial(grpo.loss_fn, graphdef=graphdef, algo=algo))(
      params, batch)
  assert float(sums['kl']) > 0 and float(loss_sum) == float(sums['pg_loss'])


def test_loss_fn_entropy_bonus_seq_mean_and_token_mean_metrics(tiny):
  graphdef, params, ref_params, rollout, rewards, valid = tiny
  algo = grpo.GRPOConfig(loss='gspo', loss_agg='seq_mean_token_mean', kl_coef=0.1,
                         entropy_coef=0.05, clip_eps_low=0.01, clip_eps_high=0.02, group_size=2,
                         microbatches=2)
  batch, _ = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=algo))(
      jax.tree.map(lambda x: x * 1.02, params), ref_params, rollout, rewards, valid)
  fn = functools.partial(grpo.loss_fn, graphdef=graphdef, algo=algo)
  no_bonus = functools.partial(grpo.loss_fn, graphdef=graphdef,
                               algo=grpo.GRPOConfig(**{**algo.__dict__, 'entropy_coef': 0.0}))

  def entropy_seq_sum(p):
    _, e = grpo.sequence_logprobs(graphdef, p, batch['tokens'], batch['mask'])
    return losses.seq_mean_token_mean(e, batch['loss_mask'])[0]

  @jax.jit
  def run(params, batch):
    logp, ent = grpo.sequence_logprobs(graphdef, params, batch['tokens'], batch['mask'])
    g, m = ts.accumulate_grads(fn, params, batch, 2)
    bonus_grad = jax.grad(lambda p: fn(p, batch)[0] - no_bonus(p, batch)[0])(params)
    return (logp, ent, fn(params, batch), grpo.token_means(m), bonus_grad,
            jax.grad(entropy_seq_sum)(params))

  logp, ent, (loss_sum, (count, sums)), metrics, bonus_grad, ent_grad = run(params, batch)
  lm = np.asarray(batch['loss_mask'], np.float64)
  pg, _ = losses.gspo(logp, batch['old_logp'], batch['adv'], batch['loss_mask'],
                      clip_eps_low=0.01, clip_eps_high=0.02)
  d = np.asarray(batch['ref_logp'], np.float64) - np.asarray(logp, np.float64)
  k3 = np.exp(d) - d - 1
  per_tok = np.asarray(pg, np.float64) + 0.1 * k3 - 0.05 * np.asarray(ent, np.float64)
  n_b = lm.sum(-1)
  has = n_b > 0
  assert int(count) == has.sum() == 6                 # rows 6 (empty) and 7 (invalid) excluded
  seq_mean = ((per_tok * lm).sum(-1)[has] / n_b[has]).mean()
  np.testing.assert_allclose(float(loss_sum) / float(count), seq_mean, rtol=1e-4)
  np.testing.assert_allclose(float(sums['entropy']), (np.asarray(ent) * lm).sum(), rtol=1e-4)
  np.testing.assert_allclose(float(sums['count/tokens']), lm.sum())
  # 2 micro-batches (3 sequences each, unequal token counts): the loss is the global sequence
  # mean, and train_step's token_means turns the diagnostics into exact global token means.
  np.testing.assert_allclose(metrics['loss'], seq_mean, rtol=1e-4)
  np.testing.assert_allclose(metrics['kl'], (k3 * lm).sum() / lm.sum(), rtol=1e-4)
  np.testing.assert_allclose(metrics['entropy'], (np.asarray(ent) * lm).sum() / lm.sum(),
                             rtol=1e-4)
  assert 'count/tokens' not in metrics
  # The entropy bonus is differentiated: grad(loss) - grad(loss without it) = -coef grad(ent).
  for a, e in zip(jax.tree.leaves(bonus_grad), jax.tree.leaves(ent_grad)):
    np.testing.assert_allclose(a, -0.05 * e, rtol=1e-3, atol=1e-4 * float(np.abs(e).max()))
  assert max(float(np.abs(e).max()) for e in jax.tree.leaves(ent_grad)) > 1e-3


# ----------------------------------------------------------------------------
# Config: recipes and validation of the algorithm section.

RECIPES = [dapo_arith, dr_grpo_arith, gspo_arith, cispo_arith, rloo_arith, reinforce_pp_arith]


@pytest.fixture
def assets(tmp_path):
  (tmp_path / 'tok.model').write_bytes(b'not read by validate')
  (tmp_path / 'base').mkdir()
  return str(tmp_path / 'tok.model'), str(tmp_path / 'base')


def _with_assets(config, assets):
  config.tokenizer.path, config.init_from = assets
  return config


@pytest.mark.parametrize('module', RECIPES, ids=lambda m: m.__name__.split('.')[-1])
def test_recipes_validate_and_change_only_the_algo_section(module, assets):
  for arg in ['', 'tiny']:
    config = _with_assets(module.get_config(arg), assets)
    config_lib.validate(config)
    base = _with_assets(grpo_arith.get_config(arg), assets)
    for section in config.keys():
      if section not in ('algo', 'name'):
        assert config[section] == base[section], section
    algo = grpo.GRPOConfig.from_config(config)
    assert algo.loss in registry.names()['loss']


def test_grpo_recipe_keeps_its_defaults():
  algo = grpo.GRPOConfig.from_config(grpo_arith.get_config())
  assert (algo.clip_eps_low, algo.clip_eps_high, algo.clip_c, algo.entropy_coef,
          algo.kl_in_reward) == (None, None, 0.0, 0.0, False)
  assert algo.loss_options() == dict(clip_eps=0.2, clip_eps_low=None, clip_eps_high=None,
                                     clip_c=0.0)
  assert algo.max_len == grpo_arith.get_config().rollout.max_new_tokens


@pytest.mark.parametrize('changes,message', [
    ({'rollout.group_size': 1, 'algo.advantage': 'rloo'},
     "config.rollout.group_size=1: GRPO needs at least 2 completions per prompt "
     "(algo.advantage='rloo' uses a group baseline; with 1 use 'reinforce_pp')"),
    ({'algo.clip_c': 1.0}, 'config.algo.clip_c=1.0: dual-clip constant must be > 1'),
    ({'algo.clip_c': 3.0, 'algo.loss': 'cispo'},
     "config.algo.clip_c=3.0: dual-clip applies to the ppo_clip and gspo losses, not "
     "algo.loss='cispo'; set it to 0"),
    ({'algo.clip_eps_high': -0.1}, 'config.algo.clip_eps_high=-0.1: must be >= 0'),
    ({'algo.clip_eps_low': -1}, 'config.algo.clip_eps_low=-1: must be >= 0'),
    ({'algo.entropy_coef': -0.01}, 'config.algo.entropy_coef=-0.01: must be >= 0'),
    ({'algo.kl_in_reward': 1}, 'config.algo.kl_in_reward=1: expected bool, got int'),
    ({'algo.loss_agg': 'seq_mean'}, "config.algo.loss_agg='seq_mean': unknown loss aggregation"),
], ids=['rloo_group_1', 'dual_clip_1', 'dual_clip_cispo', 'eps_high', 'eps_low', 'entropy',
        'kl_in_reward_type', 'unknown_agg'])
def test_algo_validation_errors(changes, message, assets):
  config = _with_assets(grpo_arith.get_config(), assets)
  for key, value in changes.items():
    section, leaf = key.split('.')
    if leaf in config[section]:
      del config[section][leaf]
    config[section][leaf] = value
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert str(info.value).startswith(message) and '\n' not in str(info.value)
  if 'unknown' in message:
    assert all(n in str(info.value) for n in AGGS)


def test_group_free_estimator_accepts_group_size_one(assets):
  config = _with_assets(reinforce_pp_arith.get_config('tiny'), assets)
  config.rollout.group_size = 1
  config_lib.validate(config)
