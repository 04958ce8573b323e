"""The RL loop: sample -> reward -> advantages -> train step(s) -> monitor -> eval -> checkpoint.

This is the only module with host-side control flow for RL runs (rft_jax/runs.py holds the workdir
lifecycle it shares with SFT). Everything it calls on device is a pure, jitted function of pytrees
(rft_jax/sampling, rft_jax/algorithms, rft_jax/monitor). Running again in the same workdir resumes
from the latest checkpoint (or reports that the run is already complete).

The failure monitor's state lives in TrainState.monitor and is updated on device every step; its
alarms come back with the step's metrics (no extra host round-trip). Incidents go to the console,
metrics.jsonl (kind 'incident'), incidents.jsonl and the end-of-run report (rft_jax/incidents.py);
remediation (config.monitor.mode) is executed here: see rft_jax/monitor/remediation.py for the
policy.
"""
import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rft_jax import (compile_ahead, compile_cache, components, evaluation, faults, incidents,
                     programs, rollouts, run_memory, runs)
from rft_jax import config as config_lib
from rft_jax.algorithms import kl_control, ppo
from rft_jax.algorithms import step_fns as step_fns_lib
from rft_jax.algorithms import train_state as ts
from rft_jax.models import functional as lm
from rft_jax.monitor import credit
from rft_jax.monitor import monitor as monlib
from rft_jax.monitor import knobs as monitor_knobs
from rft_jax.monitor.remediation import Controls, Remediator, health_metric
from rft_jax.parallel import hostdata
from rft_jax.parallel import mesh as meshlib
from rft_jax.rewards import verifiers
from rft_jax.rewards.runner import RewardRunner
from rft_jax.sampling.sampler import SamplingConfig, extra_stop_ids, shared_sampler
from rft_jax.scaling import live as scaling_live
from rft_jax.telemetry import flops, vocabulary
from rft_jax.telemetry.metrics import completion_diversity

TrainingError = runs.TrainingError


def step_rng(seed: int, step: int) -> jax.Array:
  """Sampling key of a step: fold_in(key(seed), step). Resumes reproduce it from (seed, step).
  (= rollouts.round_rng(seed, step, 0); refill rounds fold in the round too.)"""
  return rollouts.round_rng(seed, step, 0)


def monitor_settings(config):
  """(mode, knobs.monitor_config or None, watch_steps, lr_factor) from config.monitor."""
  m = config.get('monitor')
  if m is None or m.mode == 'off':
    return 'off', None, 10, 0.1
  return m.mode, monitor_knobs.monitor_config(m), m.watch_steps, m.lr_factor


def device_controls(controls: Controls, config, step: int) -> dict:
  """TrainState.controls for `step`: remediation's knobs times any injected fault. temperature
  is the one the trainer scores at: the sampler's (1 for greedy sampling, whose log-probs are
  untempered). Host float32 scalars (NumPy): placing them compiles nothing, where an eager
  jnp.float32 compiles an XLA program at a run's set-up."""
  injected = config.get('faults', [])
  lr = controls.lr_scale * faults.lr_multiplier(injected, step)
  kl = faults.kl_coef(injected, step, controls.kl_coef)
  temp = faults.trainer_temperature(injected, step, controls.temperature, config.train.steps)
  return {'lr_scale': np.float32(lr), 'kl_coef': np.float32(kl),
          'temperature': np.float32(temp if temp > 0 else 1.0)}


def observe(state: ts.TrainState, metrics: dict, *, mcfg, algo=None, rows: int = 0):
  """End of a step on device: the adaptive KL controller's update (kl_control.py; identity when
  fixed), then the monitor's -> (state, alarm arrays); no alarms when the monitor is off."""
  state = kl_control.update(state, metrics, algo, rows)
  if mcfg is None:
    return state, {}
  mstate, alarms = monlib.monitor_update(state.monitor, metrics, mcfg)
  return state.replace(monitor=mstate), alarms


def make_observe(mcfg, algo, rows: int, shardings, rep):
  """jit(observe) as a run uses it (tools/bench times this one; shared: programs.py): state
  donated, compiled for compile time (compile_cache.light_compile_options)."""
  build = lambda: jax.jit(functools.partial(observe, mcfg=mcfg, algo=algo, rows=rows),
                         donate_argnums=0, out_shardings=(shardings, rep),
                         compiler_options=compile_cache.light_compile_options())
  return programs.shared('observe', (mcfg, algo, rows, programs.tree_key(shardings), rep), build)


def run(config, workdir: str, hooks_extra=()) -> dict:
  """Trains config's RL recipe in workdir (resuming if possible). Returns summary.json's dict.

  Everything is traced under jax.set_mesh(config's mesh), so the model's activation sharding
  constraints (rft_jax/parallel/rules.py constrain) act in the sampler and the train step.
  What the run opens (data readers, checkpointer, sinks, reward workers) is closed when it
  ends, however it ends (runs.RunScope).
  """
  t_start = time.time()
  c = components.build(config)   # outside the mesh context: params are placed explicitly
  with jax.set_mesh(c.mesh), runs.RunScope() as scope:
    return _run(config, workdir, hooks_extra, c, t_start, scope)


def _run(config, workdir: str, hooks_extra, c: components.Components, t_start: float,
         scope: runs.RunScope) -> dict:
  from rft_jax.data import pipeline  # pylint: disable=g-import-not-at-top  (grain)
  os.makedirs(workdir, exist_ok=True)
  mode, mcfg, watch_steps, lr_factor = monitor_settings(config)
  algo = ppo.algo_config(config, use_reference=mode == 'auto')   # GRPOConfig or PPOConfig
  rollout_rows = config.rollout.prompts_per_step * config.rollout.group_size
  components.check_batch_splits(config, c.mesh, meshlib.resolved_note(config.mesh, c.mesh))
  memory_est = run_memory.check_memory(c, config, algo)   # one line before an accelerator OOM
  # The reference is the build's initial weights themselves, not a copy (nothing donates them):
  # one copy of the params less on the device, as memory.estimate counts it.
  ref_params = initial_ref = c.params if algo.use_reference else None
  skipped = (pipeline.BadRecords(f'{config.task.name} train split')
             if config.task.get('bad_records', 'error') == 'skip' else None)
  for reason in c.skipped_at_load if skipped is not None else ():   # GSM8K lines left out
    skipped.add(reason)
  # Each process reads only its rows of every prompt batch; GlobalBatches gathers them so that
  # every process holds the global batch (rft_jax/parallel/hostdata.py).
  share = components.process_share(config)   # rollout.prompts_per_step's rows
  data_it = hostdata.GlobalBatches(pipeline.prompt_batches(
      c.train_source, c.tokenizer, max_prompt_len=config.task.max_prompt_len, seed=config.seed,
      bad_records=skipped, **share))
  controls0 = Controls(kl_coef=algo.kl_coef, temperature=config.rollout.temperature)
  opened = runs.open_run(config, workdir, c, data_it, hooks_extra, scope=scope,
                         controls=device_controls(controls0, config, 1),
                         monitor=monlib.init_monitor(mcfg) if mcfg else None,
                         extra=ppo.extra_state(c, algo, **ppo.critic_optimizer(config.optim, algo)),
                         uses_reference=algo.use_reference)
  state, shardings, ckpt, meta, hooks, start, reset_ref = opened
  hooks.on_message(f'memory estimate: {memory_est.describe()}')
  for notice in (*c.setup_notes, *config_lib.sampling_notices(config)):   # prompts to skip
    hooks.on_message(notice)
  total = config.train.steps
  if start >= total and 'final_eval' in meta:
    return runs.finish_complete_run(config, workdir, opened)
  batch_sh, rep = meshlib.batch_sharding(c.mesh), meshlib.replicated(c.mesh)
  # Prompts are split over data x fsdp like the train batch when they divide evenly (sampling is
  # then split too); host arrays (the global value on every process) are placed the same way.
  prompt_sh = (batch_sh if config.rollout.prompts_per_step % meshlib.batch_divisor(c.mesh) == 0
               else rep)
  to_device = lambda x: hostdata.to_sharding(x, batch_sh)   # one layout: see compile_ahead
  # Verdicts judge recovery on the primary verifier's correctness, which a fault between the
  # verifiers and the trainer (a reward scale, sign or added term) does not corrupt.
  remediator = Remediator(mode, controls0, watch_steps=watch_steps, lr_factor=lr_factor,
                          health_metric=health_metric(
                              verifiers.primary_verifier(config.rewards.weights)))
  if 'remediator' in meta:
    remediator.load_state_dict(meta['remediator'])
  if reset_ref is not None:   # remediation had reset the reference policy before the checkpoint
    ref_params = reset_ref
  # (ref_params, reset_ref) before the watched reset (its first one), checkpointed for its undo.
  ref_before_reset = incidents.resumed_undo_reference(
      ckpt, start, meta, remediator, initial_ref, c.param_shardings, hooks) if start else None
  incident_log = incidents.IncidentLog(workdir, start, meta.get(incidents.ENTRIES_KEY))
  live_fit = scaling_live.LiveFit.from_config(config, meta)   # no-op unless scaling.live_every
  watched = incidents.watched(config)   # the monitor or the live scaling fit
  report = functools.partial(incidents.write_report, config, workdir, incident_log, hooks,
                             watched)   # incidents.md, console

  injector = faults.FaultInjector(config.get('faults', []), config.seed,
                                  config.rollout.group_size, total)

  @functools.cache
  def sampler(temperature: float, max_new_tokens: int = 0, ignore_eos: bool = False):
    """One compiled sampler per temperature remediation asks for (and per injected fault)."""
    scfg = SamplingConfig(
        max_new_tokens=max_new_tokens or config.rollout.max_new_tokens,
        eos_id=-1 if ignore_eos else c.tokenizer.eos_id,
        stop_ids=() if ignore_eos else extra_stop_ids(c.tokenizer),
        pad_id=c.tokenizer.pad_id, temperature=temperature, top_k=config.rollout.top_k,
        top_p=config.rollout.top_p)
    return shared_sampler(c.graphdef, c.model_cfg, scfg, config.rollout.group_size)

  @functools.cache
  def step_fns(bf16: bool):
    """make_step_fns for this run; bf16=True only under the bf16_logits fault."""
    graphdef = c.graphdef if not bf16 else lm.abstract_params(
        dataclasses.replace(c.model_cfg, dtype='bfloat16'))[0]
    return step_fns_lib.shared_step_fns(graphdef, algo, config.optim, shardings, batch_sh, rep)
  corrupt = programs.shared('corrupt_batch', batch_sh, lambda: jax.jit(
      faults.corrupt_batch, static_argnames='shift_mask', out_shardings=batch_sh))
  # Credit-assignment signals on the advantages the loss consumes (rft_jax/monitor/credit.py);
  # none for token-level (PPO) advantages.
  light = compile_cache.light_compile_options()   # small programs: compile time is what counts
  credit_fn = None if ppo.is_ppo(algo) else programs.shared(
      'credit', (config.rollout.group_size, rep), lambda: jax.jit(functools.partial(
          credit.credit_metrics, group_size=config.rollout.group_size), out_shardings=rep,
          static_argnames='first', compiler_options=light))
  primary = verifiers.primary_verifier(config.rewards.weights)
  hard_it = None
  if any(f['type'] == 'curriculum_switch' for f in injector.faults):
    hard_it = hostdata.GlobalBatches(pipeline.prompt_batches(
        faults.hard_arith_records(c.train_source), c.tokenizer,
        max_prompt_len=config.task.max_prompt_len, seed=config.seed + 1, **share))
    scope.callback(hard_it.close)
  observe_fn = make_observe(mcfg, algo, rollout_rows, shardings, rep)
  evaluator = evaluation.Evaluator(
      c.graphdef, c.model_cfg, c.tokenizer, components.eval_batch(c, config),
      max_new_tokens=config.rollout.max_new_tokens, k=config.eval.k,
      temperature=config.eval.temperature, seed=config.seed)
  runner = RewardRunner(dict(config.rewards.weights), timeout_s=config.rewards.timeout_s,
                        num_workers=config.rewards.num_workers,
                        memory_mb=config.rewards.get('memory_mb', 0))
  scope.callback(runner.close)
  runner.start(wait=False)   # the workers import while the first step compiles
  rollout_stage = rollouts.RolloutStage(
      config, algo, data_it, c.tokenizer, runner, sampler,
      check=lambda r, s, t: rollouts.check_rewards(
          r, config.rewards.get('max_invalid_frac', 1.0), s, t,
          lambda: runs.kept_note(ckpt, workdir), config.rewards.timeout_s),
      on_message=hooks.on_step_message, skipped=skipped, injector=injector, hard_it=hard_it,
      place_prompts=lambda x: hostdata.place(x, prompt_sh),
      sample_shardings=meshlib.sampling_shardings(   # None: sample in the training layout
          shardings.params, config.rollout.get('weights_layout', 'train')))

  # The first step's train programs compile on a thread while the main one evaluates and samples
  # (rft_jax/compile_ahead.py); the process waits for it at exit (exiting under it aborts).
  ahead = None
  if compile_ahead.run_ahead(injector.faults, start, total):
    first = state.replace(controls=jax.device_put(   # as the loop places them
        device_controls(remediator.controls, config, start + 1), rep))
    fns = step_fns(False)
    ahead = compile_ahead.first_step(
        fns, first, ref_params, sampler(remediator.controls.temperature), c.params,
        config.rollout.prompts_per_step, config.task.max_prompt_len, config.rollout.group_size,
        batch_sh, c.mesh, {} if fns[2] else ppo.prepare_args(first, algo))
  runs.ensure_base_eval(meta, evaluator, c.params, hooks)   # logged at step 0
  wall_before = meta.get('wall_s', 0.0)   # wall seconds of earlier invocations of this run
  step = start
  # Steps in a row with skipped updates (saved with each checkpoint, carried on by a rewind).
  streak = incidents.SkippedStreak(meta, runs.updates_per_step(config))
  max_skipped = config.monitor.get('max_skipped_steps', 5) if mcfg is not None else 1

  def execute(decision) -> bool:
    """A remediation decision's restore and reference reset (or its undo) -> whether the run
    rewound."""
    nonlocal state, step, ref_params, reset_ref, ref_before_reset
    rewound = None
    if decision is not None and decision.restore_before is not None:
      rewound = incidents.rewind(ckpt, decision.restore_before, state, shardings, c.params,
                                 c.param_shardings, data_it, meta, hooks, remediator, step)
    if rewound is not None:
      # The restored checkpoint's reference: the one remediation had reset before it, else
      # the initial policy (a reset made after it belongs to the abandoned trajectory), as a
      # resume from that checkpoint would read it.
      step, state, reset_ref, restored_meta = rewound
      ref_params = reset_ref if reset_ref is not None else initial_ref
      streak.load(restored_meta)
    if decision is not None and decision.reset_reference:
      if not decision.escalation:   # an escalation's undo goes back to before the first reset
        ref_before_reset = ref_params, reset_ref
      ref_params = reset_ref = jax.tree.map(jnp.copy, state.params)
    if decision is not None and decision.undo_reference_reset:
      ref_params, reset_ref = ref_before_reset or (initial_ref, None)
    if not incidents.reset_undoable(remediator):   # undone or kept: nothing more to put back
      ref_before_reset = None
    return rewound is not None

  stop = runs.StopRequest()   # SIGTERM / SIGINT: finish this step, checkpoint, exit
  try:
    while step < total:
      step += 1
      t0 = time.time()
      # Sample and score (one round, or DAPO's refill rounds): rft_jax/rollouts.py.
      got = rollout_stage(state.params, step, remediator.controls.temperature)
      rollout, t2 = jax.tree.map(to_device, got.rollout), time.time()
      t1 = t2 - got.reward_s
      prepare, train_step, fused = step_fns(injector.trainer_bf16(step))
      state = state.replace(controls=jax.device_put(   # same placement as the step outputs:
          device_controls(remediator.controls, config, step), rep))   # no second compile
      rewards_d, valid_d = to_device(got.rewards_b), to_device(got.valid_b)
      sign_b, shift = injector.batch_faults(step, len(got.rewards_b))
      if ahead is not None:   # the first step's programs compiling on their thread
        failed, ahead = ahead.wait(), None
        if failed:
          hooks.on_step_message(step, f'the train programs compiled ahead failed ({failed}); '
                                'compiling them at the first call')
      if fused is not None and sign_b is None:   # reference + policy passes in one program
        state, metrics, adv_b = fused(state, ref_params, rollout, rewards_d, valid_d)
        step_metrics = {}
      else:
        batch, metrics = prepare(state.params,
                                 state.params if ref_params is None else ref_params,
                                 rollout, rewards_d, valid_d,
                                 **ppo.prepare_args(state, algo))   # critic, in-reward KL coef
        if sign_b is not None:   # injected credit-assignment faults (FaultBench)
          batch = corrupt(batch, jnp.asarray(sign_b), shift_mask=shift)
          p = rollout.prompt_tokens_bp.shape[1]   # the invariant, on the mask actually used
          metrics['invariant/prompt_loss_tokens'] = batch['loss_mask'][:, :p - 1].sum()
        adv_b = batch['adv']
        state, step_metrics = step_fns_lib.train_epochs(train_step, state, batch,
                                                        algo.updates_per_batch)
      if credit_fn is not None:   # on the advantages the train step consumed (after any fault)
        correct_b = got.rewards.per_verifier.get(primary, got.rewards_b)
        metrics.update(credit_fn(adv_b, rewards_d,
                                 to_device(np.asarray(correct_b, np.float32)), valid_d,
                                 first=rollout.prompt_tokens_bp.shape[1] - 1))
      reward_metrics = {**got.rewards.metrics(), **got.metrics,
                        'invariant/reward_out_of_range':
                            got.rewards.out_of_range_frac(config.rewards.weights)}
      metrics = {**metrics, **step_metrics,
                 **{k: np.float32(v) for k, v in reward_metrics.items()}}   # host: no program
      state, alarms = observe_fn(state, metrics)
      metrics, alarms = jax.device_get((metrics, alarms))   # the step's one host transfer
      metrics = {k: float(v) for k, v in metrics.items()}
      if mcfg is not None:
        metrics.update({k: float(v) for k, v in monlib.alarm_metrics(alarms).items()})
      t3 = time.time()
      gen_tokens = got.gen_tokens   # all rounds' tokens
      metrics.update(completion_diversity(hostdata.to_host(rollout.tokens_bt),
                                         hostdata.to_host(rollout.mask_bt)))
      if skipped is not None:
        metrics['data/skipped_records'] = float(skipped.total)   # in this invocation
      metrics.update({'time/step_s': t3 - t0, 'time/sample_s': t1 - t0,
                      'time/reward_s': t2 - t1, 'time/train_s': t3 - t2,
                      'throughput/tokens_per_s': gen_tokens / max(t3 - t0, 1e-9)})
      metrics.update(step_compute(config, c.model_cfg, metrics, meta))
      hooks.on_step(step, vocabulary.with_aliases(metrics))   # + verl names (README table)

      if mcfg is not None:
        decision = incidents.handle_alarms(alarms, step, remediator, hooks, incident_log,
                                 health=metrics.get(remediator.health_metric))
        if decision is not None and decision.halt:
          raise TrainingError(
              f'halted at step {step} by the failure monitor: {decision.reason}; in {workdir}: '
              f'{incidents.halt_checkpoints(ckpt.all_steps(), decision.onset, workdir)}; '
              f'see {incident_log.path}')
        if execute(decision):
          continue   # rewound: the steps after the restored checkpoint run again
      # Non-finite parameters stop the run here unless 'auto' restored a checkpoint from before
      # them just above (incident nonfinite_params): halt raised above, off/warn stop here, and
      # so does auto when it did not restore (a watch open, restores used up, no checkpoint).
      # A non-finite loss or gradient (its update was skipped on the device) stops a run
      # without the monitor and is reported by one with it; a streak of max_skipped such steps
      # is an incident (skipped_streak) that 'auto' repairs as nonfinite_params, else it stops.
      bad = runs.check_finite(metrics, step, ckpt, workdir, stop_on_loss=mcfg is None,
                              why=remediator.why_no_restore('nonfinite_params', step))
      if bad and mode in ('off', 'warn'):
        hooks.on_step_message(step, f'step {step}: non-finite {bad}; the update was skipped')
      if streak.observe(bad, metrics.get('update_skipped', 1.0)) >= max_skipped:
        if mcfg is not None and execute(incidents.handle_streak(
            streak.steps, max_skipped, step, remediator, hooks, incident_log)):
          continue
        runs.check_skipped_streak(streak.steps, max_skipped, bad, step, ckpt, workdir,
                                  streak.skipped, streak.updates,
                                  remediator.why_no_restore('skipped_streak', step))
      last = step == total
      if step % config.train.eval_every == 0 or last:
        result = evaluator(state.params)
        meta['last_eval'] = result
        live = live_fit.observe_eval(step, result, meta)   # scaling/* metrics, anomaly incident
        hooks.on_eval(step, {**result, **live.metrics})
        live.report(step, hooks, incident_log)
        if last:
          meta['final_eval'] = result
      stopping = stop.agreed()
      if step % config.train.ckpt_every == 0 or last or stopping:
        meta['wall_s'] = wall_before + time.time() - t_start
        meta['remediator'] = remediator.state_dict()
        meta[incidents.ENTRIES_KEY] = len(incident_log.entries)
        streak.save(meta)
        before = incidents.undo_reference(meta, remediator, ref_before_reset)   # or None
        runs.save_checkpoint(config, ckpt, step, state, data_it.get_state(), meta, hooks,
                             reference=reset_ref, stopping=stopping, reference_before_reset=before)
      if stopping and not last:
        report(stopped=True)   # after the stop's checkpoint: incidents.md of the steps run
        runs.preempt(config, workdir, stop, step, hooks, ckpt)
  except TrainingError as e:   # halted, non-finite loss, reward failure: keep what explains it
    hooks.on_stop(str(e))   # metrics.jsonl's record of why (api.open_run(...).messages)
    report(stopped=True)
    runs.close_stopped_run(config, workdir, hooks, ckpt)
    raise
  finally:
    stop.restore()
  report()
  runs.ensure_final_eval(meta, evaluator, state.params, hooks, total)
  summary = runs.make_summary(config, meta['base_eval'], meta['final_eval'], total,
                              wall_before + time.time() - t_start)
  summary['incidents'] = incident_log.count(ran=watched)
  return runs.finish_run(config, workdir, summary, hooks, ckpt)


def step_compute(config, model_cfg, metrics: dict, meta: dict) -> dict:
  """'compute/flops_step' (estimated, rft_jax/telemetry/flops.py; extra DAPO sampling rounds
  included) and 'compute/flops_cumulative' (kept in the checkpoint's meta across resumes; steps
  re-run after a remediation rewind count again: that compute was spent)."""
  f = flops.step_flops_from_config(config, metrics['response/len_mean'], model_cfg)
  step = f['total'] + (metrics.get('sampling/rounds', 1.0) - 1.0) * f['sampling']
  meta['flops'] = meta.get('flops', 0.0) + step
  return {'compute/flops_step': step, 'compute/flops_cumulative': meta['flops']}
