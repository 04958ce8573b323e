"""Test-only verifiers, in a module of their own so spawned reward workers can import them.

The runner pickles verifiers by module path; a worker unpickling one imports this module
(it inherits the parent's sys.path), which registers these names in its VERIFIERS too.
"""
import os
import random
import signal
import time

from rft_jax.rewards import verifiers


@verifiers.register_verifier('test_length')
def length(completion: str, answer: str) -> float:
  """len(completion): a non-binary value, to check weighted sums."""
  del answer
  return float(len(completion))


@verifiers.register_verifier('test_raises_on_boom')
def raises_on_boom(completion: str, answer: str) -> float:
  """Raises RuntimeError when the completion is 'boom', else 1.0."""
  del answer
  if completion == 'boom':
    raise RuntimeError('boom!')
  return 1.0


@verifiers.register_verifier('test_sleeps_on_hang')
def sleeps_on_hang(completion: str, answer: str) -> float:
  """Sleeps (practically) forever when the completion is 'hang', else 1.0."""
  del answer
  if completion == 'hang':
    time.sleep(1000)
  return 1.0


@verifiers.register_verifier('test_stuck_on_hang')
def stuck_on_hang(completion: str, answer: str) -> float:
  """On 'hang', blocks SIGALRM and sleeps: stands in for C code that ignores signals."""
  del answer
  if completion == 'hang':
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(1000)
  return 1.0


@verifiers.register_verifier('test_swallows_everything')
def swallows_everything(completion: str, answer: str) -> float:
  """On 'hang', sleeps inside `except Exception`, which must not swallow the timeout."""
  del answer
  if completion == 'hang':
    try:
      time.sleep(1000)
    except Exception:  # pylint: disable=broad-exception-caught
      return 0.5
  return 1.0


@verifiers.register_verifier('test_returns_nan')
def returns_nan(completion: str, answer: str) -> float:
  """Returns NaN: a verifier bug that must count as an error, not a score."""
  del completion, answer
  return float('nan')


@verifiers.register_verifier('test_broken_key')
def broken_key(completion: str, answer: str) -> float:
  """A broken verifier: raises KeyError on every input (a bug in user reward code)."""
  raise KeyError(f'no such field for {completion!r}')


@verifiers.register_verifier('test_allocates_on_big')
def allocates_on_big(completion: str, answer: str) -> float:
  """On 'big', allocates 2 GiB (and touches it): must hit the worker's memory limit."""
  del answer
  if completion == 'big':
    block = bytearray(2 * 2**30)
    return float(len(block))
  return 1.0


@verifiers.register_verifier('test_hangs_on_5_percent')
def hangs_on_5_percent(completion: str, answer: str) -> float:
  """Hangs on a random 5% of calls (independent of the text, so no answer is always lost);
  otherwise scores nothing (0.0): use with weight 0 beside the real verifiers."""
  del completion, answer
  if _RNG.random() < 0.05:
    time.sleep(1000)
  return 0.0


_RNG = random.Random()   # seeded from the OS: differs per worker process


@verifiers.register_verifier('test_exits_on_die')
def exits_on_die(completion: str, answer: str) -> float:
  """On 'die', ends its process at once with exit code 3 (a crash in native code), else 1.0."""
  del answer
  if completion == 'die':
    os._exit(3)  # pylint: disable=protected-access
  return 1.0


@verifiers.register_verifier('test_sleeps_on_slow')
def sleeps_on_slow(completion: str, answer: str) -> float:
  """On 'slow', sleeps 0.15 s (a slow but healthy call), else 1.0."""
  del answer
  if completion == 'slow':
    time.sleep(0.15)
  return 1.0


def _exit_zero():
  pass


@verifiers.register_verifier('test_starts_a_process')
def starts_a_process(completion: str, answer: str) -> float:
  """Runs a multiprocessing child and returns 1.0 if it exited cleanly (reward code that uses
  multiprocessing itself, e.g. for its own timeouts, must work inside a reward worker)."""
  del completion, answer
  import multiprocessing  # pylint: disable=g-import-not-at-top
  child = multiprocessing.get_context('fork').Process(target=_exit_zero)
  child.start()
  child.join(timeout=30)
  return 1.0 if child.exitcode == 0 else 0.0


@verifiers.register_verifier('test_uses_its_own_alarm')
def uses_its_own_alarm(completion: str, answer: str) -> float:
  """Times itself with SIGALRM as math_verify does (own handler, alarm, alarm(0), handler
  restored), which cancels any timer the caller had armed; 'hang' sleeps before that."""
  del answer
  if completion == 'hang':
    time.sleep(1000)

  def on_alarm(signum, frame):
    raise TimeoutError('own timeout')

  old = signal.signal(signal.SIGALRM, on_alarm)
  signal.alarm(5)
  try:
    value = 1.0
  finally:
    signal.alarm(0)
    if completion != 'keep':   # 'keep': leaves its own handler installed
      signal.signal(signal.SIGALRM, old)
  return value


@verifiers.register_verifier('test_equal')
def equal(completion: str, answer: str) -> float:
  """1.0 iff completion == answer: a plain verifier that runs in the workers."""
  return float(completion == answer)


@verifiers.register_verifier('test_in_process')
def in_process(completion: str, answer: str) -> float:
  """1.0 iff it runs in the process whose pid is `answer` (runs in the workers)."""
  del completion
  return float(os.getpid() == int(answer))


@verifiers.register_verifier('test_in_process_inline', inline=True)
def in_process_inline(completion: str, answer: str) -> float:
  """As in_process, registered inline (runs in the caller's process)."""
  del completion
  return float(os.getpid() == int(answer))


@verifiers.register_verifier('test_interrupts_inline', inline=True)
def interrupts_inline(completion: str, answer: str) -> float:
  """Raises KeyboardInterrupt on 'interrupt' (a second Ctrl-C inside inline scoring)."""
  del answer
  if completion == 'interrupt':
    raise KeyboardInterrupt
  return 1.0


EVERY_8TH_CALLS = [0]   # reset by the test that uses it (inline scoring: this process's count)


@verifiers.register_verifier('test_raises_every_8th')
def raises_every_8th(completion: str, answer: str) -> float:
  """Raises on every 8th call (2 of a tiny recipe's 16 samples), else scores nothing (0.0)."""
  del completion, answer
  EVERY_8TH_CALLS[0] += 1
  if EVERY_8TH_CALLS[0] % 8 == 0:
    raise RuntimeError(f'call {EVERY_8TH_CALLS[0]}')
  return 0.0
