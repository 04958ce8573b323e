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
where the batch sharding is P(('data', 'fsdp')): jit reuses the program for those). A mismatch
would cost one more compile of the same program, not a wrong result; tests/test_recompile.py
checks that each compiles once, on the thread, on one device and on a (1, 2, 1) mesh.
Timings in experiments/bench/README.md.

One process only: with several (multi-host) it has not been tested or measured, so the trainer
does not start it there. RFT_JAX_COMPILE_AHEAD=0 in the environment turns it off (programs then
compile at their first call): a run that stops before its first step (a bad verifier, a stop in
the base evaluation) does not compile train programs it will not run, nor wait for them. The
test suite sets it (tests/conftest.py): many of its runs stop early on purpose, and with the
thread the error-path modules took ~30% longer; tests/test_recompile.py turns it back on.
"""
import contextlib
import os
import threading

import jax
import jax.numpy as jnp


ENV = 'RFT_JAX_COMPILE_AHEAD'


def enabled() -> bool:
  """False where the environment sets RFT_JAX_COMPILE_AHEAD=0."""
  return os.environ.get(ENV, '1') != '0'


def abstract(tree):
  """jax.Arrays -> jax.ShapeDtypeStructs with their shardings and weak types (what jit keys a
  program on), without holding the buffers (the step donates the state's); other leaves kept."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
                      if isinstance(x, jax.Array) else x, tree)


def rollout_shapes(sample, params, prompts: int, prompt_len: int):
  """The Rollout sample(params, tokens_bp, mask_bp, key) returns for a [prompts, prompt_len]
  int32 prompt batch, as ShapeDtypeStructs (jax.eval_shape: no compile, no device work)."""
  tokens_bp = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.eval_shape(sample, abstract(params), tokens_bp, tokens_bp, key)


class Ahead:
  """work() on a daemon thread under jax.set_mesh(mesh), the mesh context the calls that use its
  programs run under (None: none); wait() joins it. The context is per thread, and jit keys its
  programs on it: compiled under another, the call would compile its own.

  The owner must wait() before its process exits, however it stops (the trainer registers it
  with the run's scope, `register`): a process that exits while XLA compiles on the thread aborts
  ('terminate called ...', exit 134). An error on the thread is kept (self.error) and not
  raised: the main thread's own call compiles the program again and raises it there, with the
  run's context around it."""

  def __init__(self, work, mesh, register=None):
    """register(wait), when given, is called before the thread starts (the trainer passes its
    run scope's callback): an exception that lands in between leaves nothing unwaited."""
    self.error = None
    self._thread = threading.Thread(target=self._run, args=(work, mesh),
                                    name='rft_jax-compile-ahead', daemon=True)
    if register is not None:
      register(self.wait)
    self._thread.start()

  def _run(self, work, mesh) -> None:
    try:
      with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        work()
    except Exception as e:  # pylint: disable=broad-except  (see the class docstring)
      self.error = e

  def wait(self) -> None:
    if self._thread.ident is not None:   # started (else there is nothing to wait for)
      self._thread.join()


def at(tree, sharding):
  """ShapeDtypeStructs (or arrays) -> ShapeDtypeStructs at `sharding`."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding,
                                                     weak_type=s.weak_type), tree)


def first_step(step_fns, state, ref_params, sample, params, prompts: int, prompt_len: int,
               group_size: int, batch_sh, mesh, prepare_kwargs: dict, register=None) -> Ahead:
  """Starts compiling the train programs of a step that samples with sample(...) on
  [prompts, prompt_len] prompts, G = group_size completions each.

  step_fns: (prepare, train_step, fused) as step_fns.make_step_fns returns them; fused when it
  is not None, else prepare(params, ref_params or params, rollout, rewards_b, valid_b,
  **prepare_kwargs) and train_step(state, batch). `state` as the step passes it (its controls
  placed as the loop places them); prepare_kwargs: ppo.prepare_args of it. mesh, register: see
  Ahead."""
  prepare, train_step, fused = step_fns
  rows = prompts * group_size
  state, ref_params, prepare_kwargs = abstract((state, ref_params, prepare_kwargs))
  rollout = at(rollout_shapes(sample, params, prompts, prompt_len), batch_sh)
  rewards_b = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=batch_sh)
  valid_b = jax.ShapeDtypeStruct((rows,), jnp.bool_, sharding=batch_sh)

  def work():
    if fused is not None:
      fused.lower(state, ref_params, rollout, rewards_b, valid_b).compile()
      return
    args = (state.params, state.params if ref_params is None else ref_params, rollout,
            rewards_b, valid_b)
    prepare.lower(*args, **prepare_kwargs).compile()
    batch, _ = jax.eval_shape(prepare, *args, **prepare_kwargs)
    train_step.lower(state, at(batch, batch_sh)).compile()
  return Ahead(work, mesh, register)
