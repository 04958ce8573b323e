"""Host <-> device data movement that is correct with one process or many (jax.distributed).

With several processes a jax.Array spans devices that this process cannot read, and a numpy
array passed to a jitted function is taken to be the same global value on every process. The RL
loop keeps to one rule that makes both safe: every host-side value that feeds the device is a
*global* value, identical on every process (the prompt batch, the rewards), and every device
value the host reads is first gathered to its global value (`to_host`). Expensive host work
(scoring completions) is split by rows and the results gathered (`process_rows`, `gather_rows`).
Input is read the same way: each process reads only its rows of every batch and `GlobalBatches`
gathers the global batch.

With one process every function here is the plain single-host operation.
"""
import json

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


def to_sharding(x, sharding: jax.sharding.Sharding) -> jax.Array:
  """x at `sharding` (or one equivalent to it): a host array placed (place); a jax.Array laid
  out otherwise moved with a device copy on one process, kept on several."""
  if not isinstance(x, jax.Array):
    return place(x, sharding)
  if jax.process_count() > 1 or x.sharding.is_equivalent_to(sharding, x.ndim):
    return x
  return jax.device_put(x, sharding)


def barrier(name: str) -> None:
  """Returns once every process has called barrier(name): what process 0 alone does to shared
  storage (checkpoint deletions, manifests) is then done for all. Nothing with one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


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


def gather_strings(local) -> np.ndarray:
  """Concatenates every process's str array [n] (same n on each), in process order."""
  local = np.asarray(local, dtype=str)
  if jax.process_count() == 1:
    return local
  width = int(gather_rows(np.asarray([max(local.dtype.itemsize // 4, 1)], np.int32)).max())
  codes = local.astype(f'<U{width}').view(np.uint32).reshape(len(local), width)
  return gather_rows(codes).view(f'<U{width}').reshape(-1)


def _gather_field(value) -> np.ndarray:
  value = np.asarray(value)
  if value.dtype.kind in 'US':
    return gather_strings(value)
  return gather_rows(value).astype(value.dtype)   # int64 ids travel as int32 without x64


class GlobalBatches:
  """Global batches from per-process reads: process i of P reads only rows [i*b, (i+1)*b) of
  every global batch of B = P*b records (pipeline.prompt_batches/sft_batches with shard_index,
  shard_count), and each batch is gathered so that every process holds the global value that
  the rest of the loop expects (module docstring). With one process it is the inner iterator.

  get_state/set_state keep grain's iterator state portable: while the processes read in step
  ({'next_index': n} equal on all, nothing skipped) the state saved is the global position
  {'next_index': n*P}, the same as a one-process run's, so a checkpoint resumes on any number
  of processes. Otherwise (records skipped unevenly) every process's state is saved and the run
  must resume with the same number of processes.
  """

  def __init__(self, local_it):
    self.local_it = local_it

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    local = next(self.local_it)
    if jax.process_count() == 1:
      return local
    return {k: _gather_field(v) for k, v in local.items()}

  def get_state(self) -> dict:
    state, count = self.local_it.get_state(), jax.process_count()
    if count == 1:
      return state
    states = [json.loads(s) for s in gather_strings([json.dumps(state, sort_keys=True)])]
    if set(state) == {'next_index'} and all(s == states[0] for s in states):
      return {'next_index': int(state['next_index']) * count}
    return {'process_states': states}

  def set_state(self, state: dict) -> None:
    count = jax.process_count()
    if 'process_states' in state:
      if len(state['process_states']) != count:
        raise ValueError(f'the data position was saved by {len(state["process_states"])} '
                         f'processes that had skipped records unevenly; resume with that many '
                         f'processes (this run has {count})')
      state = state['process_states'][jax.process_index()]
    elif count > 1 and set(state) == {'next_index'}:
      if state['next_index'] % count:
        raise ValueError(f'data position next_index={state["next_index"]} cannot be split over '
                         f'{count} processes')
      state = {'next_index': state['next_index'] // count}
    self.local_it.set_state(state)

  def close(self) -> None:
    """Ends the inner iterator's reading threads (grain's prefetch), as its garbage collection
    would: a failed run's traceback keeps the iterator alive (runs.RunScope closes it)."""
    getattr(self.local_it, 'close', lambda: None)()
