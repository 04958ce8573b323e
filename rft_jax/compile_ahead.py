"""The first step's train programs, compiled on a background thread while the run samples.

At a cold start the train side of a step is the run's largest compile: the fused reference +
policy program (rft_jax/algorithms/grpo_fused.py, one update per batch) or prepare_batch and
train_step (several updates, PPO). Their arguments' shapes, dtypes and shardings are known
before anything is sampled:

  state, ref_params      the arrays the first step passes (their shapes and shardings)
  rollout                jax.eval_shape of the sampler on a [B, P] int32 prompt batch (traces
                         it, compiles nothing), every field at the batch sharding
  rewards_b, valid_b     float32 [B*G] and bool [B*G] at the batch sharding
  batch                  jax.eval_shape of prepare_batch on those, at the batch sharding

so a thread lowers and compiles them (`jit(f).lower(*shapes).compile()`) while the main thread
compiles and runs the base evaluation and the first sampling and scoring. The step's calls then
find the executables in jit's cache: same shapes, dtypes and weak types, and shardings that are
the same or equivalent (the sampler's outputs come out as P('fsdp',) or P('tensor', 'fsdp')
where the batch sharding is P(('data', 'fsdp')): jit reuses the program for those; the trainer
moves a rollout laid out in a way not equivalent to the batch sharding there, e.g. replicated
prompts, hostdata.to_sharding). A mismatch would cost one more compile of the same program, not
a wrong result, and an error on the thread is reported as a message at the first step.
tests/test_recompile.py checks that each compiles once and on the thread: fused and two-pass
on one device, fused on a (1, 2, 1) mesh, PPO's. Timings in experiments/bench/README.md.

CPU and one process only: on a GPU or TPU, XLA's compile runs autotuning kernels and takes
device memory while the sampler holds its KV cache (not measured, not in the memory estimate),
and several processes (multi-host) have not been tested, so the trainer does not start it
there (run_ahead). RFT_JAX_COMPILE_AHEAD=0 in the environment turns it off (programs then
compile at their first call): a run that stops before its first step (a bad verifier, a stop in
the base evaluation) does not compile train programs it will not run, nor wait for them. The
test suite sets it (tests/conftest.py): many of its runs stop early on purpose, and with the
thread the error-path modules took ~30% longer; tests/test_recompile.py turns it back on.
"""
import atexit
import contextlib
import os
import signal
import sys
import threading

import jax
import jax.numpy as jnp


ENV = 'RFT_JAX_COMPILE_AHEAD'


def enabled() -> bool:
  """False where the environment sets RFT_JAX_COMPILE_AHEAD=0."""
  return os.environ.get(ENV, '1') != '0'


def run_ahead(faults, start: int, total: int) -> bool:
  """Whether trainer.run compiles its first step ahead: enabled(), on CPU, one process, no
  injected faults (they change the step's programs), a step left to run."""
  return (enabled() and jax.default_backend() == 'cpu' and jax.process_count() == 1
          and not faults and start < total)


def abstract(tree, sharding=None):
  """jax.Arrays and ShapeDtypeStructs -> ShapeDtypeStructs with their weak types and their own
  shardings, or `sharding` when given (what jit keys a program on), without holding the buffers
  (the step donates the state's); other leaves kept."""
  kinds = (jax.Array, jax.ShapeDtypeStruct)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=sharding or x.sharding, weak_type=x.weak_type)
                      if isinstance(x, kinds) else x, tree)


def rollout_shapes(sample, params, prompts: int, prompt_len: int):
  """The Rollout sample(params, tokens_bp, mask_bp, key) returns for a [prompts, prompt_len]
  int32 prompt batch, as ShapeDtypeStructs (jax.eval_shape: no compile, no device work);
  params: arrays or ShapeDtypeStructs."""
  tokens_bp = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.eval_shape(sample, params, tokens_bp, tokens_bp, key)


_RUNNING = set()   # the Ahead threads not joined yet (wait_all joins them at exit)


def wait_all() -> None:
  """Joins every compile thread still running (atexit runs it). A Ctrl-C while it waits ends the
  process at once with status 130 (os._exit: no C++ teardown under the compile), where Ctrl-C
  has Python's own handler (not where it is ignored, as for a job a shell put in the background,
  nor where an application installed its own: as rft_jax/stop_signals.py)."""
  if (_RUNNING and threading.current_thread() is threading.main_thread()
      and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, _exit_interrupted)
  for ahead in list(_RUNNING):
    ahead.wait()


def _exit_interrupted(*_) -> None:
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(130)   # pylint: disable=protected-access


class Ahead:
  """work() on a daemon thread under jax.set_mesh(mesh), the mesh context the calls that use its
  programs run under (None: none); wait() joins it. The context is per thread, and jit keys its
  programs on it: compiled under another, the call would compile its own.

  A process that exits while XLA compiles on the thread aborts ('terminate called ...', exit
  134), so the process waits for it at exit (wait_all, registered with atexit), not the run: a
  run that stops before its first step (a bad verifier, a stop in the base evaluation) reports
  at once, and the command's exit waits for the compile (seconds for the tiny model). An error
  on the thread is kept (self.error; wait() returns it) and not raised: the main thread's own
  call compiles the program again and raises it there, with the run's context around it."""

  def __init__(self, work, mesh):
    self.error = None
    self._thread = threading.Thread(target=self._run, args=(work, mesh),
                                    name='rft_jax-compile-ahead', daemon=True)
    atexit.unregister(wait_all)   # registered last, so run first: before the libraries' handlers
    atexit.register(wait_all)
    _RUNNING.add(self)
    self._thread.start()

  def _run(self, work, mesh) -> None:
    try:
      with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        work()
    except Exception as e:  # pylint: disable=broad-except  (see the class docstring)
      self.error = e
    finally:   # done: nothing left for wait_all (nor held by it in a long-lived process)
      _RUNNING.discard(self)

  def wait(self) -> str | None:
    """Joins the thread -> None, or its error in one line ('TypeError: ...')."""
    if self._thread.ident is not None:   # started (else there is nothing to wait for)
      self._thread.join()
    _RUNNING.discard(self)
    return None if self.error is None else f'{type(self.error).__name__}: {self.error}'


def compile_step(step_fns, state, ref_params, rollout, rewards_b, valid_b, prepare_kwargs: dict,
                 batch_sh) -> None:
  """Lowers and compiles the step's train programs (see first_step) for these abstract
  arguments; the batch of the two-pass path is jax.eval_shape of prepare at batch_sh."""
  prepare, train_step, fused = step_fns
  if fused is not None:
    fused.lower(state, ref_params, rollout, rewards_b, valid_b).compile()
    return
  args = (state.params, state.params if ref_params is None else ref_params, rollout, rewards_b,
          valid_b)
  prepare.lower(*args, **prepare_kwargs).compile()
  batch, _ = jax.eval_shape(prepare, *args, **prepare_kwargs)
  train_step.lower(state, abstract(batch, batch_sh)).compile()


def first_step(step_fns, state, ref_params, sample, params, prompts: int, prompt_len: int,
               group_size: int, batch_sh, mesh, prepare_kwargs: dict) -> Ahead:
  """Starts compiling the train programs of a step that samples with sample(...) on
  [prompts, prompt_len] prompts, G = group_size completions each.

  step_fns: (prepare, train_step, fused) as step_fns.make_step_fns returns them; fused when it
  is not None, else prepare(params, ref_params or params, rollout, rewards_b, valid_b,
  **prepare_kwargs) and train_step(state, batch). `state` as the step passes it (its controls
  placed as the loop places them); prepare_kwargs: ppo.prepare_args of it. mesh: see Ahead."""
  rows = prompts * group_size
  state, ref_params, params, prepare_kwargs = abstract(
      (state, ref_params, params, prepare_kwargs))
  rewards_b = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=batch_sh)
  valid_b = jax.ShapeDtypeStruct((rows,), jnp.bool_, sharding=batch_sh)
  # The sampler's trace here, on the main thread (0.15-0.3 s), before it traces the same sampler
  # for the first call; on the thread the two traces contend for the GIL (no gain measured).
  rollout = abstract(rollout_shapes(sample, params, prompts, prompt_len), batch_sh)
  return Ahead(lambda: compile_step(step_fns, state, ref_params, rollout, rewards_b, valid_b,
                                    prepare_kwargs, batch_sh), mesh)
