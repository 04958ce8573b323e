"""Runs untrusted Python (e.g. model-generated code) in a separate, limited process.

    result = run_python(source, stdin='', timeout_s=1.0, memory_mb=512)
    result.ok            exit status 0 within the time limit
    result.timed_out     killed at timeout_s (wall clock) or by the CPU-time limit

What confines the child:
  - a fresh interpreter in isolated mode (`python -I -S`): no user site, no PYTHON* env vars,
    cwd is a new empty temporary directory (deleted afterwards), environment reduced to PATH/HOME;
  - resource limits set in the child before the code runs, soft and hard: address space
    (memory_mb), CPU seconds, file size written (16 MiB), open files (64), no core dumps;
  - its own session (process group): on timeout the whole group is killed, grandchildren too;
  - no network when the machine allows a private network namespace (`unshare -n`, checked once;
    `network_isolated()` says whether it is in use);
  - stdout/stderr are cut at `max_output_bytes`.

This is containment against accidents (infinite loops, memory blow-ups, stray files, runaway
children), NOT a security boundary against deliberately hostile code: the child runs as the same
user (root can raise its own limits), sees the file system and can read what that user can. For
adversarial settings run verifiers inside a container or gVisor/nsjail.
"""
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile

# Runs inside the child: set the limits (soft = hard, so they cannot be raised back by an
# unprivileged process), then the program as __main__.
_BOOTSTRAP = """\
import resource, runpy, sys
mem, cpu, fsize = (int(a) for a in sys.argv[1:4])
for lim, val in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                 (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, 64),
                 (resource.RLIMIT_CORE, 0)):
  resource.setrlimit(lim, (val, val))
sys.argv = ['main.py']
runpy.run_path('main.py', run_name='__main__')
"""
_MAX_FILE_BYTES = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  returncode: int | None     # None when killed at the wall-clock timeout
  stdout: str
  stderr: str
  timed_out: bool

  @property
  def ok(self) -> bool:
    return self.returncode == 0 and not self.timed_out


@functools.cache
def _unshare_prefix() -> tuple[str, ...]:
  """('unshare', '-n') or ('unshare', '-rn') if a private network namespace works here, else ()."""
  if shutil.which('unshare') is None:
    return ()
  for prefix in (('unshare', '-n'), ('unshare', '-rn')):
    try:
      if subprocess.run([*prefix, 'true'], capture_output=True, timeout=5).returncode == 0:
        return prefix
    except (OSError, subprocess.SubprocessError):
      pass
  return ()


def network_isolated() -> bool:
  return bool(_unshare_prefix())


def run_python(source: str, *, stdin: str = '', timeout_s: float = 1.0, memory_mb: int = 512,
               max_output_bytes: int = 65536) -> SandboxResult:
  """Runs `source` as a program in a limited child process (see the module doc).

  Raises OSError only when the child cannot be started at all (a problem of this machine, not
  of the program); every outcome of the program itself is a SandboxResult.
  """
  with tempfile.TemporaryDirectory(prefix='rft_sandbox_') as tmp:
    with open(os.path.join(tmp, 'main.py'), 'w', encoding='utf-8') as f:
      f.write(source)
    cpu_s = max(1, int(timeout_s) + 1)
    cmd = [*_unshare_prefix(), sys.executable, '-I', '-S', '-c', _BOOTSTRAP,
           str(memory_mb * 2**20), str(cpu_s), str(_MAX_FILE_BYTES)]
    proc = subprocess.Popen(cmd, cwd=tmp, env={'PATH': '/usr/bin:/bin', 'HOME': tmp},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
      out, err = proc.communicate(stdin.encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      _kill_group(proc)
      out, err = proc.communicate()
    finally:
      _kill_group(proc)   # grandchildren left behind, and the SIGALRM path of the runner
    code = None if timed_out else proc.returncode
    timed_out = timed_out or code == -signal.SIGXCPU   # the CPU-time limit
    cut = lambda b: b[:max_output_bytes].decode('utf-8', 'replace')
    return SandboxResult(code, cut(out), cut(err), timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  if proc.poll() is None:
    proc.wait()
