"""Mesh construction and the NamedShardings of params, optimizer state and batches.

Mesh axes are ('data', 'fsdp', 'tensor'). Parameters carry logical axis names (see
rft_jax/models/llama.py); LOGICAL_RULES maps them to mesh axes. Batches are split over
('data', 'fsdp') along their leading (row) dimension.
"""
import math
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')
LOGICAL_RULES = {
    'batch': BATCH_AXES,
    'vocab': 'tensor',
    'embed': 'fsdp',
    'heads': 'tensor',
    'kv_heads': 'tensor',
    'mlp': 'tensor',
}


class MeshError(ValueError):
  """A mesh that cannot be built on the devices present (one-line message)."""


def mesh_shape(mesh_cfg: Any, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 ('the rest') in config.mesh to a concrete (data, fsdp, tensor) shape."""
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  known = math.prod(s for s in sizes if s != -1)
  if sizes.count(-1) > 1:
    raise MeshError('config.mesh: at most one axis may be -1')
  if -1 in sizes:
    if num_devices % known:
      raise MeshError(f'config.mesh: {num_devices} devices are not divisible by the fixed axes '
                      f'(product {known})')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) > num_devices:
    raise MeshError(f'config.mesh={dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices '
                    f'but only {num_devices} are present')
  return tuple(sizes)


def make_mesh(mesh_cfg: Any, devices=None) -> Mesh:
  """Builds an Auto-axis mesh (explicit sharding-in-types is not used here)."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_cfg, len(devices))
  n = math.prod(shape)
  return Mesh(np.asarray(devices[:n]).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))


def logical_to_mesh(spec: P) -> P:
  """P('embed', 'mlp') -> P('fsdp', 'tensor') under LOGICAL_RULES (unknown names replicate)."""
  return P(*(LOGICAL_RULES.get(name) if name is not None else None for name in spec))


def param_shardings(abstract_state: nnx.State, mesh: Mesh) -> dict:
  """Pure-dict pytree of NamedShardings matching nnx.to_pure_dict(params)."""
  specs = nnx.to_pure_dict(nnx.get_partition_spec(abstract_state))
  return jax.tree.map(lambda s: NamedSharding(mesh, logical_to_mesh(s)), specs,
                      is_leaf=lambda x: isinstance(x, P))


def opt_state_shardings(tx: optax.GradientTransformation, params_abstract, params_shardings,
                        mesh: Mesh):
  """Optimizer-state shardings: param-shaped leaves follow their param, the rest replicate."""
  state_abstract = jax.eval_shape(tx.init, params_abstract)
  return optax.tree_utils.tree_map_params(
      tx, lambda _, sharding: sharding, state_abstract, params_shardings,
      transform_non_params=lambda _: replicated(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over ('data', 'fsdp'); other dimensions replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh) -> int:
  """Rows of every batch must be a multiple of this (the data x fsdp size)."""
  return mesh.shape['data'] * mesh.shape['fsdp']
