"""Multi-host GRPO: two jax.distributed CPU processes (4 devices each) train like one process.

The real user path: `python -m rft_jax.main` started once per process with JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID (rft_jax/parallel/distributed.py). Three steps on a
(data, fsdp, tensor) = (2, 2, 2) mesh must log the same metrics as one process with 8 devices and
the same global batch; then both restore that checkpoint on a (1, 4, 2) mesh and continue to
step 5, again like one process does. Only process 0 writes logs. Online DPO, offline DPO and SFT
(two steps each) also log what one process logs.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow   # four tiny runs, two of them as process pairs: ~2-3 min on 2 cores


def overrides(mesh, steps):
  data, fsdp, tensor = mesh
  return [f'--config.mesh.data={data}', f'--config.mesh.fsdp={fsdp}',
          f'--config.mesh.tensor={tensor}', f'--config.train.steps={steps}',
          f'--config.train.eval_every={steps}', f'--config.train.ckpt_every={steps}',
          '--config.telemetry.tensorboard=False']


def train(workdir, mesh, steps, processes, recipe='configs/grpo_arith.py:tiny', extra=()):
  """Runs a tiny recipe as `processes` processes sharing 8 CPU devices; returns outputs."""
  cmd = [sys.executable, '-m', 'rft_jax.main', '--config', recipe,
         '--workdir', workdir, *overrides(mesh, steps), *extra]
  base = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
              XLA_FLAGS=xla_flags.with_cpu_devices(8 // processes))
  envs = [base]
  if processes > 1:
    with socket.socket() as s:
      s.bind(('localhost', 0))
      port = s.getsockname()[1]
    envs = [dict(base, JAX_COORDINATOR_ADDRESS=f'localhost:{port}',
                 JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(i))
            for i in range(processes)]
  procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for env in envs]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, (out + err)[-3000:]
  return [out for out, _ in outs]


def logged(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]   # one writer: every line is whole JSON
  return [r for r in rows if r['kind'] in ('train', 'eval')]


def assert_same_metrics(multi, single):
  assert [(r['step'], r['kind']) for r in multi] == [(r['step'], r['kind']) for r in single]
  for m, s in zip(multi, single):
    for key, value in s.items():
      if isinstance(value, float) and not key.startswith(('time/', 'throughput/')):
        # gloo and in-process collectives may sum in another order: fp32 rounding only
        assert abs(m[key] - value) <= 1e-5 * (1 + abs(value)), (m['step'], key, m[key], value)


def test_two_processes_train_like_one_and_resume_on_another_mesh(tmp_path):
  multi, single = str(tmp_path / 'two_processes'), str(tmp_path / 'one_process')
  outs = train(multi, (2, 2, 2), 3, processes=2)
  train(single, (2, 2, 2), 3, processes=1)
  assert_same_metrics(logged(multi), logged(single))
  assert 'step 3/3' in outs[0] and 'step 3/3' not in outs[1]   # only process 0 logs

  outs = train(multi, (1, 4, 2), 5, processes=2)   # restore onto another mesh and continue
  train(single, (1, 4, 2), 5, processes=1)
  assert 'resumed from checkpoint at step 3' in outs[0]
  rows = logged(multi)
  assert [r['step'] for r in rows if r['kind'] == 'train'] == [1, 2, 3, 4, 5]
  assert_same_metrics(rows, logged(single))
  with open(os.path.join(multi, 'summary.json')) as f:
    assert json.load(f)['steps'] == 5


@pytest.mark.parametrize('recipe,extra', [
    ('configs/online_dpo_arith.py:tiny', ()),
    ('configs/dpo_arith.py:tiny', ()),
    ('configs/sft_arith.py:tiny', ('--config.sft.batch_size=16',)),
])
def test_dpo_and_sft_two_processes_train_like_one(tmp_path, recipe, extra):
  """The other loops on the same multi-process data path (each process reads its share of every
  batch, hostdata.GlobalBatches): two steps on (2,2,2) log what one process logs."""
  multi, single = str(tmp_path / 'two_processes'), str(tmp_path / 'one_process')
  train(multi, (2, 2, 2), 2, processes=2, recipe=recipe, extra=extra)
  train(single, (2, 2, 2), 2, processes=1, recipe=recipe, extra=extra)
  multi_rows, single_rows = logged(multi), logged(single)
  assert [r['step'] for r in single_rows if r['kind'] == 'train'] == [1, 2]
  assert_same_metrics(multi_rows, single_rows)
