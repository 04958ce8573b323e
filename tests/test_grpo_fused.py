"""The fused on-policy GRPO step equals prepare_batch + train_step (to float rounding)."""
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from rft_jax.algorithms import grpo, grpo_fused, train_state as ts
from rft_jax.models import functional as lm
from rft_jax.models.llama import ModelConfig
from rft_jax.sampling.sampler import Rollout, SamplingConfig, make_sampler

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  max_position_embeddings=64)
G = 4


def jitted_train_step(state, batch, graphdef, algo, tx, schedule):
  return jax.jit(functools.partial(grpo.train_step, graphdef=graphdef, algo=algo, tx=tx,
                                   schedule=schedule))(state, batch)


@pytest.mark.parametrize('algo_kw', [
    dict(kl_coef=0.04),
    dict(kl_coef=0.0),
    dict(kl_coef=0.04, kl_in_reward=True, tis_cap=2.0, entropy_coef=0.01,
         loss_agg='seq_mean_token_sum_norm', max_len=6),
])
def test_fused_step_matches_prepare_then_train_step(algo_kw):
  graphdef, state = lm.create(CFG)
  params = nnx.to_pure_dict(state)
  rng = np.random.default_rng(0)
  p = 7
  lens = rng.integers(3, p + 1, 4)
  mask = (np.arange(p)[None] >= p - lens[:, None]).astype(np.int32)
  tokens = np.where(mask, rng.integers(4, 64, (4, p)), 0).astype(np.int32)
  rollout = make_sampler(graphdef, CFG, SamplingConfig(max_new_tokens=6, eos_id=2, pad_id=0,
                                                       temperature=0.9), group_size=G)(
      params, tokens, mask, jax.random.key(0))
  rewards = jnp.asarray(rng.integers(0, 2, 4 * G), jnp.float32)
  valid = jnp.ones(4 * G, bool).at[3].set(False)
  optim = ml_collections.ConfigDict(dict(lr=1e-3, warmup_steps=0, b1=0.9, b2=0.99,
                                         weight_decay=0.0, grad_clip=1.0))
  tx, schedule = ts.make_optimizer(optim), ts.lr_schedule(optim)
  algo = grpo.GRPOConfig(group_size=G, **algo_kw)
  assert grpo_fused.fusable(algo)
  state = ts.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
  ref = jax.tree.map(lambda x: x * 1.01, params)

  # Jitted (not op by op, which compiled every primitive alone: ~2x the test's time).
  batch, metrics = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=algo))(
      params, ref, rollout, rewards, valid)
  s1, m1 = jitted_train_step(state, batch, graphdef, algo, tx, schedule)
  m1 = {**metrics, **m1}
  fused = jax.jit(functools.partial(grpo_fused.fused_step, graphdef=graphdef, algo=algo, tx=tx,
                                    schedule=schedule))
  s2, m2, adv = fused(state, ref if algo.use_reference else None, rollout, rewards, valid)

  assert set(m1) == set(m2)
  for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  np.testing.assert_allclose(adv, batch['adv'], rtol=1e-6, atol=1e-6)
  assert float(m2['ppo_kl']) == 0.0   # old log-probs are the update's own forward pass
  assert float(m2['invariant/group_prompt_mismatch']) == 0.0   # the sampler's group layout
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    # Adam steps of lr 1e-3 on ~1e-6 differences: the fused pass scores each group's prompt
    # once (shared_prompt), train_step runs the full pass, equal up to float rounding
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_scoring_at_the_sampling_temperature():
  """controls['temperature'] = the sampler's: the trainer's log-probs are log softmax(z / T)
  (plain numpy reference), the sampler/trainer mismatch is float rounding, and the fused step
  still equals prepare + train_step; scored untempered the same rollout shows the mismatch."""
  graphdef, state = lm.create(CFG)
  params = nnx.to_pure_dict(state)
  rng = np.random.default_rng(1)
  tokens = rng.integers(4, 64, (4, 5)).astype(np.int32)
  mask = np.ones_like(tokens)
  temp = 0.7
  rollout = make_sampler(graphdef, CFG, SamplingConfig(max_new_tokens=6, eos_id=2, pad_id=0,
                                                       temperature=temp), group_size=G)(
      params, tokens, mask, jax.random.key(3))
  tokens_bs, mask_bs, _, _ = grpo.rollout_sequences(rollout)
  got, _ = jax.jit(functools.partial(grpo.sequence_logprobs, graphdef))(
      params, tokens_bs, mask_bs, temperature=jnp.float32(temp))
  z = np.asarray(jax.jit(functools.partial(lm.forward, graphdef))(params, tokens_bs, mask_bs),
                 np.float64)[:, :-1] / temp
  logp = z - z.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  want = np.take_along_axis(logp, np.asarray(tokens_bs)[:, 1:, None], axis=-1)[..., 0]
  np.testing.assert_allclose(got, want, atol=2e-5)

  rewards = jnp.asarray(rng.integers(0, 2, 4 * G), jnp.float32)
  valid = jnp.ones(4 * G, bool)
  algo = grpo.GRPOConfig(group_size=G, kl_coef=0.04)
  ref = jax.tree.map(lambda x: x * 1.01, params)
  prep = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=algo))
  _, untempered = prep(params, ref, rollout, rewards, valid)
  batch, metrics = prep(params, ref, rollout, rewards, valid, temperature=jnp.float32(temp))
  assert float(untempered['mismatch/logp_abs_diff']) > 1e-2   # near-uniform random model
  assert float(metrics['mismatch/logp_abs_diff']) < 1e-5

  optim = ml_collections.ConfigDict(dict(lr=1e-3, warmup_steps=0, b1=0.9, b2=0.99,
                                         weight_decay=0.0, grad_clip=1.0))
  tx, schedule = ts.make_optimizer(optim), ts.lr_schedule(optim)
  controls = {'lr_scale': jnp.float32(1), 'kl_coef': jnp.float32(0.04),
              'temperature': jnp.float32(temp)}
  state = ts.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params),
                        controls=controls)
  _, m1 = jitted_train_step(state, batch, graphdef, algo, tx, schedule)
  _, m2, _ = jax.jit(functools.partial(grpo_fused.fused_step, graphdef=graphdef, algo=algo,
                                       tx=tx, schedule=schedule))(state, ref, rollout, rewards,
                                                                  valid)
  assert float(m2['mismatch/logp_abs_diff']) < 1e-5
  for k in ('loss', 'kl', 'entropy', 'grad_norm'):
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_fusable_only_for_one_update_over_one_microbatch():
  assert grpo_fused.fusable(grpo.GRPOConfig(updates_per_batch=1))
  assert not grpo_fused.fusable(grpo.GRPOConfig(updates_per_batch=2))
  assert not grpo_fused.fusable(grpo.GRPOConfig(microbatches=2))


def test_group_prompt_mismatch_counts_rows_off_their_groups_prompt():
  """The invariant shared_prompt relies on: 0 for the sampler's layout, 1 per differing row."""
  tokens = np.repeat(np.arange(12, dtype=np.int32).reshape(3, 4), 2, axis=0)   # 3 groups of 2
  mask = np.ones_like(tokens)
  rollout = lambda t, m: Rollout(
      prompt_tokens_bp=jnp.asarray(t), prompt_mask_bp=jnp.asarray(m),
      tokens_bt=jnp.zeros((6, 2), jnp.int32), logp_bt=jnp.zeros((6, 2)),
      mask_bt=jnp.ones((6, 2), jnp.int32), truncated_b=jnp.zeros(6, bool))
  assert int(grpo.group_prompt_mismatch(rollout(tokens, mask), 2)) == 0
  bad_tokens, bad_mask = tokens.copy(), mask.copy()
  bad_tokens[3, 0] += 1      # row 3 (group 1's second row): another token
  bad_mask[4, 0] = 0         # row 4 (group 2's first row): the second row now differs
  assert int(grpo.group_prompt_mismatch(rollout(bad_tokens, bad_mask), 2)) == 2
