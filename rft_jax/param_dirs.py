"""Standalone parameter directories: the shipped base policy, `init_from`, `tools.checkpoint
export`'s and `tools.export_base`'s output. Orbax StandardCheckpointer directories holding just a
params pytree (run checkpoints, with optimiser state, data state and manifests: checkpoint.py).
"""
import os
from typing import Any

import jax


def orbax_module():
  """orbax.checkpoint, imported at first use (~0.16 s of imports): a process that never saves
  or restores (tools.bench's workload) does not pay for it."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp


def abstract(tree, shardings=None):
  """ShapeDtypeStructs (carrying the target shardings, when given) to restore into."""
  sds = lambda x, s=None: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
  return jax.tree.map(sds, tree) if shardings is None else jax.tree.map(sds, tree, shardings)


def check_params_out(path: str) -> None:
  """FileExistsError unless `path` is absent, empty, or a params directory written before (it
  has orbax's _CHECKPOINT_METADATA): save_params replaces the whole directory, and a mistyped
  --out once deleted whatever was there."""
  if os.path.isdir(path) and os.listdir(path) and not os.path.isfile(
      os.path.join(path, '_CHECKPOINT_METADATA')):
    raise FileExistsError(f'{path} exists and is not a parameter checkpoint (no orbax '
                          '_CHECKPOINT_METADATA); refusing to replace it: give a new directory')
  if os.path.exists(path) and not os.path.isdir(path):
    raise FileExistsError(f'{path} exists and is a file; give a new directory')


def save_params(path: str, params: Any) -> None:
  """Writes a params pytree to a standalone orbax directory, replacing an earlier one there
  (check_params_out: never another directory)."""
  ocp = orbax_module()
  check_params_out(path)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.abspath(path), params, force=True)


def check_params(path: str, like_params: Any) -> None:
  """FileNotFoundError / ValueError (first line: what is wrong) unless `path` is a params
  directory of save_params whose arrays have the names and shapes of like_params (arrays or
  ShapeDtypeStructs). Reads orbax's metadata only, never an array: load_params checks this
  before reading (orbax's failed async reads log pages of tracebacks), --validate_only too."""
  path = os.path.abspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'no parameter checkpoint at {path}')
  if not os.path.isfile(os.path.join(path, '_CHECKPOINT_METADATA')):
    raise ValueError(f'{path} is not a parameter checkpoint (no orbax _CHECKPOINT_METADATA)')
  with orbax_module().StandardCheckpointer() as ckptr:
    saved = ckptr.metadata(path).item_metadata
  shapes = lambda tree: {'/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in p):
                         tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  have, want = shapes(saved), shapes(like_params)
  for name in sorted(set(have) | set(want)):
    if have.get(name) != want.get(name):
      raise ValueError(f'does not match config.model: {name} is {have.get(name) or "absent"} '
                       f'there, {want.get(name) or "absent"} in this model')


def load_params(path: str, like_params: Any, shardings: Any = None) -> Any:
  """Reads params saved by save_params into the structure (and shardings) of like_params
  (check_params first)."""
  ocp = orbax_module()
  check_params(path, like_params)
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(os.path.abspath(path), abstract(like_params, shardings))
