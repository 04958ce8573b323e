"""XLA_FLAGS for the tests: cheaper CPU code generation, and fake CPU devices for subprocesses."""
import os

# The tests' programs are tiny, so XLA's compile time dominates, not their run time. A full
# cold-cache `make test` took 1060 s at XLA's default level and 889 s at 0 (AMD EPYC, 2 cores,
# same day); the long learning runs lose a few seconds each to slower code. Runs and
# benchmarks keep XLA's defaults.
FAST_COMPILE = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'


def use_fast_compile() -> None:
  """Adds FAST_COMPILE to this process's XLA_FLAGS (subprocesses inherit it), unless an
  optimisation level is already there. Before JAX starts its backend: conftest does it."""
  flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_backend_optimization_level' not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} {FAST_COMPILE}'.strip()


def with_cpu_devices(n: int) -> str:
  """XLA_FLAGS for a subprocess with n CPU devices, the fast-compile flags kept."""
  return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()


def without_fast_compile() -> str:
  """XLA_FLAGS for a subprocess whose run time outweighs its compile time (FaultBench's 40-step
  run: 71 s at level 0 against 49 s at XLA's default, cold cache, AMD EPYC 2 cores)."""
  return ' '.join(os.environ.get('XLA_FLAGS', '').replace(FAST_COMPILE, '').split())
