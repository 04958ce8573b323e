"""Fixtures shared by several test modules (a fixture used by one module stays in it)."""
import os

import pytest

import xla_flags

xla_flags.use_fast_compile()   # before any test imports JAX: see xla_flags.py
# Runs compile their train programs at first use, not on a thread ahead (rft_jax/compile_ahead.py):
# many tests stop a run before its first step on purpose. tests/test_recompile.py turns it on.
os.environ['RFT_JAX_COMPILE_AHEAD'] = '0'


@pytest.fixture
def assets(tmp_path):
  """A tokenizer file and an init_from directory that exist, as absolute paths (for the
  config tests: validate() only checks that they exist)."""
  tokenizer = tmp_path / 'tok.model'
  tokenizer.write_bytes(b'not read by validate')
  init_from = tmp_path / 'base'
  init_from.mkdir()
  return str(tokenizer), str(init_from)


def _process_signals():
  """The main thread's SIGINT/SIGTERM/SIGALRM handlers, its blocked signals, the SIGALRM timer
  and the working directory: what a run or a verifier changes and must put back."""
  import os  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
  return ({s: signal.getsignal(s) for s in sigs},
          signal.pthread_sigmask(signal.SIG_BLOCK, []),
          signal.getitimer(signal.ITIMER_REAL)[0] > 0,   # armed (its time left runs down)
          os.getcwd())


def _restore_signals(saved) -> None:
  import os  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  handlers, mask, armed, cwd = saved
  if not armed:
    signal.setitimer(signal.ITIMER_REAL, 0)
  for sig, handler in handlers.items():
    signal.signal(sig, handler)
  signal.pthread_sigmask(signal.SIG_SETMASK, mask)
  os.chdir(cwd)


@pytest.fixture(autouse=True)
def no_orbax_logging_left_muted():
  """Every test closes the Checkpointers it opens: one left open after a failed save or restore
  keeps orbax's logging muted (checkpoint_errors.Quiet) in the process, a notebook's included.
  Nor may a test leave a signal handler, a blocked signal, an armed SIGALRM timer or another
  working directory behind: the tests after it (in CI's order) would inherit them. Checked
  after each test, so the test that leaves it is the one that fails."""
  import logging  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from rft_jax import checkpoint_errors  # pylint: disable=g-import-not-at-top
  names = checkpoint_errors._LOGGERS   # pylint: disable=protected-access  (the ones Quiet mutes)
  before = [list(logging.getLogger(n).filters) for n in names], sys.unraisablehook
  signals_before = _process_signals()
  yield
  after = [list(logging.getLogger(n).filters) for n in names], sys.unraisablehook
  signals_after = _process_signals()
  if after != before:   # put back, so the tests after this one are judged on their own
    for n, filters in zip(names, before[0]):
      logging.getLogger(n).filters[:] = filters
    sys.unraisablehook = before[1]
    pytest.fail(f'the test left logging filters or sys.unraisablehook changed: {after}')
  if signals_after != signals_before:
    _restore_signals(signals_before)
    changed = [(what, b, a) for what, b, a in zip(
        ('signal handlers', 'blocked signals', 'SIGALRM timer armed', 'working directory'),
        signals_before, signals_after) if b != a]
    pytest.fail(f'the test left process state changed (before, after): {changed}')
