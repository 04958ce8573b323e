r"""The scaling sweep: run it, collect its eval curves, and backtest the fits on it.

  python -m experiments.scaling.run_sweep run       # SFT the small base, then 4 RL runs
  python -m experiments.scaling.run_sweep collect   # runs/scaling_sweep/* -> results/points.json
  python -m experiments.scaling.run_sweep report    # results/points.json -> report.{json,md,png}

`run` skips what is already done (a run dir with summary.json), so it resumes after a stop.
Recipes: experiments/scaling/sweep_config.py. The committed results are in
experiments/scaling/results/ (points.json holds every run's eval points, so `report` reruns
without the runs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from experiments.scaling import sweep_config as sc
from rft_jax.telemetry.sinks import read_jsonl
from tools import cli

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, 'results')
RL_RUNS = tuple(f'{a}_{s}' for s in sc.SIZES for a in sc.ALGOS)
CONFIG = 'experiments/scaling/sweep_config.py'


def _sh(cmd: list[str], log: str) -> int:
  print(f'$ {" ".join(cmd)}  (log: {log})', flush=True)
  t0 = time.time()
  with open(log, 'w', encoding='utf-8') as f:
    rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
  print(f'  -> exit {rc} after {time.time() - t0:.0f} s', flush=True)
  return rc


def _done(name: str) -> bool:
  return os.path.isfile(os.path.join(sc.SWEEP_DIR, name, 'summary.json'))


def export_base(workdir: str, out: str) -> None:
  """The params of the SFT run's last checkpoint as a base-policy dir (as tools.export_base,
  but read as a raw pytree: independent of the TrainState fields of the code reading it)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  ckpts = os.path.join(workdir, 'checkpoints')
  step = max(int(d) for d in os.listdir(ckpts) if d.isdigit())
  with ocp.StandardCheckpointer() as ckptr:
    raw = ckptr.restore(os.path.abspath(os.path.join(ckpts, str(step), 'state')))
  checkpoint.save_params(out, raw['params'])
  print(f'exported the params of {workdir} step {step} to {out}', flush=True)


def cmd_run(_args) -> int:
  os.makedirs(sc.SWEEP_DIR, exist_ok=True)
  py = sys.executable
  failed = []
  for name in ('sft_small',) + RL_RUNS:
    if name.endswith('_small') and name != 'sft_small' and not os.path.isdir(sc.base_dir('small')):
      if not _done('sft_small'):
        failed.append(name)
        continue
      export_base(os.path.join(sc.SWEEP_DIR, 'sft_small'), sc.base_dir('small'))
    if _done(name):
      print(f'{name}: done already', flush=True)
      continue
    rc = _sh([py, '-m', 'rft_jax.main', '--config', f'{CONFIG}:{name}', '--workdir',
              os.path.join(sc.SWEEP_DIR, name)], os.path.join(sc.SWEEP_DIR, f'{name}.log'))
    if rc:
      failed.append(name)
  print('failed: ' + (', '.join(failed) if failed else 'none'), flush=True)
  return 1 if failed else 0


def collect_run(name: str) -> dict:
  """One run's eval curve (mean@8 and greedy) against logged cumulative FLOPs."""
  from tools import scaling as tool  # pylint: disable=g-import-not-at-top
  workdir = os.path.join(sc.SWEEP_DIR, name)
  curves = {m: tool.load_run(workdir, f'eval/{m}_acc', None) for m in ('mean@8', 'greedy')}
  with open(os.path.join(workdir, 'summary.json'), encoding='utf-8') as f:
    summary = json.load(f)
  start = next(r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='start'))
  algo, _, size = name.rpartition('_')
  return {'size': size, 'algo': algo, 'params': int(start['config']['params'].replace(',', '')),
          'steps': summary['steps'], 'wall_s': summary['wall_s'],
          'step': curves['mean@8']['step'], 'compute': curves['mean@8']['compute'],
          **{m: c['value'] for m, c in curves.items()},
          **{f'R0_{m}': c['R0'] for m, c in curves.items()}}


def cmd_collect(_args) -> int:
  runs = {name: collect_run(name) for name in RL_RUNS if _done(name)}
  missing = [n for n in RL_RUNS if n not in runs]
  with open(os.path.join(sc.SWEEP_DIR, 'sft_small', 'summary.json'), encoding='utf-8') as f:
    sft = json.load(f)
  setup = (f'{len(runs)} runs of {sc.STEPS} steps (32 prompts x 8 completions per step), '
           f'eval every {sc.EVAL_EVERY} steps; sizes: tiny = configs/common.tiny_model from the '
           f'shipped SFT base, small = sweep_config.small_model SFT\'d from scratch by the same '
           f'recipe (its base: greedy {sft["final_greedy_acc"]:.1%}, mean@8 '
           f'{sft["final_mean@8_acc"]:.1%}); recipes: experiments/scaling/sweep_config.py.')
  doc = {'setup': setup, 'missing': missing, 'runs': runs}
  os.makedirs(RESULTS, exist_ok=True)
  path = os.path.join(RESULTS, 'points.json')
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(doc, f, indent=1)
  print(f'wrote {path} ({len(runs)} runs; missing: {", ".join(missing) or "none"})')
  return 0


def cmd_report(_args) -> int:
  from experiments.scaling import report  # pylint: disable=g-import-not-at-top
  report.write(os.path.join(RESULTS, 'points.json'), RESULTS)
  print(open(os.path.join(RESULTS, 'report.md'), encoding='utf-8').read())
  print(f'wrote {RESULTS}/report.{{json,md,png}}')
  return 0


def main(argv=None) -> int:
  parser = cli.ArgumentParser(prog='python -m experiments.scaling.run_sweep')   # one-line errors
  sub = parser.add_subparsers(dest='command', required=True)
  sub.add_parser('run', help='run the sweep (skips finished runs)')
  sub.add_parser('collect', help='runs -> results/points.json')
  sub.add_parser('report', help='results/points.json -> results/report.{json,md,png}')
  args = parser.parse_args(argv)
  return {'run': cmd_run, 'collect': cmd_collect, 'report': cmd_report}[args.command](args)


if __name__ == '__main__':
  sys.exit(main())
