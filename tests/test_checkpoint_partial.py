"""What a failed checkpoint write leaves on disk (rft_jax.checkpoint)."""

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
