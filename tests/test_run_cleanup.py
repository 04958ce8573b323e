"""A run that fails before or in its step loop (its base eval, a reward worker that cannot start,
SIGTERM in set-up, a bug in the step) leaves nothing running in a process that goes on, as
api.train's in a notebook does: no reward-worker processes, no sink threads, no open files, and
orbax's logging not muted (runs.RunScope). The error itself comes out unchanged.
"""
import collections
import gc
import logging
import multiprocessing
import os
import threading
from multiprocessing import resource_tracker

import pytest

from rft_jax import api, evaluation, runs
from rft_jax.algorithms import sft as sft_step
from rft_jax.rewards import verifiers
from rft_jax.stop_signals import SetupInterrupted
import reward_fixtures  # noqa: F401  (registers test_length: a verifier the workers run)


def rl_config():
  """Tiny GRPO, one step, with what a run can leave behind: a reward worker (test_length runs
  in one), the TensorBoard sink (a writer thread) and metrics.jsonl."""
  return api.load_config('grpo_arith:tiny', {
      'train.steps': 1, 'rewards.num_workers': 1, 'telemetry.tensorboard': True,
      'rewards.weights': {'correct': 1.0, 'test_length': 0.0}})


def orbax_filters() -> list:
  """The filters on the loggers a checkpointer mutes (checkpoint_errors.Quiet), as they are now."""
  return [list(logging.getLogger(n).filters) for n in ('absl', 'orbax', 'asyncio')]


def eval_fails(monkeypatch, error, seen=None):
  """Every Evaluator call raises `error`: the base eval at step 0 is the first. seen: a list
  that gets orbax_filters() as they are then."""
  def fail(self, params):
    if seen is not None:
      seen.append(orbax_filters())
    raise error
  monkeypatch.setattr(evaluation.Evaluator, '__call__', fail)


def open_files() -> list[str]:
  """What this process's file descriptors are open on."""
  fds = [os.path.join('/proc/self/fd', fd) for fd in os.listdir('/proc/self/fd')]
  return sorted(os.readlink(fd) for fd in fds if os.path.exists(fd))


def check_released(train, error_type, match=None, same_as=None):
  """train() raises error_type (`same_as` itself, where given); afterwards the process holds
  what it held before: no more child processes or Python threads (checked while the error is
  held, as a notebook holds the last one: its traceback keeps the run's frames), orbax's loggers
  with the filters they had, and, the error let go, no more open files (those frames hold the
  run's data sources, as they would any local)."""
  resource_tracker.ensure_running()   # multiprocessing's, started once: its pipe stays open
  gc.collect()
  # Judged on what the run adds: an earlier test module in this worker may have left files open
  # (closed by gc meanwhile, maybe) or threads running.
  files, filters = open_files(), orbax_filters()
  children, threads = set(multiprocessing.active_children()), set(threading.enumerate())
  with pytest.raises(error_type, match=match) as raised:
    train()
  assert same_as is None or raised.value is same_as   # unchanged: not wrapped nor replaced
  assert set(multiprocessing.active_children()) <= children   # reward workers ended
  for thread in set(threading.enumerate()) - threads:
    thread.join(timeout=30)   # ending (orbax's clean-up, grain's readers); a sink's never did
  assert [t.name for t in set(threading.enumerate()) - threads] == []
  assert orbax_filters() == filters
  raised.value.with_traceback(None)   # let go of the run's frames, as a notebook at its next
  del raised                          # error (`same_as`, the test's own, still refers to it)
  gc.collect()
  assert sorted((collections.Counter(open_files()) - collections.Counter(files)).elements()) == []


def test_an_rl_base_eval_error_leaves_no_workers_threads_or_files(tmp_path, monkeypatch):
  boom = RuntimeError('boom in the base eval')
  eval_fails(monkeypatch, boom)
  check_released(lambda: api.train(rl_config(), str(tmp_path), progress=False), RuntimeError,
                 same_as=boom)


def test_sigterm_in_the_base_eval_after_a_failed_restore_unmutes_orbax(tmp_path, monkeypatch):
  """The workdir's only checkpoint cannot be read (set aside; orbax's logging is muted until
  the checkpointer closes), then SIGTERM lands in the base eval (preempt_at_once's
  SetupInterrupted, a BaseException)."""
  os.makedirs(tmp_path / 'checkpoints' / '1')   # a step directory orbax lists, with nothing in it
  stop, seen = SetupInterrupted('SIGTERM outside the step loop'), []
  eval_fails(monkeypatch, stop, seen)
  check_released(lambda: api.train(rl_config(), str(tmp_path), progress=False),
                 SetupInterrupted, same_as=stop)
  assert os.listdir(tmp_path / 'checkpoints.quarantine')   # the restore did fail,
  assert all(seen[0])   # and muted orbax's loggers until the checkpointer closed


class DiesAtStart:
  """A verifier whose worker dies unpickling it (exit 3): the worker never starts."""

  def __call__(self, completion, answer):
    return 1.0

  def __reduce__(self):
    return os._exit, (3,)   # pylint: disable=protected-access


def test_a_reward_worker_that_cannot_start_leaves_no_sinks_open(tmp_path, monkeypatch):
  """The worker's failure comes at the first step's scoring, a RuntimeError in the step loop."""
  monkeypatch.setitem(verifiers.VERIFIERS, 'test_dies_at_start', DiesAtStart())
  config = rl_config()
  config.rewards.weights = {'correct': 1.0, 'test_dies_at_start': 0.0}
  check_released(lambda: api.train(config, str(tmp_path), progress=False), RuntimeError,
                 match='reward worker 0 failed to start')


@pytest.mark.parametrize('where', ['base_eval', 'worker_start'])
def test_an_online_dpo_error_leaves_no_workers_threads_or_files(tmp_path, monkeypatch, where):
  """The base eval, or a reward worker that cannot start (at the first step's scoring)."""
  config = api.load_config('online_dpo_arith:tiny', {
      'train.steps': 1, 'rewards.num_workers': 1, 'telemetry.tensorboard': True,
      'rewards.weights': {'correct': 1.0, 'test_length': 0.0}})
  train = lambda: api.train(config, str(tmp_path), progress=False)
  if where == 'base_eval':
    boom = RuntimeError('boom in the base eval')
    eval_fails(monkeypatch, boom)
    check_released(train, RuntimeError, same_as=boom)
  else:
    monkeypatch.setitem(verifiers.VERIFIERS, 'test_dies_at_start', DiesAtStart())
    config.rewards.weights = {'correct': 1.0, 'test_dies_at_start': 0.0}
    check_released(train, RuntimeError, match='reward worker 0 failed to start')


@pytest.mark.parametrize('where', ['base_eval', 'train_step'])
def test_an_sft_error_leaves_no_threads_or_files(tmp_path, monkeypatch, where):
  """The base eval, or the train step as it is traced (a bug in the loop, not a TrainingError)."""
  boom = RuntimeError(f'boom in the {where}')
  if where == 'base_eval':
    eval_fails(monkeypatch, boom)
  else:
    def step(*args, **kwargs):
      raise boom
    monkeypatch.setattr(sft_step, 'train_step', step)
  config = api.load_config('sft_arith:tiny', {'train.steps': 1, 'telemetry.tensorboard': True})
  check_released(lambda: api.train(config, str(tmp_path), progress=False), RuntimeError,
                 same_as=boom)


def test_a_close_that_fails_under_the_run_error_does_not_replace_it(capsys):
  """The rest is still closed, and the failed close is one line on stderr."""
  closed, boom = [], RuntimeError('the run')

  def fails():
    raise OSError('disk')
  with pytest.raises(RuntimeError) as raised:
    with runs.RunScope() as scope:
      scope.callback(closed.append, 'checkpointer')
      scope.callback(fails)
      raise boom
  assert raised.value is boom and closed == ['checkpointer']
  assert capsys.readouterr().err == 'closing the stopped run: OSError: disk\n'
