"""Scores a chunk of completions with verifiers, each call under a time limit: the part of the
reward runner (runner.py) that runs inside a worker process (or inline).

    values_vn, status_vn, first_errors = score_chunk([('correct', fn)], completions, answers,
                                                     timeout_s=2.0, use_alarm=True, offset=0)

A call that raises is an ERROR, one that runs past `timeout_s` (SIGALRM, main thread only) a
TIMEOUT; neither gets a value (NaN). runner.py turns the status codes into RewardResult.
"""
import math
import signal
import time

import numpy as np

# Per-(verifier, sample) status codes.
OK, ERROR, TIMEOUT = 0, 1, 2

_MAX_MESSAGE_CHARS = 300


class VerifierTimeout(BaseException):
  """Raised inside a verifier call by SIGALRM when the call runs past its timeout.

  A BaseException, so a verifier's own `except Exception:` cannot swallow it.
  """


# The call being timed: its start (time.monotonic()) and limit; None between calls.
_call_start = None
_call_limit_s = 0.0


def _on_alarm(signum, frame):
  """SIGALRM: raises VerifierTimeout in the call being timed if it has run past its limit,
  else re-arms the timer for that call's remaining time (or a full limit between calls).

  One timer serves a whole chunk: it is armed once, and fires only when some call could be
  over its limit, so a call costs a clock read and a getitimer check instead of two setitimer
  system calls (0.25 against 0.35 ms for 128 calls of the bench's verifier, on 2 cores).
  """
  del signum, frame
  start = _call_start
  elapsed = 0.0 if start is None else time.monotonic() - start
  if start is not None and elapsed >= _call_limit_s:
    signal.setitimer(signal.ITIMER_REAL, _call_limit_s)   # for the calls after this one
    raise VerifierTimeout()
  signal.setitimer(signal.ITIMER_REAL, max(_call_limit_s - elapsed, 1e-3))


def score_chunk(fns, completions, answers, timeout_s, use_alarm, offset):
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
  global _call_start, _call_limit_s
  n_v, n = len(fns), len(completions)
  values_vn = np.full((n_v, n), np.nan, np.float32)
  status_vn = np.full((n_v, n), OK, np.int8)
  first_errors = [None] * n_v
  clock = time.monotonic if use_alarm else (lambda: None)
  old_handler = None
  if use_alarm:
    _call_start, _call_limit_s = None, float(timeout_s)
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
  try:
    for v, (_, fn) in enumerate(fns):
      values, status = [math.nan] * n, [OK] * n   # lists: cheaper per call than array items
      for i, (completion, answer) in enumerate(zip(completions, answers)):
        try:
          # The alarm raises only while _call_start is set, i.e. inside this inner try, so a
          # timeout always lands in the except clauses below.
          if use_alarm and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0:
            # The call before used SIGALRM itself (math_verify's timeouts do) and turned the
            # timer off: this call gets the runner's handler and timer back. (0.4 us a call;
            # signal.getsignal, to catch a handler left behind with the timer still on, costs
            # 2 us, as much as the whole per-call cost this scheme saves.)
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
          try:
            _call_start = clock()
            value = fn(completion, answer)
          finally:
            _call_start = None
          value = float(value)
          if not math.isfinite(value):
            raise ValueError(f'verifier returned non-finite value {value}')
          values[i] = value
        except VerifierTimeout:
          status[i] = TIMEOUT
        except Exception as e:  # pylint: disable=broad-exception-caught
          status[i] = ERROR
          if first_errors[v] is None:
            first_errors[v] = truncate(
                f'{type(e).__name__}: {e} [sample {offset + i}, completion {completion!r:.60}]')
      values_vn[v], status_vn[v] = values, status
  finally:
    if use_alarm:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
  return values_vn, status_vn, first_errors


def truncate(message: str) -> str:
  return message if len(message) <= _MAX_MESSAGE_CHARS else message[:_MAX_MESSAGE_CHARS] + '...'
