"""Checkpoints written by two jax.distributed processes into one shared directory: every process
lists the same checkpoints after each save (tests/multihost_checkpoint_check.py).

Process 0 alone deletes the checkpoints beyond `keep`; the others listed the directory again at
once, before it was done: they kept a deleted step, and a two-process run resumed on another mesh
with `python -m rft_jax.main` had process 1 exit 2 with "No such file or directory:
.../checkpoints/2" (orbax read a step being renamed away) while process 0 finished."""
import json
import os
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_process_lists_the_checkpoints_process_0_kept(tmp_path):
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  procs = []
  for i in range(2):
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
               XLA_FLAGS='--xla_force_host_platform_device_count=1',
               JAX_COORDINATOR_ADDRESS=f'localhost:{port}', JAX_NUM_PROCESSES='2',
               JAX_PROCESS_ID=str(i), CKPT_DIR=str(tmp_path / 'checkpoints'))
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(REPO, 'tests', 'multihost_checkpoint_check.py')],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  try:
    outs = [p.communicate(timeout=180) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  listed = [json.loads([line for line in out.splitlines() if 'RESULT ' in line][-1]
                       .split('RESULT ', 1)[1]) for out, _ in outs]
  assert listed[0] == listed[1] == [[1], [1, 2], [2, 3], [3, 4]], listed
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['3', '4']
