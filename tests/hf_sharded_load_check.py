"""Loads a HF directory on one device and on a (data=1, fsdp=4, tensor=2) mesh; prints JSON.

Run as a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (see
test_hf_checkpoint.py): the device count is fixed when JAX starts. Usage: MODEL_DIR.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from rft_jax.models import functional as lm
from rft_jax.models import hf_checkpoint
from rft_jax.parallel import mesh as meshlib


def main(model_dir: str):
  cfg = hf_checkpoint.load_hf_config(model_dir)
  graphdef, abstract = lm.abstract_params(cfg)
  rng = np.random.RandomState(0)
  tokens = jnp.asarray(rng.randint(0, cfg.vocab_size, (8, 12)))
  mask = jnp.ones((8, 12), jnp.int32).at[::3, :5].set(0)
  out = {}
  for name, shape in (('single', dict(data=1, fsdp=1, tensor=1)),
                      ('fsdp4_tp2', dict(data=1, fsdp=4, tensor=2))):
    mesh = meshlib.make_mesh(shape)
    params = hf_checkpoint.load_hf_params(model_dir, cfg, meshlib.param_shardings(abstract, mesh))
    q_kernel = params['layers'][0]['self_attn']['q_proj']['kernel']
    logits = jax.jit(lm.forward, static_argnums=0)(graphdef, params, tokens, mask)
    out[name] = {
        'devices': int(mesh.size),
        'q_kernel_blocks': len({str(s.index) for s in q_kernel.addressable_shards}),
        'q_kernel_block_shape': list(q_kernel.addressable_shards[0].data.shape),
        'params': [np.asarray(x).ravel() for x in jax.tree.leaves(params)],
        'logits': np.asarray(logits),
    }
  single, sharded = out['single'], out['fsdp4_tp2']
  json.dump({
      'devices': sharded['devices'],
      'q_kernel_blocks': sharded['q_kernel_blocks'],
      'q_kernel_block_shape': sharded['q_kernel_block_shape'],
      'max_param_diff': max(float(np.abs(a - b).max())
                            for a, b in zip(single['params'], sharded['params'])),
      'max_logit_diff': float(np.abs(single['logits'] - sharded['logits'])[
          np.asarray(mask, bool)].max()),
  }, sys.stdout)


if __name__ == '__main__':
  main(sys.argv[1])
