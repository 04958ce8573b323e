"""The DPO loop (configs/dpo_arith.py, configs/online_dpo_arith.py): offline and online DPO.

  offline (config.dpo.mode='offline'): a fixed pair dataset (config.dpo.pairs, e.g. 'arith_slips'
      in rft_jax/data/arith_pairs.py) -> shuffled pair batches of config.dpo.batch_size -> step.
  online  (config.dpo.mode='online'): each step, G = rollout.group_size completions for each of
      rollout.prompts_per_step prompts from the current policy (the jitted sampler) -> verifiers
      (config.rewards) -> one pair per prompt, chosen = best reward, rejected = worst (prompts
      whose completions all score the same are skipped and counted) -> step.

The step is rft_jax.algorithms.dpo.train_step: loss config.dpo.loss_type (sigmoid / ipo /
hinge), beta, label_smoothing, (sum, count) over config.dpo.microbatches.

Reference log-probs. The reference is the initial policy (config.init_from), frozen; the train
step never runs it. Offline: computed ONCE per pair before the first step, one jitted forward
over the pair set in fixed-size chunks (`reference_table`: [N, 2] float32 keyed by the pair's
position in the source); each batch looks its pairs up on the host. A resumed run recomputes
the same table from the same initial params, so resume stays exact. Online: each step's pairs
are new, so the jitted batch preparation (dpo.online_batch) scores just them with the frozen
params, once per pair.

Same workdir layout, checkpoints (train state + data-iterator state), resume, telemetry and
summary.json as rft_jax/sft.py (rft_jax/runs.py). Metrics use TRL's names: loss,
rewards/{chosen,rejected,margins,accuracies}, logps/{chosen,rejected}; online runs add
pairs/step, pairs/skipped_prompts and the reward/response metrics.
"""
import functools
import os
import time

import jax
import numpy as np

from rft_jax import components, evaluation, programs, rollouts, run_memory, runs, trainer
from rft_jax.algorithms import dpo
from rft_jax.algorithms import step_fns
from rft_jax.data import arith_pairs, pipeline
from rft_jax.parallel import hostdata
from rft_jax.parallel import mesh as meshlib
from rft_jax.rewards.runner import RewardRunner
from rft_jax.sampling.sampler import SamplingConfig, extra_stop_ids, shared_sampler
from rft_jax.sampling.text import decode_completions

# config.dpo.pairs -> fn(data_dir) -> random-access source of {'id', 'prompt', 'chosen',
# 'rejected'} records (rft_jax.config.DPO_PAIR_SOURCES names the task each belongs to).
PAIR_SOURCES = {'arith_slips': arith_pairs.load_pairs}
PAIR_KEYS = tuple(f'{side}_{field}' for side in ('chosen', 'rejected')
                  for field in arith_pairs.PAIR_FIELDS)
REFERENCE_CHUNK = 1024   # pairs per reference forward when precomputing the table
CONSOLE_KEYS = (('loss', 'loss'), ('rewards/accuracies', 'pref acc'),
                ('rewards/margins', 'margin'), ('logps/chosen', 'logp c'))
ONLINE_CONSOLE_KEYS = (('reward/mean', 'reward'), ('pairs/step', 'pairs')) + CONSOLE_KEYS


def pair_source(config):
  """config.dpo.pairs's source, cut to its first config.dpo.max_pairs pairs (0 = all)."""
  source = PAIR_SOURCES[config.dpo.pairs](config.task.data_dir)
  n = config.dpo.get('max_pairs', 0)
  return arith_pairs.Subset(source, n) if n else source


def reference_table(logps_fn, ref_params, source, tokenizer, *, max_prompt_len: int,
                    answer_len: int, chunk: int = REFERENCE_CHUNK) -> np.ndarray:
  """[N, 2] float32 summed reference log-probs (chosen, rejected) of every pair, by position.

  One pass in order; every chunk has the same shape (the last one padded with repeats), so
  logps_fn(params, batch) -> (logp_c_b, logp_r_b) compiles once.
  """
  n = len(source)
  chunk = min(chunk, n)
  table = np.zeros((n, 2), np.float32)
  batches = arith_pairs.pair_batches(source, tokenizer, max_prompt_len=max_prompt_len,
                                     answer_len=answer_len, batch_size=chunk, seed=0,
                                     shuffle=False, num_epochs=1, drop_remainder=False)
  for raw in batches:
    index, k = np.asarray(raw['index']), len(raw['index'])
    pad = lambda x: np.concatenate([x, np.repeat(x[-1:], chunk - k, 0)]) if k < chunk else x
    logp_c, logp_r = jax.device_get(logps_fn(ref_params, {key: pad(raw[key])
                                                          for key in PAIR_KEYS}))
    table[index, 0], table[index, 1] = logp_c[:k], logp_r[:k]
  return table


def offline_batch(raw: dict, table: np.ndarray) -> dict:
  """A pair_batches batch plus its reference log-probs looked up by pair index (see dpo.py)."""
  index = np.asarray(raw['index'])
  return {**{k: raw[k] for k in PAIR_KEYS}, 'ref_chosen': table[index, 0],
          'ref_rejected': table[index, 1], 'pair_mask': np.ones(len(index), np.float32)}


class OfflinePairs:
  """Step batches from the pair iterator and the precomputed reference table."""

  def __init__(self, data_it, table, batch_sh):
    self.data_it, self.table, self.batch_sh = data_it, table, batch_sh

  def __call__(self, step: int, params) -> tuple[dict, dict]:
    del params
    batch = offline_batch(runs.next_batch(self.data_it, step), self.table)   # global, every process
    return {k: hostdata.place(v, self.batch_sh) for k, v in batch.items()}, {}

  def close(self):
    pass


class OnlinePairs:
  """Step batches sampled from the current policy: sample -> verify -> pair -> reference."""

  def __init__(self, config, c: components.Components, data_it, ref_params, batch_sh, rep,
               kept, on_message):
    self.config, self.c, self.data_it, self.ref_params = config, c, data_it, ref_params
    self.kept = kept   # () -> runs.kept_note: the checkpoint a reward failure keeps
    self.on_message = on_message   # (step, text): hooks.on_step_message
    self.unscored_reported = set()   # verifiers whose failures were said (rollouts.say_unscored)
    self.batch_sh = batch_sh
    r = config.rollout
    self.sampler = shared_sampler(c.graphdef, c.model_cfg, SamplingConfig(
        max_new_tokens=r.max_new_tokens, eos_id=c.tokenizer.eos_id, pad_id=c.tokenizer.pad_id,
        stop_ids=extra_stop_ids(c.tokenizer),
        temperature=r.temperature, top_k=r.top_k, top_p=r.top_p), r.group_size)
    self.prepare = programs.shared(
        'dpo_online_batch', (c.graphdef, r.group_size, batch_sh, rep),
        lambda: jax.jit(functools.partial(dpo.online_batch, graphdef=c.graphdef,
                                          group_size=r.group_size), out_shardings=(batch_sh, rep)))
    self.runner = RewardRunner(dict(config.rewards.weights), timeout_s=config.rewards.timeout_s,
                               num_workers=config.rewards.num_workers,
                               memory_mb=config.rewards.get('memory_mb', 0))
    self.runner.start(wait=False)   # the workers import while the first step compiles

  def __call__(self, step: int, params) -> tuple[dict, dict]:
    prompts = runs.next_batch(self.data_it, step)   # the global batch on every process
    t0 = time.time()
    rollout = self.sampler(params, hostdata.place(prompts['prompt_tokens'], self.batch_sh),
                           hostdata.place(prompts['prompt_mask'], self.batch_sh),
                           trainer.step_rng(self.config.seed, step))
    host = jax.tree.map(hostdata.to_host, rollout)   # the global rollout, on every process
    texts = decode_completions(self.c.tokenizer, host.tokens_bt, host.mask_bt)
    t1 = time.time()
    answers = np.repeat(prompts['answer'], self.config.rollout.group_size)
    rewards = rollouts.score_rows(self.runner, texts, list(answers))   # each process its rows
    rollouts.check_rewards(rewards, self.config.rewards.max_invalid_frac, step, texts,
                           self.kept, self.config.rewards.timeout_s)
    rollouts.say_unscored(self.on_message, step, rewards, len(texts),
                          self.config.rewards.timeout_s, self.unscored_reported)
    batch, metrics = self.prepare(self.ref_params, rollout,
                                  hostdata.place(rewards.total, self.batch_sh),
                                  hostdata.place(rewards.valid, self.batch_sh))
    extra = {k: v for k, v in rewards.metrics().items() if k != 'reward/total/mean'}
    return batch, {**metrics, **extra, 'time/sample_s': t1 - t0,
                   'time/reward_s': time.time() - t1}

  def close(self):
    self.runner.close()


def run(config, workdir: str, hooks_extra=()) -> dict:
  """Trains config's DPO recipe in workdir (resuming if possible). Returns summary.json's dict.
  What the run opens (data readers, checkpointer, sinks, reward workers) is closed when it
  ends, however it ends (runs.RunScope)."""
  with runs.RunScope() as scope:
    return _run(config, workdir, hooks_extra, scope)


def _run(config, workdir: str, hooks_extra, scope: runs.RunScope) -> dict:
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  c = components.build(config)
  dcfg = dpo.DPOConfig.from_config(config)
  online = config.dpo.mode == 'online'
  components.check_batch_splits(config, c.mesh, meshlib.resolved_note(config.mesh, c.mesh))
  memory_est = run_memory.check_memory(c, config)   # one line before an accelerator OOM
  # each process reads its rows of every batch; GlobalBatches gathers the global batch
  share = components.process_share(config)   # of the pairs (prompts online) of a step
  if online:
    data_it = hostdata.GlobalBatches(pipeline.prompt_batches(
        c.train_source, c.tokenizer, seed=config.seed,
        max_prompt_len=config.task.max_prompt_len, **share))
    completion_len = config.rollout.max_new_tokens
  else:
    source = pair_source(config)
    data_it = hostdata.GlobalBatches(arith_pairs.pair_batches(
        source, c.tokenizer, seed=config.seed, max_prompt_len=config.task.max_prompt_len,
        answer_len=config.dpo.answer_len, **share))
    completion_len = config.dpo.answer_len
  opened = runs.open_run(config, workdir, c, data_it, hooks_extra, scope=scope,
                         console_keys=ONLINE_CONSOLE_KEYS if online else CONSOLE_KEYS)
  state, shardings, ckpt, meta, hooks, start, _ = opened
  hooks.on_message(f'memory estimate: {memory_est.describe()}')
  total = config.train.steps
  if start >= total and 'final_eval' in meta:
    return runs.finish_complete_run(config, workdir, opened)

  # The frozen reference: the initial params. The train state holds its own copy (runs.init_state
  # or a restore), so donating the state never touches these buffers.
  ref_params = c.params
  batch_sh, rep = meshlib.batch_sharding(c.mesh), meshlib.replicated(c.mesh)
  if online:
    make_batch = OnlinePairs(config, c, data_it, ref_params, batch_sh, rep,
                             kept=lambda: runs.kept_note(ckpt, workdir),
                             on_message=hooks.on_step_message)
    scope.callback(make_batch.close)   # its reward workers
  else:
    t0 = time.time()
    try:
      pair_logps = programs.shared('dpo_pair_logps', c.graphdef, lambda: jax.jit(
          functools.partial(dpo.pair_logps, graphdef=c.graphdef)))
      table = reference_table(pair_logps,
                              ref_params, source, c.tokenizer,
                              max_prompt_len=config.task.max_prompt_len,
                              answer_len=config.dpo.answer_len)
    except ValueError as e:   # a pair that does not fit task.max_prompt_len / dpo.answer_len
      raise components.SetupError(
          f'offline DPO pairs: {str(e).strip().splitlines()[-1]}') from None
    hooks.on_message(f'reference log-probs of {len(source)} pairs computed once in '
                     f'{time.time() - t0:.1f}s (the initial policy prefers the chosen answer in '
                     f'{np.mean(table[:, 0] > table[:, 1]):.0%} of them)')
    make_batch = OfflinePairs(data_it, table, batch_sh)
  step_fn = step_fns.shared_update_step(dpo.train_step, c.graphdef, config.optim, shardings,
                                        batch_sh, rep, dcfg=dcfg)
  evaluator = evaluation.Evaluator(
      c.graphdef, c.model_cfg, c.tokenizer, components.eval_batch(c, config),
      max_new_tokens=completion_len, k=config.eval.k, temperature=config.eval.temperature,
      seed=config.seed)
  runs.ensure_base_eval(meta, evaluator, c.params, hooks)   # logged at step 0
  wall_before = meta.get('wall_s', 0.0)
  stop = runs.StopRequest()   # SIGTERM / SIGINT: finish this step, checkpoint, exit 75
  try:
    for step in range(start + 1, total + 1):
      t0 = time.time()
      batch, extra = make_batch(step, state.params)
      t1 = time.time()
      state, metrics = step_fn(state, batch)
      metrics = {k: float(v) for k, v in jax.device_get({**metrics, **extra}).items()}
      meta['pairs_total'] = meta.get('pairs_total', 0.0) + metrics['pairs']
      metrics.update({'time/step_s': time.time() - t0, 'time/train_s': time.time() - t1})
      hooks.on_step(step, metrics)   # a non-finite step is logged first: its values show why
      runs.check_finite(metrics, step, ckpt, workdir)   # loss, gradient, parameters
      last = step == total
      if step % config.train.eval_every == 0 or last:
        result = evaluator(state.params)
        hooks.on_eval(step, result)
        meta['final_eval' if last else 'last_eval'] = result
      stopping = stop.agreed()
      if step % config.train.ckpt_every == 0 or last or stopping:
        meta['wall_s'] = wall_before + time.time() - t_start
        runs.save_checkpoint(config, ckpt, step, state, data_it.get_state(), meta, hooks,
                             stopping=stopping)
      if stopping and not last:
        runs.preempt(config, workdir, stop, step, hooks, ckpt)
  except runs.TrainingError:   # non-finite loss, gradient or parameters: the plot, sinks closed
    runs.close_stopped_run(config, workdir, hooks, ckpt)
    raise
  finally:
    stop.restore()
  runs.ensure_final_eval(meta, evaluator, state.params, hooks, total)
  summary = runs.make_summary(config, meta['base_eval'], meta['final_eval'], total,
                              wall_before + time.time() - t_start)
  summary.update({'dpo_mode': config.dpo.mode, 'dpo_loss_type': config.dpo.loss_type,
                  'pairs_per_step': round(meta['pairs_total'] / total, 2)})
  return runs.finish_run(config, workdir, summary, hooks, ckpt)
