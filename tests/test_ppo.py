"""PPO with a critic: the value loss, explained variance and whitening against hand-worked values
or NumPy references written here; prepare_batch's token rewards and GAE against a plain-Python
loop; the one-pass backbone against the model's forward; micro-batch invariance of the summed
policy + value objective; the update lowering the value loss; mini-batch epochs. The recipe's
config checks and a tiny end-to-end run are in test_ppo_recipe.py."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import grpo_arith
from model_fixtures import TINY_B, TINY_P, TINY_T, tiny_batch, tiny_model_config
from rft_jax.algorithms import critic, grpo, ppo
from rft_jax.algorithms import train_state as ts
from rft_jax.models import ModelConfig, create
from rft_jax.models import functional as lm

# ----------------------------------------------------------------------------
# Pure pieces.


def test_clipped_value_loss_hand_values():
  #            v    old   R     unclipped  v_clip  clipped   0.5*max  clip used
  v = jnp.array([1.0, 0.0, 1.2, 0.6])
  old = jnp.array([0.5, 0.5, 0.5, 0.5])
  ret = jnp.array([0.0, 1.0, 1.0, 1.0])
  vf, clipped = critic.clipped_value_loss(v, old, ret, 0.2)
  # row 0: (1-0)^2=1 vs (0.7-0)^2=.49 -> .5; row 1: 1 vs (.3-1)^2=.49 -> .5;
  # row 2: (.2)^2=.04 vs (.7-1)^2=.09 -> .045 (clipped); row 3: inside the range, .16 -> .08.
  np.testing.assert_allclose(vf, [0.5, 0.5, 0.045, 0.08], rtol=1e-6)
  np.testing.assert_array_equal(clipped, [0, 0, 1, 0])
  # Gradient: v - R where the unclipped term is the max, 0 where the clipped one is.
  g = jax.grad(lambda x: critic.clipped_value_loss(x, old, ret, 0.2)[0].sum())(v)
  np.testing.assert_allclose(g, [1.0, -1.0, 0.0, -0.4], rtol=1e-6, atol=1e-7)
  vf0, clipped0 = critic.clipped_value_loss(v, old, ret, 0.0)   # clipping off
  np.testing.assert_allclose(vf0, 0.5 * (np.asarray(v) - np.asarray(ret)) ** 2, rtol=1e-6)
  assert not np.asarray(clipped0).any()


def test_value_clip_indicator_ignores_rounding_inside_the_range():
  # Values near 0 of either sign: old + (v - old) is often v off by one ulp, and the clipped
  # term then exceeds the unclipped one by rounding alone. No value here moves by more than the
  # clip (|v - old| <= 0.15 < 0.2), so vf_clipfrac must be 0 (it was ~0.3% of tokens, and in a
  # tiny PPO run 0.04 on one device against 0.10 on a 1x4x2 mesh).
  rng = np.random.default_rng(0)
  old = (rng.normal(size=20000) * 0.02).astype(np.float32)
  v = (old + np.clip(rng.normal(size=20000) * 0.05, -0.15, 0.15)).astype(np.float32)
  ret = np.full(20000, 0.6, np.float32)
  vf, clipped = critic.clipped_value_loss(jnp.asarray(v), jnp.asarray(old), jnp.asarray(ret), 0.2)
  assert float(np.asarray(clipped).sum()) == 0
  np.testing.assert_allclose(vf, 0.5 * (v - ret) ** 2, rtol=1e-5)


def test_explained_variance_against_numpy():
  rng = np.random.RandomState(0)
  ret = rng.randn(4, 7).astype(np.float32)
  val = (ret + 0.5 * rng.randn(4, 7)).astype(np.float32)
  m = (rng.rand(4, 7) > 0.3).astype(np.float32)
  r, d = ret[m > 0].astype(np.float64), (ret - val)[m > 0].astype(np.float64)
  want = 1 - np.var(d, ddof=1) / np.var(r, ddof=1)   # verl: unbiased variances
  got = critic.explained_variance(jnp.asarray(val), jnp.asarray(ret), jnp.asarray(m))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert 0.3 < want < 0.95                                     # not a degenerate case
  ev = lambda v: float(critic.explained_variance(jnp.asarray(v), jnp.asarray(ret),
                                                 jnp.asarray(m)))
  assert abs(ev(ret) - 1.0) < 1e-6                             # perfect critic
  assert abs(ev(np.full_like(ret, r.mean()))) < 1e-5           # the mean explains nothing
  assert float(critic.explained_variance(jnp.ones((2, 3)), jnp.ones((2, 3)) * 2,
                                         jnp.ones((2, 3)))) == 0.0   # Var[R] = 0


def test_masked_whiten_against_numpy():
  rng = np.random.RandomState(1)
  x = rng.randn(3, 5).astype(np.float32) * 3 + 2
  m = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.float32)
  sel = x[m > 0].astype(np.float64)
  want = np.where(m > 0, (x - sel.mean()) / np.sqrt(sel.var() + 1e-8), 0.0)
  np.testing.assert_allclose(critic.masked_whiten(jnp.asarray(x), jnp.asarray(m)), want,
                             rtol=1e-5, atol=1e-6)


def test_token_rewards_on_the_last_completion_token():
  m = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)
  r = ppo.token_rewards(jnp.array([2.0, -1.0, 5.0, 0.5]), m)
  np.testing.assert_array_equal(r, [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.5]])


# ----------------------------------------------------------------------------
# On a tiny model.

CFG = tiny_model_config()
B, P, T = TINY_B, TINY_P, TINY_T


@pytest.fixture(scope='module')
def tiny():
  """tiny_batch with the first two groups' prompts left-padded by one token, and a value head."""
  *batch, rng = tiny_batch(np.array([[0, 1, 1]] * 4 + [[1, 1, 1]] * 4))
  head = {'kernel': jnp.asarray(rng.randn(CFG.hidden_size) * 0.5, jnp.float32),
          'bias': jnp.float32(0.1)}
  return (*batch, head)


@pytest.mark.parametrize('tied', [False, True])
def test_hidden_and_logits_equals_the_model_forward(tied):
  cfg = ModelConfig(**{**CFG.__dict__, 'tie_word_embeddings': tied})
  graphdef, state = create(cfg, seed=1)
  params = nnx.to_pure_dict(state)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 16, (3, 6)), jnp.int32)
  mask = jnp.asarray([[0, 0, 1, 1, 1, 1], [1] * 6, [1, 1, 1, 1, 0, 0]], jnp.int32)
  h, logits = jax.jit(critic.hidden_and_logits, static_argnums=0)(graphdef, params, tokens, mask)
  want = jax.jit(lm.forward, static_argnums=0)(graphdef, params, tokens, mask)
  np.testing.assert_array_equal(logits, want)
  assert h.shape == (3, 6, cfg.hidden_size)


def ref_gae_row(r, v, gamma, lam):
  """Plain-Python GAE on one completion (all tokens real)."""
  adv, last = [0.0] * len(r), 0.0
  for t in reversed(range(len(r))):
    nv = v[t + 1] if t + 1 < len(r) else 0.0
    last = r[t] + gamma * nv - v[t] + gamma * lam * last
    adv[t] = last
  return adv


@pytest.mark.parametrize('shared_prompt', [True, False])
@pytest.mark.parametrize('mode', ['shared', 'separate'])
def test_prepare_batch_gae_against_a_python_loop(tiny, mode, shared_prompt):
  graphdef, params, ref_params, rollout, rewards, valid, head = tiny
  critic_params = {'head': head}
  backbone = params
  if mode == 'separate':   # a critic backbone different from the policy's
    backbone = jax.tree.map(lambda x: x * 0.9, params)
    critic_params['backbone'] = backbone
  algo = ppo.PPOConfig(critic=mode, gamma=0.9, lam=0.8, kl_coef=0.3, kl_in_reward=True,
                       group_size=2, microbatches=2, shared_prompt=shared_prompt)
  prep = jax.jit(functools.partial(ppo.prepare_batch, graphdef=graphdef, algo=algo))
  batch, metrics = prep(params, ref_params, rollout, rewards, valid, critic_params=critic_params,
                        kl_coef=jnp.float32(0.25))
  # Independent pieces: log-probs from the model's forward, values from the critic backbone.
  seq_logp = jax.jit(grpo.sequence_logprobs, static_argnums=0)
  old_logp, _ = seq_logp(graphdef, params, batch['tokens'], batch['mask'])
  ref_logp, _ = seq_logp(graphdef, ref_params, batch['tokens'], batch['mask'])
  h, _ = jax.jit(critic.hidden_and_logits, static_argnums=0)(graphdef, backbone, batch['tokens'],
                                                             batch['mask'])
  values = np.asarray(h, np.float64)[:, :-1] @ np.asarray(head['kernel'], np.float64) + 0.1
  # The completion positions (the only ones a loss or metric reads); the shared-prompt passes
  # leave the prompt positions at 0.
  np.testing.assert_allclose(batch['old_logp'][:, P - 1:], old_logp[:, P - 1:], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(batch['old_values'][:, P - 1:], values[:, P - 1:], rtol=1e-4,
                             atol=1e-5)
  if shared_prompt:
    assert not np.asarray(batch['old_values'][:, :P - 1]).any()
    assert metrics['invariant/group_prompt_mismatch'] == 0
  lengths = np.asarray(rollout.mask_bt).sum(-1)
  raw = np.zeros((B, P - 1 + T))
  ret = np.zeros((B, P - 1 + T))
  for i in range(B):
    n = lengths[i] if bool(valid[i]) else 0
    if not n:
      continue
    pos = np.arange(P - 1, P - 1 + n)
    d = np.asarray(ref_logp, np.float64)[i, pos] - np.asarray(old_logp, np.float64)[i, pos]
    r = -0.25 * (np.exp(d) - d - 1)      # k3 KL in the reward, beta = the kl_coef passed
    r[-1] += float(rewards[i])
    raw[i, pos] = ref_gae_row(list(r), list(values[i, pos]), 0.9, 0.8)
    ret[i, pos] = raw[i, pos] + values[i, pos]
  lm_ = np.asarray(batch['loss_mask'])
  assert lm_[:, :P - 1].sum() == 0 and lm_[7].sum() == 0 and lm_[6].sum() == 0
  np.testing.assert_allclose(batch['returns'], ret, rtol=1e-4, atol=1e-5)
  sel = raw[lm_ > 0]
  white = np.where(lm_ > 0, (raw - sel.mean()) / np.sqrt(sel.var() + 1e-8), 0.0)
  np.testing.assert_allclose(batch['adv'], white, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(metrics['critic/advantages/raw_mean'], sel.mean(), rtol=1e-4)
  ev = 1 - np.var((ret - values)[lm_ > 0]) / np.var(ret[lm_ > 0])
  np.testing.assert_allclose(metrics['critic/vf_explained_var'], ev, rtol=1e-4, atol=1e-5)
  assert float(metrics['kl_reward/seq_kl']) > 1e-4                 # the KL term is not vacuous
  assert metrics['invariant/prompt_loss_tokens'] == 0


@pytest.mark.parametrize('chunks', [1, 2, 8])
@pytest.mark.parametrize('mode', ['shared', 'separate'])
def test_shared_prompt_scoring_equals_whole_rows(tiny, mode, chunks):
  """algo.shared_prompt (each group's prompt through the policy, critic and reference once)
  gives the batch and metrics of scoring every row whole, on the completion positions; in 8
  chunks, which do not divide the 4 groups, it scores row by row."""
  graphdef, params, ref_params, rollout, rewards, valid, _ = tiny
  cp = _critic_params(tiny, mode)
  out = {}
  for shared in (True, False):
    algo = ppo.PPOConfig(critic=mode, kl_coef=0.3, kl_in_reward=True, group_size=2,
                         score_chunks=chunks, shared_prompt=shared)
    prep = jax.jit(functools.partial(ppo.prepare_batch, graphdef=graphdef, algo=algo))
    out[shared] = prep(params, ref_params, rollout, rewards, valid, critic_params=cp,
                       temperature=jnp.float32(0.7))
  (got, got_m), (want, want_m) = out[True], out[False]
  for k in ('old_logp', 'ref_logp', 'old_values', 'adv', 'returns', 'loss_mask'):
    np.testing.assert_allclose(got[k][:, P - 1:], want[k][:, P - 1:], rtol=2e-5, atol=2e-6,
                               err_msg=k)
  assert np.abs(np.asarray(want['old_values'][:, P - 1:])).max() > 0.05   # not vacuous
  assert np.abs(np.asarray(want['adv'])).max() > 0.1
  for k in want_m:
    np.testing.assert_allclose(got_m[k], want_m[k], rtol=2e-5, atol=2e-6, err_msg=k)


def _prepared(tiny, algo, critic_params):
  graphdef, params, ref_params, rollout, rewards, valid, _ = tiny
  prep = jax.jit(functools.partial(ppo.prepare_batch, graphdef=graphdef, algo=algo))
  return prep(params, ref_params, rollout, rewards, valid, critic_params=critic_params)[0]


def _critic_params(tiny, mode):
  _, params, *_, head = tiny
  out = {'head': head}
  if mode == 'separate':
    out['backbone'] = jax.tree.map(lambda x: x * 0.9, params)
  return out


@pytest.mark.parametrize('mode,agg', [('shared', 'token_mean'),
                                      ('separate', 'seq_mean_token_mean')])
def test_objective_and_gradients_are_microbatch_invariant(tiny, mode, agg):
  graphdef, params, *_ = tiny
  cp = _critic_params(tiny, mode)
  algo = ppo.PPOConfig(critic=mode, loss_agg=agg, kl_coef=0.1, vf_coef=0.7, vf_clip=0.0,
                       group_size=2)
  batch = _prepared(tiny, algo, cp)
  # Move the params a little so ratios differ from 1 and values from V_old.
  moved = jax.tree.map(lambda x: x * 1.03, (params, cp))

  @functools.partial(jax.jit, static_argnums=1)
  def grads(p, n):
    agg_fn = grpo.registry.get_loss_agg(agg)
    n_pg = agg_fn(jnp.zeros_like(batch['loss_mask']), batch['loss_mask'])[1]
    fn = functools.partial(ppo.loss_fn, graphdef=graphdef, algo=algo, kl_coef=jnp.float32(0.1),
                           n_pg=n_pg, n_tok=batch['loss_mask'].sum())
    return ppo.sum_grads(fn, p, batch, n)

  (g1, m1), (g4, m4) = grads(moved, 1), grads(moved, 4)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
  for k in ('loss', 'critic/vf_loss', 'critic/vpred_mean', 'pg_loss'):
    np.testing.assert_allclose(m1[k], m4[k], rtol=1e-5, atol=1e-7, err_msg=k)
  # The summed objective against its pieces computed independently: the GRPO family's policy
  # loss (grpo.loss_fn) plus vf_coef * a NumPy value loss.
  pol, crit = moved
  policy_loss = jax.jit(functools.partial(grpo.loss_fn, graphdef=graphdef, algo=algo,
                                          kl_coef=jnp.float32(0.1)))
  pg_sum, (count, _) = policy_loss(pol, batch)
  h, _ = jax.jit(critic.hidden_and_logits, static_argnums=0)(
      graphdef, pol if mode == 'shared' else crit['backbone'], batch['tokens'], batch['mask'])
  v = np.asarray(h, np.float64)[:, :-1] @ np.asarray(crit['head']['kernel'], np.float64)
  v += float(crit['head']['bias'])
  lm_ = np.asarray(batch['loss_mask'], np.float64)
  vf = (0.5 * (v - np.asarray(batch['returns'])) ** 2 * lm_).sum() / lm_.sum()
  np.testing.assert_allclose(m1['critic/vf_loss'], vf, rtol=1e-4)
  np.testing.assert_allclose(m1['loss'], float(pg_sum) / float(count) + 0.7 * vf, rtol=1e-4)
  # 'separate': the value loss never reaches the policy, the policy loss never the critic
  if mode == 'separate':
    g_no_vf = jax.jit(jax.grad(lambda p: policy_loss(p, batch)[0] / count))(pol)
    for a, b in zip(jax.tree.leaves(g1[0]), jax.tree.leaves(g_no_vf)):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


def _lr_optim(lr):
  optim = grpo_arith.get_config().optim
  optim.lr, optim.warmup_steps = lr, 0
  return optim


def _state(tiny, mode, algo, critic_lr=1e-2):
  """(TrainState with a critic, the step functions' keyword arguments, critic params)."""
  _, params, *_ = tiny
  optim = grpo_arith.get_config().optim
  kwargs = dict(graphdef=tiny[0], algo=algo, tx=ts.make_optimizer(optim),
                schedule=ts.lr_schedule(optim), critic_tx=ts.make_optimizer(_lr_optim(critic_lr)),
                critic_schedule=ts.lr_schedule(_lr_optim(critic_lr)))
  cp = _critic_params(tiny, mode)
  state = ts.TrainState(step=jnp.int32(0), params=params, opt_state=kwargs['tx'].init(params),
                        critic={'params': cp, 'opt_state': kwargs['critic_tx'].init(cp)})
  return state, kwargs, cp


@pytest.mark.parametrize('mode', ['shared', 'separate'])
def test_train_step_reduces_the_value_loss_on_a_fixed_batch(tiny, mode):
  algo = ppo.PPOConfig(critic=mode, kl_coef=0.0, vf_coef=1.0, vf_clip=0.0, group_size=2)
  state, kwargs, cp = _state(tiny, mode, algo)
  step = jax.jit(functools.partial(ppo.train_step, **kwargs))
  batch = _prepared(tiny, algo, cp)
  losses = []
  for _ in range(25):
    state, m = step(state, batch)
    losses.append(float(m['critic/vf_loss']))
  assert losses[-1] < 0.2 * losses[0], losses
  assert int(state.step) == 25 and float(m['critic/grad_norm']) > 0


@pytest.mark.parametrize('mode', ['shared', 'separate'])
def test_scoring_follows_the_temperature_control(tiny, mode):
  """prepare_batch scores at the temperature it is given (the policy's log-probs equal
  grpo.sequence_logprobs at that temperature) and the update at controls['temperature']: with
  both at 0.5 the first update's ratio is 1 (ppo_kl 0); scoring at 1 instead is off-policy."""
  graphdef, params, ref_params, rollout, rewards, valid, _ = tiny
  algo = ppo.PPOConfig(critic=mode, kl_coef=0.05, group_size=2)
  state, kwargs, cp = _state(tiny, mode, algo)
  prep = jax.jit(functools.partial(ppo.prepare_batch, graphdef=graphdef, algo=algo))
  cold, _ = prep(params, ref_params, rollout, rewards, valid, critic_params=cp,
                 temperature=jnp.float32(0.5))
  want, _ = grpo.sequence_logprobs(graphdef, params, cold['tokens'], cold['mask'],
                                   temperature=jnp.float32(0.5))
  np.testing.assert_allclose(cold['old_logp'][:, P - 1:], want[:, P - 1:], rtol=1e-5, atol=1e-5)
  plain = _prepared(tiny, algo, cp)['old_logp']
  assert float(jnp.abs(cold['old_logp'] - plain).max()) > 0.1
  step = jax.jit(functools.partial(ppo.train_step, **kwargs))
  controls = lambda t: {'lr_scale': jnp.float32(1), 'kl_coef': jnp.float32(0.05),
                        'temperature': jnp.float32(t)}
  _, m = step(state.replace(controls=controls(0.5)), cold)
  assert abs(float(m['ppo_kl'])) < 1e-6
  _, m = step(state.replace(controls=controls(1.0)), cold)
  assert abs(float(m['ppo_kl'])) > 1e-3


def test_minibatch_epoch_equals_sequential_updates_on_the_shuffled_slices(tiny):
  algo = ppo.PPOConfig(critic='shared', kl_coef=0.05, vf_clip=0.2, minibatches=2, group_size=2)
  state, kwargs, cp = _state(tiny, 'shared', algo)
  batch = _prepared(tiny, algo, cp)
  new, metrics = jax.jit(functools.partial(ppo.train_step, **kwargs))(state, batch)
  assert int(new.step) == 2
  # By hand: the documented permutation, then one update on each half, in order.
  perm = jax.random.permutation(jax.random.fold_in(jax.random.key(0), 0), B)
  assert not (np.asarray(perm) == np.arange(B)).all()
  update = jax.jit(functools.partial(ppo.update, **kwargs))
  s, ms = state, []
  for half in (perm[:B // 2], perm[B // 2:]):
    s, m = update(s, jax.tree.map(lambda x: x[half], batch))
    ms.append(m)
  for k in ('loss', 'critic/vf_loss', 'pg_loss', 'grad_norm', 'critic/grad_norm'):
    np.testing.assert_allclose(metrics[k], (ms[0][k] + ms[1][k]) / 2, rtol=1e-4, atol=1e-7,
                               err_msg=k)
  for a, b in zip(jax.tree.leaves((new.params, new.critic)),
                  jax.tree.leaves((s.params, s.critic))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
