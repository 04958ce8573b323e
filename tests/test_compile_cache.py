"""rft_jax/compile_cache.py: the persistent compilation cache, also when turned on late."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_enable_after_jax_has_compiled_writes_to_the_directory_given(tmp_path):
  """As api.train in a notebook that ran JAX code before: with no cache directory yet, then
  with another directory already in use (JAX keeps the first one it opened unless reset)."""
  code = ('import os, sys, jax\n'
          'from rft_jax import compile_cache\n'
          'jax.jit(lambda x: x + 1)(1.0)\n'
          'print(compile_cache.enable(sys.argv[1]))\n'
          'jax.jit(lambda x: x * 3 - 1)(2.0)\n'
          'print(len(os.listdir(sys.argv[1])))\n'
          'print(compile_cache.enable(sys.argv[2]))\n'
          'jax.jit(lambda x: x * 5 - 2)(2.0)\n'
          'print(len(os.listdir(sys.argv[2])))\n')
  first, second = tmp_path / 'first', tmp_path / 'second'
  env = {k: v for k, v in os.environ.items()
         if k not in ('JAX_COMPILATION_CACHE_DIR', 'RFT_JAX_COMPILATION_CACHE')}
  done = subprocess.run([sys.executable, '-c', code, str(first), str(second)], cwd=REPO,
                        capture_output=True, text=True, timeout=120,
                        env={**env, 'JAX_PLATFORMS': 'cpu'})
  assert done.returncode == 0, done.stderr[-2000:]
  path_1, entries_1, path_2, entries_2 = done.stdout.split()
  assert path_1 == str(first) and int(entries_1) >= 1
  assert path_2 == str(second) and int(entries_2) >= 1
