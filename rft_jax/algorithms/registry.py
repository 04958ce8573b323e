"""Name -> function registries for advantage estimators and policy losses.

Recipes pick entries by string (`config.algo.advantage = 'grpo'`, `config.algo.loss = 'ppo_clip'`).
A new estimator or loss is one decorated function; the train step never changes.
"""
from typing import Callable

ADVANTAGES: dict[str, Callable] = {}
LOSSES: dict[str, Callable] = {}
LOSS_AGGREGATIONS: dict[str, Callable] = {}


def _register(table: dict, kind: str, name: str):
  def wrap(fn):
    if name in table:
      raise ValueError(f'{kind} {name!r} is registered twice')
    table[name] = fn
    return fn
  return wrap


def register_advantage(name: str, *, min_group_size: int = 2, zero_group_mean: bool = True,
                       token_level: bool = False):
  """Registers an estimator `(rewards_b, valid_b, group_size, **options) -> adv_b`.

  min_group_size: the smallest rollout.group_size it is meaningful for (2: a group baseline).
  zero_group_mean: every group's advantages sum to 0 (then prepare_batch reports the monitor's
  'invariant/group_adv_mean_max'; otherwise that key is left out, as it does not apply).
  token_level: it also takes `mask_bl=` (the loss mask [B, L]), `kl_bl=` (per-token KL [B, L] or
  None) and `kl_coef=`, and then returns adv_bl [B, L]: the batch assembly gives it the KL in the
  reward per token instead of subtracting the sequence's sum from r_b.
  """
  def wrap(fn):
    fn.min_group_size, fn.zero_group_mean = min_group_size, zero_group_mean
    fn.token_level = token_level
    return _register(ADVANTAGES, 'advantage estimator', name)(fn)
  return wrap


def register_loss(name: str):
  return _register(LOSSES, 'policy loss', name)


def register_loss_agg(name: str):
  return _register(LOSS_AGGREGATIONS, 'loss aggregation', name)


def _get(table: dict, kind: str, name: str):
  # Importing the implementations fills the tables.
  # pylint: disable-next=g-import-not-at-top
  from rft_jax.algorithms import advantages, losses  # noqa: F401
  if name not in table:
    raise KeyError(f'unknown {kind} {name!r}; known: {", ".join(sorted(table))}')
  return table[name]


def get_advantage(name: str) -> Callable:
  return _get(ADVANTAGES, 'advantage estimator', name)


def get_loss(name: str) -> Callable:
  return _get(LOSSES, 'policy loss', name)


def get_loss_agg(name: str) -> Callable:
  return _get(LOSS_AGGREGATIONS, 'loss aggregation', name)


def names() -> dict[str, list[str]]:
  """All registered names by kind, e.g. for config validation."""
  # pylint: disable-next=g-import-not-at-top
  from rft_jax.algorithms import advantages, losses  # noqa: F401
  return {'advantage': sorted(ADVANTAGES), 'loss': sorted(LOSSES),
          'loss_agg': sorted(LOSS_AGGREGATIONS)}
