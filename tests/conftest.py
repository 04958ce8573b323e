"""Fixtures shared by several test modules (a fixture used by one module stays in it)."""
import pytest


@pytest.fixture
def assets(tmp_path):
  """A tokenizer file and an init_from directory that exist, as absolute paths (for the
  config tests: validate() only checks that they exist)."""
  tokenizer = tmp_path / 'tok.model'
  tokenizer.write_bytes(b'not read by validate')
  init_from = tmp_path / 'base'
  init_from.mkdir()
  return str(tokenizer), str(init_from)


@pytest.fixture(autouse=True)
def no_orbax_logging_left_muted():
  """Every test closes the Checkpointers it opens: one left open after a failed save or restore
  keeps orbax's logging muted (checkpoint_errors.Quiet) in the process, a notebook's included.
  Checked after each test, so the test that leaves it is the one that fails."""
  import logging  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from rft_jax import checkpoint_errors  # pylint: disable=g-import-not-at-top
  names = checkpoint_errors._LOGGERS   # pylint: disable=protected-access  (the ones Quiet mutes)
  before = [list(logging.getLogger(n).filters) for n in names], sys.unraisablehook
  yield
  after = [list(logging.getLogger(n).filters) for n in names], sys.unraisablehook
  if after != before:   # put back, so the tests after this one are judged on their own
    for n, filters in zip(names, before[0]):
      logging.getLogger(n).filters[:] = filters
    sys.unraisablehook = before[1]
    pytest.fail(f'the test left logging filters or sys.unraisablehook changed: {after}')
