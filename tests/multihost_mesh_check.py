"""Run by tests/test_parallel.py as 2 processes x 4 CPU devices, configured only by env vars
(rft_jax.parallel.distributed): build the global (2, 2, 2) mesh, place a row-sharded batch from
each process's local rows, reduce it under jit; then the host<->device helpers of
rft_jax/parallel/hostdata.py on arrays no single process holds. Prints one marked JSON line."""
import json

from rft_jax.parallel import distributed

assert distributed.initialize_from_env()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rft_jax.parallel import hostdata  # noqa: E402
from rft_jax.parallel import mesh as meshlib  # noqa: E402


def main():
  mesh = meshlib.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
  rows = 16 // jax.process_count()
  local = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + 100 * jax.process_index()
  batch = jax.make_array_from_process_local_data(meshlib.batch_sharding(mesh), local, (16, 3))
  total = jax.jit(jnp.sum, out_shardings=meshlib.replicated(mesh))(batch)
  # Marked: gloo/XLA may print their own lines to stdout in either process.
  result = {'process': jax.process_index(), 'processes': jax.process_count(),
            'devices': jax.device_count(), 'local_devices': jax.local_device_count(),
            'sum': float(total)}
  # The same global value on both processes -> row-sharded array -> back to numpy on each.
  global_value = np.arange(16 * 3, dtype=np.int32).reshape(16, 3)
  placed = hostdata.place(global_value, meshlib.batch_sharding(mesh))
  result['placed_fully_addressable'] = placed.is_fully_addressable
  result['round_trip'] = bool((hostdata.to_host(placed) == global_value).all())
  rows_here = hostdata.process_rows(16)
  result['rows'] = [rows_here.start, rows_here.stop]
  result['gathered'] = hostdata.gather_rows(global_value[rows_here] * 10).tolist() == (
      global_value * 10).tolist()
  result['counts'] = hostdata.sum_counts({'a': 1 + jax.process_index(), 'b': 5})
  print('RESULT ' + json.dumps(result), flush=True)


if __name__ == '__main__':
  main()
