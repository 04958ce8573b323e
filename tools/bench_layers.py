"""Compile time, step time and XLA's temp memory of the training forward+backward pass against
depth: layers unrolled or in one lax.scan (config.model.scan_layers), with each remat policy.

  python -m tools.bench_layers [--layers 4,16,32] [--batch 64] [--seq 48] [--repeats 5]

The model is configs/common.py's tiny model (hidden 128, FFN 384, 4 heads) at each depth; the
function is jit(value_and_grad(token-mean NLL)) on random tokens. Compile time is
`lower().compile()` wall time (no persistent cache); step time the median of --repeats calls
after one warm-up; temp memory XLA's own `memory_analysis().temp_size_in_bytes` (what the
backward pass keeps plus scratch, per device). Prints a markdown table with the machine named.
"""
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import common
from rft_jax.models import ModelConfig, create, forward
from rft_jax.models.llama import REMAT_POLICIES
from tools import cli
from tools.bench_report import machine


def nll_value_and_grad(cfg: ModelConfig):
  """params, tokens [B,T] -> (mean next-token NLL, grads), jitted."""
  graphdef, _ = create(cfg)

  def loss(params, tokens_bt):
    mask_bt = jnp.ones_like(tokens_bt)
    logp = jax.nn.log_softmax(forward(graphdef, params, tokens_bt, mask_bt)[:, :-1])
    return -jnp.take_along_axis(logp, tokens_bt[:, 1:, None], -1).mean()
  return jax.jit(jax.value_and_grad(loss))


def measure(cfg: ModelConfig, batch: int, seq: int, repeats: int) -> dict:
  _, params = create(cfg, seed=0)
  tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, cfg.vocab_size)
  t0 = time.perf_counter()
  compiled = nll_value_and_grad(cfg).lower(params, tokens).compile()
  compile_s = time.perf_counter() - t0
  jax.block_until_ready(compiled(params, tokens))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(params, tokens))
    times.append(time.perf_counter() - t0)
  mem = compiled.memory_analysis()
  temp = getattr(mem, 'temp_size_in_bytes', float('nan')) if mem is not None else float('nan')
  return {'compile_s': compile_s, 'step_s': float(np.median(times)), 'temp_mb': temp / 2**20}


def main(argv=None):
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--layers', default='4,16,32')
  ap.add_argument('--batch', type=int, default=64)
  ap.add_argument('--seq', type=int, default=48)
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--remat', default='none,full', help='comma-separated ModelConfig.remat values')
  args = ap.parse_args(argv)
  try:   # a bad value: one usage line, exit 2 (were tracebacks; --repeats 0 printed nan)
    depths = [int(x) for x in args.layers.split(',')]
  except ValueError:
    depths = [0]
  if min(depths) < 1:
    ap.error(f'--layers={args.layers!r}: expected comma-separated integers >= 1')
  known = ('none', *REMAT_POLICIES)
  unknown = set(args.remat.split(',')) - set(known)
  if unknown:
    ap.error(f'--remat={args.remat!r}: unknown {sorted(unknown)}; known: ' + ', '.join(known))
  for flag, value in (('batch', args.batch), ('seq', args.seq), ('repeats', args.repeats)):
    if value < 1:
      ap.error(f'--{flag}={value}: must be >= 1')
  base = ModelConfig.from_dict(common.tiny_model())
  m = machine()
  print(f"{m['cpu']}, {m['cores']} cores, {m['device']}, jax {m['jax']}, "
        f"load {m['load_avg_1min']:.1f}; batch {args.batch} x {args.seq} tokens\n")
  print('| layers | remat | loop | compile s | step s | XLA temp MB |')
  print('|---:|---|---|---:|---:|---:|')
  for layers in depths:
    for remat in args.remat.split(','):
      for scan in (False, True):
        cfg = dataclasses.replace(base, num_hidden_layers=layers, remat=remat, scan_layers=scan)
        r = measure(cfg, args.batch, args.seq, args.repeats)
        print(f"| {layers} | {remat} | {'scan' if scan else 'unrolled'} | {r['compile_s']:.2f} "
              f"| {r['step_s']:.3f} | {r['temp_mb']:.1f} |", flush=True)


if __name__ == '__main__':
  main()
