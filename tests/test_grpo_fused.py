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
from rft_jax.sampling.sampler import SamplingConfig, make_sampler

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  max_position_embeddings=64)
G = 4


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

  batch, metrics = grpo.prepare_batch(params, ref, rollout, rewards, valid, graphdef=graphdef,
                                      algo=algo)
  s1, m1 = grpo.train_step(state, batch, graphdef=graphdef, algo=algo, tx=tx, schedule=schedule)
  m1 = {**metrics, **m1}
  fused = jax.jit(functools.partial(grpo_fused.fused_step, graphdef=graphdef, algo=algo, tx=tx,
                                    schedule=schedule))
  s2, m2, adv = fused(state, ref if algo.use_reference else None, rollout, rewards, valid)

  assert set(m1) == set(m2)
  for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  np.testing.assert_allclose(adv, batch['adv'], rtol=1e-6, atol=1e-6)
  assert float(m2['ppo_kl']) == 0.0   # old log-probs are the update's own forward pass
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(a, b, atol=5e-6)   # Adam steps of lr 1e-3 on ~1e-7 differences


def test_fusable_only_for_one_update_over_one_microbatch():
  assert grpo_fused.fusable(grpo.GRPOConfig(updates_per_batch=1))
  assert not grpo_fused.fusable(grpo.GRPOConfig(updates_per_batch=2))
  assert not grpo_fused.fusable(grpo.GRPOConfig(microbatches=2))
