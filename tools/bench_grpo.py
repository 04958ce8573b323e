"""rft_jax side of `python -m tools.bench`: the issue-11 GRPO workload (tools/bench_workload.py),
timed phase by phase through the trainer's own jitted functions, in the trainer's order:

  sample    make_sampler(...)            prefill + decode loop, blocked until done
  verify    RewardRunner(texts)          verifiers in the reward workers (text decode is host)
  train     make_step_fns(...).fused     reference pass + policy fwd/bwd + AdamW, one program
  host      trainer.observe + device_get, detokenising, Python between phases

The phases the fused programs hide are timed on their own right after each step, outside the
step's clock, on the same inputs (and the step's updated parameters): `prefill` and `decode`
(sampler.prefill, then sampler.decode on its outputs, each jitted alone; decode may stop at a
different length than the step's sampler did, since the parameters moved) and `ref` (the
reference pass, grpo.score_logprobs, jitted alone, best of 3 calls; policy = train - ref).

  python -m tools.bench_grpo --first-step --assets DIR   (time to first step; run by tools.bench)
"""
import functools
import json
import os
import time

T_START = time.time()

import jax  # noqa: E402  (after T_START: the import counts towards the time to first step)
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from rft_jax import compile_ahead, compile_cache, components, runs  # noqa: E402
from rft_jax.algorithms import grpo, step_fns, train_state as ts  # noqa: E402
from rft_jax.models import functional as lm  # noqa: E402
from rft_jax.models import hf_checkpoint  # noqa: E402
from rft_jax.models.llama import ModelConfig  # noqa: E402
from rft_jax.monitor import monitor as monlib  # noqa: E402
from rft_jax.monitor.detectors import MonitorConfig  # noqa: E402
from rft_jax.parallel import hostdata  # noqa: E402
from rft_jax.parallel import mesh as meshlib  # noqa: E402
from rft_jax.rewards.runner import RewardRunner  # noqa: E402
from rft_jax.sampling import sampler as samplerlib  # noqa: E402
from rft_jax.sampling.text import decode_completions  # noqa: E402
from rft_jax.telemetry import flops  # noqa: E402
from rft_jax.tokenizer import HFTokenizer  # noqa: E402
from rft_jax import trainer  # noqa: E402
from tools import bench_workload as wl, cli  # noqa: E402

T_IMPORTED = time.time()
COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                  '/jax/core/compile/jaxpr_to_mlir_module_duration',
                  '/jax/core/compile/backend_compile_duration')


class CompileClock:
  """Seconds JAX spent tracing, lowering and compiling (or loading from the persistent cache),
  and the XLA programs compiled (their names, in order), from jax.monitoring events."""

  def __init__(self):
    self.seconds, self.programs, self.cache_hits = 0.0, [], 0
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    jax.monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event, secs, fun_name='?', **_):
    if event in COMPILE_EVENTS:
      self.seconds += secs
    if event == COMPILE_EVENTS[-1]:
      self.programs.append(fun_name)

  def _on_event(self, event, **_):
    if event == '/jax/compilation_cache/cache_hits':
      self.cache_hits += 1


def optim_config(w: wl.Workload):
  """AdamW as TRL's defaults (betas 0.9/0.999, no weight decay, grad norm clipped at 1)."""
  return ml_collections.ConfigDict(dict(lr=w.lr, warmup_steps=0, b1=0.9, b2=0.999,
                                        weight_decay=0.0, grad_clip=1.0))


class RftSide:
  """The workload set up as rft_jax.trainer sets up a run (one device, monitor on)."""

  def __init__(self, w: wl.Workload, assets: str):
    self.w = w
    with open(os.path.join(assets, 'prompts.json')) as f:
      self.batches = json.load(f)['batches']
    self.tokenizer = HFTokenizer(assets)
    self.model_cfg = ModelConfig.from_dict(w.model_dict())
    mesh = meshlib.make_mesh(dict(data=-1, fsdp=1, tensor=1))
    graphdef, abstract = lm.abstract_params(self.model_cfg)
    param_sh = meshlib.param_shardings(abstract, mesh)
    params = hf_checkpoint.load_hf_params(assets, self.model_cfg, param_sh)
    c = components.Components(mesh=mesh, tokenizer=self.tokenizer, model_cfg=self.model_cfg,
                              graphdef=graphdef, params=params, param_shardings=param_sh,
                              train_source=None, test_source=None)
    self.graphdef = graphdef
    self.ahead = None   # compile_ahead.Ahead of the first step's fused program (first_step)
    self.algo = grpo.GRPOConfig(kl_coef=w.kl_coef, group_size=w.group_size,
                                shared_prompt=w.shared_prompt)
    tx, schedule = ts.make_optimizer(optim_config(w)), ts.lr_schedule(optim_config(w))
    self.mcfg = MonitorConfig()
    controls = trainer.device_controls(trainer.Controls(kl_coef=w.kl_coef),
                                       ml_collections.ConfigDict({'train': {'steps': 1}}), 1)
    monitor = monlib.init_monitor(self.mcfg)
    shardings = runs.state_shardings(c, tx, controls, monitor)
    self.state = runs.init_state(params, tx, shardings, controls, monitor)
    self.ref_params = params   # as trainer.run: the initial weights themselves, no copy
    rep = meshlib.replicated(mesh)
    self.batch_sh = meshlib.batch_sharding(mesh)
    _, _, self.fused = step_fns.make_step_fns(graphdef, self.algo, tx, schedule, shardings,
                                              self.batch_sh, rep)
    self.observe = trainer.make_observe(self.mcfg, self.algo, w.rows, shardings, rep)
    scfg = samplerlib.SamplingConfig(max_new_tokens=w.max_new_tokens, eos_id=wl.EOS_ID,
                                     pad_id=wl.PAD_ID, temperature=1.0)
    self.sampler = samplerlib.make_sampler(graphdef, self.model_cfg, scfg, w.group_size)
    self.prefill = jax.jit(functools.partial(
        samplerlib.prefill, graphdef, model_cfg=self.model_cfg,
        max_new_tokens=w.max_new_tokens, group_size=w.group_size))
    self.decode = jax.jit(functools.partial(samplerlib.decode, graphdef, model_cfg=self.model_cfg,
                                            cfg=scfg, group_size=w.group_size))
    first = w.prompt_len_max - 1   # as fused_step: the LM head on completion positions only
    self.ref_pass = jax.jit(functools.partial(grpo.score_logprobs, graphdef, first=first,
                                              group_size=self.algo.prompt_group()))
    self.runner = RewardRunner({'first_even': 1.0}, timeout_s=2.0, num_workers=w.reward_workers)

  def prompts(self, step: int):
    """Step's prompts, tokenised by rft_jax's tokenizer and left-padded to the workload's
    longest prompt (the fixed max_prompt_len of a recipe: one shape, no recompiles)."""
    texts = self.batches[step % len(self.batches)]['text']
    ids = [self.tokenizer.encode(t) for t in texts]
    return wl.left_pad(ids, self.w.prompt_len_max)

  def step(self, step: int, extra: bool = True) -> dict:
    """One GRPO step as trainer.run runs it -> seconds per phase (and the step's metrics)."""
    tokens, mask = self.prompts(step)
    t0 = time.perf_counter()
    rollout = jax.block_until_ready(self.sampler(
        self.state.params, tokens, mask, trainer.step_rng(self.w.seed, step)))
    t1 = time.perf_counter()
    texts = decode_completions(self.tokenizer, rollout.tokens_bt, rollout.mask_bt)
    t2 = time.perf_counter()
    rewards = self.runner(texts, [''] * len(texts))
    t3 = time.perf_counter()
    place = lambda x: hostdata.place(x, self.batch_sh)   # as trainer.run's to_device
    if self.ahead is not None:   # as trainer.run: the program compiling on its thread
      self.ahead.wait()
    self.state, metrics, _ = self.fused(self.state, self.ref_params, rollout,
                                        place(rewards.total), place(rewards.valid))
    jax.block_until_ready(self.state.params)
    t4 = time.perf_counter()
    self.state, alarms = self.observe(self.state, metrics)
    metrics, _ = jax.device_get((metrics, alarms))   # the step's one host transfer
    t5 = time.perf_counter()
    out = {'step_s': t5 - t0, 'sample_s': t1 - t0, 'verify_s': t3 - t2, 'train_s': t4 - t3,
           'host_s': (t2 - t1) + (t5 - t4), 'loss': float(metrics['loss']),
           'reward': float(metrics['reward/mean']),
           'gen_tokens': int(np.asarray(rollout.mask_bt).sum())}
    if extra:   # the hidden phases, timed alone on the same inputs (outside the step's clock)
      t = time.perf_counter()
      prefilled = jax.block_until_ready(self.prefill(self.state.params, tokens, mask))
      out['prefill_s'] = time.perf_counter() - t
      rng = trainer.step_rng(self.w.seed, step)
      t = time.perf_counter()
      jax.block_until_ready(self.decode(self.state.params, tokens, mask, rng, *prefilled))
      out['decode_s'] = time.perf_counter() - t
      seq, seq_mask, _, _ = grpo.rollout_sequences(rollout)
      # Best of 3: ref_s is subtracted from the fused program's time, so a one-off stall here
      # would understate the policy phase (at the tiny preset even below zero).
      ref_times = []
      for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(self.ref_pass(self.ref_params, seq, seq_mask))
        ref_times.append(time.perf_counter() - t)
      out['ref_s'] = min(ref_times)
      out['policy_s'] = out['train_s'] - out['ref_s']
    return out

  def flops(self, step: int) -> dict:
    """Model FLOPs (rft_jax.telemetry.flops: real tokens, no padding) of one step's phases,
    with the mean completion length of the workload's first rollout; 'policy_update' counts each
    row's prompt (the convention of the FLOPs papers, and TRL's work), 'policy_update_computed'
    the work the update does (with shared_prompt each prompt once per group)."""
    tokens, mask = self.prompts(step)
    p_b = np.repeat(mask.sum(-1), self.w.group_size).astype(float)
    g = float(self.w.max_new_tokens)
    fwd = sum(flops.forward_flops(self.model_cfg, p + g) for p in p_b)
    unique_prefill = sum(flops.forward_flops(self.model_cfg, p) for p in mask.sum(-1))
    decode = sum(flops.forward_flops(self.model_cfg, p + g)
                 - flops.forward_flops(self.model_cfg, p) for p in p_b)
    # What the step computes with algo.shared_prompt: each prompt once per group, then the
    # completions attending to it (the prefill + decode structure); else every row whole.
    computed = unique_prefill + decode if self.algo.shared_prompt else fwd
    return {'policy_update': 3 * fwd, 'reference': fwd, 'prefill': unique_prefill,
            'decode': decode, 'prompt_tokens': float(mask.sum()) * self.w.group_size,
            'policy_update_computed': 3 * computed}


def xla_flops(jitted, *args) -> float:
  cost = jitted.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost.get('flops', float('nan'))) if cost else float('nan')


def first_step(assets: str, w: wl.Workload) -> tuple[dict, RftSide]:
  """Set-up and one full step in a fresh process (the caller sets JAX_COMPILATION_CACHE_DIR)."""
  compile_cache.enable()
  clock = CompileClock()
  t0 = time.time()
  side = RftSide(w, assets)
  side.runner.start(wait=False)   # as trainer.run: the workers import while the step compiles
  if compile_ahead.enabled():   # as trainer.run: compiled while it samples (under no mesh,
    side.ahead = compile_ahead.first_step(   # as the bench's calls run)
        (None, None, side.fused), side.state, side.ref_params, side.sampler, side.state.params,
        w.prompts_per_step, w.prompt_len_max, w.group_size, side.batch_sh, None, {})
  t1 = time.time()
  try:
    side.step(0, extra=False)
  finally:   # a process exiting under an XLA compile aborts (rft_jax/compile_ahead.py)
    if side.ahead is not None:
      side.ahead.wait()
  t2 = time.time()
  return {'end_time': t2, 'import_s': T_IMPORTED - T_START, 'setup_s': t1 - t0,
          'first_step_s': t2 - t1, 'compile_s': clock.seconds,
          'xla_compiles': len(clock.programs), 'programs': clock.programs,
          'cache_hits': clock.cache_hits}, side


def main():
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--first-step', action='store_true', required=True)
  ap.add_argument('--assets', required=True)
  ap.add_argument('--workload', default='{}', help='Workload fields as JSON')
  args = ap.parse_args()
  w = wl.Workload(**json.loads(args.workload))
  result, side = first_step(args.assets, w)
  print('RESULT ' + json.dumps(result), flush=True)
  side.runner.close()


if __name__ == '__main__':
  main()
