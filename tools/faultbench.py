"""FaultBench: inject real faults into live GRPO runs and score the failure monitor.

  python -m tools.faultbench --suite ci|full [--jobs N] [--out DIR] [--seeds 1,2]
                            [--faults healthy,adv_sign_flip,...] [--modes warn]
                            [--run-timeout-s 1800] [--set cusum_h=6 ...]
  python -m tools.faultbench --replay SRC --out DIR [--set min_trend_warmup=11 ...]

Every run is the arithmetic GRPO recipe (configs/grpo_arith.py) shrunk to fit many runs on a
CPU (BENCH_OVERRIDES), from the shipped base policy, with one fault of rft_jax/faults.py
injected at an onset drawn uniformly from 30-60% of the run (per seed and fault type), or none
(healthy), or a benign change that must not raise incidents. `--set KNOB=VALUE` (repeatable)
sets a monitor knob (rft_jax/monitor/knobs.py, as config.monitor.KNOB) in every run: parsed and
range-checked as tools.monitor_replay's, kept in each run's record and the report's command.
Runs execute in `--jobs` spawned processes, one run per process; a run past `--run-timeout-s`
(default 1800) is killed, and it or one whose process dies is recorded with its error while the
others go on. Then the runs are scored (tools/faultbench_score.py) and the out dir gets
results.jsonl (one record per run), report.md, score.json and PNGs. `--replay SRC` runs
nothing: it rescores the warn-mode runs an earlier invocation kept under SRC/runs with the
monitor replayed over their logs under the --set knobs (tools/faultbench_replay.py), into --out.

Suites:
  ci    lr_spike, mask_shift and reward_length, one benign change and a healthy run; one seed,
        warn mode, 40 steps: a few minutes, run by the test suite (it checks the scoring
        works on real runs, not the headline numbers)
  full  every fault type and benign change on --seeds (default 1,2) in warn mode, every fault
        type once more in auto mode (first seed) for remediation, and healthy runs on each
        seed in both modes; 60 steps per run

The monitor's thresholds were set before this benchmark existed (on synthetic traces,
tools/monitor_false_alarms.py) and are not tuned on any FaultBench seed: every seed here is
held out.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import shutil
import sys
import time

import numpy as np

from rft_jax import faults as faultlib
from tools import cli, faultbench_replay

CI_FAULTS = ('lr_spike', 'mask_shift', 'reward_length')
CI_BENIGN = ('lr_schedule_step',)
BENIGN = tuple(n for n, f in faultlib.FAULTS.items() if f.family == 'benign')
FAULTED = tuple(n for n, f in faultlib.FAULTS.items() if f.family != 'benign')

BENCH_OVERRIDES = {
    'rollout.prompts_per_step': 16, 'rollout.group_size': 8,
    'eval.num_prompts': 128, 'eval.k': 4,
    'train.ckpt_every': 5, 'train.keep_checkpoints': 6,
    'telemetry.console': False, 'telemetry.tensorboard': False, 'telemetry.plot': False,
    'rewards.num_workers': 0,
}


def onset_for(seed: int, fault: str, steps: int) -> int:
  """Onset drawn uniformly from [0.3, 0.6] x steps, fixed per (seed, fault)."""
  rng = np.random.default_rng([seed, sum(map(ord, fault))])
  return int(rng.integers(int(0.3 * steps), int(0.6 * steps) + 1))


def plan(suite: str, seeds: list[int], faults: list[str] | None = None,
         modes: list[str] | None = None) -> list[dict]:
  """The run specs of a suite; `faults` (names of fault types, benign changes or 'healthy')
  and `modes` ('warn', 'auto') keep only the matching runs."""
  steps = 40 if suite == 'ci' else 60
  faulted, benign = (CI_FAULTS, CI_BENIGN) if suite == 'ci' else (FAULTED, BENIGN)
  seeds = seeds[:1] if suite == 'ci' else seeds
  specs = []
  for seed in seeds:
    specs.append({'fault': 'healthy', 'seed': seed, 'mode': 'warn'})
    specs += [{'fault': f, 'seed': seed, 'mode': 'warn'} for f in faulted + benign]
  if suite == 'full':
    specs.append({'fault': 'healthy', 'seed': seeds[0], 'mode': 'auto'})
    specs += [{'fault': f, 'seed': seeds[0], 'mode': 'auto'} for f in faulted]
  if faults:
    unknown = set(faults) - {'healthy', *faultlib.FAULTS}
    if unknown:
      raise ValueError(f'--faults: unknown {sorted(unknown)}; known: healthy, '
                       + ', '.join(faultlib.FAULT_TYPES))
    specs = [s for s in specs if s['fault'] in faults]
  if modes:
    specs = [s for s in specs if s['mode'] in modes]
  for s in specs:
    s['steps'] = steps
    s['onset'] = onset_for(s['seed'], s['fault'], steps) if s['fault'] != 'healthy' else steps + 1
    s['name'] = f"{s['fault']}-s{s['seed']}-{s['mode']}"
  return specs


def make_config(spec: dict):
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  config = grpo_arith.get_config()
  config.update_from_flattened_dict({**BENCH_OVERRIDES, 'train.steps': spec['steps'],
                                     'train.eval_every': spec['steps'], 'seed': spec['seed']})
  config.monitor.mode = spec['mode']
  for knob, value in spec.get('monitor', {}).items():   # --set: as config.monitor.<knob>
    config.monitor[knob] = value
  if spec['fault'] not in ('healthy', 'resume'):
    config.faults = [{'type': spec['fault'], 'onset_step': spec['onset'],
                      'strength': faultlib.FAULTS[spec['fault']].strength}]
  return config


def run_one(spec: dict, out_dir: str) -> dict:
  """Trains one run in this process and returns its record (see tools/faultbench_score.py)."""
  from rft_jax import runs, trainer  # pylint: disable=g-import-not-at-top
  from rft_jax import workdir_config  # pylint: disable=g-import-not-at-top
  workdir = os.path.join(out_dir, 'runs', spec['name'])
  problem = workdir_config.check_replaceable(workdir)
  if problem:   # main checked every run's first; something appeared since
    return record(spec, out_dir, None, problem, 0.0)
  shutil.rmtree(workdir, ignore_errors=True)   # a run directory of an earlier invocation
  config, t0, error, summary = make_config(spec), time.time(), None, None
  try:
    if spec['fault'] == 'resume':   # stop at onset (as a preemption would), then resume
      first = make_config(spec)
      first.train.steps = spec['onset']
      trainer.run(first, workdir)
    summary = trainer.run(config, workdir)
  except runs.TrainingError as e:   # e.g. the monitor halted the run: a legitimate outcome
    error = None
    summary = {'halted': str(e)}
  except Exception as e:  # pylint: disable=broad-exception-caught
    error = f'{type(e).__name__}: {e}'
  return record(spec, out_dir, summary, error, time.time() - t0)


def record(spec: dict, out_dir: str, summary: dict | None, error: str | None,
           wall_s: float) -> dict:
  """The run's record from what its workdir holds (incidents, metrics) and how it ended."""
  from rft_jax.telemetry.sinks import read_jsonl  # pylint: disable=g-import-not-at-top
  workdir = os.path.join(out_dir, 'runs', spec['name'])
  incidents = []
  path = os.path.join(workdir, 'incidents.jsonl')
  if os.path.exists(path):   # (read_jsonl skips a line torn by a killed run)
    incidents = [{k: e.get(k) for k in faultbench_replay.INCIDENT_KEYS}
                 for e in read_jsonl(path, kind='incident')]
  rows = read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train') if os.path.exists(
      os.path.join(workdir, 'metrics.jsonl')) else []
  # Every step the monitor observed, in order: after an auto-mode restore the redone ones again
  # (metrics.jsonl, like incidents.jsonl, keeps the steps a restore abandoned).
  observed = [r['step'] for r in rows]
  family = 'healthy' if spec['fault'] == 'healthy' else faultlib.FAULTS[spec['fault']].family
  return {**spec, 'family': family, 'incidents': incidents,
          'steps_done': max(observed, default=0), 'steps_observed': len(observed),
          'steps_observed_before_onset': sum(s < spec['onset'] for s in observed),
          'final_acc': (summary or {}).get('final_greedy_acc'),
          'halted': (summary or {}).get('halted'), 'error': error,
          'wall_s': round(wall_s, 1)}


def _child(spec: dict, out_dir: str, conn) -> None:
  conn.send(run_one(spec, out_dir))
  conn.close()


def run_all(specs: list[dict], out_dir: str, jobs: int,
            run_timeout_s: float = 1800.0) -> list[dict]:
  """Runs specs in up to `jobs` spawned processes, one run per process. A run past
  `run_timeout_s` is killed, and one whose process dies is recorded too: either gets a record
  with `error` set, from what its workdir holds, and the benchmark goes on."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, 'results.jsonl')
  records, pending, running = [], list(specs), []   # running: (spec, process, conn, start)
  ctx = multiprocessing.get_context('spawn')
  with open(path, 'w') as f:
    while pending or running:
      while pending and len(running) < jobs:
        spec = pending.pop(0)
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(spec, out_dir, send), daemon=True)
        proc.start()
        send.close()
        running.append((spec, proc, recv, time.time()))
      time.sleep(0.2)
      for item in list(running):
        spec, proc, recv, start = item
        rec = None
        if recv.poll():
          try:
            rec = recv.recv()
          except EOFError:   # died after closing the pipe
            pass
        if rec is None and proc.is_alive() and time.time() - start <= run_timeout_s:
          continue
        if rec is None and proc.is_alive():
          proc.kill()
          rec = record(spec, out_dir, None, f'timeout: killed after {run_timeout_s:.0f} s '
                       '(--run-timeout-s)', time.time() - start)
        elif rec is None:
          proc.join()
          rec = record(spec, out_dir, None, f'the run process died (exit code '
                       f'{proc.exitcode})', time.time() - start)
        proc.join(timeout=30)   # a run that answered but hangs on its way out is not waited on
        if proc.is_alive():
          proc.kill()
          proc.join()
        recv.close()
        running.remove(item)
        records.append(rec)
        f.write(json.dumps(rec) + '\n')
        f.flush()
        first = rec['incidents'][0] if rec['incidents'] else None
        print(f"[{len(records)}/{len(specs)}] {rec['name']}: {len(rec['incidents'])} incident(s)"
              + (f" (first {first['fault_class']} at {first['step']})" if first else '')
              + f" acc {rec['final_acc']} {rec['wall_s']}s {rec['error'] or ''}", flush=True)
  return records


def _plan_from_args(ap: argparse.ArgumentParser, args) -> list[dict]:
  """plan() for the command line; ap.error (exit 2) for a value that would crash, hang
  (--jobs 0) or select no run at all."""
  if args.jobs < 1:
    ap.error(f'--jobs={args.jobs}: must be >= 1')
  if not args.run_timeout_s > 0:
    ap.error(f'--run-timeout-s={args.run_timeout_s:g}: must be > 0')
  try:
    seeds = [int(s) for s in args.seeds.split(',')]
  except ValueError:
    seeds = [-1]
  if min(seeds) < 0:
    ap.error(f'--seeds={args.seeds!r}: expected comma-separated integers >= 0, e.g. 1,2')
  modes = [m for m in args.modes.split(',') if m]
  if set(modes) - {'warn', 'auto'}:
    ap.error(f'--modes={args.modes!r}: the modes are warn and auto')
  try:
    specs = plan(args.suite, seeds, [f for f in args.faults.split(',') if f], modes)
  except ValueError as e:
    ap.error(str(e))
  if not specs:
    ap.error(f'--faults={args.faults!r} --modes={args.modes!r} leave no run of the '
             f'{args.suite} suite (ci: {", ".join(("healthy",) + CI_FAULTS + CI_BENIGN)}, '
             'warn mode only)')
  from rft_jax.monitor import knobs  # pylint: disable=g-import-not-at-top
  try:   # the parser and ranges of tools.monitor_replay --set, with the recipe's other knobs
    overrides = knobs.parse_set(args.set)
    knobs.monitor_config(make_config(specs[0]).monitor, **overrides)
  except ValueError as e:
    ap.error(str(e))
  for s in specs if overrides else ():
    s['monitor'] = dict(overrides)
  return specs


def _replay_from_args(ap: argparse.ArgumentParser, args, out: str) -> list[dict]:
  """--replay SRC: SRC's warn-mode records with replayed incidents, written to
  out/results.jsonl; ap.error (exit 2) for a flag or a kept run the replay cannot use."""
  if args.rescore:
    ap.error('--replay and --rescore: give one (--replay rescores under --set knobs)')
  if not args.out or os.path.abspath(args.out) == os.path.abspath(args.replay):
    ap.error(f'--replay {args.replay}: give another --out (its results.jsonl is kept)')
  from rft_jax.monitor import knobs  # pylint: disable=g-import-not-at-top
  try:
    overrides = knobs.parse_set(args.set)
    knobs.monitor_config(None, **overrides)   # a bad value: one line naming the knob
    stored = faultbench_replay.read_records(args.replay)
    kept = faultbench_replay.replayable(stored)
    if not kept:
      raise ValueError(f'{args.replay}/results.jsonl: no warn-mode run without error to replay')
    records = faultbench_replay.replay_records(args.replay, kept, overrides)
  except ValueError as e:
    ap.error(f'--replay: {e}')
  print(f'FaultBench replay of {args.replay}: {len(records)} warn-mode runs'
        + (f' ({len(stored) - len(kept)} auto-mode or failed runs left out)'
           if len(stored) > len(kept) else ''), flush=True)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, 'results.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  return records


def main(argv=None) -> int:
  ap = cli.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--suite', choices=('ci', 'full'), default='ci')
  ap.add_argument('--jobs', type=int, default=2)
  ap.add_argument('--seeds', default='1,2')
  ap.add_argument('--out', default=None)
  ap.add_argument('--faults', default='',
                  help='comma list: keep only these fault types / benign changes / healthy')
  ap.add_argument('--modes', default='', help='comma list of modes to keep (warn, auto)')
  ap.add_argument('--rescore', action='store_true', help='score an existing results.jsonl')
  ap.add_argument('--run-timeout-s', type=float, default=1800.0,
                  help='wall limit per run: a run past it is killed and recorded as an error')
  ap.add_argument('--set', action='append', default=[], metavar='KNOB=VALUE',
                  help='a monitor knob for every run, as config.monitor.KNOB (rft_jax/monitor/'
                       'knobs.py), e.g. --set cusum_h=6; repeatable')
  ap.add_argument('--replay', default=None, metavar='SRC',
                  help="rescore the warn-mode runs kept in an earlier invocation's --out SRC "
                       'with the monitor replayed over their logs under the --set knobs; '
                       'writes --out')
  args = ap.parse_args(argv)
  if args.rescore and args.set:
    ap.error('--set applies to new runs; --rescore scores the runs of an earlier invocation '
             '(their knobs are in results.jsonl; --replay rescores them under other knobs)')
  out = args.out or os.path.join('runs', f'faultbench_{args.suite}')
  from tools import faultbench_report, faultbench_score  # pylint: disable=g-import-not-at-top
  if args.replay is not None:
    records = _replay_from_args(ap, args, out)
  elif args.rescore:
    results = os.path.join(out, 'results.jsonl')
    if not os.path.isfile(results):
      ap.error(f'--rescore: no {results} (--out names the directory of an earlier run)')
    with open(results) as f:
      records = [json.loads(line) for line in f]
  else:
    specs = _plan_from_args(ap, args)
    from rft_jax import workdir_config  # pylint: disable=g-import-not-at-top
    for spec in specs:   # each run's workdir is deleted first: only an earlier run's
      problem = workdir_config.check_replaceable(os.path.join(out, 'runs', spec['name']))
      if problem:
        ap.error(f'--out {out}: {problem}; move it or give another --out')
    print(f'FaultBench {args.suite}: {len(specs)} runs, {args.jobs} jobs, out {out}', flush=True)
    records = run_all(specs, out, args.jobs, args.run_timeout_s)
  scores = faultbench_score.score(records)
  with open(os.path.join(out, 'score.json'), 'w') as f:
    json.dump(scores, f, indent=2)
  given = sys.argv[1:] if argv is None else list(argv)   # argv[0] is the script's path
  command = shlex.join(['python', '-m', 'tools.faultbench', *given])
  report = faultbench_report.write(out, scores, records, command=command)
  print(report)
  return 0


if __name__ == '__main__':
  sys.exit(main())
