"""Run by tests/test_preemption.py as two jax.distributed CPU processes: SIGTERM to one of them
must stop both after the same step (runs.StopRequest.agreed is a collective)."""
import sys
import time

import jax


def main(process_id: int, port: int, out_path: str) -> None:
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=f'localhost:{port}', num_processes=2,
                             process_id=process_id)
  from rft_jax import runs  # pylint: disable=g-import-not-at-top
  stop = runs.StopRequest()
  for step in range(1, 3000):
    time.sleep(0.01)
    with open(out_path, 'w') as f:
      f.write(f'{step}\n')
    if stop.agreed():
      print(f'stopped after step {step}: {stop.signal_name}', flush=True)
      sys.exit(75)
  sys.exit(1)


if __name__ == '__main__':
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
