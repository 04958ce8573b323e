"""Tests for rft_jax.algorithms against hand-worked values: the GRPO advantage (invalid rows,
equal and all-invalid groups, no std scaling, exact zeros), the registry, the PPO-clip loss and
its gradient, the KL estimators (formulas; k1 and k3 unbiased), token_mean and the learning-rate
schedule. The GRPO step on a tiny model is in test_algorithms.py."""
import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model_fixtures import np_log_softmax
from rft_jax.algorithms import registry
from rft_jax.algorithms import train_state as ts
from rft_jax.algorithms.advantages import group_stats
from rft_jax.algorithms.advantages import grpo as grpo_adv
from rft_jax.algorithms.losses import kl_penalty, ppo_clip, token_mean

EPS = 1e-6   # grpo's default std epsilon


# ----------------------------------------------------------------------------
# Advantages.


def test_grpo_hand_values_invalid_row_and_equal_group():
  # Group 0: rewards 1, 0, 3 valid and 5 invalid -> stats over {1, 0, 3}:
  #   mean = 4/3, var = ((1-4/3)^2 + (4/3)^2 + (5/3)^2) / 3 = (1 + 16 + 25) / 27 = 14/9
  # Group 1: all rewards 2 -> std 0 -> advantages 0.
  rewards = jnp.array([1.0, 0.0, 3.0, 5.0, 2.0, 2.0, 2.0, 2.0])
  valid = jnp.array([True, True, True, False, True, True, True, True])
  mean, std = 4.0 / 3.0, math.sqrt(14.0) / 3.0
  want = [(1 - mean) / (std + EPS), (0 - mean) / (std + EPS), (3 - mean) / (std + EPS), 0.0,
          0.0, 0.0, 0.0, 0.0]
  np.testing.assert_allclose(np.asarray(grpo_adv(rewards, valid, 4)), want, rtol=1e-6, atol=1e-7)
  m, s, c = group_stats(rewards, valid, 4)
  np.testing.assert_allclose(np.asarray(m), [mean] * 4 + [2.0] * 4, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(s), [std] * 4 + [0.0] * 4, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(c), [3] * 4 + [4] * 4)


def test_grpo_binary_group_and_all_invalid_group():
  rewards = jnp.array([1.0, 0.0, 1.0, 0.0, 7.0, 1.0, 3.0, 4.0])
  valid = jnp.array([True] * 4 + [False] * 4)
  want = [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)] * 2 + [0.0] * 4
  np.testing.assert_allclose(np.asarray(grpo_adv(rewards, valid, 4)), want, rtol=1e-6)
  # Group size 2: pairs (1, 0) (1, 0) (7, 1) (3, 4) all valid.
  valid = jnp.ones(8, bool)
  want = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1.0]
  np.testing.assert_allclose(np.asarray(grpo_adv(rewards, valid, 2)), want, rtol=1e-5)


def test_grpo_without_std_scaling():
  rewards = jnp.array([1.0, 0.0, 3.0, 5.0, 2.0, 2.0, 2.0, 2.0])
  valid = jnp.array([True, True, True, False, True, True, True, True])
  want = [1 - 4 / 3, -4 / 3, 3 - 4 / 3, 0.0, 0.0, 0.0, 0.0, 0.0]
  got = grpo_adv(rewards, valid, 4, scale_by_std=False)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def test_registry_lookups():
  assert registry.get_advantage('grpo') is grpo_adv
  assert registry.get_loss('ppo_clip') is ppo_clip
  assert registry.get_loss_agg('token_mean') is token_mean
  with pytest.raises(KeyError):
    registry.get_loss('nope')
  names = registry.names()
  assert 'grpo' in names['advantage'] and 'ppo_clip' in names['loss']


def test_grpo_equal_rewards_give_exactly_zero_advantage():
  """Rewards like 1.1 (not exactly representable) must not leave rounding residue / eps."""
  rewards = jnp.array([1.1] * 8 + [0.1] * 8, jnp.float32)
  adv = grpo_adv(rewards, jnp.ones(16, bool), 8)
  assert np.all(np.asarray(adv) == 0.0)


@pytest.mark.parametrize('advantage', ['grpo', 'dr_grpo', 'grpo_batch_norm'])
@pytest.mark.parametrize('value,group', [(100.7, 3), (100.7, 16), (1000.1, 8), (12.3, 12)])
def test_a_group_of_equal_large_rewards_has_exactly_zero_advantage(advantage, value, group):
  """At |r| ~10 and above the float32 mean of equal rewards is off by an ulp (~1e-6 to 1e-4),
  more than a std threshold of 1e-6: GRPO gave every row of such a group ~±0.9 (found at
  [100.7] * 3). A second group with spread keeps its advantages, and a third with one invalid
  row differing from the rest has none either (invalid rows hold no statistic)."""
  rewards = np.concatenate([np.full(group, value), value + np.arange(group),
                            np.full(group, value)]).astype(np.float32)
  rewards[2 * group] = -5.0   # the third group's odd one out, invalid below
  valid = np.ones(3 * group, bool)
  valid[2 * group] = False
  adv = np.asarray(registry.get_advantage(advantage)(jnp.asarray(rewards), jnp.asarray(valid),
                                                     group))
  assert np.all(adv[:group] == 0.0) and np.all(adv[2 * group:] == 0.0), adv
  spread = adv[group:2 * group]
  assert np.all(np.diff(spread) > 0) and abs(spread.sum()) < 1e-3 * group, spread


# ----------------------------------------------------------------------------
# Losses.


def test_ppo_clip_hand_values():
  eps = 0.2
  ratios = np.array([1.1, 1.5, 0.5, 1.1, 1.5, 0.5, 1.0])
  adv = np.array([1.0, 1.0, 1.0, -2.0, -2.0, -2.0, 3.0])
  # -min(r*A, clip(r)*A):
  #   A=+1: r=1.1 -> -1.1 ; r=1.5 -> -min(1.5, 1.2) = -1.2 (clip_high) ; r=0.5 -> -min(.5,.8) = -.5
  #   A=-2: r=1.1 -> 2.2 ; r=1.5 -> -min(-3, -2.4) = 3.0 ; r=0.5 -> -min(-1, -1.6) = 1.6 (clip_low)
  #   A=3, r=1 -> -3
  want_loss = [-1.1, -1.2, -0.5, 2.2, 3.0, 1.6, -3.0]
  want_high = [0, 1, 0, 0, 0, 0, 0]
  want_low = [0, 0, 0, 0, 0, 1, 0]
  # One row per token so that each token has its own advantage ([B, L=1]).
  old = np.full((7, 1), -1.3, np.float32)
  logp = (old + np.log(ratios)[:, None]).astype(np.float32)
  mask = np.ones((7, 1), np.float32)
  loss, st = ppo_clip(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv, jnp.float32),
                      jnp.asarray(mask), clip_eps=eps)
  np.testing.assert_allclose(np.asarray(loss)[:, 0], want_loss, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(st['clip_high'])[:, 0], want_high)
  np.testing.assert_array_equal(np.asarray(st['clip_low'])[:, 0], want_low)
  np.testing.assert_allclose(np.asarray(st['ratio'])[:, 0], ratios, rtol=1e-5)
  # d loss / d logp = -r*A where the unclipped branch is active, 0 where the clip bound is.
  g = jax.grad(lambda lp: ppo_clip(lp, jnp.asarray(old), jnp.asarray(adv, jnp.float32),
                                   jnp.asarray(mask), clip_eps=eps)[0].sum())(jnp.asarray(logp))
  want_g = -ratios * adv * np.array([1, 0, 1, 1, 1, 0, 1])
  np.testing.assert_allclose(np.asarray(g)[:, 0], want_g, rtol=1e-5, atol=1e-7)


def test_kl_estimators_formulas():
  rng = np.random.RandomState(0)
  logp = rng.randn(4, 6).astype(np.float32) - 2.0
  ref = rng.randn(4, 6).astype(np.float32) - 2.0
  d = ref.astype(np.float64) - logp
  np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, 'k1')), -d, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, 'k2')), d * d / 2, rtol=1e-5,
                             atol=1e-6)
  k3 = np.asarray(kl_penalty(logp, ref, 'k3'))
  np.testing.assert_allclose(k3, np.exp(d) - d - 1, rtol=1e-4, atol=1e-6)
  assert (k3 >= 0).all()
  for est in ['k1', 'k2', 'k3']:
    assert np.all(np.asarray(kl_penalty(logp, logp, est)) == 0.0)
  with pytest.raises(ValueError):
    kl_penalty(logp, ref, 'k4')


def test_k1_k3_are_unbiased_for_kl():
  """Averaged over samples x ~ pi, k1 and k3 estimate KL(pi || ref) = sum pi log(pi / ref)."""
  rng = np.random.RandomState(1)
  lp = np_log_softmax(rng.randn(10))
  lr = np_log_softmax(lp + 0.5 * rng.randn(10))
  true_kl = float((np.exp(lp) * (lp - lr)).sum())
  x = rng.choice(10, size=200_000, p=np.exp(lp))
  for est in ['k1', 'k3']:
    v = np.asarray(kl_penalty(jnp.asarray(lp[x], jnp.float32), jnp.asarray(lr[x], jnp.float32),
                              est), np.float64)
    assert abs(v.mean() - true_kl) < 5 * v.std() / math.sqrt(len(x)) + 1e-4, est


def test_token_mean():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
  s, c = token_mean(x, m)
  assert float(s) == 1 + 2 + 5 + 6 and float(c) == 4.0


# ----------------------------------------------------------------------------
# Learning-rate schedule.


def test_lr_schedule_warmup():
  sched = ts.lr_schedule(SimpleNamespace(lr=2.0, warmup_steps=4))
  np.testing.assert_allclose([float(sched(i)) for i in range(7)],
                             [0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0], rtol=1e-6)


def test_lr_schedule_without_warmup_starts_at_lr():
  sched = ts.lr_schedule(SimpleNamespace(lr=2.0, warmup_steps=0))
  assert float(sched(0)) == 2.0


@pytest.mark.parametrize('value', [100.7, 1000.1, 12.3])
def test_reinforce_pp_of_a_batch_of_equal_large_rewards_is_exactly_zero(value):
  """REINFORCE++ whitens over the batch: equal rewards (no KL term) left the mean's rounding
  residue over its std, ~±0.9 per token. Row-level and token-level paths; with a spread in
  the batch the advantages are not 0."""
  rewards = jnp.full(8, value, jnp.float32)
  valid = jnp.ones(8, bool)
  mask = jnp.asarray(np.tril(np.ones((8, 5)))[:, ::-1].copy(), jnp.float32)
  adv = registry.get_advantage('reinforce_pp')
  assert np.all(np.asarray(adv(rewards, valid, 4)) == 0.0)
  assert np.all(np.asarray(adv(rewards, valid, 4, mask_bl=mask)) == 0.0)
  assert np.abs(np.asarray(adv(rewards.at[0].add(1.0), valid, 4, mask_bl=mask))).max() > 0.5
