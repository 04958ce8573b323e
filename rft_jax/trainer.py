"""The RL loop: sample -> reward -> advantages -> train step(s) -> telemetry -> eval -> checkpoint.

This is the only module with host-side control flow. Everything it calls on device is a pure,
jitted function of pytrees (rft_jax/sampling, rft_jax/algorithms). A run lives in one workdir:

  workdir/checkpoints/<step>/   orbax: train state, data-iterator state, run metadata
  workdir/metrics.jsonl         one line per step / eval / message
  workdir/tb/                   TensorBoard events
  workdir/run.png               the run's main signals
  workdir/summary.json          base vs final held-out accuracy, steps, wall seconds

Running again in the same workdir resumes from the latest checkpoint (or reports that the run is
already complete).
"""
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rft_jax import components, evaluation
from rft_jax.algorithms import grpo
from rft_jax.algorithms import train_state as ts
from rft_jax.checkpoint import Checkpointer
from rft_jax.data import pipeline
from rft_jax.parallel import mesh as meshlib
from rft_jax.rewards.runner import RewardRunner
from rft_jax.sampling.sampler import SamplingConfig, make_sampler
from rft_jax.sampling.text import decode_completions
from rft_jax.telemetry import sinks
from rft_jax.telemetry.plot import plot_run


class TrainingError(RuntimeError):
  """A run that had to stop (e.g. non-finite loss); the last good checkpoint is kept."""


def step_rng(seed: int, step: int) -> jax.Array:
  """Sampling key of a step: fold_in(key(seed), step). Resumes reproduce it from (seed, step)."""
  return jax.random.fold_in(jax.random.key(seed), step)


def init_state(params, tx, state_shardings) -> ts.TrainState:
  """Fresh TrainState built on device with the target shardings."""
  make = lambda p: ts.TrainState(step=jnp.int32(0), params=p, opt_state=tx.init(p))
  return jax.jit(make, out_shardings=state_shardings)(params)


def state_shardings(c: components.Components, tx):
  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), c.params)
  rep = meshlib.replicated(c.mesh)
  return ts.TrainState(step=rep, params=c.param_shardings,
                       opt_state=meshlib.opt_state_shardings(tx, like, c.param_shardings, c.mesh))


def write_summary(workdir: str, summary: dict) -> None:
  tmp = os.path.join(workdir, 'summary.json.tmp')
  with open(tmp, 'w') as f:
    json.dump(summary, f, indent=2, sort_keys=True)
  os.replace(tmp, os.path.join(workdir, 'summary.json'))


def make_summary(config, base_eval: dict, final_eval: dict, steps: int, wall_s: float) -> dict:
  """summary.json fields (documented in the README)."""
  k = config.eval.k
  return {
      'recipe': config.name,
      'steps': steps,
      'wall_s': round(wall_s, 1),
      'base_greedy_acc': base_eval['eval/greedy_acc'],
      f'base_mean@{k}_acc': base_eval[f'eval/mean@{k}_acc'],
      'final_greedy_acc': final_eval['eval/greedy_acc'],
      f'final_mean@{k}_acc': final_eval[f'eval/mean@{k}_acc'],
      'eval_prompts': config.eval.num_prompts,
      'eval_k': k,
  }


def open_run(config, workdir, c: components.Components, tx, data_it, hooks_extra=(),
             console_keys=sinks.DEFAULT_CONSOLE_KEYS):
  """Creates or resumes a run -> (state, state shardings, checkpointer, meta, hooks, start step).

  Resuming restores the train state onto this mesh, the data iterator and the run metadata from
  the latest checkpoint; metrics logged after that checkpoint are dropped from metrics.jsonl.
  """
  shardings = state_shardings(c, tx)
  state = init_state(c.params, tx, shardings)
  ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'), keep=config.train.keep_checkpoints)
  meta, start = {}, ckpt.latest_step() or 0
  if start:
    state, data_state, meta = ckpt.restore(start, state, shardings)
    data_it.set_state(data_state)
  hooks = sinks.make_sinks(workdir, console=config.telemetry.console,
                           jsonl=config.telemetry.jsonl, tensorboard=config.telemetry.tensorboard,
                           total_steps=config.train.steps, resume_step=start,
                           console_keys=console_keys)
  for h in hooks_extra:
    hooks.append(h)
  hooks.on_start(start, config.train.steps, {
      'recipe': config.name, 'workdir': workdir, 'params': f'{c.model_cfg.num_params():,}',
      'devices': f'{c.mesh.size} x {jax.devices()[0].platform}'})
  if start and start < config.train.steps:
    hooks.on_message(f'resumed from checkpoint at step {start}')
  return state, shardings, ckpt, meta, hooks, start


def finish_complete_run(config, workdir, opened) -> dict:
  """A second invocation of a finished run: say so, re-emit its summary, train nothing."""
  _, _, ckpt, meta, hooks, start = opened
  hooks.on_message(f'run already complete ({start}/{config.train.steps} steps) in {workdir}; '
                   'delete the workdir or raise config.train.steps to train further')
  summary = make_summary(config, meta['base_eval'], meta['final_eval'], start, meta['wall_s'])
  return finish_run(config, workdir, summary, hooks, ckpt, plot=False)


def finish_run(config, workdir, summary, hooks, ckpt, plot=True) -> dict:
  """Writes summary.json and the plot, closes sinks and checkpointer."""
  write_summary(workdir, summary)
  if plot and config.telemetry.plot and config.telemetry.jsonl:
    plot_run(os.path.join(workdir, 'metrics.jsonl'), os.path.join(workdir, 'run.png'),
             title=config.name)
  hooks.on_end(summary)
  hooks.close()
  ckpt.close()
  return summary


def run(config, workdir: str, hooks_extra=()) -> dict:
  """Trains config's RL recipe in workdir (resuming if possible). Returns summary.json's dict."""
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  c = components.build(config)
  algo = grpo.GRPOConfig.from_config(config)
  rollout_rows = config.rollout.prompts_per_step * config.rollout.group_size
  if rollout_rows % (meshlib.batch_divisor(c.mesh) * algo.microbatches):
    raise components.SetupError(
        f'config.rollout: prompts_per_step*group_size={rollout_rows} is not divisible by '
        f'data*fsdp={meshlib.batch_divisor(c.mesh)} times algo.microbatches={algo.microbatches}')
  tx, schedule = ts.make_optimizer(config.optim), ts.lr_schedule(config.optim)
  ref_params = jax.tree.map(jnp.copy, c.params) if algo.kl_coef > 0 else None
  data_it = pipeline.prompt_batches(
      c.train_source, c.tokenizer, max_prompt_len=config.task.max_prompt_len,
      batch_size=config.rollout.prompts_per_step, seed=config.seed,
      shard_index=jax.process_index(), shard_count=jax.process_count())
  r = open_run(config, workdir, c, tx, data_it, hooks_extra)
  state, shardings, ckpt, meta, hooks, start = r
  total = config.train.steps
  if start >= total and 'final_eval' in meta:
    return finish_complete_run(config, workdir, r)
  batch_sh, rep = meshlib.batch_sharding(c.mesh), meshlib.replicated(c.mesh)

  sampler = make_sampler(c.graphdef, c.model_cfg, SamplingConfig(
      max_new_tokens=config.rollout.max_new_tokens, eos_id=c.tokenizer.eos_id,
      pad_id=c.tokenizer.pad_id, temperature=config.rollout.temperature,
      top_k=config.rollout.top_k, top_p=config.rollout.top_p),
      group_size=config.rollout.group_size)
  prepare = jax.jit(functools.partial(grpo.prepare_batch, graphdef=c.graphdef, algo=algo),
                    out_shardings=(batch_sh, rep))
  train_step = jax.jit(
      functools.partial(grpo.train_step, graphdef=c.graphdef, algo=algo, tx=tx,
                        schedule=schedule),
      in_shardings=(shardings, batch_sh), out_shardings=(shardings, rep), donate_argnums=0)
  evaluator = evaluation.Evaluator(
      c.graphdef, c.model_cfg, c.tokenizer, components.eval_batch(c, config),
      max_new_tokens=config.rollout.max_new_tokens, k=config.eval.k,
      temperature=config.eval.temperature, seed=config.seed)
  runner = RewardRunner(dict(config.rewards.weights), timeout_s=config.rewards.timeout_s,
                        num_workers=config.rewards.num_workers)
  runner.start()

  if 'base_eval' not in meta:
    meta['base_eval'] = evaluator(c.params)
    hooks.on_eval(0, {k.replace('eval/', 'eval/base_'): v for k, v in meta['base_eval'].items()})
  wall_before = meta.get('wall_s', 0.0)   # wall seconds of earlier invocations of this run
  try:
    for step in range(start + 1, total + 1):
      t0 = time.time()
      prompts = next(data_it)
      rollout = sampler(state.params, prompts['prompt_tokens'], prompts['prompt_mask'],
                        step_rng(config.seed, step))
      texts = decode_completions(c.tokenizer, rollout.tokens_bt, rollout.mask_bt)
      t1 = time.time()
      answers = np.repeat(prompts['answer'], config.rollout.group_size)
      rewards = runner(texts, list(answers))
      t2 = time.time()
      batch, metrics = prepare(state.params, ref_params if ref_params is not None else
                               state.params, rollout, jnp.asarray(rewards.total),
                               jnp.asarray(rewards.valid))
      for _ in range(algo.updates_per_batch):
        state, step_metrics = train_step(state, batch)
      metrics = {**jax.device_get(metrics), **jax.device_get(step_metrics)}
      metrics = {k: float(v) for k, v in metrics.items()}
      if not np.isfinite(metrics['loss']):
        raise TrainingError(f'non-finite loss at step {step}; stopped with the last good '
                            f'checkpoint (step {ckpt.latest_step() or "none"}) kept in {workdir}')
      t3 = time.time()
      gen_tokens = float(np.asarray(rollout.mask_bt).sum())
      metrics.update(rewards.metrics())
      metrics.update({'time/step_s': t3 - t0, 'time/sample_s': t1 - t0,
                      'time/reward_s': t2 - t1, 'time/train_s': t3 - t2,
                      'throughput/tokens_per_s': gen_tokens / max(t3 - t0, 1e-9)})
      hooks.on_step(step, metrics)
      last = step == total
      if step % config.train.eval_every == 0 or last:
        result = evaluator(state.params)
        meta['last_eval'] = result
        hooks.on_eval(step, result)
        if last:
          meta['final_eval'] = result
      if step % config.train.ckpt_every == 0 or last:
        meta['wall_s'] = wall_before + time.time() - t_start
        ckpt.save(step, state, data_it.get_state(), meta)
  finally:
    runner.close()
  summary = make_summary(config, meta['base_eval'], meta['final_eval'], total,
                         wall_before + time.time() - t_start)
  return finish_run(config, workdir, summary, hooks, ckpt)
