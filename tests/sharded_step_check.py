"""Runs one GRPO train step on two meshes and prints their metrics and grads as JSON.

Run as a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (see
test_parallel.py): the device count is fixed when JAX starts.
"""
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rft_jax.algorithms import grpo
from rft_jax.algorithms import train_state as ts
from rft_jax.models import functional as lm
from rft_jax.models.llama import ModelConfig
from rft_jax.parallel import mesh as meshlib
from rft_jax.sampling.sampler import SamplingConfig, make_sampler


def main():
  cfg = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16)
  graphdef, state = lm.create(cfg, 0)
  params = nnx.to_pure_dict(state)
  _, abstract = lm.abstract_params(cfg)
  b, p = 16, 6
  prompts = jax.random.randint(jax.random.key(1), (b, p), 4, 32)
  pmask = jnp.ones((b, p), jnp.int32).at[::3, :2].set(0)
  rollout = make_sampler(graphdef, cfg, SamplingConfig(max_new_tokens=5, eos_id=3, pad_id=0))(
      params, prompts, pmask, jax.random.key(2))
  rewards = jax.random.uniform(jax.random.key(3), (b,))
  algo = grpo.GRPOConfig(group_size=4, kl_coef=0.05, microbatches=2)
  optim = type('O', (), dict(lr=1e-3, warmup_steps=0, b1=0.9, b2=0.99, weight_decay=0.0,
                             grad_clip=1.0))
  tx, schedule = ts.make_optimizer(optim), ts.lr_schedule(optim)
  batch, _ = grpo.prepare_batch(params, params, rollout, rewards, jnp.ones(b, bool),
                                graphdef=graphdef, algo=algo)
  out = {}
  for name, shape in (('single', dict(data=1, fsdp=1, tensor=1)),
                      ('dp2_fsdp2_tp2', dict(data=2, fsdp=2, tensor=2))):
    mesh = meshlib.make_mesh(shape)
    p_sh = meshlib.param_shardings(abstract, mesh)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    st_sh = ts.TrainState(step=meshlib.replicated(mesh), params=p_sh,
                          opt_state=meshlib.opt_state_shardings(tx, like, p_sh, mesh))
    fresh = jax.tree.map(jnp.copy, params)   # the step donates its state: keep `params` alive
    st = jax.device_put(ts.TrainState(step=jnp.int32(0), params=fresh,
                                      opt_state=tx.init(fresh)), st_sh)
    bt = jax.device_put(batch, meshlib.batch_sharding(mesh))
    grad_fn = jax.jit(lambda prm, bb: ts.accumulate_grads(
        lambda q, mb: grpo.loss_fn(q, mb, graphdef=graphdef, algo=algo), prm, bb,
        algo.microbatches), in_shardings=(p_sh, meshlib.batch_sharding(mesh)))
    grads, _ = grad_fn(st.params, bt)
    step = jax.jit(functools.partial(grpo.train_step, graphdef=graphdef, algo=algo, tx=tx,
                                     schedule=schedule),
                   in_shardings=(st_sh, meshlib.batch_sharding(mesh)),
                   out_shardings=(st_sh, meshlib.replicated(mesh)), donate_argnums=0)
    st, metrics = step(st, bt)
    q_kernel = st.params['layers'][0]['self_attn']['q_proj']['kernel']
    out[name] = {
        'devices': int(mesh.size),
        'q_kernel_shards': len(q_kernel.addressable_shards),
        'metrics': {k: float(v) for k, v in metrics.items()},
        'grads': [np.asarray(g).ravel().tolist() for g in jax.tree.leaves(grads)],
    }
  json.dump(out, sys.stdout)


if __name__ == '__main__':
  main()
