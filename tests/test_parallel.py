"""Sharding: one GRPO step, greedy sampling and checkpoint restore agree across meshes.

One subprocess (tests/sharded_step_check.py, 8 fake CPU devices) computes every mesh; the
(1, 1, 1) mesh is the reference. Meshes are (data, fsdp, tensor); each runs under jax.set_mesh
(activation constraints on) except 2x2x2_plain (off, as trainer.py traces today). Tolerances:
metrics rtol 2e-5 / atol 1e-7, gradients rtol 1e-4 / atol 1e-6 (fp32 reduction order); greedy
tokens exactly; checkpoint values bit-exactly.
"""
import json
import os
import subprocess
import sys

import filelock
import numpy as np
import pytest

from multihost_fixtures import run_processes
from rft_jax.models.llama import ModelConfig
from rft_jax.parallel import mesh as meshlib
import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDED = ('8x1x1', '1x8x1', '2x2x2', '1x4x2', '2x2x2_plain',   # _plain: without jax.set_mesh
           '2x2x2_scan')   # _scan: the step with model.scan_layers and remat 'full'


@pytest.fixture(scope='module')
def meshes(tmp_path_factory, worker_id):
  """The sharded-step check's results, computed once per test session: under xdist the
  workers share the session's temp root, and the first to take the lock runs the check (one
  subprocess, ~65 s on 2 cores) while the other waits for its files."""
  root = tmp_path_factory.getbasetemp()
  out_dir = (root if worker_id == 'master' else root.parent) / 'sharded_step_check'
  with filelock.FileLock(str(out_dir) + '.lock'):
    if not (out_dir / 'info.json').exists():
      out_dir.mkdir(exist_ok=True)
      env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
                 XLA_FLAGS=xla_flags.with_cpu_devices(8))
      out = subprocess.run([sys.executable, os.path.join(REPO, 'tests', 'sharded_step_check.py'),
                            str(out_dir)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
      assert out.returncode == 0, out.stderr[-3000:]
      (out_dir / 'info.json').write_text(out.stdout)   # written last: marks the results whole
  with np.load(out_dir / 'results.npz') as f:
    arrays = dict(f)
  return json.loads((out_dir / 'info.json').read_text()), arrays


@pytest.mark.parametrize('name', SHARDED)
def test_step_loss_and_grads_match_one_device(meshes, name):
  info, arrays = meshes
  single, sharded = info['1x1x1'], info[name]
  assert single['devices'] == 1 and sharded['devices'] == 8
  assert sharded['q_kernel_shards'] == 8          # params really are spread over the mesh
  for k in ('loss', 'pg_loss', 'kl', 'entropy', 'grad_norm', 'clip_frac/low', 'update_norm'):
    np.testing.assert_allclose(sharded['metrics'][k], single['metrics'][k], rtol=2e-5,
                               atol=1e-7, err_msg=k)
  grads = sorted(k for k in arrays if k.startswith('1x1x1/grad/'))
  assert len(grads) > 10
  for k in grads:
    np.testing.assert_allclose(arrays[k.replace('1x1x1', name)], arrays[k], rtol=1e-4,
                               atol=1e-6, err_msg=k)


@pytest.mark.parametrize('name', SHARDED)
def test_greedy_tokens_identical(meshes, name):
  info, arrays = meshes
  d, f, _ = (int(x) for x in name.split('_')[0].split('x'))
  if not name.endswith('_plain'):   # without the model's constraints XLA may split rows less
    assert info[name]['token_row_splits'] == d * f   # the sampler split rows over data*fsdp
  np.testing.assert_array_equal(arrays[f'{name}/tokens'], arrays['1x1x1/tokens'])
  np.testing.assert_allclose(arrays[f'{name}/logp'], arrays['1x1x1/logp'], atol=2e-5)


@pytest.mark.parametrize('name', [n for n in SHARDED if not n.endswith('_scan')])
def test_shared_prompt_scores_and_grads_match_one_device(meshes, name):
  """grpo.score_logprobs with each group's prompt run once (4 groups of 4 rows; on 8x1x1 and
  1x8x1 fewer groups than row shards) gives the one-device log-probs and gradients."""
  _, arrays = meshes
  want = arrays['1x1x1/shared_logp']
  assert np.abs(want).max() > 0.1   # not vacuous
  np.testing.assert_allclose(arrays[f'{name}/shared_logp'], want, rtol=2e-5, atol=2e-6)
  grads = sorted(k for k in arrays if k.startswith('1x1x1/shared_grad/'))
  assert len(grads) > 10
  for k in grads:   # a sum of log-probs: gradients up to ~4, fp32 reduction order ~1e-6
    np.testing.assert_allclose(arrays[k.replace('1x1x1', name)], arrays[k], rtol=1e-4,
                               atol=1e-5, err_msg=k)


def test_sampling_with_weights_whole_over_fsdp_gives_the_same_tokens(meshes):
  """rollout.weights_layout='no_fsdp' on (1,4,2): each device holds half of q_proj (its tensor
  slice, 2 distinct pieces over 8 devices, not 8), and greedy sampling is unchanged."""
  info, arrays = meshes
  assert info['1x4x2_nofsdp']['q_kernel_distinct_shards'] == 2
  np.testing.assert_array_equal(arrays['1x4x2_nofsdp/tokens'], arrays['1x1x1/tokens'])
  np.testing.assert_allclose(arrays['1x4x2_nofsdp/logp'], arrays['1x1x1/logp'], atol=2e-5)


@pytest.mark.parametrize('name', ('1x8x1', '2x2x2', '1x4x2', '2x2x2_plain'))
def test_checkpoint_from_8x1x1_restores_on_other_mesh(meshes, name):
  restore = meshes[0][name]['restore']
  assert restore['from'] == '8x1x1'
  assert restore['leaves'] > 20                  # params + AdamW mu, nu + counts + step
  assert restore['equal'], 'restored values differ from the saved state'
  assert restore['shardings_match'], 'restored arrays do not carry the target shardings'
  assert restore['q_kernel_shards'] == 8


def test_mesh_shape_resolution_and_errors():
  assert meshlib.mesh_shape({'data': -1, 'fsdp': 2, 'tensor': 1}, 8) == (4, 2, 1)
  assert meshlib.mesh_shape({'data': 1, 'fsdp': 1, 'tensor': 1}, 8) == (1, 1, 1)
  with pytest.raises(meshlib.MeshError, match='needs 16 devices'):
    meshlib.mesh_shape({'data': 4, 'fsdp': 4, 'tensor': 1}, 8)
  with pytest.raises(meshlib.MeshError, match=r'^config.mesh: the fixed axes \(fsdp=3, '
                     r'tensor=1; product 3\) do not divide the 8 devices, so mesh.data=-1 has '
                     r'no whole size$'):
    meshlib.mesh_shape({'data': -1, 'fsdp': 3, 'tensor': 1}, 8)
  # An error about a size a -1 resolved to says so.
  assert meshlib.resolved_note({'data': 2, 'fsdp': 1, 'tensor': -1}, (2, 1, 4)) == (
      ' (config.mesh.tensor=-1 resolved to 4)')
  assert meshlib.resolved_note({'data': 2, 'fsdp': 1, 'tensor': 4}, (2, 1, 4)) == ''
  with pytest.raises(meshlib.MeshError, match=r'config.mesh.fsdp=0'):
    meshlib.mesh_shape({'data': 1, 'fsdp': 0, 'tensor': 1}, 8)


CFG = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)


@pytest.mark.parametrize('field,value,shape,match', [
    ('num_attention_heads', 6, (1, 1, 4), 'tensor=4 does not divide model num_attention_heads=6'),
    ('num_key_value_heads', 2, (1, 1, 4), 'tensor=4 does not divide model num_key_value_heads=2'),
    ('intermediate_size', 129, (1, 1, 2), 'tensor=2 does not divide model intermediate_size=129'),
    ('vocab_size', 33, (1, 1, 2), 'vocab_size=33'),
    ('hidden_size', 60, (1, 8, 1), 'fsdp=8 does not divide model hidden_size=60'),
])
def test_model_mesh_mismatch_is_one_line(field, value, shape, match):
  import dataclasses
  cfg = dataclasses.replace(CFG, **{field: value})
  if field == 'num_attention_heads':
    cfg = dataclasses.replace(cfg, num_key_value_heads=4)
  with pytest.raises(meshlib.MeshError, match=match) as e:
    meshlib.check_model_fits_mesh(cfg, shape)
  assert '\n' not in str(e.value)


def test_model_and_batch_fit():
  meshlib.check_model_fits_mesh(CFG, (2, 2, 2))
  meshlib.check_model_fits_mesh(CFG, {'data': 1, 'fsdp': 8, 'tensor': 1})
  meshlib.check_batch_fits_mesh(16, (2, 4, 1))
  with pytest.raises(meshlib.MeshError, match=r'rollout rows=12 is not divisible by .*2\*4=8'):
    meshlib.check_batch_fits_mesh(12, (2, 4, 1), 'rollout rows')


def test_two_processes_from_env_vars_build_one_global_mesh():
  """The multi-host path (jax.distributed from env vars) with 2 local CPU processes x 4 devices."""
  results = run_processes('multihost_mesh_check.py', devices=4, timeout=120)
  # rows of process 0: 0..23; of process 1: 100 + 0..23  ->  2 * 276 + 24 * 100
  expected = 2 * sum(range(24)) + 24 * 100
  for i, r in enumerate(results):
    assert (r['process'], r['processes'], r['devices'], r['local_devices']) == (i, 2, 8, 4)
    assert r['sum'] == expected
    assert not r['placed_fully_addressable'] and r['round_trip'] and r['gathered']
    assert r['rows'] == [8 * i, 8 * (i + 1)] and r['counts'] == {'a': 3, 'b': 10}


@pytest.mark.slow   # two tiny runs on 8 fake devices: ~1-2 min on 2 cores
def test_trainer_resharding_for_sampling_reports_its_time_and_trains_the_same(tmp_path):
  """python -m rft_jax.main on (1,4,2) with rollout.weights_layout 'no_fsdp' vs 'train': the same
  rewards and losses (fp32 rounding), and time/reshard_s logged (0 when nothing is resharded)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
             XLA_FLAGS=xla_flags.with_cpu_devices(8))
  rows = {}
  for layout in ('train', 'no_fsdp'):
    workdir = str(tmp_path / layout)
    out = subprocess.run(
        [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/grpo_arith.py:tiny',
         '--workdir', workdir, '--config.mesh.data=1', '--config.mesh.fsdp=4',
         '--config.mesh.tensor=2', '--config.train.steps=2', '--config.train.eval_every=2',
         '--config.telemetry.tensorboard=False', f'--config.rollout.weights_layout={layout}'],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # the resolved mesh is said on the first line (it said only 'devices=8 x cpu')
    assert 'devices=8 x cpu  mesh=1x4x2 (data x fsdp x tensor)' in out.stdout.splitlines()[0]
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      rows[layout] = [r for r in map(json.loads, f) if r['kind'] == 'train']
  assert [r['step'] for r in rows['no_fsdp']] == [1, 2]
  for a, b in zip(rows['train'], rows['no_fsdp']):
    for key in ('reward/mean', 'loss', 'kl', 'entropy', 'grad_norm'):
      assert abs(a[key] - b[key]) <= 1e-5 * (1 + abs(a[key])), (key, a[key], b[key])
  assert all(r['time/reshard_s'] > 0 for r in rows['no_fsdp'])
  assert all(r['time/reshard_s'] < r['time/sample_s'] for r in rows['no_fsdp'])
