"""Checkpoints written by two jax.distributed processes into one shared directory: every process
lists the same checkpoints after each save (tests/multihost_checkpoint_check.py).

Process 0 alone deletes the checkpoints beyond `keep`; the others listed the directory again at
once, before it was done: they kept a deleted step, and a two-process run resumed on another mesh
with `python -m rft_jax.main` had process 1 exit 2 with "No such file or directory:
.../checkpoints/2" (orbax read a step being renamed away) while process 0 finished."""
import os

from multihost_fixtures import run_processes


def test_every_process_lists_the_checkpoints_process_0_kept(tmp_path):
  listed = run_processes('multihost_checkpoint_check.py', devices=1,
                         CKPT_DIR=str(tmp_path / 'checkpoints'))
  assert listed[0] == listed[1] == [[1], [1, 2], [2, 3], [3, 4]], listed
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['3', '4']
