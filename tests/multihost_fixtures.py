"""Running a check script as several jax.distributed processes on this machine's CPU (the
multi-host tests; tests/multihost_*_check.py set up by rft_jax.parallel.distributed's env vars)."""
import json
import os
import socket
import subprocess
import sys

import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A localhost TCP port nothing listens on now (for jax.distributed's coordinator)."""
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def run_processes(script: str, devices: int, processes: int = 2, timeout: float = 180,
                  **env: str) -> list:
  """Runs tests/`script` as `processes` jax.distributed processes of `devices` CPU devices each
  (and `env`), asserts each exits 0 -> what each printed after 'RESULT ' as JSON (its last such
  line: gloo prints its own lines to stdout), in process order."""
  port = free_port()
  procs = []
  for i in range(processes):
    process_env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
                       XLA_FLAGS=xla_flags.with_cpu_devices(devices),
                       JAX_COORDINATOR_ADDRESS=f'localhost:{port}',
                       JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(i), **env)
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(REPO, 'tests', script)], cwd=REPO, env=process_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  try:
    outs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  return [json.loads([line for line in out.splitlines() if 'RESULT ' in line][-1]
                     .split('RESULT ', 1)[1]) for out, _ in outs]
