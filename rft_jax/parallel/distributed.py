"""Multi-host start-up: jax.distributed.initialize from environment variables.

Every host runs the same command; before any other JAX call (first thing in main):

  JAX_COORDINATOR_ADDRESS=host0:1234   the coordinator (process 0's host and a free port)
  JAX_NUM_PROCESSES=N                  number of processes (one per host)
  JAX_PROCESS_ID=i                     this process, 0 .. N-1

JAX itself reads only JAX_COORDINATOR_ADDRESS; the other two are passed here. On Cloud TPU pods,
SLURM and Open MPI, RFT_DISTRIBUTED=1 alone lets JAX detect all three. Without any of these
variables nothing happens (one process). Afterwards jax.devices() lists every host's devices, so
config.mesh describes the global mesh (data * fsdp * tensor = all devices); each host feeds its
devices' rows and scores its share of the completions (rft_jax/parallel/hostdata.py).
"""
import os

import jax


def initialize_from_env(environ=None) -> bool:
  """Calls jax.distributed.initialize per the variables above; returns whether it did."""
  env = os.environ if environ is None else environ
  address = env.get('JAX_COORDINATOR_ADDRESS')
  if not address and env.get('RFT_DISTRIBUTED', '') not in ('1', 'true'):
    return False
  kwargs = {}
  if address:
    kwargs['coordinator_address'] = address
  if env.get('JAX_NUM_PROCESSES'):
    kwargs['num_processes'] = int(env['JAX_NUM_PROCESSES'])
  if env.get('JAX_PROCESS_ID'):
    kwargs['process_id'] = int(env['JAX_PROCESS_ID'])
  if env.get('JAX_PLATFORMS', '') == 'cpu':   # CPU collectives across processes need gloo
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(**kwargs)
  return True
