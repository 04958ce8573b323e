"""Train state, optimizer and the shared gradient-accumulation update.

Every train step in rft_jax is `step(state, batch) -> (state, metrics)`. Losses are written as
`loss_fn(params, microbatch) -> (loss_sum, (count, metric_sums))`: the step sums both over
micro-batches, then divides once, so the gradient is the exact global token mean whatever the
number of micro-batches (and, under jit over a data-parallel mesh, of shards).
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class TrainState:
  """step: int32 scalar, optimiser updates taken so far (skipped non-finite ones included).
  params: pure dict of float32 arrays (nnx.to_pure_dict layout). controls: run-time knobs the
  host may change between steps without recompiling (e.g. {'lr_scale', 'kl_coef'} as float32
  scalars), None = defaults. monitor: the failure monitor's state, or None.
  critic: PPO's critic {'params', 'opt_state'} (rft_jax/algorithms/critic.py), or None.
  kl_ctrl: the adaptive KL controller's state (rft_jax/algorithms/kl_control.py), or None.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  controls: Any = None
  monitor: Any = None
  critic: Any = None
  kl_ctrl: Any = None

  def control(self, name: str, default: float) -> jax.Array:
    if self.controls is None or name not in self.controls:
      return jnp.float32(default)
    return self.controls[name]


def lr_schedule(optim_cfg) -> optax.Schedule:
  """Linear warm-up from 0 to lr over warmup_steps, then constant (warmup_steps=0: constant)."""
  if optim_cfg.warmup_steps <= 0:
    return optax.constant_schedule(optim_cfg.lr)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, optim_cfg.lr, max(optim_cfg.warmup_steps, 1)),
       optax.constant_schedule(optim_cfg.lr)], [max(optim_cfg.warmup_steps, 1)])


def make_optimizer(optim_cfg) -> optax.GradientTransformation:
  """Global-norm clipping (grad_clip <= 0 disables it) followed by AdamW."""
  parts = []
  if optim_cfg.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(optim_cfg.grad_clip))
  parts.append(optax.adamw(lr_schedule(optim_cfg), b1=optim_cfg.b1, b2=optim_cfg.b2,
                           weight_decay=optim_cfg.weight_decay))
  return optax.chain(*parts)


def split_microbatches(batch: dict, n: int) -> dict:
  """[B, ...] leaves -> [n, B/n, ...] (rows of one micro-batch are consecutive)."""
  return jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)


def accumulate_grads(loss_fn: Callable, params, batch: dict, microbatches: int):
  """Sums (grad of loss_sum, count, metric sums) over micro-batches with lax.scan.

  Returns (grads of the global mean, metric means), both divided by the global count.
  """
  grad_fn = jax.grad(loss_fn, has_aux=True)
  mbs = split_microbatches(batch, microbatches)

  def body(carry, mb):
    g_acc, count_acc, sums_acc = carry
    g, (count, sums) = grad_fn(params, mb)
    return (jax.tree.map(jnp.add, g_acc, g), count_acc + count,
            jax.tree.map(jnp.add, sums_acc, sums)), None

  first = jax.tree.map(lambda x: x[0], mbs)
  _, (_, sums_shape) = jax.eval_shape(grad_fn, params, first)
  init = (jax.tree.map(jnp.zeros_like, params), jnp.float32(0.0),
          jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape))
  (g, count, sums), _ = jax.lax.scan(body, init, mbs)
  denom = jnp.maximum(count, 1.0)
  return jax.tree.map(lambda x: x / denom, g), jax.tree.map(lambda x: x / denom, sums)


def apply_gradients(state: TrainState, grads, tx: optax.GradientTransformation, schedule):
  """One optimiser update -> (new state, {'grad_norm', 'update_norm', 'param_norm', 'lr', ...}).

  The update is scaled by controls['lr_scale'] (default 1): for AdamW this is the learning rate
  times lr_scale. Non-finite gradients, or a learning rate times lr_scale that is not finite (an
  inf lr's warm-up gives 0 * inf = NaN), skip the update entirely (params and optimizer state
  kept, 'update_skipped' = 1) so one bad batch cannot destroy the run; the step counter still
  advances. (Scalars, not the update's norm: that would make every parameter wait for a reduction
  over the whole update.)
  """
  grad_norm = optax.tree.norm(grads)
  lr = schedule(state.step) * state.control('lr_scale', 1.0)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(lr)
  safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
  updates, opt_state = tx.update(safe_grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: u * state.control('lr_scale', 1.0), updates)
  params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
  stats = {'grad_norm': grad_norm,
           'update_norm': jnp.where(finite, optax.tree.norm(updates), 0.0),
           'param_norm': optax.tree.norm(params),
           'lr': lr,
           'update_skipped': 1.0 - finite.astype(jnp.float32)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), stats
