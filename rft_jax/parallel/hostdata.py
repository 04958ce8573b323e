"""Host <-> device data movement that is correct with one process or many (jax.distributed).

With several processes a jax.Array spans devices that this process cannot read, and a numpy
array passed to a jitted function is taken to be the same global value on every process. The RL
loop keeps to one rule that makes both safe: every host-side value that feeds the device is a
*global* value, identical on every process (the prompt batch, the rewards), and every device
value the host reads is first gathered to its global value (`to_host`). Expensive host work
(scoring completions) is split by rows and the results gathered (`process_rows`, `gather_rows`).

With one process every function here is the plain single-host operation.
"""
import jax
import numpy as np
from jax.experimental import multihost_utils


def to_host(x) -> np.ndarray:
  """The global value of a jax.Array (or array-like) as numpy, on every process."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def place(x, sharding: jax.sharding.Sharding) -> jax.Array:
  """A host array holding the same global value on every process -> jax.Array with `sharding`;
  each process fills only the shards its devices hold."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def process_rows(n_rows: int) -> slice:
  """The contiguous rows [i*n/P, (i+1)*n/P) this process (i of P) works on; n % P == 0."""
  count, index = jax.process_count(), jax.process_index()
  if n_rows % count:
    raise ValueError(f'{n_rows} rows cannot be split evenly over {count} processes')
  per = n_rows // count
  return slice(index * per, (index + 1) * per)


def gather_rows(local: np.ndarray) -> np.ndarray:
  """Concatenates every process's rows (same shape on each), in process order."""
  if jax.process_count() == 1:
    return np.asarray(local)
  return np.asarray(multihost_utils.process_allgather(np.asarray(local), tiled=True))


def sum_counts(counts: dict[str, int]) -> dict[str, int]:
  """{name: count} summed over processes (same keys on each)."""
  if jax.process_count() == 1 or not counts:
    return dict(counts)
  names = sorted(counts)
  totals = multihost_utils.process_allgather(np.asarray([counts[k] for k in names], np.int64))
  return {k: int(v) for k, v in zip(names, np.asarray(totals).sum(axis=0))}
