r"""The measured algorithm table: run each arithmetic recipe and tabulate what it achieved.

  python -m tools.algo_table --out /tmp/algo_runs [--steps N] [--recipes grpo,dapo,...]

Runs the recipes one after another, each in a fresh workdir `<out>/<recipe>` (removed first if
an earlier invocation left it; any other folder of that name is refused, exit 2, before anything
runs) as its own `python -m rft_jax.main` process (console output appended to
`<out>/<recipe>.log` under a line giving the date and command: earlier invocations' logs stay),
then writes `experiments/algorithms/results.md` and `results.json` (--results to change):
base -> final held-out greedy and mean@k accuracy (summary.json), their gains, the mean train
reward of the last 10 steps (of the final trajectory: after a remediation rewind, as re-run),
the median step time (`time/step_s` in metrics.jsonl, every step that ran), the run's
wall time, and the hardware line. --steps overrides every recipe's train.steps (default: each
recipe's own). --recipes runs some of them (RECIPES' names: grpo, ..., online_dpo); another
name is refused, exit 2. Numbers hold for the machine that ran them; the table says which.
"""
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from rft_jax import workdir_config
from rft_jax.telemetry.records import final_trajectory
from rft_jax.telemetry.sinks import read_jsonl
from tools import cli

RECIPES = ('grpo', 'dapo', 'dr_grpo', 'gspo', 'cispo', 'rloo', 'reinforce_pp', 'ppo', 'dpo',
           'online_dpo')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hardware() -> str:
  """'2 CPU cores, no GPU' style line (from the affinity mask and JAX's default backend)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  try:
    import jax  # pylint: disable=g-import-not-at-top
    devices = jax.devices()
    kind = devices[0].platform
  except Exception:  # pylint: disable=broad-except
    devices, kind = [], 'cpu'
  if kind == 'cpu':
    return f'{cores} CPU cores, no GPU'
  return f'{len(devices)} x {devices[0].device_kind} ({kind}), {cores} CPU cores'


def run_recipe(name: str, out: str, steps: int | None) -> dict:
  """Runs configs/<name>_arith.py in <out>/<name>; returns its table row."""
  config = os.path.join('configs', f'{name}_arith.py')
  workdir = os.path.join(out, name)
  problem = workdir_config.check_replaceable(workdir)
  if problem:   # main checked every recipe's first; something appeared since
    raise RuntimeError(problem)
  if os.path.exists(workdir):
    shutil.rmtree(workdir)   # a run directory of an earlier invocation
  cmd = [sys.executable, '-m', 'rft_jax.main', '--config', config, '--workdir', workdir]
  if steps:
    cmd.append(f'--config.train.steps={steps}')
  t0 = time.time()
  log_path = os.path.join(out, f'{name}.log')
  with open(log_path, 'a') as log:   # 'w' lost an earlier invocation's log without a word
    log.write(f'=== {datetime.datetime.now().isoformat(" ", "seconds")}: {" ".join(cmd[1:])}\n')
    log.flush()   # before the child's output, which goes to the same file
    rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  wall = time.time() - t0
  row = {'algorithm': name, 'config': config, 'command': ' '.join(cmd[1:]), 'returncode': rc,
         'wall_s': round(wall, 1)}
  if rc != 0:
    row['error'] = f'exit {rc}: see the end of {log_path}'
    return row
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  k = summary['eval_k']
  # Step time and sampling rounds over every step that ran (a remediation rewind's abandoned
  # steps cost time too); the reward over the final trajectory (each step once, as re-run).
  records = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  train = [r for r in records if r.get('kind') == 'train']
  final = [r for r in final_trajectory(records) if r.get('kind') == 'train']
  step_s = [r['time/step_s'] for r in train if 'time/step_s' in r]
  rewards = [r['reward/mean'] for r in final if 'reward/mean' in r][-10:]
  row.update({
      'steps': summary['steps'], 'eval_prompts': summary['eval_prompts'], 'eval_k': k,
      'base_greedy_acc': summary['base_greedy_acc'],
      'final_greedy_acc': summary['final_greedy_acc'],
      'greedy_gain': summary['final_greedy_acc'] - summary['base_greedy_acc'],
      'base_mean@k_acc': summary[f'base_mean@{k}_acc'],
      'final_mean@k_acc': summary[f'final_mean@{k}_acc'],
      'mean@k_gain': summary[f'final_mean@{k}_acc'] - summary[f'base_mean@{k}_acc'],
      'median_step_s': statistics.median(step_s) if step_s else None,
      'last10_train_reward': statistics.mean(rewards) if rewards else None,
      'run_wall_s': summary.get('wall_s'),
  })
  if any('sampling/rounds' in r for r in train):
    row['mean_sampling_rounds'] = statistics.mean(r['sampling/rounds'] for r in train)
  return row


def pct(x) -> str:
  return '—' if x is None else f'{100 * x:.1f}'


def signed(x) -> str:
  return '—' if x is None else f'{100 * x:+.1f}'


def markdown(rows: list, meta: dict) -> str:
  k = next((r['eval_k'] for r in rows if 'eval_k' in r), 8)
  lines = [
      '# Measured algorithm table (arithmetic task)', '',
      f"Hardware: {meta['hardware']}. Date: {meta['date']}. Commit: {meta['commit']}. "
      f"Steps: {meta['steps']}. Command: `{meta['command']}`.", '',
      f'Held-out accuracy on {rows[0].get("eval_prompts", "?")} test prompts (percent): greedy '
      f'and mean@{k} (temperature 1), base policy -> after training; gain in points. '
      'Step time is the median of `time/step_s` (sampling, rewards, update; evals and '
      'checkpoints excluded); wall is the whole run (compiles, evals, checkpoints).', '',
      f'| algorithm | config | steps | greedy base → final | gain | mean@{k} base → final | '
      'gain | train reward (last 10) | median step s | wall s |',
      '|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    if 'error' in r:
      lines.append(f"| {r['algorithm']} | `{r['config']}` | — | failed: {r['error']} |"
                   ' | | | | | |')
      continue
    reward = '—' if r['last10_train_reward'] is None else f"{r['last10_train_reward']:.3f}"
    step = '—' if r['median_step_s'] is None else f"{r['median_step_s']:.2f}"
    lines.append(
        f"| {r['algorithm']} | `{r['config']}` | {r['steps']} | {pct(r['base_greedy_acc'])} → "
        f"{pct(r['final_greedy_acc'])} | {signed(r['greedy_gain'])} | "
        f"{pct(r['base_mean@k_acc'])} → {pct(r['final_mean@k_acc'])} | "
        f"{signed(r['mean@k_gain'])} | {reward} | {step} | {r['wall_s']:.0f} |")
  notes = [f"- {r['algorithm']}: {r['mean_sampling_rounds']:.2f} sampling rounds per step on "
           'average (dynamic sampling)' for r in rows if 'mean_sampling_rounds' in r]
  notes += [f'- {n}' for n in meta.get('notes', [])]
  if notes:
    lines += ['', 'Notes:', *notes]
  lines += ['', 'One seed per recipe (config.seed = 0); differences of a few points are within '
            'seed noise on 256 prompts.', '']
  return '\n'.join(lines)


def code_commit() -> str:
  """HEAD's short hash, with ' (+ uncommitted changes)' only when tracked files differ from it;
  '?' outside a git checkout."""
  try:
    head = subprocess.check_output(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT,
                                   text=True).strip()
    dirty = subprocess.check_output(['git', 'status', '--porcelain', '--untracked-files=no'],
                                    cwd=ROOT, text=True).strip()
  except (OSError, subprocess.CalledProcessError):
    return '?'
  return head + (' (+ uncommitted changes)' if dirty else '')


def main(argv=None) -> int:
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--out', required=True, help='parent of the per-recipe workdirs')
  ap.add_argument('--steps', type=int, default=0, help='train.steps for every recipe '
                  "(0 = each recipe's own)")
  ap.add_argument('--recipes', default=','.join(RECIPES))
  ap.add_argument('--results', default=os.path.join(ROOT, 'experiments', 'algorithms'))
  args = ap.parse_args(argv)
  names = [n.strip() for n in args.recipes.split(',') if n.strip()]
  if not names:   # was an IndexError traceback writing the empty table
    ap.error(f'--recipes={args.recipes!r}: no recipe named; known: {", ".join(RECIPES)}')
  if args.steps < 0:   # each recipe's run failed on it, one after another
    ap.error(f"--steps={args.steps}: must be >= 0 (0 = each recipe's own)")
  for name in names:   # before anything runs or is deleted
    if name not in RECIPES:
      ap.error(f'--recipes: unknown recipe {name!r}; known: {", ".join(RECIPES)}')
    problem = workdir_config.check_replaceable(os.path.join(args.out, name))
    if problem:   # a folder of the user's that happens to have a recipe's name
      ap.error(f'--out {args.out}: {problem}; move it or give another --out')
  for flag, path in (('--out', args.out), ('--results', args.results)):
    try:   # was a FileNotFoundError traceback
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      ap.error(f'{flag}={path}: cannot make the directory: {e.strerror}')
  commit = code_commit()   # before the runs: the results files they write are not code
  rows, notes = [], []
  for name in names:
    if not os.path.exists(os.path.join(ROOT, 'configs', f'{name}_arith.py')):
      notes.append(f'{name}: configs/{name}_arith.py does not exist (yet); skipped')
      print(notes[-1], flush=True)
      continue
    print(f'running {name} ...', flush=True)
    rows.append(run_recipe(name, args.out, args.steps or None))
    print(f"  {name}: {json.dumps({k: v for k, v in rows[-1].items() if k != 'command'})}",
          flush=True)
  meta = {'hardware': hardware(), 'date': datetime.date.today().isoformat(), 'commit': commit,
          'steps': args.steps or "each recipe's own",
          'command': 'python -m tools.algo_table ' + ' '.join(argv or sys.argv[1:]),
          'notes': notes}
  with open(os.path.join(args.results, 'results.json'), 'w') as f:
    json.dump({'meta': meta, 'rows': rows}, f, indent=2)
  with open(os.path.join(args.results, 'results.md'), 'w') as f:
    f.write(markdown(rows, meta))
  print(markdown(rows, meta))
  return 0 if all('error' not in r for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
