"""Scaling foresight: fit a run's eval accuracy against training compute; plan a budget.

  python -m tools.scaling fit RUN_DIR... [--exclude-first F] [--target-compute C]
                              [--config FILE[:ARG]] [--metric NAME] [--model sigmoid|power_law|both]
                              [--out DIR]
  python -m tools.scaling plan --budget C [--model-params N | --config FILE[:ARG]]

`fit` reads each RUN_DIR/metrics.jsonl (or a metrics.jsonl path). The curve's y is an eval
accuracy (`eval/mean@K_acc` if logged, else `eval/greedy_acc`; `--metric` picks another), its x
the cumulative training FLOPs spent up to that eval, the base model's eval (step 0) giving R0 at
C = 0. Compute, in this order of preference:
  1. the logged `compute/flops_cumulative` train metric (of the last train record before the
     eval: its step's, as re-run after a rewind);
  2. else summed per step from the recipe with rft_jax.telemetry.flops.step_flops_from_config
     and each step's logged `response/len_mean` (max_new_tokens if not logged). The config is
     `--config FILE[:ARG]`, else the run's own `config.json` (the config it ran with,
     overrides included), else the recipe file and variant named in the log's start record
     (`recipe_file`, a recipe of one's own too; configs/<recipe>.py in a log of before runs
     recorded the file) for a log without its run directory. The log does not record
     overrides, nor, before runs recorded it, the variant (then the full recipe is used): a
     warning on stderr says so when the variant is unknown or the step count differs.
After a remediation rewind (monitor.mode='auto') the log holds the abandoned steps, then the
redone ones: the evals fitted are those of the final trajectory (`rft_jax.telemetry.records.
final_trajectory`; an abandoned step's eval is dropped), while the x stays all the compute spent
to reach each eval, the abandoned steps' included (the trainer's logged cumulative counts
re-run steps again; the sum from the recipe counts every train record up to the eval in file
order). The fit is ScaleRL's sigmoid (default) and/or the power law in 1 - acc
(rft_jax.scaling), with block-bootstrap intervals. Writes DIR/scaling_fit.json and
DIR/scaling_fit.png (data, fit, 95% band, extrapolation to the target), DIR defaulting to
<first RUN_DIR fitted>/scaling; with several runs, each is compared with the first.

`plan` suggests a group size, prompts per step and steps for a FLOPs budget from IsoCompute-
style rules (rft_jax.scaling.plan), printing its assumptions.

Exit status: 0 when every run was fitted (or the plan succeeded); 1 when some run could not be
(its error printed, the others' results written; the last line names which); 2 with one-line
errors when no run could be fitted, or on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rft_jax import scaling
from rft_jax.telemetry import flops
from rft_jax.telemetry.records import final_trajectory
from rft_jax.telemetry.sinks import read_jsonl
from tools import cli
from tools.scaling_recipe import FLOPS_KEY as _FLOPS_KEY
from tools.scaling_recipe import UsageError, load_config, logged_recipe, warn_recipe_guess


def pick_metric(evals: Sequence[dict], metric: str | None) -> str:
  """The requested metric, else eval/mean@K_acc, else eval/greedy_acc."""
  keys = {k for r in evals for k in r if k.startswith('eval/') and not k.startswith('eval/base_')}
  if metric:
    if metric not in keys:
      raise UsageError(f'metric {metric!r} not logged (eval metrics: {sorted(keys) or "none"})')
    return metric
  for k in sorted(keys):
    if re.fullmatch(r'eval/mean@\d+_acc', k):
      return k
  if 'eval/greedy_acc' in keys:
    return 'eval/greedy_acc'
  raise UsageError(f'no eval accuracy logged (eval metrics: {sorted(keys) or "none"}); '
                   'pass --metric')


def _step_cost(config, record) -> float:
  gen = record.get('response/len_mean', config.rollout.max_new_tokens)
  return flops.step_flops_from_config(config, float(gen))['total']


def load_run(run: str, metric: str | None, config_spec: str | None) -> dict[str, Any]:
  """{'run', 'metric', 'compute_source', 'step', 'compute', 'value', 'R0'} for one run dir.

  step/compute/value: one point per eval of the final trajectory with `metric`, in step order;
  compute is the cumulative training FLOPs spent before that eval was logged, those of steps
  abandoned by a remediation rewind included. R0: the base eval's `metric` (step 0), or None.
  """
  path = run if os.path.isfile(run) else os.path.join(run, 'metrics.jsonl')
  if not os.path.isfile(path):
    raise UsageError(f'{run}: no metrics.jsonl')
  records = read_jsonl(path)
  evals = [r for r in final_trajectory(records) if r.get('kind') == 'eval']
  if not evals:   # was 'no eval accuracy logged (eval metrics: none); pass --metric'
    raise UsageError(f'{path}: no eval records' + (
        '' if records else " (no records at all: not a run's metrics.jsonl)"))
  metric = pick_metric(evals, metric)
  logged = any(_FLOPS_KEY in r for r in records if r.get('kind') == 'train')
  config, source = None, f'logged {_FLOPS_KEY}'
  recorded = os.path.join(os.path.dirname(path), 'config.json')   # the run's own config
  if not logged and not config_spec and os.path.isfile(recorded):
    import ml_collections  # pylint: disable=g-import-not-at-top
    with open(recorded, encoding='utf-8') as f:
      config = ml_collections.ConfigDict(json.load(f))
    source = f'step_flops from {recorded}'
  elif not logged:
    start = next((r for r in records if r.get('kind') == 'start'), {})
    spec = config_spec or logged_recipe(run, start.get('config', {}))
    variant = start.get('config', {}).get('variant')
    config = load_config(spec)
    source = f'step_flops from {spec}'
    if not config_spec:
      source += (' (the recipe named in the log; its variant and overrides are unknown)'
                 if variant is None else ' (the recipe and variant named in the log; its '
                 'overrides are unknown)')
      warn_recipe_guess(run, spec, config, start)
  if config is not None and 'rollout' not in config:   # SFT, offline DPO: no rollouts to count
    raise UsageError(f'{run}: no {_FLOPS_KEY} logged, and step_flops counts the rollouts of an '
                     f'RL recipe; {config.get("name", "this recipe")} has none (SFT, DPO)')
  if config is not None and 'dpo' in config:   # was counted as an RL step: too many FLOPs
    raise UsageError(f'{run}: no {_FLOPS_KEY} logged, and step_flops counts an RL step (every '
                     'completion scored and trained); online DPO trains one pair per prompt, '
                     'which it does not count')
  base_key = metric.replace('eval/', 'eval/base_')
  cum, spent = 0.0, {}   # spent: id(eval record) -> compute spent before it, in file order
  for r in records:
    kind = r.get('kind')
    if kind == 'train':
      cum = float(r[_FLOPS_KEY]) if logged and _FLOPS_KEY in r else (
          cum if logged else cum + _step_cost(config, r))
    elif kind == 'eval':
      spent[id(r)] = cum
  steps, compute, values, r0 = [], [], [], None
  for r in evals:
    if base_key in r and r.get('step', 0) == 0:
      r0 = float(r[base_key])
    elif metric in r:
      steps.append(int(r['step']))
      compute.append(spent[id(r)])
      values.append(float(r[metric]))
  return {'run': run, 'metric': metric, 'compute_source': source, 'step': steps,
          'compute': compute, 'value': values, 'R0': r0}


def fit_run(data: dict, model: str, args) -> dict[str, Any]:
  """Fits the requested models; a fit that cannot be made is {'error': why}."""
  c, v = list(data['compute']), list(data['value'])
  if data['R0'] is not None:
    c, v = [0.0] + c, [data['R0']] + v
  fits = {}
  kwargs = dict(target_compute=args.target_compute, n_boot=args.n_boot, seed=args.seed)
  if model in ('sigmoid', 'both'):
    try:
      fits['sigmoid'] = scaling.fit_sigmoid(c, v, args.exclude_first, upper=args.upper, **kwargs)
    except ValueError as e:
      fits['sigmoid'] = {'error': str(e)}
  if model in ('power_law', 'both'):
    try:
      fits['power_law'] = scaling.fit_power_law(c, v, args.exclude_first, **kwargs)
    except ValueError as e:
      fits['power_law'] = {'error': str(e)}
  return fits


def plot_fits(runs: Sequence[dict], path: str, target: float | None) -> None:
  """Data (hollow: excluded), fit (dashed past the data), bootstrap band, target, A."""
  fig = Figure(figsize=(8, 5))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  colors = ['C0', 'C1', 'C2', 'C3', 'C4', 'C5']
  for i, run in enumerate(runs):
    col, name = colors[i % len(colors)], os.path.basename(os.path.normpath(run['run']))
    c, v = np.array(run['compute']), np.array(run['value'])
    ax.scatter(c[c > 0], v[c > 0], s=14, facecolors='none', edgecolors=col)
    for kind, style in (('sigmoid', '-'), ('power_law', ':')):
      fit = run['fits'].get(kind)
      if fit is None or isinstance(fit, dict):
        continue
      ax.scatter(fit.compute, fit.values, s=14, color=col)
      hi_c = max(fit.compute[-1] * 10, target or 0)
      seen = np.geomspace(fit.compute[0], fit.compute[-1], 100)
      ahead = np.geomspace(fit.compute[-1], hi_c, 100)
      label = f'{name}: {kind}' + ('' if kind != 'sigmoid' or fit.A_identified
                                   else ' (A not identified)')
      ax.plot(seen, fit.predict(seen), style, color=col, label=label)
      ax.plot(ahead, fit.predict(ahead), '--' if style == '-' else style, color=col, alpha=0.7)
      grid = np.concatenate([seen, ahead])
      lo, hi = fit.band(grid)
      ax.fill_between(grid, lo, hi, color=col, alpha=0.12 if kind == 'sigmoid' else 0.06)
      if kind == 'sigmoid' and fit.A_identified:
        ax.axhline(fit.A, color=col, lw=0.8, ls='-.', alpha=0.6)
      if fit.prediction is not None:   # no error bar where the interval is not identified
        lo_t, hi_t = fit.prediction_interval
        ax.errorbar([fit.target_compute], [fit.prediction], fmt='D', color=col, capsize=3, ms=4,
                    yerr=None if fit.interval_reason else [[fit.prediction - lo_t],
                                                           [hi_t - fit.prediction]])
  ax.set_xscale('log')
  ax.set_xlabel('training compute (FLOPs)')
  ax.set_ylabel(runs[0]['metric'] if runs else '')
  ax.set_title('scaling fit: data (hollow = excluded), fit, 95% band, extrapolation (dashed)',
               fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc='lower right')
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _make_dir(path: str, what: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UsageError(f'{what}={path}: cannot make the directory: {e.strerror}') from None


def cmd_fit(args) -> int:
  if args.config:   # a bad --config is an error even where the runs' logged FLOPs make it unused
    load_config(args.config)
  if args.out:   # before the fits (was a FileNotFoundError traceback after them)
    _make_dir(args.out, '--out')
  runs, failed = [], []
  for run in args.runs:
    try:
      data = load_run(run, args.metric, args.config)
    except (UsageError, OSError, ValueError) as e:
      print(f'error: {e}', file=sys.stderr)
      failed.append(run)
      continue
    data['fits'] = fit_run(data, args.model, args)
    runs.append(data)
    n, base = len(data['value']), data['R0'] is not None
    print(f'{run}: {n + base} eval points of {data["metric"]}'
          + (f' (the base eval at step 0 and {n} after training)' if base else '')
          + f', compute from {data["compute_source"]}')
    for kind, fit in data['fits'].items():
      print(f'  {kind}: error: {fit["error"]}' if isinstance(fit, dict)
            else '  ' + fit.summary().replace('\n', '\n  '))
  ok = [r for r in runs if any(not isinstance(f, dict) for f in r['fits'].values())]
  if not ok:
    print('error: no run could be fitted', file=sys.stderr)
    return 2
  comparisons = []
  for other in ok[1:]:
    for kind in ('sigmoid', 'power_law'):
      fa, fb = ok[0]['fits'].get(kind), other['fits'].get(kind)
      if fa is not None and fb is not None and not isinstance(fa, dict) \
          and not isinstance(fb, dict):
        names = (ok[0]['run'], other['run'])
        result = scaling.compare(fa, fb, names=names)
        comparisons.append(result)
        print(f'compare ({kind}) {names[0]} vs {names[1]}:\n  ' + '\n  '.join(result['text']))
  out = args.out or os.path.join(ok[0]['run'] if os.path.isdir(ok[0]['run'])
                                 else os.path.dirname(ok[0]['run']) or '.', 'scaling')
  _make_dir(out, 'the output directory')
  doc = {'exclude_first': args.exclude_first, 'target_compute': args.target_compute,
         'runs': [{**{k: r[k] for k in ('run', 'metric', 'compute_source', 'R0')},
                   'points': {'step': r['step'], 'compute': r['compute'],
                              'value': [scaling.common.json_float(v) for v in r['value']]},
                   **{kind: (f if isinstance(f, dict) else f.to_dict())
                      for kind, f in r['fits'].items()}} for r in runs],
         'comparisons': comparisons}
  json_path, png_path = os.path.join(out, 'scaling_fit.json'), os.path.join(out, 'scaling_fit.png')
  with open(json_path, 'w', encoding='utf-8') as f:
    json.dump(doc, f, indent=1, allow_nan=False)
  plot_fits(ok, png_path, args.target_compute)
  print(f'wrote {json_path} and {png_path}')
  failed += [r['run'] for r in runs if not any(r is o for o in ok)]   # every fit failed
  if failed:   # was exit 0 beside the others' results
    print(f'error: {len(failed)} of {len(args.runs)} runs could not be fitted: '
          f'{", ".join(failed)}', file=sys.stderr)
    return 1
  return 0


def cmd_plan(args) -> int:
  kw: dict[str, Any] = {}
  n_params = args.model_params
  if args.config:
    config = load_config(args.config)
    if 'rollout' not in config:   # was an AttributeError traceback
      raise UsageError(f'--config={args.config}: plan splits a budget into RL rollouts; this '
                       'recipe has none (SFT, DPO): give --model-params instead')
    n_params = n_params or flops.matmul_params(flops.ModelFields(dict(config.model)))
    kw = dict(prompt_len=config.task.max_prompt_len, gen_len=config.rollout.max_new_tokens,
              updates_per_batch=int(config.algo.get('updates_per_batch', 1)),
              use_reference=flops.uses_reference(config))
  if n_params is None:
    raise UsageError('plan needs --model-params N or --config FILE')
  for name in ('prompt_len', 'gen_len', 'batch_rollouts'):
    if getattr(args, name) is not None:
      kw[name] = getattr(args, name)
  p = scaling.plan(args.budget, n_params, **kw)
  print(f'budget {p.budget:.3g} FLOPs, model {p.model_params:.3g} params: '
        f'{p.flops_per_rollout:.3g} FLOPs per rollout, {p.total_rollouts:.3g} rollouts')
  print(f'  group size (completions per prompt): {p.group_size}')
  print(f'  prompts per step:                    {p.prompts_per_step}')
  print(f'  steps:                               {p.steps}')
  print('assumptions:')
  for a in p.assumptions:
    print(f'  - {a}')
  return 0


def _fraction(text: str) -> float:
  """--exclude-first: a fraction of the run's compute in [0, 1) (a usage error, exit 2, else:
  it was refused per run, after the logs had been read)."""
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not 0 <= value < 1:
    raise argparse.ArgumentTypeError(f'{text!r} is not a fraction in [0, 1): points with compute '
                                     '<= F * max compute are left out (e.g. 0.1)')
  return value


def _flops(text: str) -> float:
  """--target-compute: a finite positive number of FLOPs (0, nan and negatives were refused
  run by run, inf after the fits, when writing the JSON)."""
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not (math.isfinite(value) and value > 0):
    raise argparse.ArgumentTypeError(f'{text!r} is not a positive number of FLOPs (e.g. 1e16)')
  return value


def _optional_float(text: str) -> float | None:
  """--upper: a finite number, or 'none' (was 'invalid _optional_float value')."""
  if text.lower() == 'none':
    return None
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not math.isfinite(value):
    raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'none'")
  return value


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = cli.ArgumentParser(prog='python -m tools.scaling', description=__doc__.split(
      '\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command', required=True)
  fit = sub.add_parser('fit', help='fit eval accuracy against training compute')
  fit.add_argument('runs', nargs='+', help='run dirs (or metrics.jsonl files)')
  fit.add_argument('--exclude-first', type=_fraction, default=0.1, metavar='F',
                   help='leave out points with compute <= F * max compute (default 0.1)')
  fit.add_argument('--target-compute', type=_flops, default=None,
                   help='also predict the metric at this many FLOPs')
  fit.add_argument('--config', default=None, help='recipe FILE[:ARG] to compute FLOPs from')
  fit.add_argument('--metric', default=None, help='eval metric (default mean@K, else greedy)')
  fit.add_argument('--model', default='sigmoid', choices=('sigmoid', 'power_law', 'both'))
  fit.add_argument('--upper', type=_optional_float, default=1.0,
                   help="bound on the asymptote A (default 1.0, an accuracy; 'none': no bound)")
  fit.add_argument('--n-boot', type=int, default=1000)
  fit.add_argument('--seed', type=int, default=0)
  fit.add_argument('--out', default=None, help='output dir (default <first run fitted>/scaling)')
  plan = sub.add_parser('plan', help='split a FLOPs budget (IsoCompute-style heuristics)')
  plan.add_argument('--budget', type=float, required=True, help='training FLOPs')
  plan.add_argument('--model-params', type=float, default=None)
  plan.add_argument('--config', default=None, help='recipe FILE[:ARG] (model, lengths)')
  plan.add_argument('--prompt-len', type=float, default=None)
  plan.add_argument('--gen-len', type=float, default=None)
  plan.add_argument('--batch-rollouts', type=int, default=None)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(argv)
  if args.command == 'fit' and args.n_boot < 20:
    print(f'error: --n-boot={args.n_boot}: the intervals need at least 20 bootstrap replicates',
          file=sys.stderr)
    return 2
  if args.command == 'fit' and args.seed < 0:   # was 'sigmoid: error: expected non-negative
    print(f'error: --seed={args.seed}: must be >= 0', file=sys.stderr)   # integer', per run
    return 2
  try:
    return cmd_fit(args) if args.command == 'fit' else cmd_plan(args)
  except (UsageError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2


if __name__ == '__main__':
  sys.exit(main())
