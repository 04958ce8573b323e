"""tools/bench's measurements of the machine and its outputs: the machine's name, a matmul rate
measured under jax.jit, per-phase statistics, and the JSON / markdown results."""
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp

PHASES = (  # (key, label): the phases first, then the finer ones
    ('step_s', 'step'), ('sample_s', 'generate'), ('ref_s', 'reference fwd'),
    ('policy_s', 'policy fwd+bwd+update'), ('verify_s', 'verifier'), ('host_s', 'host'),
    ('prefill_s', 'prefill'), ('decode_s', 'decode'), ('train_s', 'ref + policy program'))


def machine() -> dict:
  """CPU model and core count from /proc/cpuinfo and os, plus software versions."""
  model = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
    model = names[0] if names else model
  except OSError:
    pass
  try:
    with open('/proc/loadavg') as f:
      load = float(f.read().split()[0])
  except OSError:
    load = float('nan')
  return {'cpu': model, 'cores': len(os.sched_getaffinity(0)), 'load_avg_1min': load,
          'jax': jax.__version__, 'backend': jax.default_backend(),
          'device': f'{jax.device_count()} x {jax.devices()[0].device_kind}',
          'xla_flags': os.environ.get('XLA_FLAGS', '')}


def matmul_rate(n: int = 2048, repeats: int = 10, dtype: str = 'float32') -> float:
  """Best-of-`repeats` FLOP/s of an [n, n] @ [n, n] matmul in `dtype` under jax.jit."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  mm = jax.jit(jnp.dot)
  mm(a, b).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    t = time.perf_counter()
    mm(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best


# Nominal dense (no sparsity) peak FLOP/s per device, from the vendors' data sheets, for MFU.
# Devices not listed get no MFU row (only the ratio to the measured matmul rate).
PEAK_FLOPS = {
    ('NVIDIA H200', 'bfloat16'): 989e12,
    ('NVIDIA H100 80GB HBM3', 'bfloat16'): 989e12,
    ('NVIDIA A100-SXM4-80GB', 'bfloat16'): 312e12,
    ('NVIDIA A100-SXM4-40GB', 'bfloat16'): 312e12,
}


def peak_flops(dtype: str) -> float | None:
  """PEAK_FLOPS of this process's devices in dtype, summed over the local devices; or None."""
  devices = jax.local_devices()
  peak = PEAK_FLOPS.get((devices[0].device_kind, dtype))
  return peak * len(devices) if peak else None


def peak_device_bytes() -> int | None:
  """Peak bytes in use on device 0 since start (allocator statistics; None on CPU)."""
  peak = (jax.local_devices()[0].memory_stats() or {}).get('peak_bytes_in_use')
  return None if peak is None else int(peak)


def _rate(flops_s: float) -> str:
  return (f'{flops_s / 1e12:.1f} TFLOP/s' if flops_s >= 1e12 else f'{flops_s / 1e9:.1f} GFLOP/s')


def stats(values) -> dict:
  values = [float(v) for v in values]
  if not values:
    return {}
  return {'median': statistics.median(values), 'min': min(values), 'max': max(values),
          'n': len(values)}


def summarise(steps: list[dict]) -> dict:
  """{phase: {median, min, max, n}} over the timed steps."""
  return {k: stats([s[k] for s in steps if k in s]) for k, _ in PHASES
          if any(k in s for s in steps)}


def _sec(x: float) -> str:
  """Seconds, with two significant digits below 10 ms (the verifier's ~0.4 ms read 0.000)."""
  return f'{x:.3f}' if abs(x) >= 0.01 else f'{x:.5f}'


def _s(phase: dict | None) -> str:
  return _sec(phase['median']) if phase else '—'


def markdown(result: dict) -> str:
  """The results as markdown: the issue's table (medians), then the details."""
  m, rft = result['machine'], result['rft_jax']
  cols = PHASES[:6]
  lines = [f"Machine: {m['cpu']}, {m['cores']} cores ({m['device']}), 1-min load average "
           f"{m['load_avg_1min']:.1f} at the start; jax {m['jax']}. Workload: "
           f"{result['workload_text']}. Medians over {rft['phases']['step_s']['n']} steps "
           f"(after {result['warmup']} warm-up steps), seconds.", '',
           '| system | ' + ' | '.join(label for _, label in cols) + ' |',
           '|---' * (len(cols) + 1) + '|',
           '| rft_jax | ' + ' | '.join(_s(rft['phases'].get(k)) for k, _ in cols) + ' |']
  trl = result.get('trl')
  if trl and 'phases' in trl:
    v = trl['versions']
    lines.append(f"| TRL {v['trl']} GRPOTrainer, torch {v['torch']} | "
                 + ' | '.join(_s(trl['phases'].get(k)) for k, _ in cols) + ' |')
    lines.append('| TRL / rft_jax | ' + ' | '.join(
        f"{result['ratio'][k]:.2f}x" if k in result['ratio'] else '—' for k, _ in cols) + ' |')
  elif trl:
    lines.append(f"| TRL | not run: {trl.get('error', '?')} |" + ' |' * (len(cols) - 1))
  lines += ['', '| measure | value |', '|---|---|']
  for k, label in PHASES:
    p = rft['phases'].get(k)
    if p:
      lines.append(f"| rft_jax {label} s (median / min / max) | {_sec(p['median'])} / "
                   f"{_sec(p['min'])} / {_sec(p['max'])} |")
  d = rft['derived']
  lines += [
      f"| prefill prompt tokens/s (each prompt once, shared by its group) | "
      f"{d['prefill_tok_s']:,.0f} |",
      f"| decode tokens/s ({d['gen_tokens']:.0f} tokens per step) | {d['decode_tok_s']:,.0f} |",
      f"| policy update model FLOP/s (6N/token + attention, real tokens) | "
      f"{_rate(d['update_flops_s'])} |",
      f"| matmul rate (jit {result['workload'].get('dtype', 'float32')} {result['matmul_n']}x"
      f"{result['matmul_n']}) | {_rate(result['matmul_flops_s'])} |",
      f"| update FLOP/s / matmul rate | {d['update_mfu']:.0%} |"]
  if 'update_mfu_peak' in d:
    lines.append(f"| update MFU (model FLOP/s / the device's nominal peak, "
                 f"{result['peak_flops_s'] / 1e12:.0f} TFLOP/s) | {d['update_mfu_peak']:.1%} |")
  lines += [
      f"| policy update FLOP/s of the work done (each prompt once per group when shared) | "
      f"{_rate(d.get('update_computed_flops_s', float('nan')))} = "
      f"{d.get('update_computed_mfu', float('nan')):.0%} of the matmul rate |"]
  if result['machine'].get('backend', 'cpu') == 'cpu':
    # (XLA's GPU cost analysis counted 2 of the program's ~76 model TFLOPs on an H200: no rate)
    lines.append(f"| ref + policy program, XLA's FLOP count (padding included) / time | "
                 f"{_rate(d['train_xla_flops_s'])} |")
  if rft.get('warmup_step_s'):
    lines.append(f"| warm-up step(s) in this process, compiles included | "
                 + ', '.join(f'{t:.1f} s' for t in rft['warmup_step_s']) + ' |')
  for name in ('cold', 'warm'):
    f = result.get('first_step', {}).get(name)
    if f and 'error' in f:
      lines.append(f"| time to first step, {name} compilation cache | failed: "
                   f"{' '.join(f['error'])[:200]} |")
    elif f:
      lines.append(f"| time to first step, {name} compilation cache | {f['ttfs_s']:.1f} s "
                   f"(imports {f['import_s']:.1f}, set-up {f['setup_s']:.1f}, first step "
                   f"{f['first_step_s']:.1f}; compile {f['compile_s']:.1f} s, "
                   f"{f['xla_compiles']} programs, {f['cache_hits']} cache hits) |")
  lines.append(f"| peak host memory, rft_jax process | {rft['peak_rss_mib']:.0f} MiB |")
  if rft.get('peak_device_bytes'):
    lines.append(f"| peak device memory, rft_jax | {rft['peak_device_bytes'] / 2**30:.1f} GiB |")
  if trl and 'peak_rss_mib' in trl:
    lines.append(f"| peak host memory, TRL process | {trl['peak_rss_mib']:.0f} MiB |")
  return '\n'.join(lines) + '\n'


def write(result: dict, out_dir: str, name: str) -> tuple[str, str]:
  os.makedirs(out_dir, exist_ok=True)
  paths = (os.path.join(out_dir, f'{name}.json'), os.path.join(out_dir, f'{name}.md'))
  with open(paths[0], 'w') as f:
    json.dump(result, f, indent=1)
  with open(paths[1], 'w') as f:
    f.write(markdown(result))
  return paths
