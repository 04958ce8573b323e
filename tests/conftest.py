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
