"""Per-layer rematerialisation (config.model.remat): same loss and gradients, fewer saved
activations; a bad policy name is a one-line config error."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_arith
from rft_jax import config as config_lib
from rft_jax.models import ModelConfig, create, forward

CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def loss_and_grads(cfg, params, tokens_bt, mask_bt):
  graphdef, _ = create(cfg)

  def loss(p):
    logits = forward(graphdef, p, tokens_bt, mask_bt)
    logp = jax.nn.log_softmax(logits[:, :-1])
    picked = jnp.take_along_axis(logp, tokens_bt[:, 1:, None], -1)[..., 0]
    return -(picked * mask_bt[:, 1:]).sum() / mask_bt[:, 1:].sum()
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize('policy', ['full', 'dots', 'dots_no_batch'])
def test_remat_keeps_loss_and_gradients(policy):
  _, params = create(CFG, seed=3)
  tokens = jax.random.randint(jax.random.key(0), (2, 10), 0, CFG.vocab_size)
  mask = jnp.ones((2, 10), jnp.int32).at[0, :3].set(0)
  loss0, grads0 = loss_and_grads(CFG, params, tokens, mask)
  loss1, grads1 = loss_and_grads(dataclasses.replace(CFG, remat=policy), params, tokens, mask)
  np.testing.assert_allclose(loss1, loss0, rtol=1e-6)
  for g0, g1 in zip(jax.tree.leaves(grads0), jax.tree.leaves(grads1)):
    np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-7)


def test_full_remat_saves_fewer_residuals():
  """What jax keeps for the backward pass shrinks under 'full' (each layer's input only)."""
  _, params = create(CFG, seed=3)
  tokens = jnp.zeros((2, 10), jnp.int32)
  mask = jnp.ones((2, 10), jnp.int32)

  def saved_bytes(cfg):
    graphdef, _ = create(cfg)
    f = lambda p: forward(graphdef, p, tokens, mask).sum()
    _, vjp_fn = jax.vjp(f, params)   # a Partial: its leaves are what the backward pass reads
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp_fn))
  assert saved_bytes(dataclasses.replace(CFG, remat='full')) < saved_bytes(CFG)


def test_unknown_remat_policy_is_a_config_error():
  config = grpo_arith.get_config()
  config.model.remat = 'everything'
  with pytest.raises(config_lib.ConfigError, match=r"^config.model.remat='everything': must be "
                                                   r"one of 'none', 'full'"):
    config_lib.validate(config)
