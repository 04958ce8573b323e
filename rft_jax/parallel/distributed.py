"""Multi-host start-up: jax.distributed.initialize from environment variables.

Every host runs the same command; before any other JAX call (first thing in main):

  JAX_COORDINATOR_ADDRESS=host0:1234   the coordinator (process 0's host and a free port)
  JAX_NUM_PROCESSES=N                  number of processes (one per host)
  JAX_PROCESS_ID=i                     this process, 0 .. N-1

JAX itself reads only JAX_COORDINATOR_ADDRESS; the other two are passed here. On Cloud TPU pods,
SLURM and Open MPI, RFT_DISTRIBUTED=1 alone lets JAX detect all three. Any of them asks for
jax.distributed (JAX_NUM_PROCESSES=1 or JAX_PROCESS_ID=0 alone does not): a number of processes
without the address, off such a cluster, is a DistributedEnvError, not a separate one-process
run on every host. Without any of these variables nothing happens (one process).
Every process waits for the others to connect: a line on stderr after a few seconds says so, and
after RFT_DISTRIBUTED_TIMEOUT_S (default 300) it exits 2 with one line; SIGTERM or Ctrl-C while
it waits ends it at once (jax.distributed.initialize blocks in C++, where Python's signal
handlers never ran, and JAX itself gave up after 300 s with a C++ abort and a stack dump).
Afterwards jax.devices() lists every host's devices, so config.mesh describes the global mesh
(data * fsdp * tensor = all devices); each host feeds its devices' rows and scores its share of
the completions (rft_jax/parallel/hostdata.py).
"""
import os
import signal
import sys
import threading
import time

import jax

from rft_jax import stop_signals

DEFAULT_TIMEOUT_S = 300   # JAX's own initialization_timeout
SAY_WAITING_AFTER_S = 3


class DistributedEnvError(ValueError):
  """A variable above that cannot start jax.distributed (one line naming it)."""


def _int_var(env, name: str, lowest: int) -> int | None:
  if not env.get(name):
    return None
  try:
    value = int(env[name])
  except ValueError:
    value = None
  if value is None or value < lowest:
    raise DistributedEnvError(f'{name}={env[name]!r}: expected an integer >= {lowest}')
  return value


def requested(environ=None) -> bool:
  """Whether the variables above ask for jax.distributed (several processes): the devices of the
  other hosts are then not known before it starts."""
  env = os.environ if environ is None else environ
  several = any(env.get(name, '').strip() not in ('', one)   # a bad value too: named later
                for name, one in (('JAX_NUM_PROCESSES', '1'), ('JAX_PROCESS_ID', '0')))
  return several or bool(env.get('JAX_COORDINATOR_ADDRESS')) or env.get(
      'RFT_DISTRIBUTED', '') in ('1', 'true')


def known_process_count(environ=None) -> tuple[int | None, str]:
  """(the processes a run started here has, how that is known): jax.process_count() once
  jax.distributed is initialised, or where the variables above ask for none (starts JAX's
  backend); else JAX_NUM_PROCESSES, for a run about to start (None where it is not set, as
  with RFT_DISTRIBUTED=1 alone: JAX finds it as it starts). DistributedEnvError for a value that
  is not a number."""
  env = os.environ if environ is None else environ
  if jax.distributed.is_initialized() or not requested(env):
    return jax.process_count(), ''
  return _int_var(env, 'JAX_NUM_PROCESSES', 1), ' of JAX_NUM_PROCESSES'


def initialize_from_env(environ=None) -> bool:
  """Calls jax.distributed.initialize per the variables above; returns whether it did.
  DistributedEnvError for a variable that is not a number, a process id not below the number
  of processes, or RFT_DISTRIBUTED=1 where JAX finds no cluster to read them from."""
  env = os.environ if environ is None else environ
  address = env.get('JAX_COORDINATOR_ADDRESS')
  if not requested(env):
    return False
  kwargs = {}
  if address:
    kwargs['coordinator_address'] = address
  num, index = _int_var(env, 'JAX_NUM_PROCESSES', 1), _int_var(env, 'JAX_PROCESS_ID', 0)
  if num is not None:
    kwargs['num_processes'] = num
  if index is not None:
    kwargs['process_id'] = index
  if num is not None and index is not None and index >= num:
    raise DistributedEnvError(f'JAX_PROCESS_ID={index}: must be below JAX_NUM_PROCESSES={num}')
  if env.get('JAX_PLATFORMS', '') == 'cpu':   # CPU collectives across processes need gloo
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  timeout_s = _int_var(env, 'RFT_DISTRIBUTED_TIMEOUT_S', 1) or DEFAULT_TIMEOUT_S
  try:
    _connect(kwargs, timeout_s, ' '.join(f'{k}={env[k]}' for k in _VARIABLES if env.get(k)))
  except ValueError as e:   # e.g. 'coordinator_address should be defined.' off a cluster
    names = ' '.join(f'{k}={env[k]!r}' for k in _VARIABLES if env.get(k))
    raise DistributedEnvError(f'{names}: jax.distributed cannot start ({e}); off a TPU pod, '
                              'SLURM or Open MPI set JAX_COORDINATOR_ADDRESS, '
                              'JAX_NUM_PROCESSES and JAX_PROCESS_ID') from None
  return True


def _connect(kwargs: dict, timeout_s: int, names: str) -> None:
  """jax.distributed.initialize(**kwargs) in a thread while this one waits: a signal's handler
  runs here (SIGTERM: exit 75, Ctrl-C: 130, as stop_signals.exit_at_once; the half-connected
  client cannot be taken back, so the process ends), and after timeout_s without all the
  processes this exits 2 with one line, before JAX's own deadline (a minute later) aborts.
  Raises what initialize raised (e.g. ValueError off a cluster)."""
  outcome: list[BaseException | None] = []

  def attempt():
    try:
      jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s + 60)
      outcome.append(None)
    except BaseException as e:  # pylint: disable=broad-exception-caught
      outcome.append(e)

  thread = threading.Thread(target=attempt, name='jax.distributed.initialize', daemon=True)
  start = time.monotonic()
  thread.start()
  said = False
  try:
    while thread.is_alive() and time.monotonic() - start < timeout_s:
      thread.join(0.25)
      if thread.is_alive() and not said and time.monotonic() - start > SAY_WAITING_AFTER_S:
        print(f'waiting for every process to connect ({names}; jax.distributed, up to '
              f'{timeout_s} s: RFT_DISTRIBUTED_TIMEOUT_S)', file=sys.stderr, flush=True)
        said = True
  except KeyboardInterrupt:
    stop_signals.exit_at_once(signal.SIGINT, None)
  except stop_signals.SetupInterrupted:
    stop_signals.exit_at_once(signal.SIGTERM, None)
  if thread.is_alive():
    os.write(2, f'error: {names}: not every process connected within {timeout_s} s '
                '(jax.distributed); start the same command on every host, each with its own '
                'JAX_PROCESS_ID, or raise RFT_DISTRIBUTED_TIMEOUT_S\n'.encode())
    os._exit(2)   # pylint: disable=protected-access  (the waiting client cannot be stopped)
  if outcome[0] is not None:
    raise outcome[0]


_VARIABLES = ('RFT_DISTRIBUTED', 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES',
              'JAX_PROCESS_ID')
