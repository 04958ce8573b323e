"""A second invocation in a workdir that a run is using is refused (one line, exit 2)."""
import fcntl
import os

import pytest

from rft_jax import main as main_lib
from rft_jax import workdir_lock


def _hold(path):
  """What a running invocation holds: an exclusive flock on the workdir; the fd to close."""
  fd = os.open(path, os.O_RDONLY)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  return fd


def test_a_second_invocation_in_a_busy_workdir_is_one_line_and_touches_nothing(tmp_path,
                                                                                capsys):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  fd = _hold(workdir)
  try:
    status = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny', '--workdir',
                            str(workdir), '--config.train.steps=1'])
  finally:
    os.close(fd)
  err = capsys.readouterr().err
  assert status == 2
  assert err.count('\n') == 1 and err.startswith('error: ')
  assert f'--workdir={workdir} is in use by another rft_jax run' in err
  assert os.listdir(workdir) == []   # no config.json, checkpoint or metrics of its own


def test_the_lock_is_exclusive_and_released_at_the_end_of_the_block(tmp_path):
  with workdir_lock.held(str(tmp_path)):
    with pytest.raises(workdir_lock.WorkdirBusy, match='in use by another rft_jax run'):
      with workdir_lock.held(str(tmp_path)):
        pass
    with workdir_lock.held(str(tmp_path), take=False):   # a process other than 0: no lock
      pass
  with workdir_lock.held(str(tmp_path)):   # released: the next run takes it
    pass
