"""Checkpoints with orbax: the train state as arrays, the data iterator and run metadata as JSON.

Layout of a run's checkpoints: workdir/checkpoints/<step>/{state, data, meta}. `state` is the
TrainState pytree (params, optimizer state, step); `data` the grain iterator state; `meta` a small
JSON dict (e.g. the base policy's held-out accuracy, so a resumed run still reports it). The
sampling RNG is derived as fold_in(key(seed), step), so (seed, step) restore it exactly.

Standalone parameter directories (the shipped base policy, `init_from`) hold just the params.
"""
import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def _abstract(tree, shardings=None):
  """ShapeDtypeStructs (carrying the target shardings, when given) to restore into."""
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager with the three items above."""

  def __init__(self, directory: str, keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def delete_after(self, step: int) -> list[int]:
    """Deletes checkpoints newer than `step` (a rewound run's abandoned future); returns them."""
    gone = [s for s in self.all_steps() if s > step]
    for s in gone:
      self._manager.delete(s)
    return gone

  def all_steps(self) -> list[int]:
    """Steps of the complete checkpoints on disk, ascending."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
    """Saves and waits: a checkpoint reported as written is complete on disk."""
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, like_state: Any, shardings: Any = None):
    """Restores (state, data_state, meta) into the structure/shardings of `like_state`."""
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(like_state, shardings)),
        data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
    return out['state'], out['data'], out['meta']

  def close(self) -> None:
    self._manager.close()


def save_params(path: str, params: Any) -> None:
  """Writes a params pytree to a standalone orbax directory (overwrites)."""
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.abspath(path), params, force=True)


def load_params(path: str, like_params: Any, shardings: Any = None) -> Any:
  """Reads params saved by save_params into the structure (and shardings) of like_params."""
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'no parameter checkpoint at {path}')
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(path, _abstract(like_params, shardings))
