"""Tests for rft_jax.rewards: the arithmetic verifiers, the registry, the runner's configuration,
totals and metrics, and inline verifiers scored in this process beside the workers. The worker
pool (verifiers sent to workers, failures, timeouts, start-up and exit) is in
test_reward_workers.py."""
import math
import os
import sys
import threading
import types

import numpy as np
import pytest

from rft_jax.rewards import runner as runner_lib
from rft_jax.rewards import verifiers

# Spawned workers import test verifiers by module path and inherit sys.path from this process:
# make sure the directory holding reward_fixtures is on it however pytest imported this file.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
  sys.path.insert(0, _TESTS_DIR)
import reward_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position

RewardRunner = runner_lib.RewardRunner

# (completion, answer, correct, format)
VERIFIER_CASES = [
    ('85', '85', 1.0, 1.0),
    (' 85 ', '85', 1.0, 1.0),
    ('85\n', '85', 1.0, 1.0),
    ('085', '85', 1.0, 1.0),
    ('-33', '-33', 1.0, 1.0),
    ('-033', '-33', 1.0, 1.0),
    ('33', '-33', 0.0, 1.0),
    ('-0', '0', 1.0, 1.0),
    ('0', '0', 1.0, 1.0),
    ('84', '85', 0.0, 1.0),
    ('85.0', '85', 0.0, 0.0),
    ('8 5', '85', 0.0, 0.0),
    ('+85', '85', 0.0, 0.0),
    ('1_000', '1000', 0.0, 0.0),
    ('85!', '85', 0.0, 0.0),
    ('85 85', '85', 0.0, 0.0),
    ('', '85', 0.0, 0.0),
    ('   ', '85', 0.0, 0.0),
    ('-', '85', 0.0, 0.0),
    ('\u0668\u0665', '85', 0.0, 0.0),  # Arabic-Indic digits: int() accepts them, we do not.
    ('123456', '123456', 1.0, 1.0),
    ('-123456', '-123456', 1.0, 1.0),
    ('1234567', '1234567', 1.0, 0.0),  # Correct but over 6 digits.
    ('0000085', '85', 1.0, 0.0),  # Leading zeros count as digits.
    ('9' * 5000, '9' * 5000, 1.0, 0.0),  # Beyond int()'s 4300-digit limit.
    ('85', ' 85 ', 1.0, 1.0),
]


@pytest.mark.parametrize('completion,answer,want_correct,want_format', VERIFIER_CASES)
def test_verifiers_table(completion, answer, want_correct, want_format):
  assert verifiers.VERIFIERS['correct'](completion, answer) == want_correct
  assert verifiers.VERIFIERS['format'](completion, answer) == want_format


def test_correct_raises_on_malformed_answer():
  with pytest.raises(ValueError, match='not an integer'):
    verifiers.correct('85', '85.0')


def test_registry():
  assert verifiers.get_verifier('correct') is verifiers.correct
  with pytest.raises(KeyError, match='known: .*correct.*format'):
    verifiers.get_verifier('nosuch')
  # Re-registering the same function is fine (a module imported again in a worker) ...
  verifiers.register_verifier('correct')(verifiers.correct)
  # ... a different function under a taken name is not.
  with pytest.raises(ValueError, match='registered twice'):
    verifiers.register_verifier('correct')(reward_fixtures.length)
  # One definition loaded under two module names (a recipe file, as the command line loads it)
  # is the same function.
  twin = types.FunctionType(verifiers.correct.__code__, {}, 'correct')
  twin.__module__ = 'another_name_for_the_module'
  verifiers.register_verifier('correct')(twin)
  verifiers.register_verifier('correct')(verifiers.correct)   # restore it
  assert verifiers.get_verifier('correct') is verifiers.correct


def test_runner_rejects_bad_config():
  with pytest.raises(KeyError, match=r"unknown verifier 'nosuch'; known: .*correct, .*format"):
    RewardRunner({'correct': 1.0, 'nosuch': 1.0})
  with pytest.raises(ValueError, match='reserved'):
    RewardRunner({'total': 1.0})
  # A verifier that cannot be sent to a worker fails at construction, not in the worker.
  lock = threading.Lock()
  verifiers.register_verifier('test_holds_a_lock')(lambda c, a, _lock=lock: 1.0)
  with pytest.raises(ValueError, match=r"^verifier 'test_holds_a_lock' cannot be sent to worker "
                     r"processes \(TypeError: .*\); use num_workers=0"):
    RewardRunner({'test_holds_a_lock': 1.0}, num_workers=2)
  RewardRunner({'test_holds_a_lock': 1.0}, num_workers=0)  # Inline needs no pickling.


def _batch(n=50, seed=0):
  rng = np.random.default_rng(seed)
  answers, completions = [], []
  for _ in range(n):
    a, b = rng.integers(-99, 100, size=2)
    answers.append(str(a + b))
    completions.append(rng.choice([str(a + b), str(a + b + 1), f' {a + b}', f'{a + b}.0',
                                   'x', '', '0' * 8 + str(abs(a + b))]))
  return completions, answers


@pytest.mark.parametrize('num_workers', [0, 2])
def test_totals_match_plain_loop(num_workers):
  weights = {'correct': 1.0, 'format': 0.25, 'test_length': -0.5}
  completions, answers = _batch()
  with RewardRunner(weights, num_workers=num_workers) as runner:
    result = runner(completions, answers)
    again = runner(completions[:3], answers[:3])  # Workers are reused across calls.
  want = [sum(w * verifiers.VERIFIERS[name](c, a) for name, w in weights.items())
          for c, a in zip(completions, answers)]
  np.testing.assert_allclose(result.total, want, rtol=1e-6)
  np.testing.assert_allclose(again.total, want[:3], rtol=1e-6)
  assert result.total.dtype == np.float32 and result.total.shape == (50,)
  assert result.valid.all()
  for name in weights:
    want_v = [verifiers.VERIFIERS[name](c, a) for c, a in zip(completions, answers)]
    np.testing.assert_array_equal(result.per_verifier[name], np.float32(want_v))
  assert result.errors == result.timeouts == {name: 0 for name in weights}
  assert result.error_messages == {}


def test_metrics():
  result = runner_lib.RewardResult(
      total=np.float32([1.5, 0.0, 0.5, 0.0]),
      per_verifier={'correct': np.float32([1, 0, 0, np.nan]),
                    'format': np.float32([1, np.nan, 1, 1])},
      valid=np.array([True, False, True, False]),
      errors={'correct': 0, 'format': 1}, timeouts={'correct': 1, 'format': 0})
  assert result.metrics() == {
      'reward/correct/mean': 0.5, 'reward/format/mean': 1.0, 'reward/total/mean': 1.0,
      'reward/correct/std': 0.5, 'reward/format/std': 0.0,
      'reward/errors/correct': 0.0, 'reward/errors/format': 1.0,
      'reward/timeouts/correct': 1.0, 'reward/timeouts/format': 0.0,
      'reward/invalid_frac': 0.5, 'reward/stuck_chunks': 0.0}


def test_empty_batch_and_length_mismatch():
  runner = RewardRunner({'correct': 1.0}, num_workers=2)
  result = runner([], [])
  assert result.total.shape == (0,) and result.valid.shape == (0,)
  assert math.isnan(result.metrics()['reward/correct/mean'])
  assert runner.worker_pids == []  # An empty batch starts no workers.
  with pytest.raises(ValueError, match='3 completions but 2 answers'):
    runner(['1', '2', '3'], ['1', '2'])

def test_inline_verifiers_score_in_this_process_beside_the_workers():
  """Verifiers registered inline=True run here; the others in the workers, in the same call."""
  pid = str(os.getpid())
  with RewardRunner({'test_in_process_inline': 1.0, 'test_in_process': 2.0},
                    num_workers=2) as runner:
    result = runner(['a'] * 4, [pid] * 4)
    assert len(runner.worker_pids) == 2
  assert result.per_verifier['test_in_process_inline'].tolist() == [1.0] * 4
  assert result.per_verifier['test_in_process'].tolist() == [0.0] * 4
  assert result.total.tolist() == [1.0] * 4 and result.valid.all()


def test_only_inline_verifiers_start_no_workers():
  completions, answers = _batch()
  with RewardRunner({'correct': 1.0, 'format': 0.25}, num_workers=2) as runner:
    runner.start(wait=False)
    result = runner(completions, answers)
    assert runner.worker_pids == []
  want = [verifiers.correct(c, a) + 0.25 * verifiers.format_ok(c, a)
          for c, a in zip(completions, answers)]
  np.testing.assert_allclose(result.total, want, rtol=1e-6)


def test_an_interrupt_while_scoring_inline_leaves_no_answer_for_the_next_call():
  """The workers' chunks are out while the inline verifiers run; an interrupt there ends the
  workers, so the next call cannot read the interrupted call's answers as its own."""
  with RewardRunner({'test_interrupts_inline': 1.0, 'test_equal': 1.0},
                    num_workers=2) as runner:
    with pytest.raises(KeyboardInterrupt):
      runner(['interrupt', 'x', 'y', 'z'], ['interrupt', 'x', 'y', 'z'])
    assert runner.worker_pids == []
    result = runner(['1', '2'], ['1', '3'])
  assert result.total.tolist() == [2.0, 1.0] and result.valid.all()


def test_inline_is_a_property_of_the_name():
  """The same function under another name without inline runs in the workers; a builtin (no
  attributes to set) can be registered inline."""
  import operator  # pylint: disable=g-import-not-at-top
  verifiers.register_verifier('test_correct_in_workers')(verifiers.correct)
  assert verifiers.is_inline('correct') and not verifiers.is_inline('test_correct_in_workers')
  with RewardRunner({'test_correct_in_workers': 1.0, 'correct': 1.0}, num_workers=1) as runner:
    assert runner(['1', '2'], ['1', '3']).total.tolist() == [2.0, 0.0]
    assert len(runner.worker_pids) == 1
  verifiers.register_verifier('test_builtin_inline', inline=True)(operator.eq)
  with RewardRunner({'test_builtin_inline': 1.0}, num_workers=2) as runner:
    assert runner(['a', 'b'], ['a', 'c']).total.tolist() == [1.0, 0.0]
    assert runner.worker_pids == []
