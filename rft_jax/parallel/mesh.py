"""Mesh construction and the NamedShardings of params, optimizer state and batches.

Mesh axes are ('data', 'fsdp', 'tensor'). Parameters carry logical axis names (see
rft_jax/models/llama.py); LOGICAL_RULES (rules.py) maps them to mesh axes. Batches are split over
('data', 'fsdp') along their leading (row) dimension.

What a mesh (d, f, t) needs of a model, checked by check_model_fits_mesh before anything is
placed (one-line MeshError naming the number):
  heads % t == 0, kv_heads % t == 0, intermediate_size % t == 0, vocab_size % t == 0
  hidden_size % f == 0                          (every 'embed' dimension is split over fsdp)
and of every batch: rows % (d * f * parts) == 0, parts its micro-batches etc.
(check_batch_fits_mesh).
"""
import math
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rft_jax.parallel.rules import (  # noqa: F401  (re-exported)
    BATCH_AXES, LOGICAL_RULES, MESH_AXES, logical_to_mesh)


class MeshError(ValueError):
  """A mesh that cannot be built on the devices present (one-line message)."""


def mesh_shape(mesh_cfg: Any, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 ('the rest') in config.mesh to a concrete (data, fsdp, tensor) shape."""
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  for a, s in zip(MESH_AXES, sizes):
    if s == 0 or s < -1:
      raise MeshError(f'config.mesh.{a}={s}: an axis size is a positive device count or -1')
  known = math.prod(s for s in sizes if s != -1)
  if sizes.count(-1) > 1:
    raise MeshError('config.mesh: at most one axis may be -1')
  if -1 in sizes:
    if num_devices % known:
      wild = MESH_AXES[sizes.index(-1)]
      fixed = ', '.join(f'{a}={s}' for a, s in zip(MESH_AXES, sizes) if s != -1)
      raise MeshError(f'config.mesh: the fixed axes ({fixed}; product {known}) do not divide '
                      f'the {num_devices} devices, so mesh.{wild}=-1 has no whole size')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) > num_devices:
    raise MeshError(f'config.mesh={dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices '
                    f'(data*fsdp*tensor) but only {num_devices} are present')
  return tuple(sizes)


def resolved_note(mesh_cfg: Any, mesh) -> str:
  """' (config.mesh.tensor=-1 resolved to 4)' for the axis a -1 left to the device count, so an
  error about the resolved size names what the user set; '' without a -1."""
  shape = _shape_of(mesh)
  wild = [(a, n) for a, n in zip(MESH_AXES, shape) if int(mesh_cfg[a]) == -1]
  return ''.join(f' (config.mesh.{a}=-1 resolved to {n})' for a, n in wild)


def make_mesh(mesh_cfg: Any, devices=None) -> Mesh:
  """Builds an Auto-axis mesh (explicit sharding-in-types is not used here)."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_cfg, len(devices))
  n = math.prod(shape)
  return Mesh(np.asarray(devices[:n]).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))


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


SAMPLING_LAYOUTS = ('train', 'no_fsdp')


def sampling_shardings(param_shardings, layout: str):
  """The params' shardings for sampling (config.rollout.weights_layout), or None to sample with
  the training layout.

  'train': sample with the training shardings (with fsdp > 1 every decode step all-gathers the
  weights it uses). 'no_fsdp': drop the fsdp axis, so each device holds its tensor slice of every
  weight whole for the whole decode loop (one all-gather per step, params / tensor bytes per
  device while sampling)."""
  if layout not in SAMPLING_LAYOUTS:
    raise ValueError(f'weights layout {layout!r} is not one of {SAMPLING_LAYOUTS}')
  if layout == 'train':
    return None

  def drop_fsdp(sharding: NamedSharding) -> NamedSharding:
    spec = []
    for entry in sharding.spec:
      axes = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,)) if a != 'fsdp')
      spec.append(None if not axes or axes == (None,) else axes if len(axes) > 1 else axes[0])
    return NamedSharding(sharding.mesh, P(*spec))
  return jax.tree.map(drop_fsdp, param_shardings,
                      is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over ('data', 'fsdp'); other dimensions replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh) -> int:
  """Rows of every batch must be a multiple of this (the data x fsdp size)."""
  return mesh.shape['data'] * mesh.shape['fsdp']


def _shape_of(mesh) -> tuple[int, int, int]:
  """A Mesh, or a (data, fsdp, tensor) tuple / dict -> (data, fsdp, tensor)."""
  if isinstance(mesh, Mesh):
    return tuple(int(mesh.shape[a]) for a in MESH_AXES)
  if isinstance(mesh, dict):
    return tuple(int(mesh[a]) for a in MESH_AXES)
  return tuple(int(s) for s in mesh)


def check_model_fits_mesh(model_cfg, mesh) -> None:
  """Raises MeshError (one line naming the number) when model_cfg cannot be split over mesh.

  tensor must divide the query heads, the KV heads (no KV-head replication is implemented), the
  MLP size and the vocabulary; fsdp must divide hidden_size. mesh: a Mesh or (data, fsdp, tensor).
  """
  _, fsdp, tensor = _shape_of(mesh)
  for name, n in (('num_attention_heads', model_cfg.num_attention_heads),
                  ('num_key_value_heads', model_cfg.num_key_value_heads),
                  ('intermediate_size', model_cfg.intermediate_size),
                  ('vocab_size', model_cfg.vocab_size)):
    if n % tensor:
      raise MeshError(f'config.mesh.tensor={tensor} does not divide model {name}={n} '
                      '(tensor parallelism splits it evenly); pick a tensor size that divides it')
  if model_cfg.hidden_size % fsdp:
    raise MeshError(f'config.mesh.fsdp={fsdp} does not divide model hidden_size='
                    f'{model_cfg.hidden_size} (FSDP splits every parameter\'s embed dimension)')


def check_batch_fits_mesh(rows: int, mesh, what: str = 'batch rows',
                          factors: tuple[tuple[str, int], ...] = ()) -> None:
  """Raises MeshError unless data*fsdp*prod(factors) divides `rows`: batches are split by rows
  over data x fsdp, after being cut into prod(n for _, n in factors) equal parts (micro-batches,
  mini-batches, score chunks). factors: ((config key, n), ...), named in the message."""
  data, fsdp, _ = _shape_of(mesh)
  parts = math.prod(n for _, n in factors)
  if rows % (data * fsdp * parts):
    times = ''.join(f' times {key}={n}' for key, n in factors)
    total = f' = {data * fsdp * parts}' if factors else ''
    raise MeshError(f'{what}={rows} is not divisible by config.mesh data*fsdp={data}*{fsdp}='
                    f'{data * fsdp}{times}{total}: rows are split over both axes')
