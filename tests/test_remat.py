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


@pytest.mark.parametrize('remat', ['none', 'full'])
def test_scan_over_layers_keeps_loss_and_gradients(remat):
  """config.model.scan_layers: one lax.scan over stacked layer weights = the unrolled loop."""
  _, params = create(CFG, seed=5)
  tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, CFG.vocab_size)
  mask = jnp.ones((2, 10), jnp.int32).at[1, :4].set(0)
  loss0, grads0 = loss_and_grads(CFG, params, tokens, mask)
  loss1, grads1 = loss_and_grads(dataclasses.replace(CFG, scan_layers=True, remat=remat),
                                 params, tokens, mask)
  np.testing.assert_allclose(loss1, loss0, rtol=1e-6)
  assert jax.tree.structure(grads1) == jax.tree.structure(grads0)
  for g0, g1 in zip(jax.tree.leaves(grads0), jax.tree.leaves(grads1)):
    np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-7)


def test_scan_over_layers_lowers_one_layer_body():
  """The scanned forward holds one copy of the layer computation: its lowered text does not grow
  with depth the way the unrolled one does."""
  tokens, mask = jnp.zeros((2, 10), jnp.int32), jnp.ones((2, 10), jnp.int32)

  def text_size(cfg):
    graphdef, params = create(cfg)
    return len(jax.jit(lambda p: forward(graphdef, p, tokens, mask)).lower(params).as_text())
  deep = dataclasses.replace(CFG, num_hidden_layers=6)
  grow_unrolled = text_size(deep) - text_size(CFG)
  grow_scanned = (text_size(dataclasses.replace(deep, scan_layers=True))
                  - text_size(dataclasses.replace(CFG, scan_layers=True)))
  assert grow_scanned < grow_unrolled / 5, (grow_scanned, grow_unrolled)


def test_bench_layers_prints_a_row_per_depth_policy_and_loop(capsys):
  from tools import bench_layers   # pylint: disable=g-import-not-at-top
  bench_layers.main(['--layers', '1,2', '--remat', 'none', '--batch', '2', '--seq', '8',
                     '--repeats', '1'])
  rows = [line.split('|')[1:-1] for line in capsys.readouterr().out.splitlines()
          if line.startswith('| ') and line[2].isdigit()]
  assert [(r[0].strip(), r[2].strip()) for r in rows] == [
      ('1', 'unrolled'), ('1', 'scan'), ('2', 'unrolled'), ('2', 'scan')]
  assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows)
