"""Runs verifiers over a batch of completions in worker processes, off the jitted path.

    with RewardRunner({'correct': 1.0, 'format': 0.1}, timeout_s=2.0) as runner:
      result = runner(completions, answers)   # RewardResult; result.total is float32 [N]
      log(result.metrics())

Verifiers registered `inline=True` (verifiers.register_verifier; the built-in `correct` and
`format`: bounded-time string checks) are scored in the calling process with no timer, while
the workers score the others; a raise is still an error for that sample. The isolation below
is for the others.

Isolation, from the inside out:
  1. (scoring.py) Each (sample, verifier) call runs under a SIGALRM timer (`timeout_s`). A call
     that runs past it is interrupted and recorded as a timeout; the rest of the chunk is still
     scored. A call that raises is recorded as an error. Neither is ever scored 0: the verifier's
     value is NaN and the sample is marked invalid (`valid[i] == False`, `total[i] == 0.0`). A
     verifier that uses SIGALRM itself (math_verify's timeouts do) and turns the timer off gets
     the runner's handler and timer back before the next call; one that cancels the timer and then
     hangs in the same call, or leaves its own handler behind with the timer on, is left to 3.
  2. Each worker process has an address-space limit (`memory_mb`): a verifier that allocates
     past it gets MemoryError (an error, as in 1); one that dies outright is case 3.
  3. A chunk whose worker does not answer within `n_calls * timeout_s + grace_s` (a verifier stuck
     in C code, or one blocking SIGALRM) is abandoned: all of its samples count as timed out and
     that worker is killed. A worker that dies makes its chunk's samples errors. Either way a
     fresh worker takes its place on the next call (`workers_replaced` counts them).
Workers are plain processes started with 'spawn' (the parent runs JAX threads, so fork is
unsafe), each with its own pipe; they start on the first call (or `start()`) and are reused
across calls. The batch is split into one chunk per worker, so a call costs one pipe round trip
per worker: ~0.2 ms over scoring inline on 2 cores, where a concurrent.futures process pool (its
queues and helper threads) cost ~0.8 ms. `num_workers=0` scores inline in the calling process;
the SIGALRM timeout then applies only on the main thread, and there is no memory limit.

A RewardRunner is not thread-safe: call it from one thread.
"""
import atexit
import dataclasses
import multiprocessing
import multiprocessing.connection
import sys
import threading
import time
import weakref
from typing import Mapping, Sequence

import numpy as np

from rft_jax.rewards import verifiers
from rft_jax.rewards.result import RewardResult
from rft_jax.rewards.scoring import ERROR, OK, TIMEOUT, score_chunk, truncate
from rft_jax.rewards.worker import READY, pickle_for_workers, worker_main

# Names that would collide with the runner's own metric groups.
_RESERVED_NAMES = frozenset({'total', 'errors', 'timeouts', 'invalid_frac', 'stuck_chunks'})

_STARTUP_TIMEOUT_S = 120.0


def _close_workers(workers: list) -> None:
  """Asks each worker in `workers` to stop (killing any that does not within 5 s) and empties
  the list's slots in place."""
  running = [w for w in workers if w is not None]
  workers[:] = [None] * len(workers)
  for w in running:
    try:
      w.conn.send(None)
    except OSError:
      pass
  for w in running:
    w.process.join(timeout=5.0)
    w.kill()   # a no-op for one that has exited; closes our end of its pipe


_LIVE_RUNNERS = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
  """Ends the workers of runners never closed. Registered after multiprocessing's exit handler
  (imported above), so it runs before it: that one waits for non-daemon children, which would
  wait for their next task forever."""
  for runner in list(_LIVE_RUNNERS):
    runner.close()


@dataclasses.dataclass
class _Worker:
  """A spawned worker process and the parent's end of its pipe."""
  process: multiprocessing.process.BaseProcess
  conn: multiprocessing.connection.Connection

  def kill(self) -> None:
    """Kills the process (if still running), waits for it and closes the pipe."""
    self.process.kill()
    self.process.join(timeout=5.0)
    self.conn.close()


def _start_hint() -> str:
  """Why a worker most often dies at start-up: spawn imports the main script again in the
  worker, and a script that trains at import time (no `if __name__ == '__main__':`) makes
  that import fail. Empty when the main module is not a script (python -m, a notebook)."""
  main = sys.modules.get('__main__')
  main_file = getattr(main, '__file__', None)
  if not main_file or getattr(main, '__spec__', None) is not None:   # python -m x: not a script
    return ''
  return (f"; the workers import {main_file} again (multiprocessing spawn), so a script must "
          "start training under `if __name__ == '__main__':`, or set rewards.num_workers=0 "
          "to score in this process")


class RewardRunner:
  """Scores completions with weighted verifiers in spawned worker processes."""

  def __init__(self, weights: Mapping[str, float], timeout_s: float = 2.0,
               num_workers: int = 2, *, grace_s: float = 5.0, memory_mb: int = 0):
    """Creates the runner; worker processes start lazily.

    Args:
      weights: verifier name -> weight in `total`. Every named verifier runs (weight 0 too).
      timeout_s: per-(sample, verifier) time limit in seconds.
      num_workers: worker processes; 0 scores inline in the calling process.
      grace_s: slack added to a chunk's worst-case time before the safety net declares its
        worker stuck and replaces it.
      memory_mb: memory (address space, MiB) a worker's verifiers may allocate beyond the
        worker's own start-up size; past it an allocation fails (MemoryError: the sample is an
        error). 0 = no limit. Not applied inline (num_workers=0).
    """
    if not weights:
      raise ValueError('RewardRunner needs at least one verifier weight')
    if timeout_s <= 0 or grace_s <= 0:
      raise ValueError(f'timeout_s and grace_s must be > 0, got {timeout_s}, {grace_s}')
    if num_workers < 0:
      raise ValueError(f'num_workers must be >= 0, got {num_workers}')
    self._fns = []
    for name in weights:
      if name in _RESERVED_NAMES:
        raise ValueError(f'verifier name {name!r} is reserved for reward metrics')
      self._fns.append((name, verifiers.get_verifier(name)))
    # Rows of the [V, N] results: verifiers scored here untimed, and those isolated (workers,
    # or here under the timer when num_workers=0).
    self._inline_v = [v for v, (name, _) in enumerate(self._fns) if verifiers.is_inline(name)]
    self._isolated_v = [v for v in range(len(self._fns)) if v not in self._inline_v]
    self._weights_v = np.asarray([float(weights[n]) for n, _ in self._fns], np.float32)
    self.timeout_s = float(timeout_s)
    self.num_workers = int(num_workers)
    self.grace_s = float(grace_s)
    self.memory_mb = int(memory_mb)
    self.workers_replaced = 0  # Workers the safety net killed (stuck) or found dead.
    # No workers when every verifier is inline. Changed in place only.
    self._workers: list[_Worker | None] = [None] * (self.num_workers if self._isolated_v else 0)
    self._starting: set[int] = set()   # workers started without waiting for their answer
    # Workers are not daemons (a verifier may start processes of its own), so a runner dropped
    # without close() must still end them: at garbage collection, or at exit (_close_at_exit).
    weakref.finalize(self, _close_workers, self._workers)
    _LIVE_RUNNERS.add(self)
    if self._workers:
      # cloudpickle sends functions of an importable module by name (the worker imports the
      # module) and the rest by value: a verifier defined in a notebook cell, a lambda, a
      # closure. Plain pickle could name __main__'s functions but a spawned worker of a
      # notebook or `python -c` cannot import __main__, and died at start-up.
      self._fn_blobs = []   # [(name, cloudpickle of the verifier)], what each worker gets
      for name, fn in (self._fns[v] for v in self._isolated_v):
        try:
          self._fn_blobs.append((name, pickle_for_workers(fn)))
        except Exception as e:  # pylint: disable=broad-exception-caught
          raise ValueError(
              f'verifier {name!r} cannot be sent to worker processes ({type(e).__name__}: '
              f'{e}); use num_workers=0 to score in this process') from None

  @property
  def names(self) -> list[str]:
    return [name for name, _ in self._fns]

  @property
  def worker_pids(self) -> list[int]:
    """Process ids of the running workers ([] before the first call and after close())."""
    return [w.process.pid for w in self._workers if w is not None]

  def start(self, wait: bool = True) -> None:
    """Starts the workers that are not running (all, the first time). With wait, returns when
    each has answered, so process start-up stays out of a call's deadline; without, returns at
    once (the workers import while the caller compiles) and the next call or start() waits for
    them. No-op when inline."""
    missing = [k for k, w in enumerate(self._workers) if w is None]
    if not missing and not self._starting:   # every call comes here: nothing to do
      return
    ctx = multiprocessing.get_context('spawn')   # The parent runs JAX threads: no fork.
    for k in missing:
      parent_conn, child_conn = ctx.Pipe()
      process = ctx.Process(target=worker_main, name=f'reward-worker-{k}',
                            args=(child_conn, self._fn_blobs, self.memory_mb))
      process.start()
      child_conn.close()   # Only the child holds its end now: its death reads as EOF here.
      self._workers[k] = _Worker(process, parent_conn)
    self._starting.update(missing)
    if not wait:
      return
    for k in sorted(self._starting):
      worker = self._workers[k]
      try:
        if not worker.conn.poll(_STARTUP_TIMEOUT_S):
          raise TimeoutError(f'no answer in {_STARTUP_TIMEOUT_S:.0f} s')
        if worker.conn.recv() != READY:
          raise RuntimeError('unexpected first message')
      except (EOFError, OSError, TimeoutError, RuntimeError) as e:
        worker.process.join(timeout=1.0)
        self.close()
        raise RuntimeError(f'reward worker {k} failed to start: {type(e).__name__}: {e} '
                           f'(exit code {worker.process.exitcode}){_start_hint()}') from e
    self._starting.clear()

  def close(self) -> None:
    """Shuts the worker processes down. The runner restarts them if called again."""
    self._starting.clear()
    _close_workers(self._workers)

  def __enter__(self) -> 'RewardRunner':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def __call__(self, completions: Sequence[str], answers: Sequence[str]) -> RewardResult:
    """Scores `completions[i]` against `answers[i]` with every verifier; see RewardResult."""
    completions, answers = list(completions), list(answers)
    if len(completions) != len(answers):
      raise ValueError(f'{len(completions)} completions but {len(answers)} answers')
    n_v, n = len(self._fns), len(completions)
    values_vn = np.full((n_v, n), np.nan, np.float32)
    status_vn = np.full((n_v, n), OK, np.int8)
    messages = [None] * n_v
    stuck = 0
    if not n:
      return self._result(values_vn, status_vn, messages, stuck)
    sent = self._send_chunks(completions, answers) if self._isolated_v and self._workers else None
    if self._inline_v:   # while the workers score theirs
      try:
        self._score_here(self._inline_v, completions, answers, False, values_vn, status_vn,
                         messages)
      except BaseException:   # e.g. KeyboardInterrupt: no answer may be left for the next call
        self.close()
        raise
    if sent is not None:
      stuck = self._collect_chunks(*sent, values_vn, status_vn, messages)
    elif self._isolated_v:
      use_alarm = threading.current_thread() is threading.main_thread()
      self._score_here(self._isolated_v, completions, answers, use_alarm, values_vn, status_vn,
                       messages)
    return self._result(values_vn, status_vn, messages, stuck)

  def _score_here(self, rows, completions, answers, use_alarm, values_vn, status_vn, messages):
    """Scores verifiers `rows` (indices into self._fns) in this process; fills in place."""
    values, status, first_errors = score_chunk(
        [self._fns[v] for v in rows], completions, answers, self.timeout_s, use_alarm, 0)
    values_vn[rows], status_vn[rows] = values, status
    for v, message in zip(rows, first_errors):
      messages[v] = message

  def _send_chunks(self, completions, answers):
    """Sends one chunk of the batch to each worker -> (send time, [(worker, lo, hi, error)])."""
    self.start()
    n = len(completions)
    edges = np.linspace(0, n, min(len(self._workers), n) + 1).round().astype(int)
    t0 = time.monotonic()
    sent = []
    for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
      try:
        self._workers[k].conn.send(
            (completions[lo:hi], answers[lo:hi], self.timeout_s, True, int(lo)))
        sent.append((k, lo, hi, None))
      except OSError as e:   # The worker is gone (broken pipe).
        sent.append((k, lo, hi, e))
    return t0, sent

  def _collect_chunks(self, t0, sent, values_vn, status_vn, messages) -> int:
    """Fills the isolated verifiers' rows of values/status/messages in place from each worker's
    answer; returns the stuck chunks.

    A worker that does not answer by its chunk's deadline is killed (its chunk: timeouts); one
    that died or whose pipe broke makes its chunk errors. Either is replaced on the next call.
    """
    rows = self._isolated_v
    stuck = 0
    for k, lo, hi, send_error in sent:
      worker = self._workers[k]
      # Worst case for a healthy worker: every call in its chunk runs into the timeout.
      deadline = t0 + (hi - lo) * len(rows) * self.timeout_s + self.grace_s
      error = send_error
      if error is None:
        try:
          if not worker.conn.poll(max(0.0, deadline - time.monotonic())):
            status_vn[rows, lo:hi] = TIMEOUT
            stuck += 1
            self._replace(k)
            continue
          chunk_values, chunk_status, chunk_messages = worker.conn.recv()
        except (EOFError, OSError) as e:   # Died mid-chunk (the pipe reads EOF).
          error = e
      if error is not None:
        worker.process.join(timeout=1.0)
        status_vn[rows, lo:hi] = ERROR
        for v in rows:
          messages[v] = messages[v] or truncate(
              f'reward worker died (exit code {worker.process.exitcode}): '
              f'{type(error).__name__}: {error} [samples {lo}-{hi - 1}]')
        self._replace(k)
        continue
      values_vn[rows, lo:hi] = chunk_values
      status_vn[rows, lo:hi] = chunk_status
      for v, message in zip(rows, chunk_messages):
        messages[v] = messages[v] or message
    return stuck

  def _replace(self, k: int) -> None:
    """Kills worker k (a stuck one ignores everything else); the next call starts a new one."""
    worker, self._workers[k] = self._workers[k], None
    worker.kill()
    self.workers_replaced += 1

  def _result(self, values_vn, status_vn, messages, stuck) -> RewardResult:
    valid_n = (status_vn == OK).all(axis=0)
    total_n = (self._weights_v[:, None] * np.where(status_vn == OK, values_vn, 0.0)).sum(axis=0)
    total_n = np.where(valid_n, total_n, 0.0).astype(np.float32)
    names = self.names
    return RewardResult(
        total=total_n,
        per_verifier={name: values_vn[v].astype(np.float32) for v, name in enumerate(names)},
        valid=valid_n,
        errors={name: int((status_vn[v] == ERROR).sum()) for v, name in enumerate(names)},
        timeouts={name: int((status_vn[v] == TIMEOUT).sum()) for v, name in enumerate(names)},
        error_messages={name: messages[v] for v, name in enumerate(names) if messages[v]},
        stuck_chunks=stuck)
