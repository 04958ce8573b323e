"""Run by tests/test_checkpoint_multihost.py as 2 processes x 1 CPU device, configured by env
vars (rft_jax.parallel.distributed): checkpoints 1..4 with keep=2 into one shared directory,
process 0's deletions slowed (a shared filesystem, a busy host). Prints, marked, the verified
steps each process lists after each save."""
import json
import os
import time

from rft_jax.parallel import distributed

assert distributed.initialize_from_env()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from rft_jax import checkpoint  # noqa: E402


def slow_deletions():
  """Process 0 renames a checkpoint for deletion 1.5 s late."""
  rename = os.replace

  def late(src, dst):
    if str(dst).endswith('.deleting'):
      time.sleep(1.5)
    rename(src, dst)
  os.replace = late


def main():
  if jax.process_index() == 0:
    slow_deletions()
  mesh = Mesh(np.asarray(jax.devices()), ('rows',))
  value = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
  x = jax.make_array_from_callback(value.shape, NamedSharding(mesh, P('rows')),
                                   lambda index: value[index])
  ckpt = checkpoint.Checkpointer(os.environ['CKPT_DIR'], keep=2)
  listed = []
  for step in range(1, 5):
    ckpt.save(step, {'x': x}, {'next_index': step}, {'step': step})
    listed.append(ckpt.all_steps())
  ckpt.close()
  print('RESULT ' + json.dumps(listed), flush=True)


if __name__ == '__main__':
  main()
