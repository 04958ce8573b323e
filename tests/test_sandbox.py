"""The code sandbox and the reward workers' memory limit: each failure mode is contained and
reported for what it is (a wrong program scores 0; a verifier that blows its memory is an error)."""
import os
import sys
import time

import pytest

from rft_jax.rewards import code_exec, sandbox
from rft_jax.rewards.runner import RewardRunner

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
  sys.path.insert(0, _TESTS_DIR)
import reward_fixtures  # noqa: E402,F401  pylint: disable=g-import-not-at-top,unused-import


def test_a_good_program_runs_and_reads_stdin():
  r = sandbox.run_python('import sys\nprint(sum(map(int, sys.stdin.read().split())))',
                         stdin='2 3 4')
  assert r.ok and r.stdout.strip() == '9', r


def test_an_endless_loop_is_killed_at_the_timeout():
  t0 = time.monotonic()
  r = sandbox.run_python('while True:\n  pass', timeout_s=0.5)
  assert r.timed_out and not r.ok
  assert time.monotonic() - t0 < 5


def test_a_memory_blow_up_fails_inside_the_child():
  r = sandbox.run_python('x = bytearray(2 * 2**30)\nprint(len(x))', memory_mb=256)
  assert not r.ok and 'MemoryError' in r.stderr, r


def test_children_of_the_program_die_with_it(tmp_path):
  marker = tmp_path / 'alive'
  # The program starts a grandchild that would write the marker after 2 s, then loops.
  src = ('import subprocess, sys\n'
         f'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2); '
         f'open({str(marker)!r}, \\"w\\").write(\\"x\\")"])\n'
         'while True:\n  pass\n')
  r = sandbox.run_python(src, timeout_s=0.5)
  assert r.timed_out
  time.sleep(2.5)
  assert not marker.exists()


def test_files_go_to_a_private_directory_that_is_removed():
  r = sandbox.run_python('import os\nopen("out.txt", "w").write("hi")\nprint(os.getcwd())')
  assert r.ok
  assert not os.path.exists(r.stdout.strip())


def test_no_network_when_the_machine_allows_it():
  src = ('import socket\n'
         's = socket.socket()\n'
         's.settimeout(1)\n'
         's.connect(("1.1.1.1", 53))\n')
  if not sandbox.network_isolated():
    pytest.skip('this machine allows no private network namespace (unshare -n)')
  r = sandbox.run_python(src, timeout_s=3)
  assert not r.ok and 'unreachable' in r.stderr, r


def test_python_tests_verifier():
  good = 'Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n'
  bad = '```python\ndef add(a, b):\n    return a - b\n```'
  loops = '```python\ndef add(a, b):\n    while True: pass\n```'
  tests = 'assert add(2, 3) == 5\nassert add(-1, 1) == 0'
  assert code_exec.python_tests(good, tests) == 1.0
  assert code_exec.python_tests(bad, tests) == 0.0
  assert code_exec.python_tests(loops, tests) == 0.0
  assert code_exec.extract_program('def f(): pass') == 'def f(): pass'


def test_worker_memory_limit_turns_a_blow_up_into_an_error():
  with RewardRunner({'test_allocates_on_big': 1.0}, timeout_s=10.0, num_workers=1,
                    memory_mb=256) as runner:
    result = runner(['ok', 'big', 'ok'], ['', '', ''])
  assert result.valid.tolist() == [True, False, True]
  assert result.errors == {'test_allocates_on_big': 1}
  assert 'MemoryError' in result.error_messages['test_allocates_on_big']
  assert result.total.tolist() == [1.0, 0.0, 1.0]
