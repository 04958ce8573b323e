"""Runs verifiers over a batch of completions in a process pool, off the jitted path.

    with RewardRunner({'correct': 1.0, 'format': 0.1}, timeout_s=2.0) as runner:
      result = runner(completions, answers)   # RewardResult; result.total is float32 [N]
      log(result.metrics())

Isolation, from the inside out:
  1. Each (sample, verifier) call runs under a SIGALRM timer (`timeout_s`). A call that runs past
     it is interrupted and recorded as a timeout; the rest of the chunk is still scored. A call
     that raises is recorded as an error. Neither is ever scored 0: the verifier's value is NaN
     and the sample is marked invalid (`valid[i] == False`, `total[i] == 0.0`).
  2. Each worker process has an address-space limit (`memory_mb`): a verifier that allocates
     past it gets MemoryError (an error, as in 1); one that dies outright is case 3.
  3. A chunk whose worker does not answer within `n_calls * timeout_s + grace_s` (a verifier stuck
     in C code, or one blocking SIGALRM) is abandoned: all of its samples count as timed out, the
     pool's processes are killed and a fresh pool is started on the next call. A worker that
     dies makes its chunk's samples errors, and the pool is replaced the same way.
Workers use the 'spawn' start method (the parent runs JAX threads, so fork is unsafe), start on
the first call (or `start()`), and are reused across calls. The batch is split into one chunk
per worker, so a call costs one round trip per worker. `num_workers=0` scores inline in the
calling process, for debugging; the SIGALRM timeout then applies only on the main thread.

A RewardRunner is not thread-safe: call it from one thread.
"""
import concurrent.futures
import dataclasses
import math
import multiprocessing
import pickle
import resource
import signal
import threading
import time
from typing import Mapping, Sequence

import numpy as np

from rft_jax.rewards import verifiers

# Per-(verifier, sample) status codes.
OK, ERROR, TIMEOUT = 0, 1, 2

# Names that would collide with the runner's own metric groups.
_RESERVED_NAMES = frozenset({'total', 'errors', 'timeouts', 'invalid_frac', 'stuck_chunks'})

_STARTUP_TIMEOUT_S = 120.0
_MAX_MESSAGE_CHARS = 300


class VerifierTimeout(BaseException):
  """Raised inside a verifier call by SIGALRM when the call runs past its timeout.

  A BaseException, so a verifier's own `except Exception:` cannot swallow it.
  """


_alarm_armed = False


def _on_alarm(signum, frame):
  del signum, frame
  if _alarm_armed:  # A late alarm after the call returned is ignored.
    raise VerifierTimeout()


def _call_with_alarm(fn, completion: str, answer: str, timeout_s: float):
  """Calls `fn(completion, answer)`; SIGALRM raises VerifierTimeout after `timeout_s`."""
  global _alarm_armed
  _alarm_armed = True
  signal.setitimer(signal.ITIMER_REAL, timeout_s)
  try:
    return fn(completion, answer)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    _alarm_armed = False


def _score_chunk(fns, completions, answers, timeout_s, use_alarm, offset):
  """Scores one chunk; runs in a worker process (or inline).

  Args:
    fns: list of (name, verifier) pairs; the verifiers travel pickled by module path.
    completions, answers: lists of n strings.
    timeout_s: per-call timeout, enforced with SIGALRM when `use_alarm`.
    use_alarm: whether to arm SIGALRM (only possible on a process's main thread).
    offset: index of this chunk's first sample in the batch, for error messages.

  Returns:
    (values [V, n] float32, NaN unless OK; status [V, n] int8 of OK/ERROR/TIMEOUT;
     first error message per verifier, or None).
  """
  n_v, n = len(fns), len(completions)
  values_vn = np.full((n_v, n), np.nan, np.float32)
  status_vn = np.full((n_v, n), OK, np.int8)
  first_errors = [None] * n_v
  old_handler = signal.signal(signal.SIGALRM, _on_alarm) if use_alarm else None
  try:
    for v, (_, fn) in enumerate(fns):
      for i in range(n):
        try:
          if use_alarm:
            value = _call_with_alarm(fn, completions[i], answers[i], timeout_s)
          else:
            value = fn(completions[i], answers[i])
          value = float(value)
          if not math.isfinite(value):
            raise ValueError(f'verifier returned non-finite value {value}')
          values_vn[v, i] = value
        except VerifierTimeout:
          status_vn[v, i] = TIMEOUT
        except Exception as e:  # pylint: disable=broad-exception-caught
          status_vn[v, i] = ERROR
          if first_errors[v] is None:
            first_errors[v] = _truncate(
                f'{type(e).__name__}: {e} [sample {offset + i}, '
                f'completion {completions[i]!r:.60}]')
  finally:
    if use_alarm:
      signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
  return values_vn, status_vn, first_errors


def _init_worker(memory_mb: int = 0):
  # Ctrl-C goes to the whole process group; the parent decides what happens to the workers.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if memory_mb:   # address space the verifiers may add on top of the worker's own
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = _address_space_bytes() + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY
                                            else min(soft, hard), hard))


def _address_space_bytes() -> int:
  """This process's current virtual memory size (VmSize), in bytes."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmSize:'):
        return int(line.split()[1]) * 1024
  return 0


def _ping() -> bool:
  return True


def _truncate(message: str) -> str:
  return message if len(message) <= _MAX_MESSAGE_CHARS else message[:_MAX_MESSAGE_CHARS] + '...'


def _nan_mean(x: np.ndarray) -> float:
  return float(x.mean()) if x.size else float('nan')


def _nan_std(x: np.ndarray) -> float:
  return float(x.std()) if x.size else float('nan')


@dataclasses.dataclass
class RewardResult:
  """Rewards for a batch of N completions.

  Attributes:
    total: float32 [N], sum over verifiers of weight * value; 0.0 where not `valid`.
    per_verifier: name -> float32 [N] verifier value; NaN where that verifier raised or timed out.
    valid: bool [N], False where any verifier raised or timed out for that sample.
    errors: name -> number of samples where that verifier raised.
    timeouts: name -> number of samples where that verifier timed out (or its chunk was stuck).
    error_messages: name -> the first error message of that verifier in this batch.
    stuck_chunks: chunks abandoned by the safety net (their worker did not answer in time).
  """
  total: np.ndarray
  per_verifier: dict[str, np.ndarray]
  valid: np.ndarray
  errors: dict[str, int]
  timeouts: dict[str, int]
  error_messages: dict[str, str] = dataclasses.field(default_factory=dict)
  stuck_chunks: int = 0

  def out_of_range_frac(self, weights: Mapping[str, float]) -> float:
    """Share of valid samples whose total lies outside [lo, hi], the range weighted verifiers
    scoring in [0, 1] can produce: lo = sum_v min(w_v, 0), hi = sum_v max(w_v, 0) (with a
    float32 rounding margin). Non-zero means something between the verifiers and the trainer
    changed the reward (a scale, a sign, an undeclared shaping term) or a verifier broke its
    [0, 1] contract; the monitor's invariant/reward_out_of_range."""
    w = np.asarray([float(weights.get(n, 0.0)) for n in self.per_verifier], np.float64)
    lo, hi = np.minimum(w, 0).sum(), np.maximum(w, 0).sum()
    margin = 1e-5 * max(1.0, np.abs(w).sum())
    t = np.asarray(self.total, np.float64)[self.valid]
    return float(np.mean((t < lo - margin) | (t > hi + margin))) if t.size else 0.0

  def metrics(self) -> dict[str, float]:
    """Flat scalar metrics: per-verifier mean and std over valid samples, error/timeout counts,
    invalid fraction."""
    out = {}
    for name, values in self.per_verifier.items():
      out[f'reward/{name}/mean'] = _nan_mean(values[self.valid])
      out[f'reward/{name}/std'] = _nan_std(values[self.valid])
    out['reward/total/mean'] = _nan_mean(self.total[self.valid])
    for name, count in self.errors.items():
      out[f'reward/errors/{name}'] = float(count)
    for name, count in self.timeouts.items():
      out[f'reward/timeouts/{name}'] = float(count)
    out['reward/invalid_frac'] = float(1.0 - self.valid.mean()) if self.valid.size else 0.0
    out['reward/stuck_chunks'] = float(self.stuck_chunks)
    return out


class RewardRunner:
  """Scores completions with weighted verifiers in a pool of spawned worker processes."""

  def __init__(self, weights: Mapping[str, float], timeout_s: float = 2.0,
               num_workers: int = 2, *, grace_s: float = 5.0, memory_mb: int = 0):
    """Creates the runner; worker processes start lazily.

    Args:
      weights: verifier name -> weight in `total`. Every named verifier runs (weight 0 too).
      timeout_s: per-(sample, verifier) time limit in seconds.
      num_workers: worker processes; 0 scores inline in the calling process.
      grace_s: slack added to a chunk's worst-case time before the safety net declares its
        worker stuck and replaces the pool.
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
    self._weights_v = np.asarray([float(weights[n]) for n, _ in self._fns], np.float32)
    self.timeout_s = float(timeout_s)
    self.num_workers = int(num_workers)
    self.grace_s = float(grace_s)
    self.memory_mb = int(memory_mb)
    self.pool_restarts = 0  # How many times the safety net killed and replaced the pool.
    self._pool = None
    if self.num_workers:
      for name, fn in self._fns:
        try:
          pickle.dumps(fn)
        except Exception as e:  # pylint: disable=broad-exception-caught
          raise ValueError(
              f'verifier {name!r} cannot be sent to worker processes ({e}); register a '
              'module-level function, or use num_workers=0') from None

  @property
  def names(self) -> list[str]:
    return [name for name, _ in self._fns]

  def start(self) -> None:
    """Starts the worker processes now (otherwise the first call does). No-op when inline."""
    if self.num_workers == 0 or self._pool is not None:
      return
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=self.num_workers, mp_context=multiprocessing.get_context('spawn'),
        initializer=_init_worker, initargs=(self.memory_mb,))
    self._pool = pool
    # One ping per worker makes the pool spawn all of them; waiting for the pings keeps
    # process start-up (a fresh interpreter per worker) out of the first call's deadline.
    pings = [pool.submit(_ping) for _ in range(self.num_workers)]
    try:
      for ping in pings:
        ping.result(timeout=_STARTUP_TIMEOUT_S)
    except Exception as e:
      self._kill_pool()
      raise RuntimeError(f'reward workers failed to start: {type(e).__name__}: {e}') from e

  def close(self) -> None:
    """Shuts the worker processes down. The runner restarts them if called again."""
    if self._pool is not None:
      pool, self._pool = self._pool, None
      pool.shutdown(wait=True, cancel_futures=True)

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
    if n and self.num_workers == 0:
      use_alarm = threading.current_thread() is threading.main_thread()
      values_vn, status_vn, messages = _score_chunk(
          self._fns, completions, answers, self.timeout_s, use_alarm, 0)
    elif n:
      stuck = self._score_in_pool(completions, answers, values_vn, status_vn, messages)
    return self._result(values_vn, status_vn, messages, stuck)

  def _score_in_pool(self, completions, answers, values_vn, status_vn, messages) -> int:
    """Fills values/status/messages in place from one task per worker; returns stuck chunks."""
    self.start()
    n_v, n = len(self._fns), len(completions)
    edges = np.linspace(0, n, min(self.num_workers, n) + 1).round().astype(int)
    t0 = time.monotonic()
    tasks = []
    for lo, hi in zip(edges[:-1], edges[1:]):
      future = self._pool.submit(_score_chunk, self._fns, completions[lo:hi], answers[lo:hi],
                                 self.timeout_s, True, int(lo))
      tasks.append((lo, hi, future))
    stuck, replace_pool = 0, False
    for lo, hi, future in tasks:
      # Worst case for a healthy worker: every call in its chunk runs into the timeout.
      deadline = t0 + (hi - lo) * n_v * self.timeout_s + self.grace_s
      try:
        chunk_values, chunk_status, chunk_messages = future.result(
            timeout=max(0.0, deadline - time.monotonic()))
      except concurrent.futures.TimeoutError:
        status_vn[:, lo:hi] = TIMEOUT
        stuck += 1
        replace_pool = True
        continue
      except Exception as e:  # pylint: disable=broad-exception-caught
        # A worker died (BrokenProcessPool) or the task could not be (un)pickled.
        status_vn[:, lo:hi] = ERROR
        for v in range(n_v):
          messages[v] = messages[v] or _truncate(f'worker failed: {type(e).__name__}: {e}')
        replace_pool = True
        continue
      values_vn[:, lo:hi] = chunk_values
      status_vn[:, lo:hi] = chunk_status
      for v in range(n_v):
        messages[v] = messages[v] or chunk_messages[v]
    if replace_pool:
      self._kill_pool()
      self.pool_restarts += 1
    return stuck

  def _kill_pool(self) -> None:
    """Kills the pool's processes (a stuck one ignores everything else); the next call
    starts a fresh pool."""
    pool, self._pool = self._pool, None
    if pool is None:
      return
    if hasattr(pool, 'kill_workers'):  # Python >= 3.14.
      pool.kill_workers()
      processes = []
    else:  # No public API before 3.14: kill the executor's processes directly.
      processes = list((getattr(pool, '_processes', None) or {}).values())
      for process in processes:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
      process.join(timeout=5.0)

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
