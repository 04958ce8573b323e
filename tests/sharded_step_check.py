"""A GRPO step, greedy sampling and cross-mesh checkpoint restore on five meshes of 8 CPU devices.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python tests/sharded_step_check.py OUT_DIR

Run as a subprocess (see test_parallel.py): the device count is fixed when JAX starts. For every
(data, fsdp, tensor) mesh in MESHES, under `jax.set_mesh(mesh)` (so the model's activation
constraints are live; '2x2x2_plain' without it, as trainer.py traces today) it runs the
project's greedy sampler on batch-sharded prompts, then one jitted GRPO step (grpo.train_step's
body, donating its state, also returning the gradients) with params / optimizer state / batch
placed by the project's shardings. The batch is the one-device mesh's greedy rollout, prepared
once (grpo.prepare_batch, kl_coef > 0, 2 micro-batches). The mesh (8,1,1)'s post-step
TrainState (params, AdamW mu/nu, step) is saved with rft_jax.checkpoint.Checkpointer and
restored onto each later mesh with that mesh's target shardings.

Writes OUT_DIR/results.npz: '<mesh>/grad/<i>' (gradient leaves, tree order), '<mesh>/tokens'
[B,T] and '<mesh>/logp' [B,T]; prints JSON {mesh: {devices, q_kernel_shards, metrics, restore}}.
"""
import contextlib
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rft_jax.algorithms import grpo
from rft_jax.algorithms import train_state as ts
from rft_jax.checkpoint import Checkpointer
from rft_jax.models import functional as lm
from rft_jax.models.llama import ModelConfig
from rft_jax.parallel import mesh as meshlib
from rft_jax.sampling.sampler import SamplingConfig, make_sampler

MESHES = {'1x1x1': (1, 1, 1), '8x1x1': (8, 1, 1), '1x8x1': (1, 8, 1), '2x2x2': (2, 2, 2),
          '1x4x2': (1, 4, 2), '2x2x2_plain': (2, 2, 2),   # _plain: no jax.set_mesh
          '2x2x2_scan': (2, 2, 2),   # _scan: model.scan_layers with remat 'full'
          '1x4x2_nofsdp': (1, 4, 2)}   # _nofsdp: greedy sampling only, weights_layout 'no_fsdp'
SAVE_ON = '8x1x1'
# Smaller than configs/common.py's tiny model (compile time dominates), with every sharded
# dimension divisible by 8 (fsdp: E=64) or 2 (tensor: H=4, K=2, F=128, V=32).
CFG = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)
B, P_LEN, T_NEW, GROUP = 16, 6, 5, 4


def log(msg):
  print(f'[{time.perf_counter() - T0:6.1f}s] {msg}', file=sys.stderr, flush=True)


def prepare(graphdef, params, rollout):
  """The GRPO batch of a rollout with random rewards and reference log-probs of other params
  (kl_coef > 0, so the loss has a non-zero KL term)."""
  algo = grpo.GRPOConfig(group_size=GROUP, kl_coef=0.05, microbatches=2)
  rewards = jax.random.uniform(jax.random.key(3), (B,))
  ref_params = nnx.to_pure_dict(lm.create(CFG, 1)[1])
  prep = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=algo))
  batch, _ = prep(params, ref_params, rollout, rewards, jnp.ones(B, bool))
  return algo, batch


def state_shardings(mesh, tx, like_params, abstract):
  p_sh = meshlib.param_shardings(abstract, mesh)
  return ts.TrainState(step=meshlib.replicated(mesh), params=p_sh,
                       opt_state=meshlib.opt_state_shardings(tx, like_params, p_sh, mesh))


def same_sharding(x, target) -> bool:
  return x.sharding.is_equivalent_to(target, x.ndim)


def main(out_dir):
  graphdef, state = lm.create(CFG, 0)
  params = nnx.to_pure_dict(state)
  # Groups of GROUP rows share their prompt, as the group sampler lays them out.
  prompts = jnp.repeat(jax.random.randint(jax.random.key(1), (B // GROUP, P_LEN), 4,
                                          CFG.vocab_size), GROUP, axis=0)
  pmask = jnp.repeat(jnp.ones((B // GROUP, P_LEN), jnp.int32).at[::3, :2].set(0), GROUP, axis=0)
  _, abstract = lm.abstract_params(CFG)
  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  optim = type('O', (), dict(lr=1e-3, warmup_steps=0, b1=0.9, b2=0.99, weight_decay=0.0,
                             grad_clip=1.0))
  tx, schedule = ts.make_optimizer(optim), ts.lr_schedule(optim)
  greedy = make_sampler(graphdef, CFG, SamplingConfig(max_new_tokens=T_NEW, eos_id=3, pad_id=0,
                                                      temperature=0.0))
  algo = batch = None

  scan_graphdef = lm.create(dataclasses.replace(CFG, scan_layers=True, remat='full'), 0)[0]

  def step_and_grads(state, bt, graphdef):
    """grpo.train_step's body (accumulate, token means, AdamW), also returning the gradients."""
    grads, metrics = ts.accumulate_grads(
        lambda q, mb: grpo.loss_fn(q, mb, graphdef=graphdef, algo=algo), state.params, bt,
        algo.microbatches)
    new_state, opt_stats = ts.apply_gradients(state, grads, tx, schedule)
    return new_state, {**grpo.token_means(metrics), **opt_stats}, grads

  def shared_scores(params, tokens_bs, mask_bs, loss_mask_bl):
    """Log-probs scored with each group's prompt once (grpo.score_logprobs, group_size = GROUP,
    4 groups: fewer than data * fsdp on 8x1x1 and 1x8x1) and the gradient of their masked sum."""
    f = lambda q: grpo.score_logprobs(graphdef, q, tokens_bs, mask_bs, first=P_LEN - 1,
                                      group_size=GROUP)
    return f(params), jax.grad(lambda q: (f(q) * loss_mask_bl).sum())(params)

  ckpt_dir, saved, arrays, out = tempfile.mkdtemp(), None, {}, {}
  log('setup done')
  for name, shape in MESHES.items():
    mesh = meshlib.make_mesh(dict(zip(meshlib.MESH_AXES, shape)))
    meshlib.check_model_fits_mesh(CFG, mesh)
    meshlib.check_batch_fits_mesh(B, mesh)
    with contextlib.nullcontext() if name.endswith('_plain') else jax.set_mesh(mesh):
      st_sh = state_shardings(mesh, tx, like, abstract)
      b_sh, rep = meshlib.batch_sharding(mesh), meshlib.replicated(mesh)
      sample_sh = (meshlib.sampling_shardings(st_sh.params, 'no_fsdp')
                   if name.endswith('_nofsdp') else st_sh.params)
      sample_params = jax.device_put(params, sample_sh)
      rollout = greedy(sample_params, jax.device_put(prompts, b_sh),
                       jax.device_put(pmask, b_sh), jax.random.key(4))
      log(f'{name}: greedy sample')
      if name.endswith('_nofsdp'):   # sampling only: weights whole over fsdp, split over tensor
        q_kernel = sample_params['layers'][0]['self_attn']['q_proj']['kernel']
        out[name] = {'devices': int(mesh.size), 'q_kernel_distinct_shards': len(
            {str(s.index) for s in q_kernel.addressable_shards})}
        arrays[f'{name}/tokens'] = np.asarray(rollout.tokens_bt)
        arrays[f'{name}/logp'] = np.asarray(rollout.logp_bt)
        continue
      if batch is None:   # the first (one-device) mesh's rollout is every mesh's train batch
        algo, batch = prepare(graphdef, params, jax.device_get(rollout))
        log(f'{name}: batch prepared')
      fresh = jax.tree.map(jnp.copy, params)   # the step donates its state: keep `params` alive
      st = jax.device_put(ts.TrainState(step=jnp.int32(0), params=fresh,
                                        opt_state=tx.init(fresh)), st_sh)
      step = jax.jit(functools.partial(step_and_grads, graphdef=scan_graphdef if
                                       name.endswith('_scan') else graphdef),
                     in_shardings=(st_sh, b_sh),
                     out_shardings=(st_sh, rep, st_sh.params), donate_argnums=0)
      new_st, metrics, grads = step(st, jax.device_put(batch, b_sh))
      log(f'{name}: step')
      if not name.endswith('_scan'):   # the shared-prompt pass has no scan (config_rules)
        placed = jax.device_put((params, batch['tokens'], batch['mask'], batch['loss_mask']),
                                (st_sh.params, b_sh, b_sh, b_sh))
        logp, shared_grads = jax.jit(shared_scores, out_shardings=(rep, st_sh.params))(*placed)
        arrays[f'{name}/shared_logp'] = np.asarray(logp)
        for i, g in enumerate(jax.tree.leaves(shared_grads)):
          arrays[f'{name}/shared_grad/{i}'] = np.asarray(g)
        log(f'{name}: shared-prompt scores')
      q_kernel = new_st.params['layers'][0]['self_attn']['q_proj']['kernel']
      out[name] = {'devices': int(mesh.size), 'q_kernel_shards': len(q_kernel.addressable_shards),
                   'token_row_splits': len({s.index[0].start for s in
                                            rollout.tokens_bt.addressable_shards}),
                   'metrics': {k: float(v) for k, v in metrics.items()}}
      for i, g in enumerate(jax.tree.leaves(grads)):
        arrays[f'{name}/grad/{i}'] = np.asarray(g)
      arrays[f'{name}/tokens'] = np.asarray(rollout.tokens_bt)
      arrays[f'{name}/logp'] = np.asarray(rollout.logp_bt)
      if name == SAVE_ON:
        saved = jax.tree.map(np.asarray, new_st)
        ck = Checkpointer(ckpt_dir, keep=1)
        ck.save(1, new_st, {'it': 0}, {'mesh': name})
        ck.close()
        log(f'{name}: saved checkpoint')
      elif saved is not None:
        ck = Checkpointer(ckpt_dir, keep=1)
        restored, _, meta, _ = ck.restore(1, new_st, st_sh)
        ck.close()
        vals, tgts = jax.tree.leaves(restored), jax.tree.leaves(st_sh)
        out[name]['restore'] = {
            'from': meta['mesh'], 'leaves': len(vals),
            'equal': all(np.array_equal(np.asarray(r), s)
                         for r, s in zip(vals, jax.tree.leaves(saved))),
            'shardings_match': all(same_sharding(r, t) for r, t in zip(vals, tgts)),
            'q_kernel_shards': len(restored.params['layers'][0]['self_attn']['q_proj']['kernel']
                                   .addressable_shards)}
        log(f'{name}: restored checkpoint')
  np.savez(os.path.join(out_dir, 'results.npz'), **arrays)
  json.dump(out, sys.stdout)


if __name__ == '__main__':
  T0 = time.perf_counter()
  main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
