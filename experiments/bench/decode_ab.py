"""Decode A/B behind experiments/bench/README.md's GPU table: the sampler as shipped (inverse-CDF
draw) against greedy argmax and a jax.random.categorical (Gumbel-max) draw, on a bench preset's
model and prompts, EOS off (every row decodes all max_new_tokens), median of 5 calls each.

  python experiments/bench/decode_ab.py [--preset gpu_0p5b] [--workload-json '{...}']
  XLA_FLAGS=... python experiments/bench/decode_ab.py --shipped-only   (flags need a new process)
"""
import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from rft_jax import models  # noqa: E402
from rft_jax.models import ModelConfig  # noqa: E402
from rft_jax.sampling import sampler as samplerlib  # noqa: E402
from tools import bench_grpo  # noqa: E402
from tools import bench_workload as wl  # noqa: E402


def median_s(fn, n: int = 5) -> float:
  jax.block_until_ready(fn())
  times = []
  for _ in range(n):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def choose_categorical(logits_bv, rng, cfg):
  """sampler.choose with jax.random.categorical's Gumbel-max draw (B x V uniforms)."""
  logp_v = jax.nn.log_softmax(logits_bv / cfg.temperature, axis=-1)
  token = jax.random.categorical(rng, logp_v, axis=-1).astype(jnp.int32)
  return token, jnp.take_along_axis(logp_v, token[:, None], axis=-1)[:, 0]


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--preset', default='gpu_0p5b', choices=sorted(wl.PRESETS))
  ap.add_argument('--workload-json', default='{}')
  ap.add_argument('--shipped-only', action='store_true')
  args = ap.parse_args()
  w = dataclasses.replace(wl.PRESETS[args.preset], **json.loads(args.workload_json))
  cfg = ModelConfig.from_dict(w.model_dict())
  assets = tempfile.mkdtemp(prefix='decode_ab_')
  wl.write_assets(w, nnx.to_pure_dict(models.create(cfg, w.seed)[1]), cfg, assets, 1)
  side = bench_grpo.RftSide(w, assets)
  tokens, mask = side.prompts(0)
  params, key = side.state.params, jax.random.key(0)

  def sampler(temperature=1.0):
    scfg = samplerlib.SamplingConfig(max_new_tokens=w.max_new_tokens, eos_id=-1,
                                     pad_id=wl.PAD_ID, temperature=temperature)
    fn = samplerlib.make_sampler(side.graphdef, cfg, scfg, w.group_size)
    return lambda: fn(params, tokens, mask, key)

  out = {'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
         'xla_flags': os.environ.get('XLA_FLAGS', ''), 'rows': w.rows,
         'new_tokens': w.max_new_tokens}
  out['shipped (inverse-CDF draw) s'] = median_s(sampler())
  if not args.shipped_only:
    out['greedy argmax s'] = median_s(sampler(0.0))
    shipped = samplerlib.choose
    samplerlib.choose = choose_categorical   # sample() looks choose up at trace time
    try:
      out['categorical draw s'] = median_s(sampler())
    finally:
      samplerlib.choose = shipped
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
