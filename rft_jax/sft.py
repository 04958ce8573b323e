"""The SFT loop (configs/sft_arith.py): builds the base policy that RL recipes start from.

Same workdir layout, resume and telemetry as rft_jax/runs.py, whose run helpers it reuses.
`python -m tools.export_base WORKDIR` then writes the final params as a standalone checkpoint.
"""
import os
import time

import jax
import numpy as np

from rft_jax import components, evaluation, run_memory, runs
from rft_jax.algorithms import sft as sft_step
from rft_jax.algorithms import step_fns
from rft_jax.data import pipeline
from rft_jax.parallel import hostdata
from rft_jax.parallel import mesh as meshlib


def run(config, workdir: str, hooks_extra=()) -> dict:
  """Trains config's SFT recipe in workdir (resuming if possible). Returns summary.json's dict.
  What the run opens (data readers, checkpointer, sinks) is closed when it ends, however it
  ends (runs.RunScope)."""
  with runs.RunScope() as scope:
    return _run(config, workdir, hooks_extra, scope)


def _run(config, workdir: str, hooks_extra, scope: runs.RunScope) -> dict:
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  c = components.build(config)
  components.check_batch_splits(config, c.mesh, meshlib.resolved_note(config.mesh, c.mesh))
  memory_est = run_memory.check_memory(c, config)   # one line before an accelerator OOM
  data_it = hostdata.GlobalBatches(pipeline.sft_batches(   # each process reads its rows only
      c.train_source, c.tokenizer, max_prompt_len=config.task.max_prompt_len,
      answer_len=config.sft.answer_len, seed=config.seed,
      teacher_error_rate=config.sft.teacher_error_rate,
      **components.process_share(config)))   # sft.batch_size's rows
  opened = runs.open_run(config, workdir, c, data_it, hooks_extra, scope=scope,
                         console_keys=(('loss', 'loss'), ('token_acc', 'token acc')),
                         uses_reference=False)
  state, shardings, ckpt, meta, hooks, start, _ = opened
  hooks.on_message(f'memory estimate: {memory_est.describe()}')
  total = config.train.steps
  if start >= total and 'final_eval' in meta:
    return runs.finish_complete_run(config, workdir, opened)

  batch_sh, rep = meshlib.batch_sharding(c.mesh), meshlib.replicated(c.mesh)
  step_fn = step_fns.shared_update_step(sft_step.train_step, c.graphdef, config.optim, shardings,
                                        batch_sh, rep)
  evaluator = evaluation.Evaluator(
      c.graphdef, c.model_cfg, c.tokenizer, components.eval_batch(c, config),
      max_new_tokens=config.sft.answer_len, k=config.eval.k,
      temperature=config.eval.temperature, seed=config.seed)
  runs.ensure_base_eval(meta, evaluator, state.params, hooks)   # logged at step 0
  wall_before = meta.get('wall_s', 0.0)
  stop = runs.StopRequest()   # SIGTERM / SIGINT: finish this step, checkpoint, exit 75
  try:
    for step in range(start + 1, total + 1):
      t0 = time.time()
      raw = runs.next_batch(data_it, step)
      batch = {k: hostdata.place(raw[k], batch_sh) for k in ('tokens', 'mask', 'loss_mask')}
      state, metrics = step_fn(state, batch)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      dt = time.time() - t0
      metrics.update({'time/step_s': dt,
                      'throughput/tokens_per_s': float(np.asarray(raw['mask']).sum()) / dt})
      hooks.on_step(step, metrics)   # a non-finite step is logged first: its values show why
      runs.check_finite(metrics, step, ckpt, workdir)   # loss, gradient, parameters
      if step % config.train.eval_every == 0 or step == total:
        result = evaluator(state.params)
        hooks.on_eval(step, result)
        meta['final_eval' if step == total else 'last_eval'] = result
      stopping = stop.agreed()
      if step % config.train.ckpt_every == 0 or step == total or stopping:
        meta['wall_s'] = wall_before + time.time() - t_start
        runs.save_checkpoint(config, ckpt, step, state, data_it.get_state(), meta, hooks,
                             stopping=stopping)
      if stopping and step != total:
        runs.preempt(config, workdir, stop, step, hooks, ckpt)
  except runs.TrainingError:   # non-finite loss, gradient or parameters: the plot, sinks closed
    runs.close_stopped_run(config, workdir, hooks, ckpt)
    raise
  finally:
    stop.restore()
  runs.ensure_final_eval(meta, evaluator, state.params, hooks, total)
  summary = runs.make_summary(config, meta['base_eval'], meta['final_eval'], total,
                                 wall_before + time.time() - t_start)
  return runs.finish_run(config, workdir, summary, hooks, ckpt)
