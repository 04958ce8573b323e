"""Benchmark a recipe: sampler and train-step tokens/s, FLOP/s, and the monitor's cost.

  python -m tools.bench --recipe configs/grpo_arith.py [--repeats 10]

Train-step FLOPs come from XLA's cost analysis of the compiled step (attention included), with the
analytic 6N per token beside it. Sampler FLOPs are analytic (2N per prefill and decode token):
XLA's cost analysis counts a while_loop body only once. Timings exclude compilation (one
warm-up call) and report the
median of --repeats calls. Numbers are for whatever machine runs this: the device line says which.
"""
import functools
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from rft_jax import components
from rft_jax.algorithms import grpo
from rft_jax.algorithms import train_state as ts
from rft_jax import config as config_lib
from rft_jax.data import pipeline
from rft_jax.monitor import monitor as monlib
from rft_jax.monitor.detectors import MonitorConfig
from rft_jax.monitor.signals import SIGNALS
from rft_jax.monitor.signatures import SIGNATURES
from rft_jax.sampling.sampler import SamplingConfig, make_sampler
from tools.export_base import load_config


def timed(fn, args, repeats):
  jax.block_until_ready(fn(*args))   # compile + warm up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def xla_flops(jitted, args) -> float:
  cost = jitted.lower(*args).compile().cost_analysis()
  if isinstance(cost, list):
    cost = cost[0]
  return float(cost.get('flops', float('nan'))) if cost else float('nan')


class NotTimed(ValueError):
  """A recipe this bench does not time (one line)."""


def run(config_path: str, repeats: int = 10):
  """Prints the recipe's timings. NotTimed for an SFT, DPO or PPO recipe."""
  config = load_config(config_path)
  if not config_lib.is_grpo_family(config):
    raise NotTimed(f'--recipe={config_path}: this bench times the sampler and the GRPO step, '
                   'for the GRPO-family recipes (not SFT, DPO or PPO)')
  c = components.build(config)
  n_params = c.model_cfg.num_params()
  cpu = platform.processor() or platform.machine()
  print(f'device: {jax.device_count()} x {jax.devices()[0].device_kind} ({cpu}), '
        f'jax {jax.__version__}; model {n_params:,} params')

  g, t_new = config.rollout.group_size, config.rollout.max_new_tokens
  prompts = next(pipeline.prompt_batches(
      c.train_source, c.tokenizer, max_prompt_len=config.task.max_prompt_len,
      batch_size=config.rollout.prompts_per_step, seed=0))
  # Sampling with EOS disabled (eos_id=-1) so every row decodes all T tokens: a fixed workload.
  sampler = make_sampler(c.graphdef, c.model_cfg, SamplingConfig(
      max_new_tokens=t_new, eos_id=-1, pad_id=c.tokenizer.pad_id, temperature=1.0), group_size=g)
  s_args = (c.params, prompts['prompt_tokens'], prompts['prompt_mask'], jax.random.key(0))
  rows = config.rollout.prompts_per_step * g
  dt = timed(sampler, s_args, repeats)
  gen = rows * t_new
  # XLA's cost analysis counts a while_loop body once, so the decode loop is under-counted:
  # use the analytic 2N FLOPs per processed token (prefill P + T decoded; attention excluded).
  flops = 2 * n_params * rows * (prompts['prompt_tokens'].shape[1] + t_new)
  print(f'sampler   : {rows} rows x {t_new} new tokens: {dt * 1e3:8.1f} ms  '
        f'{gen / dt:10,.0f} tok/s  {flops / dt / 1e9:8.2f} GFLOP/s (analytic 2N per prefill '
        f'and decode token: {flops / 1e9:.3f} GFLOP)')

  rollout = sampler(*s_args)
  algo = grpo.GRPOConfig.from_config(config)
  rewards = jnp.asarray(np.random.default_rng(0).integers(0, 2, rows), jnp.float32)
  prepare = jax.jit(functools.partial(grpo.prepare_batch, graphdef=c.graphdef, algo=algo))
  batch, _ = prepare(c.params, c.params, rollout, rewards, jnp.ones(rows, bool))
  tx, schedule = ts.make_optimizer(config.optim), ts.lr_schedule(config.optim)
  state = ts.TrainState(step=jnp.int32(0), params=c.params, opt_state=tx.init(c.params))
  step = jax.jit(functools.partial(grpo.train_step, graphdef=c.graphdef, algo=algo, tx=tx,
                                   schedule=schedule))
  dt = timed(step, (state, batch), repeats)
  flops = xla_flops(step, (state, batch))
  tokens = int(np.prod(batch['tokens'].shape))
  print(f'train step: {rows} rows x {batch["tokens"].shape[1]} tokens: {dt * 1e3:8.1f} ms  '
        f'{tokens / dt:10,.0f} tok/s  {flops / dt / 1e9:8.2f} GFLOP/s (XLA count '
        f'{flops / 1e9:.3f} GFLOP; analytic 6N/token {6 * n_params * tokens / 1e9:.3f})')

  # The failure monitor's on-device update, on the metrics the step really produces.
  _, metrics = step(state, batch)
  mcfg = MonitorConfig()
  mstate = monlib.init_monitor(mcfg)
  update = jax.jit(functools.partial(monlib.monitor_update, cfg=mcfg))
  dm = timed(update, (mstate, metrics), max(repeats, 50))
  print(f'monitor   : {dm * 1e3:8.3f} ms per update = {100 * dm / dt:.2f}% of the train step '
        f'({len(SIGNALS)} signals, {len(SIGNATURES)} signatures)')

