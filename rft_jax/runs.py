"""A run's workdir lifecycle, shared by the RL and SFT loops: create or resume, summarise, close.

  workdir/config.json           the latest invocation's config; a later invocation must share
                                its recipe, model and algorithm (workdir_config.py)
  workdir/initial_policy.json   the initial (reference) policy's source; a resume must read the
                                same weights (initial_policy.py)
  workdir/checkpoints/<step>/   orbax: train state, data-iterator state, run metadata
  workdir/metrics.jsonl         one line per step / eval / message / incident
  workdir/tb/                   TensorBoard events
  workdir/run.png               the run's main signals
  workdir/summary.json          base vs final held-out accuracy, steps, wall seconds
"""
import contextlib
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from rft_jax import atomic_file, components, incidents, initial_policy, jsonfile, programs
from rft_jax import config as config_lib
from rft_jax.workdir_config import (  # noqa: F401  (runs.X for tools and tests)
    RUN_CONFIG, check_workdir_config, record_workdir_config)
from rft_jax.algorithms import train_state as ts
from rft_jax.checkpoint import Checkpointer, CheckpointSaveError
from rft_jax.parallel import mesh as meshlib
from rft_jax.stop_signals import (  # noqa: F401  (runs.X for the trainers, main and tests)
    SetupInterrupted, StopRequest, preempt_at_once)
from rft_jax.telemetry import sinks
from rft_jax.telemetry.plot import plot_run


class TrainingError(RuntimeError):
  """A run that had to stop (non-finite loss, a halting incident, a reward failure)."""


class Preempted(RuntimeError):
  """The run stopped on SIGTERM/SIGINT after checkpointing its last finished step."""


def check_finite(metrics: dict, step: int, ckpt: Checkpointer, workdir: str,
                 stop_on_loss: bool = True, why: str = '') -> str:
  """Stops the run (TrainingError; callers log the step first, so its values show the cause,
  and call this before anything of the step is saved or evaluated) when the
  parameters are no longer finite ('param_norm': every later step would train on garbage, and
  its checkpoints would replace the good ones), or, with stop_on_loss (no failure monitor), when
  the loss or the gradient norm is not. Returns what was not finite ('' if all was), for the
  caller to report (the update of a non-finite gradient is skipped on the device). With
  monitor.mode='auto' the trainer calls this only when remediation did not restore a checkpoint
  from before the step (the failure monitor's nonfinite_params incident); `why` it did not
  (Remediator.why_no_restore) goes into the error line."""
  bad = ' and '.join(k for k in ('loss', 'grad_norm')
                     if k in metrics and not np.isfinite(metrics[k]))
  if 'param_norm' in metrics and not np.isfinite(metrics['param_norm']):
    raise TrainingError(f'the parameters are no longer finite after step {step} (param_norm '
                        f'{metrics["param_norm"]}, grad_norm {metrics.get("grad_norm")}); '
                        f'{why + "; " if why else ""}'
                        f'{kept_note(ckpt, workdir)}')   # listed only now: it reads the disk
  if bad and stop_on_loss:
    raise TrainingError(f'non-finite {bad} at step {step}; {kept_note(ckpt, workdir)}')
  return bad


def check_skipped_streak(streak: int, limit: int, bad: str, step: int, ckpt: Checkpointer,
                         workdir: str, skipped: int | None = None, updates: int = 1,
                         why: str = '') -> None:
  """Stops the run (TrainingError) when the last `streak` steps, up to `step`, all had a
  non-finite loss or gradient (`bad`, check_finite's return), and so skipped updates, and streak
  >= limit (config.monitor.max_skipped_steps): the failure monitor reports such a step and the
  run goes on, which helps after one bad batch, but a streak means nothing is being learned (e.g.
  parameters finite but huge, or a loss that is NaN for every batch). With monitor.mode='auto'
  the trainer calls this only when remediation did not restore a checkpoint from before the
  streak (incident skipped_streak). skipped: how many of the streak's streak * updates optimiser
  updates (`updates` per step) were skipped (None: not known); `why` auto did not restore."""
  if streak >= limit:
    first, total = step - streak + 1, streak * updates
    what = ('so their updates were skipped, all or some' if skipped is None else
            'so every update was skipped' if updates == 1 and skipped == total else
            f'so {skipped} of their {total} updates were skipped')
    before = [s for s in ckpt.all_steps() if s < first]
    raise TrainingError(f'{streak} steps in a row (steps {first}-{step}) had a non-finite '
                        f'{bad}, {what} (config.monitor.max_skipped_steps={limit}); '
                        f'{why + "; " if why else ""}stopped; '
                        f'the latest checkpoint from before step {first}: '
                        f'{f"step {before[-1]}" if before else "none kept"}, in {workdir}')


def kept_note(ckpt: Checkpointer, workdir: str) -> str:
  """A stopped run's last words: the checkpoint kept, or none yet (the command starts over)."""
  step = ckpt.latest_step()
  if step is None:
    return (f'stopped before its first checkpoint, so none is kept in {workdir}; the same '
            'command starts the run over')
  return f'stopped with the last good checkpoint (step {step}) kept in {workdir}'


def next_batch(data_it, step: int):
  """next(data_it); a malformed record (the pipeline raises ValueError naming it) stops the
  run with one line instead of a traceback through the input pipeline."""
  try:
    return next(data_it)
  except ValueError as e:
    raise TrainingError(f'bad input data at step {step}: {str(e).strip().splitlines()[-1]} '
                        "(config.task.bad_records='skip' skips such records)") from None


def preempt(config, workdir: str, stop: StopRequest, step: int, hooks, ckpt: Checkpointer):
  """After the stop's checkpoint was saved (and verified): the stop's line to the hooks (the log
  records why the run ended; the console leaves it to the command line, which prints the
  exception), run.png of the steps run, as at the end of a run (~1-2 s, most of it importing
  matplotlib; the checkpoint is already safe should a grace period run out meanwhile), sinks and
  checkpointer closed (close_stopped_run); then raise Preempted with that line: which step,
  where its checkpoint is, how to resume."""
  line = (f'{stop.signal_name} after step {step}; its checkpoint is '
          f'{os.path.join(ckpt.directory, str(step))}; run the same command again to resume')
  hooks.on_stop(line)
  close_stopped_run(config, workdir, hooks, ckpt)
  raise Preempted(line)


def init_state(params, tx, state_shardings, controls=None, monitor=None, tx_key=None):
  """Fresh TrainState built on device with the target shardings. tx_key: what tx is a function
  of (programs.config_key(config.optim)), to share the program (rft_jax/programs.py)."""
  make = lambda p, controls, monitor: ts.TrainState(
      step=jnp.int32(0), params=p, opt_state=tx.init(p), controls=controls, monitor=monitor)
  build = lambda: jax.jit(make, out_shardings=state_shardings)
  key = (tx_key, programs.tree_key(state_shardings))
  init = build() if tx_key is None else programs.shared('init_state', key, build)
  return init(params, controls, monitor)


def state_shardings(c: components.Components, tx, controls=None, monitor=None):
  """Params and optimizer state per the logical rules; step, controls, monitor replicated."""
  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), c.params)
  rep = meshlib.replicated(c.mesh)
  return ts.TrainState(step=rep, params=c.param_shardings,
                       opt_state=meshlib.opt_state_shardings(tx, like, c.param_shardings, c.mesh),
                       controls=jax.tree.map(lambda _: rep, controls),
                       monitor=jax.tree.map(lambda _: rep, monitor))


def write_summary(workdir: str, summary: dict) -> None:
  with atomic_file.replacing(os.path.join(workdir, 'summary.json')) as tmp, open(tmp, 'w') as f:
    json.dump(summary, f, indent=2)   # in the run's order: a rerun prints the same table


def updates_per_step(config) -> int:
  """Optimiser updates one step makes: an RL step's rollout batch gets algo.updates_per_batch
  epochs of algo.minibatches updates (PPO; GRPO-family: one per epoch); SFT and DPO: 1."""
  if 'sft' in config or 'dpo' in config or 'algo' not in config:
    return 1
  return int(config.algo.get('updates_per_batch', 1)) * config_lib.ppo_minibatches(config.algo)


def make_summary(config, base_eval: dict, final_eval: dict, steps: int, wall_s: float) -> dict:
  """summary.json fields (documented in the README)."""
  k = config.eval.k
  return {
      'recipe': config.name,
      'variant': config.get('variant'),   # None: the recipe does not say (config_schema)
      'recipe_file': config.get('recipe_file'),   # None: a config not loaded from a file
      'steps': steps, 'optim_updates': steps * updates_per_step(config),
      'wall_s': round(wall_s, 1), 'base_greedy_acc': base_eval['eval/greedy_acc'],
      f'base_mean@{k}_acc': base_eval[f'eval/mean@{k}_acc'],
      'final_greedy_acc': final_eval['eval/greedy_acc'],
      f'final_mean@{k}_acc': final_eval[f'eval/mean@{k}_acc'],
      'eval_prompts': config.eval.num_prompts, 'eval_k': k,
  }


class RunScope(contextlib.ExitStack):
  """What an open run holds (data iterator, checkpointer and sinks from open_run, the loops'
  reward workers: `callback(close)`), closed last-added first when the run's `with` block ends,
  however it ends: a finished or stopped run's finish_run / close_stopped_run closed some already
  (twice is harmless); any other error (the base eval, a worker start, a restore, SIGTERM in
  set-up) leaves no workers, open files, muted orbax logging or threads (but the first step's
  compile: compile_ahead.py) in a process that goes on (api.train in a notebook). The error
  goes on unchanged: a close failing under it is a line on stderr."""

  def __exit__(self, exc_type, exc, tb) -> bool:
    if exc is None:
      return super().__exit__(exc_type, exc, tb)
    try:
      super().__exit__(exc_type, exc, tb)
    except Exception as e:  # pylint: disable=broad-exception-caught  (the run's error goes on)
      print(f'closing the stopped run: {type(e).__name__}: {e}', file=sys.stderr)
    return False


def open_run(config, workdir, c: components.Components, data_it, hooks_extra=(), *,
             scope: RunScope, console_keys=sinks.DEFAULT_CONSOLE_KEYS, controls=None,
             monitor=None, extra=None, uses_reference=True):
  """Creates or resumes a run -> (state, state shardings, checkpointer, meta, hooks, start step).

  Resuming restores the train state onto this mesh, the data iterator and the run metadata from
  the latest checkpoint; metrics logged after that checkpoint are dropped from metrics.jsonl.
  extra: (fields, shardings), two dicts of further TrainState fields (e.g. PPO's critic, the
  adaptive KL state: rft_jax/algorithms/ppo.py extra_state), already placed; checkpointed too.
  uses_reference: the run rebuilds a reference policy from the initial one (KL, DPO), so a
  resume must start from the same initial policy (initial_policy.check).
  scope: the caller's RunScope; data_it, the checkpointer and the sinks are closed with it.
  """
  scope.callback(data_it.close)
  check_workdir_config(config, workdir)
  tx = ts.make_optimizer(config.optim)   # what the step functions update with
  shardings = state_shardings(c, tx, controls, monitor)
  state = init_state(c.params, tx, shardings, controls, monitor,
                     tx_key=programs.config_key(config.optim))
  if extra is not None:
    shardings, state = shardings.replace(**extra[1]), state.replace(**extra[0])
  ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'), keep=config.train.keep_checkpoints)
  scope.callback(ckpt.close)
  # The reference policy is rebuilt from the initial one: resuming must not swap it.
  resuming = uses_reference and ckpt.latest_step()
  initial = initial_policy.check(config, workdir) if resuming else None
  meta, start, reference = {}, 0, None
  while ckpt.latest_step():   # newest first; one that fails to restore is set aside
    start = ckpt.latest_step()
    try:
      state, data_state, meta, reference = ckpt.restore(
          start, state, shardings, like_reference=c.params,
          reference_shardings=c.param_shardings)
    except Exception as e:  # pylint: disable=broad-exception-caught
      first = str(e).splitlines()[0] if str(e) else ''
      reason = f'{type(e).__name__}: {first.split(". See full TensorStore details")[0]}'
      if ckpt.verified(start):   # its files are intact, so it is this config that differs
        raise components.SetupError(
            f'checkpoint {start} in {workdir} does not fit this config ({reason}); resume with '
            'the config that wrote it, or use a new --workdir') from None
      ckpt.quarantine(start, f'restore failed: {reason}')
      meta, start = {}, 0
      continue
    data_it.set_state(data_state)
    break
  if start > config.train.steps and 'final_eval' not in meta:
    raise components.SetupError(
        f'config.train.steps={config.train.steps} is below the step of the unfinished run in '
        f'{workdir} (checkpoint {start}); set train.steps to {start} or more to finish it')
  if start < config.train.steps:   # an extension: the final eval is the new last step's
    meta.pop('final_eval', None)
  if start < config.train.steps or 'final_eval' not in meta or not os.path.isfile(
      os.path.join(workdir, RUN_CONFIG)):   # a finished run's keeps the config it trained with
    record_workdir_config(config, workdir)
  if jax.process_index() == 0:
    if initial is not None and start:   # checked on resume: the same policy, its files' stats
      initial_policy.record(workdir, initial)
    elif not start or not os.path.isfile(os.path.join(workdir, initial_policy.RECORD)):
      initial_policy.record(workdir, initial_policy.describe(config))   # (a resume unchecked
      # because the run has no reference keeps the record of the policy it started from)
  primary = jax.process_index() == 0   # with several processes only process 0 logs
  hooks = sinks.HookList() if not primary else sinks.make_sinks(
      workdir, console=config.telemetry.console, jsonl=config.telemetry.jsonl,
      tensorboard=config.telemetry.tensorboard, total_steps=config.train.steps,
      resume_step=start, console_keys=console_keys,
      wandb_project=config.telemetry.get('wandb_project', ''), run_name=config.name)
  scope.callback(hooks.close)
  for h in hooks_extra:
    hooks.append(h)
  for problem in ckpt.problems:   # corrupt or partial checkpoints: reported, never loaded
    hooks.on_message(problem)
  # the recipe's variant (tools.scaling reads it) and file, where the config says them
  recipe = {k: config[k] for k in ('variant', 'recipe_file') if k in config}
  hooks.on_start(start, config.train.steps, {
      'recipe': config.name, **recipe, 'workdir': workdir,
      'params': f'{c.model_cfg.num_params():,}',
      'devices': f'{c.mesh.size} x {jax.devices()[0].platform}',
      'mesh': 'x'.join(str(c.mesh.shape[a]) for a in meshlib.MESH_AXES)
              + ' (data x fsdp x tensor)'})   # with a -1 resolved
  if c.mesh.size < jax.device_count():   # legal on one host, and easy to do by mistake
    hooks.on_message(f'config.mesh={dict(c.mesh.shape)} uses {c.mesh.size} of the '
                     f'{jax.device_count()} devices (set an axis to -1 to use them all)')
  if start and start < config.train.steps:
    hooks.on_message(f'resumed from checkpoint at step {start}')
  for warning in config_lib.start_warnings(config) if start < config.train.steps else ():
    hooks.on_message(warning)   # legal, likely not meant (one line each)
  return state, shardings, ckpt, meta, hooks, start, reference


def save_checkpoint(config, ckpt: Checkpointer, step: int, state, data_state: dict, meta: dict,
                    hooks, reference=None, stopping: bool = False,
                    reference_before_reset=None) -> bool:
  """Saves a checkpoint (reference, reference_before_reset: Checkpointer.save's); on failure
  (full disk, I/O error) keeps training if at least config.train.min_good_checkpoints
  (default 1) verified checkpoints exist, else stops. The final step's checkpoint (or the one a
  stop request writes) must be saved: without it the trained policy is not on disk, so its
  failure stops the run with an error.

  Returns whether the checkpoint was written. Raises TrainingError when the run must stop.
  """
  try:
    ckpt.save(step, state, data_state, meta, reference=reference,
              reference_before_reset=reference_before_reset)
    return True
  except CheckpointSaveError as e:
    good, need = ckpt.all_steps(), config.train.get('min_good_checkpoints', 1)
    if step >= config.train.steps or stopping:
      kept = f'step {good[-1]}' if good else 'none'
      raise TrainingError(
          f'the {"final" if step >= config.train.steps else "stop"} checkpoint (step {step}) was '
          f'not saved: {e}; the policy trained up to it is not on disk (latest good checkpoint: '
          f'{kept}); free space and run the same command to {_resume_from(good)}') from None
    if len(good) >= need:
      latest = f', the latest at step {good[-1]}' if good else ''
      hooks.on_message(f'checkpoint at step {step} NOT saved: {e}; training goes on with '
                       f'{len(good)} good checkpoint(s){latest}')
      return False
    raise TrainingError(
        f'checkpoint at step {step} not saved: {e}; only {len(good)} good checkpoint(s) on '
        f'disk (config.train.min_good_checkpoints={need}), so the run stops rather than train '
        f'on without it; free space and run the same command to {_resume_from(good)}') from None


def _resume_from(good: list[int]) -> str:
  """What the same command does next, given the good checkpoints' steps."""
  return f'resume from step {good[-1]}' if good else 'start the run over (no checkpoint yet)'


def finish_complete_run(config, workdir, opened) -> dict:
  """A second invocation of a finished run: say so, re-emit its summary, train nothing."""
  _, _, ckpt, meta, hooks, start, _ = opened
  done = (f'{start}/{start} steps' if start == config.train.steps else
          f'{start} steps, more than config.train.steps={config.train.steps}')
  hooks.on_message(f'run already complete ({done}) in {workdir}; delete the workdir or raise '
                   f'config.train.steps above {start} to train further')
  path, summary = os.path.join(workdir, 'summary.json'), None
  if os.path.exists(path):   # the finished run's own record (with fields like 'incidents')
    try:   # torn or edited, or of an earlier step (an extension cut short): rebuilt
      summary = jsonfile.read_object(path)
      if summary.get('steps') != start:
        raise ValueError(f"{path} is of step {summary.get('steps')}, the checkpoint's {start}")
    except (OSError, ValueError) as e:
      hooks.on_message(f'{e}; summary.json rewritten from the checkpoint')
      summary = None
  if summary is None:
    summary = make_summary(config, meta['base_eval'], meta['final_eval'], start, meta['wall_s'])
    if not (config_lib.is_sft(config) or config_lib.is_dpo(config)):   # as the RL loop writes it
      summary['incidents'] = incidents.logged_count(config, workdir, start)
  return finish_run(config, workdir, summary, hooks, ckpt, plot=False)


def ensure_base_eval(meta: dict, evaluate, params, hooks) -> None:
  """meta['base_eval'], the starting policy's eval, logged at step 0 as eval/base_* (every loop:
  RL, DPO, SFT); a resumed run has it from its checkpoint's metadata."""
  if 'base_eval' not in meta:
    meta['base_eval'] = evaluate(params)
    hooks.on_eval(0, {k.replace('eval/', 'eval/base_'): v for k, v in meta['base_eval'].items()})


def ensure_final_eval(meta: dict, evaluate, params, hooks, total: int) -> None:
  """meta['final_eval'] for a run resumed with train.steps at its checkpoint's step, where the
  loop ran no step (and so no last-step eval): evaluated now."""
  if 'final_eval' not in meta:
    meta['final_eval'] = evaluate(params)
    hooks.on_eval(total, meta['final_eval'])


def draw_plot(config, workdir, hooks) -> None:
  """run.png from metrics.jsonl (process 0, config.telemetry.plot); with config.telemetry.jsonl
  off there is none (a message says so)."""
  if jax.process_index() != 0 or not config.telemetry.plot:
    return
  if config.telemetry.jsonl:
    plot_run(os.path.join(workdir, 'metrics.jsonl'), os.path.join(workdir, 'run.png'),
             title=config.name)
  else:
    hooks.on_message('run.png not drawn: it is drawn from metrics.jsonl, and '
                     'config.telemetry.jsonl is off')


def finish_run(config, workdir, summary, hooks, ckpt, plot=True) -> dict:
  """Writes summary.json and the plot (process 0), closes sinks and checkpointer. A plot that
  cannot be written (a full disk) is a message: the run itself finished."""
  if jax.process_index() == 0:
    write_summary(workdir, summary)
  if plot:
    try:
      draw_plot(config, workdir, hooks)
    except (OSError, ValueError, RuntimeError) as e:
      hooks.on_message(f'run.png not drawn ({os.path.join(workdir, "run.png")}): '
                       f'{type(e).__name__}: {e}')
  hooks.on_end(summary)
  hooks.close()
  ckpt.close()
  return summary


def close_stopped_run(config, workdir, hooks, ckpt) -> None:
  """For a run stopped by an error (TrainingError: halted by the monitor, non-finite loss,
  reward failure) or on request (preempt): the plot of the steps it ran, sinks flushed and
  closed, pending checkpoint writes finished. No summary.json: the run did not finish. Problems
  here are reported as a message, never raised over the error that stopped the run."""
  try:
    draw_plot(config, workdir, hooks)
  except Exception as e:  # pylint: disable=broad-except
    hooks.on_message(f'run.png not drawn: {type(e).__name__}: {e}')
  hooks.close()
  ckpt.close()
