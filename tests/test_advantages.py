"""Tests for every advantage estimator of the GRPO-family suite against hand-worked values or
plain Python-loop references (the shared ones in advantage_refs.py): group, leave-one-out and
batch baselines, REINFORCE++'s per-token returns with a KL charge, estimator traits, and GAE."""
import functools
import math

import jax.numpy as jnp
import numpy as np
import pytest

from advantage_refs import EPS, mean_std, ref_token_returns
from rft_jax import config as config_lib
from rft_jax.algorithms import advantages as adv_lib
from rft_jax.algorithms import registry

# Rewards of 3 groups of 4: group 0 has an invalid row, group 1 a single valid row, group 2 is
# all invalid; plus a group of equal rewards.
REWARDS = np.array([1.0, 0.0, 3.0, 5.0, 2.0, 7.0, 1.0, 4.0, 9.0, 9.0, 9.0, 9.0,
                    0.5, 0.5, 0.5, 0.5], np.float32)
VALID = np.array([1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1], bool)
G = 4


# ----------------------------------------------------------------------------
# Advantages: plain-Python references, one loop per estimator.


def _groups(r, v, g):
  for start in range(0, len(r), g):
    idx = list(range(start, start + g))
    yield idx, [float(r[i]) for i in idx if v[i]]


def ref_grpo(r, v, g, scale=True):
  out = [0.0] * len(r)
  for idx, vals in _groups(r, v, g):
    m, s = mean_std(vals)
    for i in idx:
      if v[i]:
        out[i] = ((r[i] - m) / (s + EPS) if s > EPS else 0.0) if scale else r[i] - m
  return out


def ref_grpo_batch_norm(r, v, g):
  _, s = mean_std([float(x) for x, ok in zip(r, v) if ok])
  out = [0.0] * len(r)
  for idx, vals in _groups(r, v, g):
    m, _ = mean_std(vals)
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
  m, s = mean_std([float(x) for x, ok in zip(r, v) if ok])
  return [(x - m) / (s + EPS) if ok else 0.0 for x, ok in zip(r, v)]


def ref_reinforce_pp_baseline(r, v, g):
  centred = ref_grpo(r, v, g, scale=False)
  m, s = mean_std([c for c, ok in zip(centred, v) if ok])
  return [(c - m) / (s + EPS) if ok else 0.0 for c, ok in zip(centred, v)]


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
