"""Tests for the reward runner's worker processes: verifiers that reach them by value (a lambda,
a notebook's function) or by path, a verifier that raises, sleeps, gets stuck in C code, kills
its worker, starts processes or uses SIGALRM itself, per-call timeouts, and the pool's start-up
and exit. Verifiers, totals and inline scoring are in test_rewards.py."""
import os
import sys
import time

import numpy as np
import pytest

from rft_jax.rewards import runner as runner_lib
from rft_jax.rewards import verifiers
from rft_jax.rewards import worker as worker_lib

# Spawned workers import test verifiers by module path and inherit sys.path from this process:
# make sure the directory holding reward_fixtures is on it however pytest imported this file.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
  sys.path.insert(0, _TESTS_DIR)
import reward_fixtures  # noqa: E402,F401  pylint: disable=g-import-not-at-top,unused-import

RewardRunner = runner_lib.RewardRunner


def test_a_lambda_or_closure_verifier_runs_in_a_worker():
  threshold = 2
  verifiers.register_verifier('test_lambda')(lambda c, a: float(len(c) > threshold))
  with RewardRunner({'test_lambda': 1.0}, num_workers=1) as runner:
    result = runner(['abc', 'a'], ['', ''])
  assert result.total.tolist() == [1.0, 0.0] and result.errors == {'test_lambda': 0}


def test_a_verifier_defined_in_a_notebook_runs_in_a_worker():
  # A notebook's (or `python -c`'s) __main__ has no file a spawned worker could import: its
  # functions go by value. They used to kill the workers at start-up ("EOFError").
  code = ('from rft_jax.rewards.verifiers import register_verifier\n'
          'from rft_jax.rewards.runner import RewardRunner\n'
          "@register_verifier('test_in_main')\n"
          'def in_main(completion, answer):\n'
          '  return float(completion == answer)\n'
          "with RewardRunner({'test_in_main': 1.0}, num_workers=2) as r:\n"
          "  print(r(['1', '2', '3'], ['1', '3', '3']).total.tolist())\n")
  import subprocess  # pylint: disable=g-import-not-at-top
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split('\n')[-2] == '[1.0, 0.0, 1.0]', done.stdout


@pytest.mark.parametrize('num_workers', [0, 2])
def test_raising_verifier_marks_samples_invalid(num_workers):
  completions = ['1', 'boom', '3', '4', 'boom', '6']
  answers = ['1', '2', '3', '5', '5', 'oops']  # 'oops': 'correct' raises on a malformed answer.
  weights = {'correct': 1.0, 'test_raises_on_boom': 2.0, 'test_returns_nan': 0.0}
  with RewardRunner({k: v for k, v in weights.items() if k != 'test_returns_nan'},
                    num_workers=num_workers) as runner:
    result = runner(completions, answers)
  np.testing.assert_array_equal(result.valid, [True, False, True, True, False, False])
  np.testing.assert_array_equal(result.total, [3.0, 0.0, 3.0, 2.0, 0.0, 0.0])
  np.testing.assert_array_equal(result.per_verifier['test_raises_on_boom'],
                                [1, np.nan, 1, 1, np.nan, 1])
  np.testing.assert_array_equal(result.per_verifier['correct'], [1, 0, 1, 0, 0, np.nan])
  assert result.errors == {'correct': 1, 'test_raises_on_boom': 2}
  assert result.timeouts == {'correct': 0, 'test_raises_on_boom': 0}
  assert result.error_messages['test_raises_on_boom'].startswith('RuntimeError: boom! [sample 1')
  assert result.error_messages['correct'].startswith("ValueError: reference answer is not an "
                                                     "integer: 'oops' [sample 5")
  metrics = result.metrics()
  assert metrics['reward/invalid_frac'] == 0.5
  assert metrics['reward/errors/test_raises_on_boom'] == 2.0
  assert metrics['reward/correct/mean'] == pytest.approx(2 / 3)
  # A verifier returning NaN is an error, never a score.
  with RewardRunner({'test_returns_nan': 1.0}, num_workers=0) as runner:
    nan_result = runner(['1'], ['1'])
  assert nan_result.errors == {'test_returns_nan': 1} and not nan_result.valid.any()


@pytest.mark.parametrize('num_workers', [0, 2])
def test_sleeping_verifier_times_out(num_workers):
  completions = ['1', 'hang', '3', '4', '5', 'hang']
  weights = {'correct': 1.0, 'test_sleeps_on_hang': 1.0, 'test_swallows_everything': 1.0}
  with RewardRunner(weights, timeout_s=0.3, num_workers=num_workers, grace_s=30.0) as runner:
    runner.start()
    t0 = time.monotonic()
    result = runner(completions, ['1', '2', '3', '4', '5', '6'])
    elapsed = time.monotonic() - t0
    np.testing.assert_array_equal(result.valid, [True, False, True, True, True, False])
    np.testing.assert_array_equal(result.total, [3.0, 0.0, 3.0, 3.0, 3.0, 0.0])
    assert result.timeouts == {'correct': 0, 'test_sleeps_on_hang': 2,
                               'test_swallows_everything': 2}
    assert result.errors == {name: 0 for name in weights}
    assert result.stuck_chunks == 0 and runner.workers_replaced == 0
    assert elapsed < 10.0  # 4 timed-out calls of 0.3 s, not 1000 s.
    # The runner (and its workers) still work afterwards.
    again = runner(['7', '8'], ['7', '9'])
    np.testing.assert_array_equal(again.total, [3.0, 2.0])
    assert again.valid.all() and runner.workers_replaced == 0


def test_stuck_worker_is_replaced():
  # Samples 0-2 go to one worker, 3-5 to the other; 'hang' at 1 blocks SIGALRM, then sleeps.
  completions = ['1', 'hang', '3', '4', '5', '6']
  answers = ['1', '2', '3', '4', '5', '7']
  with RewardRunner({'correct': 1.0, 'test_stuck_on_hang': 0.5}, timeout_s=0.2,
                    num_workers=2, grace_s=2.0) as runner:
    runner.start()
    old_pids = runner.worker_pids
    t0 = time.monotonic()
    result = runner(completions, answers)
    assert time.monotonic() - t0 < 15.0  # Deadline: 3 samples * 1 verifier * 0.2 s + 2 s.
    assert result.stuck_chunks == 1 and runner.workers_replaced == 1
    np.testing.assert_array_equal(result.valid, [False, False, False, True, True, True])
    np.testing.assert_array_equal(result.total, [0.0, 0.0, 0.0, 1.5, 1.5, 0.5])
    # 'correct' is inline (scored in this process): its values stand; the stuck chunk's
    # verifier has none.
    np.testing.assert_array_equal(result.per_verifier['correct'], [1, 0, 1, 1, 1, 0])
    assert np.isnan(result.per_verifier['test_stuck_on_hang'][:3]).all()
    assert result.timeouts == {'correct': 0, 'test_stuck_on_hang': 3}
    assert result.metrics()['reward/stuck_chunks'] == 1.0
    # The stuck worker was killed; the next call starts a new one beside the healthy one.
    again = runner(completions[2:], answers[2:])
    new_pids = runner.worker_pids
    assert len(new_pids) == 2 and new_pids[1] == old_pids[1] and old_pids[0] not in new_pids
    np.testing.assert_array_equal(again.total, [1.5, 1.5, 1.5, 0.5])
    assert again.valid.all() and runner.workers_replaced == 1
  assert runner.worker_pids == []


def test_dead_worker_makes_its_chunk_errors_and_is_replaced():
  # Samples 0-1 go to one worker, 2-3 to the other; the first dies on 'die'.
  with RewardRunner({'test_exits_on_die': 1.0}, num_workers=2) as runner:
    runner.start()
    old_pids = runner.worker_pids
    result = runner(['1', 'die', '3', '4'], ['', '', '', ''])
    np.testing.assert_array_equal(result.valid, [False, False, True, True])
    np.testing.assert_array_equal(result.total, [0.0, 0.0, 1.0, 1.0])
    assert result.errors == {'test_exits_on_die': 2} and result.stuck_chunks == 0
    assert 'reward worker died (exit code 3)' in result.error_messages['test_exits_on_die']
    assert runner.workers_replaced == 1
    again = runner(['5', '6', '7', '8'], ['', '', '', ''])
    assert again.valid.all() and again.total.tolist() == [1.0] * 4
    new_pids = runner.worker_pids
    assert new_pids[1] == old_pids[1] and old_pids[0] not in new_pids


@pytest.mark.parametrize('num_workers', [0, 1])
def test_timeout_is_per_call_not_per_chunk(num_workers):
  # Five 0.15 s calls make a 0.75 s chunk; none is over the 0.3 s limit, so none times out.
  # The call that hangs is cut off near its own limit (one timer serves the whole chunk).
  completions = ['slow'] * 5 + ['hang']
  weights = {'test_sleeps_on_slow': 1.0, 'test_sleeps_on_hang': 1.0}
  with RewardRunner(weights, timeout_s=0.3, num_workers=num_workers, grace_s=30.0) as runner:
    runner.start()
    t0 = time.monotonic()
    result = runner(completions, [''] * 6)
    elapsed = time.monotonic() - t0
  assert result.valid.tolist() == [True] * 5 + [False]
  assert result.timeouts == {'test_sleeps_on_slow': 0, 'test_sleeps_on_hang': 1}
  assert 0.75 + 0.3 <= elapsed < 0.75 + 0.3 + 2.0, elapsed


def test_a_verifier_may_start_processes_of_its_own():
  with RewardRunner({'test_starts_a_process': 1.0}, num_workers=1) as runner:
    result = runner(['a', 'b'], ['', ''])
  assert result.errors == {'test_starts_a_process': 0}, result.error_messages
  assert result.total.tolist() == [1.0, 1.0]


def test_a_runner_never_closed_does_not_hold_up_exit():
  # The workers are not daemons; without the runner's exit handler, multiprocessing's would
  # wait for them at exit, and they for their next task.
  code = ('import sys; sys.path.insert(0, sys.argv[1]); import reward_fixtures; '
          'from rft_jax.rewards.runner import RewardRunner; '
          "r = RewardRunner({'test_equal': 1.0}, num_workers=2); "
          "total = r(['1', '2'], ['1', '3']).total.sum(); "
          "print(*r.worker_pids, total, flush=True)")
  import subprocess  # pylint: disable=g-import-not-at-top
  t0 = time.monotonic()
  done = subprocess.run([sys.executable, '-c', code, _TESTS_DIR], capture_output=True, text=True,
                        timeout=60)
  assert done.returncode == 0, done.stderr
  assert time.monotonic() - t0 < 60
  *pids, total = done.stdout.split()
  assert float(total) == 1.0 and len(pids) == 2
  for pid in map(int, pids):   # the workers ended with their parent
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_workers_started_without_waiting_are_waited_for_by_the_first_call():
  with RewardRunner({'test_equal': 1.0}, num_workers=2) as runner:
    runner.start(wait=False)
    pids = runner.worker_pids
    runner.start(wait=False)   # nothing more to start
    assert len(pids) == 2 and runner.worker_pids == pids
    result = runner(['1', '2', '3'], ['1', '3', '3'])
    assert result.total.tolist() == [1.0, 0.0, 1.0] and runner.worker_pids == pids


def test_a_script_without_a_main_guard_is_told_why_its_workers_die(tmp_path):
  # spawn imports the main script again in each worker; one that starts the runner at import
  # time fails there, and the parent's error says so instead of only "EOFError".
  script = tmp_path / 'train.py'
  script.write_text('import sys; sys.path.insert(0, sys.argv[1]); import reward_fixtures\n'
                    'from rft_jax.rewards.runner import RewardRunner\n'
                    "r = RewardRunner({'test_equal': 1.0}, num_workers=1)\n"
                    "r.start(wait=False)\n"   # as the trainer: the error comes at the first call
                    "r(['1'], ['1'])\n")
  import subprocess  # pylint: disable=g-import-not-at-top
  done = subprocess.run([sys.executable, str(script), _TESTS_DIR], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode != 0
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith('RuntimeError: reward worker 0 failed to start'), last
  assert f"import {script} again" in last and "if __name__ == '__main__':" in last, last


def test_timeouts_survive_a_verifier_that_uses_sigalrm_itself():
  # The first calls cancel the runner's timer (and one leaves its own handler in place); the
  # hanging call after them must still be cut off on its own, not by the chunk's deadline.
  # (In a worker, so that a regression fails at the deadline instead of hanging the test; the
  # inline path runs the same _score_chunk.)
  with RewardRunner({'test_uses_its_own_alarm': 1.0}, timeout_s=0.3, num_workers=1,
                    grace_s=3.0) as runner:
    runner.start()
    t0 = time.monotonic()
    result = runner(['ok', 'keep', 'hang', 'ok'], [''] * 4)
    elapsed = time.monotonic() - t0
  assert result.valid.tolist() == [True, True, False, True]
  assert result.timeouts == {'test_uses_its_own_alarm': 1} and result.stuck_chunks == 0
  assert elapsed < 5.0, elapsed


def test_a_verifier_from_a_file_loaded_by_path_runs_in_a_worker(tmp_path):
  """absl loads a recipe file from its path as module `config_config`, which a worker cannot
  import by that name: its verifiers go to the workers by value (every worker died at start-up:
  ModuleNotFoundError)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'recipe_with_verifier.py'
  path.write_text('from rft_jax.rewards.verifiers import register_verifier\n\n\n'
                  "@register_verifier('test_from_a_path')\n"
                  'def longer_than_answer(completion, answer):\n'
                  '  return float(len(completion) > int(answer))\n')
  spec = importlib.util.spec_from_file_location('config_config_test', path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  try:
    spec.loader.exec_module(module)
    assert not worker_lib.importable_by_name(spec.name)  # pylint: disable=protected-access
    with RewardRunner({'test_from_a_path': 1.0}, num_workers=1) as runner:
      result = runner(['abc', 'a'], ['2', '2'])
  finally:
    del sys.modules[spec.name]
  assert result.total.tolist() == [1.0, 0.0] and result.errors == {'test_from_a_path': 0}, (
      result.error_messages)
  assert worker_lib.importable_by_name('reward_fixtures')  # pylint: disable=protected-access
