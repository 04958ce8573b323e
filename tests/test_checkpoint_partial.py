"""What a failed checkpoint write leaves on disk (rft_jax.checkpoint)."""

import asyncio
import os

import pytest
from checkpoint_fixtures import TENSORSTORE_FULL, make_state

from rft_jax import checkpoint


def test_a_write_failing_in_orbax_leaves_no_temporary_directory(tmp_path, monkeypatch):
  """Orbax writes into <step>.orbax-checkpoint-tmp; a failed save left it, holding what was
  written: on a full disk each failed save took more of the space left."""
  from orbax.checkpoint._src.serialization import serialization  # pylint: disable=C0415
  d = str(tmp_path / 'ckpts')
  ckpt = checkpoint.Checkpointer(d, keep=2)
  ckpt.save(1, make_state(1, steps=1), {}, {})

  def full_disk(arr):   # every array orbax writes fails as on a full disk
    raise ValueError(TENSORSTORE_FULL)
  monkeypatch.setattr(serialization, 'estimate_write_memory_footprint', full_disk)
  with pytest.raises(checkpoint.CheckpointSaveError):
    ckpt.save(2, make_state(2, steps=2), {}, {})
  assert sorted(os.listdir(d)) == ['1']
  monkeypatch.undo()
  ckpt.save(3, make_state(3, steps=3), {}, {})
  assert ckpt.all_steps() == [1, 3] and sorted(os.listdir(d)) == ['1', '3']
  ckpt.close()


def test_a_close_before_any_save_waits_for_orbaxs_cleanup_thread(tmp_path, monkeypatch):
  """Orbax removes an interrupted save's temporary directory on a thread started when the
  manager opens; only a save waited for it. A run refused right after opening its checkpoints
  (another seed on resume) exited under that thread, which printed 'cannot schedule new futures
  after shutdown' after the one-line error. Here the removal is slowed: close() waits for it."""
  from orbax.checkpoint._src.path import async_path  # pylint: disable=C0415
  d = tmp_path / 'ckpts'
  with checkpoint.Checkpointer(str(d)) as ckpt:
    ckpt.save(1, make_state(1, steps=1), {}, {})
  (d / '2.orbax-checkpoint-tmp-1765000000').mkdir()   # a save cut short
  rmtree = async_path.rmtree

  async def slow_rmtree(path):
    await asyncio.sleep(0.5)
    return await rmtree(path)
  monkeypatch.setattr(async_path, 'rmtree', slow_rmtree)
  checkpoint.Checkpointer(str(d)).close()
  assert sorted(os.listdir(d)) == ['1']
