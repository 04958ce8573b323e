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
  step: jax.Array          # int32 scalar: optimiser updates applied so far
  params: Any              # pure dict of float32 arrays (nnx.to_pure_dict layout)
  opt_state: Any


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
  """One optimiser update -> (new state, {'grad_norm', 'update_norm', 'param_norm', 'lr'})."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  stats = {'grad_norm': optax.tree.norm(grads), 'update_norm': optax.tree.norm(updates),
           'param_norm': optax.tree.norm(params), 'lr': schedule(state.step)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), stats
