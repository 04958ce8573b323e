"""Benchmarks: the GRPO workload of issue 11 phase by phase, optionally beside TRL; or a recipe.

  python -m tools.bench [--steps 20] [--warmup 2] [--compare trl] [--out experiments/bench]
  python -m tools.bench --preset gpu_0p5b --skip-first-step    (on a GPU or TPU)
  python -m tools.bench --recipe configs/grpo_arith.py [--repeats 10]

The default run (tools/bench_workload.py: a 4.72M-parameter Llama-shaped model, 16 prompts x 8
completions, 32 new tokens, beta 0.04, one update per batch) measures, on the machine it runs on:
per-phase seconds of rft_jax's GRPO step through the trainer's own jitted functions
(tools/bench_grpo.py: generate = prefill + decode, reference pass, policy update, verifier, host),
medians with min/max over --steps steps after --warmup; prefill and decode tokens/s; model
FLOP/s of the policy update against a matmul rate measured here; peak host memory; compile time
and time to first step in fresh processes with a cold, then a warm, persistent compilation cache.
`--compare trl` runs TRL's GRPOTrainer (tools/bench_trl.py; `pip install '.[compare]'`) on the
identical model, exported to HF format, and workload, one step of each in turn, and adds its
phases and the ratio TRL / rft_jax. `--preset gpu_0p5b` is the issue's accelerator workload (a
Qwen2.5-0.5B-shaped model in bf16): the update's MFU against the device's nominal peak where
tools/bench_report.py knows it, decode tokens/s and peak device memory. Results:
<out>/grpo_<preset>.json and .md.
`--recipe` runs the older per-recipe bench (tools/bench_recipe.py: sampler and train-step
tokens/s, XLA FLOP/s, the failure monitor's cost); it reads only --repeats, and the workload's
flags given with it (or --repeats without it) are a usage error.
"""
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from tools import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child_cmd(module: str, assets: str, w) -> list[str]:
  # Started with -c, not -m: the reward pool's spawned workers then import only what the
  # verifiers need, not the benchmark module (-m makes each of them re-import it, JAX and all).
  return [sys.executable, '-c', f'import sys; from {module} import main; sys.exit(main())',
          '--assets', assets, '--workload', json.dumps(dataclasses.asdict(w))]


def first_step_runs(assets: str, w, env: dict) -> dict:
  """Time to first step in fresh processes (environment `env`): a cold, then a warm,
  compilation cache."""
  out, cache = {}, tempfile.mkdtemp(prefix='rft_bench_cache_')
  try:
    for name in ('cold', 'warm'):
      t = time.time()
      done = subprocess.run(_child_cmd('tools.bench_grpo', assets, w) + ['--first-step'],
                            cwd=REPO, env={**env, 'JAX_COMPILATION_CACHE_DIR': cache},
                            capture_output=True, text=True, timeout=900)
      lines = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')]
      if done.returncode or not lines:
        out[name] = {'error': (done.stderr or done.stdout).strip().splitlines()[-1:]}
        print(f'time to first step, {name} cache: the child failed: {out[name]["error"]}',
              flush=True)
        continue
      r = json.loads(lines[-1][len('RESULT '):])
      r['ttfs_s'] = r.pop('end_time') - t
      out[name] = r
  finally:
    shutil.rmtree(cache, ignore_errors=True)
  return out


class TrlProcess:
  """tools.bench_trl in a child process, stepped one step at a time."""

  def __init__(self, assets: str, w, steps: int, log_path: str):
    self.log = open(log_path, 'w')
    self.proc = subprocess.Popen(
        _child_cmd('tools.bench_trl', assets, w) + ['--steps', str(steps)], cwd=REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
    self.info = self._read('READY ')

  def _read(self, prefix: str) -> dict:
    for line in self.proc.stdout:
      if line.startswith(prefix):
        return json.loads(line[len(prefix):])
    self.proc.wait()
    self.log.flush()
    with open(self.log.name) as f:
      tail = [l.strip() for l in f.read().splitlines() if l.strip()][-1:]
    raise RuntimeError(f'bench_trl exited ({self.proc.returncode}): {" ".join(tail)}')

  def step(self) -> dict:
    self.proc.stdin.write('go\n')
    self.proc.stdin.flush()
    return self._read('STEP ')

  def finish(self) -> dict:
    self.proc.stdin.close()
    done = self._read('DONE ')
    self.proc.wait(timeout=120)
    self.log.close()
    return done


def workload(args):
  """The preset named by --preset (--tiny: 'tiny'), with --full-prompt-pass and any
  --workload-json fields (e.g. fewer layers, to try an accelerator preset on a CPU)."""
  from tools import bench_workload as wl  # pylint: disable=g-import-not-at-top
  w = wl.PRESETS[args.preset]
  if args.full_prompt_pass:
    w = dataclasses.replace(w, shared_prompt=False)
  try:
    return wl.with_fields(w, json.loads(args.workload_json))
  except ValueError as e:   # not JSON, an unknown field, a bad value: main makes it exit 2
    raise ValueError(f'--workload-json {args.workload_json!r}: {e}') from None


def run_workload(args) -> dict:
  # pylint: disable=g-import-not-at-top  (JAX only for the workload mode)
  import jax
  from flax import nnx
  from rft_jax.models import functional as lm
  from rft_jax.models.llama import ModelConfig
  from tools import bench_grpo, bench_report, bench_workload as wl
  w = workload(args)
  if args.preset == 'gpu_0p5b' and jax.default_backend() == 'cpu' and w == wl.GPU_0P5B:
    print('note: --preset gpu_0p5b is sized for a GPU or TPU; on CPU one step takes many '
          'minutes (shrink it with --workload-json to try the code path)', flush=True)
  # The matmul the update is compared with: in the workload's compute dtype, large enough to
  # reach the device's rate (8192 on an accelerator).
  matmul_n = (256 if args.preset == 'tiny' else 2048 if jax.default_backend() == 'cpu'
              else 8192)
  result = {'workload': dataclasses.asdict(w), 'machine': bench_report.machine(),
            'warmup': args.warmup, 'matmul_n': matmul_n, 'preset': args.preset,
            'workload_text': (f"{args.preset.replace('issue11', 'issue 11')}: "
                              f"{ModelConfig.from_dict(w.model_dict()).num_params():,} params, "
                              f"{w.prompts_per_step} prompts x {w.group_size}, prompts "
                              f"{w.prompt_len_min}-{w.prompt_len_max} tokens, {w.max_new_tokens} "
                              f"new tokens, beta {w.kl_coef}, 1 update per batch, "
                              f"{'fp32' if w.dtype == 'float32' else w.dtype}")}
  result['matmul_flops_s'] = bench_report.matmul_rate(matmul_n, dtype=w.dtype)
  result['peak_flops_s'] = bench_report.peak_flops(w.dtype)   # None where not known
  assets = tempfile.mkdtemp(prefix='rft_bench_assets_')
  try:
    model_cfg = ModelConfig.from_dict(w.model_dict())
    _, state = lm.create(model_cfg, w.seed)
    wl.write_assets(w, nnx.to_pure_dict(state), model_cfg, assets, args.warmup + args.steps)
    if not args.skip_first_step:
      result['first_step'] = first_step_runs(assets, w, args.child_env)
    side = bench_grpo.RftSide(w, assets)
    trl = None
    if args.compare == 'trl':
      try:
        trl = TrlProcess(assets, w, args.warmup + args.steps,
                         os.path.join(assets, 'trl_stderr.log'))
        result['trl'] = {'versions': trl.info['versions'], 'params': trl.info['params'],
                         'torch_threads': trl.info['torch_threads'],
                         'setup_s': trl.info['setup_s']}
      except (RuntimeError, OSError) as e:
        result['trl'] = {'error': str(e)}
    rft_steps, trl_steps, rft_warmup_s = [], [], []
    for i in range(args.warmup + args.steps):   # one step of each in turn
      r = side.step(i)
      if i >= args.warmup:
        rft_steps.append(r)
      else:
        rft_warmup_s.append(r['step_s'])
      if trl is not None:
        t = trl.step()
        if i >= args.warmup:
          trl_steps.append({**t, 'sample_s': t.get('generate_s', 0.0)})
      print(f"step {i}: rft_jax {r['step_s']:.3f} s" + (
          f", TRL {t['step_s']:.3f} s" if trl is not None else ''), flush=True)
    side.runner.close()
    phases = bench_report.summarise(rft_steps)
    f = side.flops(0)
    med = lambda k: phases[k]['median']
    rollout = side.sampler(side.state.params, *side.prompts(0), jax.random.key(0))
    xla = bench_grpo.xla_flops(side.fused, side.state, side.ref_params, rollout,
                               jax.numpy.zeros(w.rows), jax.numpy.ones(w.rows, bool))
    gen_tokens = sum(s['gen_tokens'] for s in rft_steps) / len(rft_steps)
    result['rft_jax'] = {
        'phases': phases, 'steps': rft_steps, 'warmup_step_s': rft_warmup_s, 'flops': f,
        'xla_train_flops': xla,
        'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        'derived': {'prefill_tok_s': f['prompt_tokens'] / med('prefill_s'),
                    'gen_tokens': gen_tokens, 'decode_tok_s': gen_tokens / med('decode_s'),
                    'update_flops_s': f['policy_update'] / med('policy_s'),
                    'update_mfu': f['policy_update'] / med('policy_s') / result['matmul_flops_s'],
                    'update_computed_flops_s': f['policy_update_computed'] / med('policy_s'),
                    'update_computed_mfu': (f['policy_update_computed'] / med('policy_s')
                                            / result['matmul_flops_s']),
                    'train_xla_flops_s': xla / med('train_s')},
        'peak_device_bytes': bench_report.peak_device_bytes()}
    if result['peak_flops_s']:   # MFU: model FLOP/s over the device's nominal peak
      result['rft_jax']['derived']['update_mfu_peak'] = (
          f['policy_update'] / med('policy_s') / result['peak_flops_s'])
    if trl is not None:
      result['trl'].update(trl.finish())
      result['trl']['phases'] = bench_report.summarise(trl_steps)
      result['trl']['steps'] = trl_steps
      result['ratio'] = {k: v['median'] / phases[k]['median']
                         for k, v in result['trl']['phases'].items() if k in phases}
  finally:
    shutil.rmtree(assets, ignore_errors=True)
  return result


COMPARE_MODULES = ('trl', 'transformers', 'torch', 'accelerate', 'datasets')   # pyproject


def missing_compare_modules() -> list[str]:
  """The modules of pyproject.toml's 'compare' extra that this environment cannot import."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  return [m for m in COMPARE_MODULES if importlib.util.find_spec(m) is None]


RECIPE_FLAGS = ('recipe', 'repeats')   # the per-recipe bench's; the others: the workload's


def ignored_flags(ap, args) -> list[str]:
  """The flags given (not at their default) that the chosen bench does not read."""
  names = [a.dest for a in ap._actions if a.dest != 'help']  # pylint: disable=protected-access
  unread = [n for n in names if (n in RECIPE_FLAGS) != bool(args.recipe) and n != 'recipe']
  return ['--' + n.replace('_', '-') for n in unread
          if getattr(args, n) != ap.get_default(n)]


def main(argv=None):
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--steps', type=int, default=20, help='timed steps (after --warmup)')
  ap.add_argument('--warmup', type=int, default=2)
  ap.add_argument('--compare', choices=['trl'], default=None)
  ap.add_argument('--out', default='experiments/bench')
  from tools import bench_workload  # pylint: disable=g-import-not-at-top
  ap.add_argument('--preset', default='issue11', choices=list(bench_workload.PRESETS),
                  help='the workload (tools/bench_workload.py PRESETS): issue11 (the CPU '
                       'comparison), tiny (seconds; tests), gpu_0p5b (a 0.5B model in bf16)')
  ap.add_argument('--tiny', action='store_true', help='same as --preset tiny')
  ap.add_argument('--workload-json', default='{}',
                  help='Workload fields overriding the preset, as JSON')
  ap.add_argument('--skip-first-step', action='store_true',
                  help='skip the time-to-first-step subprocesses')
  ap.add_argument('--full-prompt-pass', action='store_true',
                  help='score every row\'s prompt (algo.shared_prompt=False), for before/after')
  ap.add_argument('--recipe', default=None, help='bench this recipe instead (bench_recipe.py)')
  ap.add_argument('--repeats', type=int, default=10, help='--recipe: timed calls')
  args = ap.parse_args(argv)
  unused = ignored_flags(ap, args)
  if unused:   # were ignored without a word (--recipe X --compare trl compared nothing)
    ap.error(f"{', '.join(unused)}: not used "
             + ('with --recipe (its flag: --repeats)' if args.recipe else 'without --recipe'))
  if args.tiny:
    args.preset = 'tiny'
  for flag, value, lowest in (('steps', args.steps, 1), ('warmup', args.warmup, 0),
                              ('repeats', args.repeats, 1)):
    if value < lowest:   # --steps 0 was a ZeroDivisionError after the warm-up steps
      ap.error(f'--{flag}={value}: must be >= {lowest}')
  try:   # before any step runs
    workload(args)
  except ValueError as e:
    ap.error(str(e))
  if not args.recipe:
    try:   # was a FileNotFoundError traceback, after the steps for a file in the way
      os.makedirs(args.out, exist_ok=True)
    except OSError as e:
      ap.error(f'--out={args.out}: cannot make the results directory: {e.strerror}')
  missing = missing_compare_modules() if args.compare == 'trl' else []
  if missing:   # before minutes of rft_jax steps, not as a failed row at the end
    ap.error(f"--compare trl needs the 'compare' extra (missing: {', '.join(missing)}): "
             "pip install -e '.[compare]'")
  if args.recipe:
    from tools import bench_recipe  # pylint: disable=g-import-not-at-top
    try:
      bench_recipe.run(args.recipe, args.repeats)
    except bench_recipe.NotTimed as e:   # an SFT, DPO or PPO recipe: was a traceback
      ap.error(str(e))
    return None
  args.child_env = dict(os.environ)   # the time-to-first-step children's, before the line below
  if not args.skip_first_step and 'XLA_PYTHON_CLIENT_PREALLOCATE' not in os.environ:
    # The time-to-first-step children run while this process is alive: on a GPU, JAX's default
    # preallocation (75% of device memory) here left a 0.5B model's child out of memory (H200,
    # 2026-12-04). This process allocates as it goes; the children keep JAX's default.
    os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
  result = run_workload(args)
  from tools import bench_report  # pylint: disable=g-import-not-at-top
  paths = bench_report.write(result, args.out, f'grpo_{args.preset}')
  print(bench_report.markdown(result))
  print('wrote ' + ', '.join(paths))
  failed = [k for k, v in result.get('first_step', {}).items() if 'error' in v]
  if failed:
    raise SystemExit(f"time to first step failed ({', '.join(failed)} cache): "
                     f"{result['first_step'][failed[0]]['error']}; the rest is in {paths[0]}")
  return result


if __name__ == '__main__':
  from rft_jax import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()   # as rft_jax.main does (the time-to-first-step runs set their own)
  main()
