"""Logical axis names -> mesh axes, and activation sharding constraints by logical name.

Kept free of model and optimizer imports so rft_jax/models can use it (models sit below
parallel/mesh.py in the import order). Mesh axes are ('data', 'fsdp', 'tensor').

  params       'vocab' -> tensor, 'embed' -> fsdp, 'heads' / 'kv_heads' / 'mlp' -> tensor
  activations  'batch' -> (data, fsdp); the same names for their feature dimensions, except the
               residual stream's E, which stays whole (None): FSDP gathers weights, not activations
"""
import math

import jax
from jax.sharding import PartitionSpec as P

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


def logical_to_mesh(spec) -> P:
  """P('embed', 'mlp') -> P('fsdp', 'tensor') under LOGICAL_RULES (unknown names replicate)."""
  return P(*(LOGICAL_RULES.get(name) if name is not None else None for name in spec))


def _axes(entry) -> tuple:
  if entry is None:
    return ()
  return entry if isinstance(entry, tuple) else (entry,)


def constrain(x: jax.Array, logical: tuple) -> jax.Array:
  """with_sharding_constraint(x, logical names) under the mesh set by `jax.set_mesh`.

  A no-op without a mesh context (plain jit, one device), so the model runs unchanged anywhere.
  A dimension whose size the mapped mesh axes do not divide is left unconstrained (e.g. an eval
  batch of 5 rows on data=2), as are mesh axes the current mesh lacks.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  spec = []
  for dim, name in zip(x.shape, logical):
    axes = tuple(a for a in _axes(LOGICAL_RULES.get(name) if name else None) if a in sizes)
    if not axes or dim % math.prod(sizes[a] for a in axes):
      spec.append(None)
    else:
      spec.append(axes if len(axes) > 1 else axes[0])
  return jax.lax.with_sharding_constraint(x, P(*spec))
