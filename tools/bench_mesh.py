"""Train-step and sampler tokens/s of one recipe per (data, fsdp, tensor) mesh shape.

  python -m tools.bench_mesh [--config configs/grpo_arith.py] [--repeats 3]
      [--meshes 1x1x1,8x1x1,1x8x1,2x2x2,1x4x2]

Without XLA_FLAGS set, this sets --xla_force_host_platform_device_count=8 before JAX starts, so
on a CPU machine the meshes run on 8 fake devices: those share the machine's cores and measure
sharding overhead (collectives, resharding, per-shard dispatch), not speedup. On a real
accelerator host the same command measures real scaling (set JAX_PLATFORMS accordingly).

Per mesh: params placed by the logical rules, prompts and batches split by rows over
data * fsdp, everything traced under `jax.set_mesh(mesh)` so the model's activation constraints
apply. The sampler decodes with EOS off (a fixed workload: rows x max_new_tokens generated
tokens); the train step is grpo.train_step (tokens = rows x sequence length). Timings exclude
compilation (one warm-up call) and are the median of --repeats calls. The last column is
rft_jax.parallel.memory's per-device peak estimate.
"""
import os
import sys

if 'jax' not in sys.modules and 'xla_force_host_platform_device_count' not in os.environ.get(
    'XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                             + ' --xla_force_host_platform_device_count=8').strip()

import contextlib  # noqa: E402
import functools  # noqa: E402
import platform  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rft_jax import components  # noqa: E402
from rft_jax.algorithms import grpo  # noqa: E402
from rft_jax.algorithms import train_state as ts  # noqa: E402
from rft_jax import config as config_lib  # noqa: E402
from rft_jax.data import pipeline  # noqa: E402
from rft_jax.models import functional as lm  # noqa: E402
from rft_jax.parallel import memory  # noqa: E402
from rft_jax.parallel import mesh as meshlib  # noqa: E402
from rft_jax.sampling.sampler import SamplingConfig, make_sampler  # noqa: E402
from tools import cli  # noqa: E402
from tools.bench_recipe import timed  # noqa: E402
from tools.export_base import load_config  # noqa: E402

CAVEAT = ('8 fake devices on 2 cores measure overhead, not speedup'
          if jax.devices()[0].platform == 'cpu' else 'real devices: speedup is meaningful')


def parse_meshes(text: str) -> list[tuple[int, int, int]]:
  """'1x1x1,2x2x2' -> [(1, 1, 1), (2, 2, 2)]; ValueError unless each is three positive ints."""
  meshes = []
  for m in text.split(','):
    parts = m.strip().split('x')
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
      raise ValueError(f'--meshes: {m!r} is not DATAxFSDPxTENSOR (three positive integers, '
                       'e.g. 2x2x2)')
    meshes.append(tuple(int(p) for p in parts))
  return meshes


def main():
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--config', default='configs/grpo_arith.py')
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--meshes', default='1x1x1,8x1x1,1x8x1,2x2x2,1x4x2')
  ap.add_argument('--no-set-mesh', action='store_true',
                  help='trace without jax.set_mesh (activation constraints off); trainer.py '
                       'traces under it')
  args = ap.parse_args()
  try:   # before anything is built
    meshes = parse_meshes(args.meshes)
  except ValueError as e:
    ap.error(str(e))
  if args.repeats < 1:
    ap.error(f'--repeats={args.repeats}: must be >= 1 (timings are the median of the calls)')
  config = load_config(args.config)
  if not config_lib.is_grpo_family(config):   # SFT, DPO, PPO
    ap.error(f'--config={args.config}: bench_mesh times the sampler and the GRPO step, for the '
             'GRPO-family recipes (not SFT, DPO or PPO)')
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
  c = components.build(config)
  cpu = platform.processor() or platform.machine()
  print(f'hardware: {jax.device_count()} x {jax.devices()[0].device_kind} ({cpu}, '
        f'{os.cpu_count()} cores), jax {jax.__version__}; model {c.model_cfg.num_params():,} '
        f'params; recipe {args.config}')
  print(f'caveat: {CAVEAT}')
  print('activation constraints: ' + ('off (no jax.set_mesh)' if args.no_set_mesh else
                                      'on (traced under jax.set_mesh)'))
  g, t_new = config.rollout.group_size, config.rollout.max_new_tokens
  rows = config.rollout.prompts_per_step * g
  prompts = next(pipeline.prompt_batches(
      c.train_source, c.tokenizer, max_prompt_len=config.task.max_prompt_len,
      batch_size=config.rollout.prompts_per_step, seed=0))
  tok_bp = jnp.repeat(prompts['prompt_tokens'], g, axis=0)   # the group expansion, done here so
  mask_bp = jnp.repeat(prompts['prompt_mask'], g, axis=0)    # the sampler's rows arrive split
  params = jax.device_get(c.params)
  algo = grpo.GRPOConfig.from_config(config)
  tx, schedule = ts.make_optimizer(config.optim), ts.lr_schedule(config.optim)
  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  _, abstract = lm.abstract_params(c.model_cfg)
  batch = None
  print(f'{"mesh d x f x t":>15} | {"sampler tok/s":>13} | {"train tok/s":>11} | '
        f'{"est. peak/device":>16}')
  for shape in meshes:
    label = 'x'.join(map(str, shape))
    try:
      mesh = meshlib.make_mesh(dict(zip(meshlib.MESH_AXES, shape)))
      meshlib.check_model_fits_mesh(c.model_cfg, mesh)
      components.check_batch_splits(config, mesh)   # the rows in algo.microbatches, as the run
    except (meshlib.MeshError, components.SetupError) as e:
      print(f'{label:>15} | skipped: {e}')
      continue
    with jax.set_mesh(mesh) if not args.no_set_mesh else contextlib.nullcontext():
      p_sh = meshlib.param_shardings(abstract, mesh)
      b_sh, rep = meshlib.batch_sharding(mesh), meshlib.replicated(mesh)
      placed = jax.device_put(params, p_sh)
      sampler = make_sampler(c.graphdef, c.model_cfg, SamplingConfig(
          max_new_tokens=t_new, eos_id=-1, pad_id=c.tokenizer.pad_id, temperature=1.0))
      s_args = (placed, jax.device_put(tok_bp, b_sh), jax.device_put(mask_bp, b_sh),
                jax.random.key(0))
      dt_s = timed(sampler, s_args, args.repeats)
      if batch is None:
        rollout = sampler(*s_args)
        rewards = jnp.asarray(np.random.default_rng(0).integers(0, 2, rows), jnp.float32)
        prepare = jax.jit(functools.partial(grpo.prepare_batch, graphdef=c.graphdef, algo=algo))
        batch = jax.device_get(prepare(placed, placed, rollout, rewards, jnp.ones(rows, bool))[0])
      st_sh = ts.TrainState(step=rep, params=p_sh,
                            opt_state=meshlib.opt_state_shardings(tx, like, p_sh, mesh))
      state = jax.device_put(ts.TrainState(step=jnp.int32(0), params=params,
                                           opt_state=tx.init(params)), st_sh)
      step = jax.jit(functools.partial(grpo.train_step, graphdef=c.graphdef, algo=algo, tx=tx,
                                       schedule=schedule),
                     in_shardings=(st_sh, b_sh), out_shardings=(st_sh, rep))
      dt_t = timed(step, (state, jax.device_put(batch, b_sh)), args.repeats)
    est = memory.estimate_run(config, c.model_cfg, mesh, microbatches=algo.microbatches)
    print(f'{label:>15} | {rows * t_new / dt_s:13,.0f} | '
          f'{batch["tokens"].size / dt_t:11,.0f} | {est.peak / 2**20:12.2f} MiB')


if __name__ == '__main__':
  main()
