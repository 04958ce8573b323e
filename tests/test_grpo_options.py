"""Tests for the options of grpo.prepare_batch and grpo.loss_fn on a tiny model: the KL charged
in the reward with a batch baseline (REINFORCE++), the entropy bonus, the sequence-mean
aggregation and the exact global token means of the diagnostics over micro-batches."""
import functools

import jax
import numpy as np
import pytest

from advantage_refs import ref_token_returns
from model_fixtures import TINY_B, TINY_P, TINY_T, tiny_batch
from rft_jax.algorithms import grpo, losses
from rft_jax.algorithms import train_state as ts


B, P, T = TINY_B, TINY_P, TINY_T


@pytest.fixture(scope='module')
def tiny():
  return tiny_batch()[:6]


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

