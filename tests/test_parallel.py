"""The GRPO train step on a (data=2, fsdp=2, tensor=2) mesh of 8 CPU devices equals one device."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rft_jax.parallel import mesh as meshlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def two_meshes():
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
             XLA_FLAGS='--xla_force_host_platform_device_count=8')
  out = subprocess.run([sys.executable, os.path.join(REPO, 'tests', 'sharded_step_check.py')],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout)


def test_sharded_step_matches_single_device(two_meshes):
  single, sharded = two_meshes['single'], two_meshes['dp2_fsdp2_tp2']
  assert single['devices'] == 1 and sharded['devices'] == 8
  assert sharded['q_kernel_shards'] == 8          # params really are spread over the mesh
  for k in ('loss', 'pg_loss', 'kl', 'entropy', 'grad_norm', 'clip_frac'):
    np.testing.assert_allclose(sharded['metrics'][k], single['metrics'][k], rtol=2e-5,
                               atol=1e-7, err_msg=k)
  for g1, g8 in zip(single['grads'], sharded['grads']):
    np.testing.assert_allclose(g8, g1, rtol=1e-4, atol=1e-6)


def test_mesh_shape_resolution_and_errors():
  assert meshlib.mesh_shape({'data': -1, 'fsdp': 2, 'tensor': 1}, 8) == (4, 2, 1)
  assert meshlib.mesh_shape({'data': 1, 'fsdp': 1, 'tensor': 1}, 8) == (1, 1, 1)
  with pytest.raises(meshlib.MeshError, match='needs 16 devices'):
    meshlib.mesh_shape({'data': 4, 'fsdp': 4, 'tensor': 1}, 8)
  with pytest.raises(meshlib.MeshError, match='not divisible'):
    meshlib.mesh_shape({'data': -1, 'fsdp': 3, 'tensor': 1}, 8)
