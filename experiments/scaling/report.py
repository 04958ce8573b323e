"""The sweep's report: backtests (fit the first 50% of each run's compute, predict its final
held-out accuracy), the live fit replayed on each run, full-run fits, algorithm comparison and
k across sizes. Input: results/points.json (written by `run_sweep collect`).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from rft_jax import scaling
from rft_jax.scaling import backtest, live

METRIC = 'mean@8'
N_BOOT = 1000
LIVE = live.LiveConfig(every=1, n_boot=200)   # the live fit as the trainer would run it


def _series(run: dict, metric: str = METRIC):
  return np.array(run['compute']), np.array(run[metric]), run[f'R0_{metric}']


def analyse(points: dict[str, Any], fraction: float = 0.5) -> dict[str, Any]:
  """Everything the report says, as a JSON-safe dict (fits without their numpy parts)."""
  out: dict[str, Any] = {'metric': f'eval/{METRIC}_acc', 'fraction': fraction,
                         'n_boot': N_BOOT, 'runs': {}}
  full_fits = {}
  for name, run in points['runs'].items():
    c, y, r0 = _series(run)
    entry: dict[str, Any] = {'size': run['size'], 'algo': run['algo'], 'params': run['params'],
                             'n_evals': int(c.size), 'final_compute': float(c[-1]),
                             'R0': r0, 'final': float(y[-1]), 'wall_s': run.get('wall_s')}
    for model in ('sigmoid', 'power_law'):
      try:
        bt = backtest.backtest(c, y, r0, fraction=fraction, model=model, n_boot=N_BOOT)
        bt.pop('_fit')
        entry[f'backtest_{model}'] = bt
      except scaling.ScalingFitError as e:
        entry[f'backtest_{model}'] = {'error': str(e)}
    updates = live.replay(run['step'], c, y, r0, LIVE, total_steps=run['steps'])
    entry['live'] = {
        'incidents': [i['step'] for u in updates for i in u.incidents],
        'step': [int(s) for s, u in zip(run['step'], updates) if 'scaling/pred_final' in u.metrics],
        **{k: [u.metrics[f'scaling/{k}'] for u in updates if 'scaling/pred_final' in u.metrics]
           for k in ('pred_final', 'pred_lo', 'pred_hi', 'A_identified')}}
    fits = {'sigmoid': scaling.fit_sigmoid(np.r_[0.0, c], np.r_[r0, y], 0.1, n_boot=N_BOOT),
            'power_law': scaling.fit_power_law(c, y, 0.1, n_boot=N_BOOT)}
    full_fits[name] = fits
    entry['full_fit'] = {k: f.to_dict() for k, f in fits.items()}
    out['runs'][name] = entry
  out['compare_algos'] = {}
  sizes = sorted({r['size'] for r in points['runs'].values()})
  algos = sorted({r['algo'] for r in points['runs'].values()})
  for size in sizes:
    names = [f'{a}_{size}' for a in algos if f'{a}_{size}' in full_fits]
    if len(names) == 2:
      out['compare_algos'][size] = scaling.compare(
          full_fits[names[0]]['sigmoid'], full_fits[names[1]]['sigmoid'], names=tuple(names))
  out['k_by_size'] = {}
  for algo in algos:
    ks = {points['runs'][n]['params']: full_fits[n]['power_law'] for n in full_fits
          if points['runs'][n]['algo'] == algo}
    out['k_by_size'][algo] = {str(int(n)): {'k': f.k, 'interval': list(f.intervals['k'])}
                              for n, f in sorted(ks.items())}
    if len(ks) >= 3:
      out['k_by_size'][algo]['k_of_n'] = scaling.fit_k_of_n(ks).to_dict()
    else:
      out['k_by_size'][algo]['k_of_n'] = (f'not fitted: k(N) = K_max N / (N + N0) has 2 '
                                          f'parameters and {len(ks)} sizes give no residual '
                                          'to test it (fit_k_of_n needs >= 3 sizes)')
    if len(ks) == 2:
      out['k_by_size'][algo]['two_sizes'] = two_size_ratio(ks)
  return out


def two_size_ratio(ks: dict) -> dict[str, Any]:
  """k(N2) / k(N1) with a 95% interval (the two fits' bootstrap replicates paired by index),
  against N2 / N1: k(N) = K_max N / (N + N0) gives k(N2) / k(N1) = (N2 / N1) (N1 + N0) / (N2 + N0),
  which lies in (1, N2 / N1) for N2 > N1 -- a larger ratio cannot come from that form."""
  (n1, f1), (n2, f2) = sorted(ks.items())
  m = min(f1.boot.shape[0], f2.boot.shape[0])
  lo, hi = scaling.common.interval(f2.boot[:m, 0] / f1.boot[:m, 0])
  ratio, size_ratio = f2.k / f1.k, n2 / n1
  verdict = ('above N2/N1: k grows faster than the saturating form allows between these sizes '
             '(far from saturation)' if lo > size_ratio else
             'within (1, N2/N1): consistent with the saturating form' if 1 < lo and hi < size_ratio
             else 'its interval overlaps 1 or N2/N1: the two sizes do not decide')
  return {'N1': n1, 'N2': n2, 'size_ratio': size_ratio, 'k_ratio': ratio,
          'k_ratio_interval': [lo, hi], 'verdict': verdict}


def _pct(x: float | None) -> str:
  return '-' if x is None or not math.isfinite(x) else f'{100 * x:.1f}'


def markdown(res: dict[str, Any], points: dict[str, Any]) -> str:
  lines = ['# Scaling sweep: results', '',
           f'Held-out {res["metric"]} (256 prompts x 8 samples, fixed seed) against training '
           f'FLOPs. {points["setup"]}', '',
           f'## Backtest: fit the first {res["fraction"]:.0%} of each run\'s compute, predict '
           'its final eval', '',
           '| run | params | evals fitted | model | predicted final [95% band] | actual final |'
           ' error (pts) | band covers final? | band + eval noise | covers it? |'
           ' A identified |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for name, r in res['runs'].items():
    for model in ('sigmoid', 'power_law'):
      bt = r[f'backtest_{model}']
      if 'error' in bt and isinstance(bt['error'], str):
        lines.append(f'| {name} | {r["params"]:,} | - | {model} | refused: {bt["error"]} | '
                     f'{_pct(r["final"])} | - | - | - | - | - |')
        continue
      lo, hi = bt['interval']
      lines.append(
          f'| {name} | {r["params"]:,} | {bt["n_fit_points"]} | {model} | '
          f'{_pct(bt["prediction"])} [{_pct(lo)}, {_pct(hi)}] | {_pct(bt["actual"])} | '
          f'{100 * bt["error"]:+.1f} | {"yes" if bt["covered"] else "**no**"} | '
          f'[{_pct(bt["interval_obs"][0])}, {_pct(bt["interval_obs"][1])}] | '
          f'{"yes" if bt["covered_obs"] else "**no**"} | '
          f'{"-" if bt["A_identified"] is None else ("yes" if bt["A_identified"] else "no")} |')
  reasons = [f'- {name}: {r["backtest_sigmoid"]["fit"]["A_reason"]}'
             for name, r in res['runs'].items() if 'fit' in r['backtest_sigmoid']
             and r['backtest_sigmoid']['fit']['A_reason']]
  if reasons:
    lines += ['', 'Why the sigmoid\'s A was not identified on the first half (the tool then '
              'flags the extrapolation as unreliable):'] + reasons
  lines += ['', '## Live fit replayed on each run (every eval, 200 bootstrap replicates)', '',
            '| run | first live prediction (step) | prediction at 50% of steps | last prediction |'
            ' anomaly incidents |', '|---|---|---|---|---|']
  for name, r in res['runs'].items():
    lv = r['live']
    if not lv['step']:
      lines.append(f'| {name} | none | - | - | {lv["incidents"] or "none"} |')
      continue
    half = max(i for i, s in enumerate(lv['step']) if s <= points['runs'][name]['steps'] / 2) \
        if lv['step'][0] <= points['runs'][name]['steps'] / 2 else 0
    fmt = lambda i: (f'{_pct(lv["pred_final"][i])} [{_pct(lv["pred_lo"][i])}, '
                     f'{_pct(lv["pred_hi"][i])}] (step {lv["step"][i]})')
    lines.append(f'| {name} | {fmt(0)} | {fmt(half)} | {fmt(-1)} | '
                 f'{", ".join(map(str, lv["incidents"])) or "none"} |')
  lines += ['', '## Full-run fits', '', '| run | A (95%) | B | C_mid (FLOPs) | k (power law) |',
            '|---|---|---|---|---|']
  for name, r in res['runs'].items():
    s, p = r['full_fit']['sigmoid'], r['full_fit']['power_law']
    a = (f'{s["A"]:.3f} [{s["intervals"]["A"][0]:.3f}, {s["intervals"]["A"][1]:.3f}]'
         if s['A_identified'] else f'not identified ({s["A_reason"]})')
    lines.append(f'| {name} | {a} | {s["B"]:.2f} | {s["C_mid"]:.3g} | {p["k"]:.3f} '
                 f'[{p["intervals"]["k"][0]:.3f}, {p["intervals"]["k"][1]:.3f}] |')
  lines += ['', '## GRPO vs Dr.GRPO (sigmoid, full runs)', '']
  for size, cmp in res['compare_algos'].items():
    lines.append(f'- {size}: ' + '; '.join(cmp['text']))
  lines += ['', '## Power-law efficiency k across model sizes', '']
  for algo, d in res['k_by_size'].items():
    ks = ', '.join(f'N={int(n):,}: k={v["k"]:.3f} [{v["interval"][0]:.3f}, '
                   f'{v["interval"][1]:.3f}]' for n, v in d.items() if n.isdigit())
    kn = d['k_of_n'] if isinstance(d['k_of_n'], str) else json.dumps(d['k_of_n'])
    lines.append(f'- {algo}: {ks}; k(N): {kn}')
    if 'two_sizes' in d:
      t = d['two_sizes']
      lines.append(f'  - k(N2)/k(N1) = {t["k_ratio"]:.2f} [{t["k_ratio_interval"][0]:.2f}, '
                   f'{t["k_ratio_interval"][1]:.2f}] for N2/N1 = {t["size_ratio"]:.2f}: '
                   f'{t["verdict"]}')
  return '\n'.join(lines) + '\n'


def plot(res: dict[str, Any], points: dict[str, Any], path: str) -> None:
  """One panel per run: data (filled = fitted first half), sigmoid backtest fit and band up
  to the final compute, the live fit's prediction of the final eval over the run."""
  names = list(res['runs'])
  fig = Figure(figsize=(11, 4 * math.ceil(len(names) / 2)))
  FigureCanvasAgg(fig)
  for i, name in enumerate(names):
    ax = fig.add_subplot(math.ceil(len(names) / 2), 2, i + 1)
    run, r = points['runs'][name], res['runs'][name]
    c, y, r0 = _series(run)
    half = c <= res['fraction'] * c[-1]
    ax.scatter(c[half], y[half], s=14, color='C0', label='evals fitted (first 50%)')
    ax.scatter(c[~half], y[~half], s=14, facecolors='none', edgecolors='C0',
               label='evals held out')
    bt = backtest.backtest(c, y, r0, fraction=res['fraction'], n_boot=N_BOOT)['_fit']
    grid = np.geomspace(c[0], c[-1], 100)
    lo, hi = bt.band(grid)
    ax.plot(grid, bt.predict(grid), color='C1', label='sigmoid fit of the first 50%')
    ax.fill_between(grid, lo, hi, color='C1', alpha=0.2)
    lv = r['live']
    if lv['step']:
      lc = np.array([c[list(run['step']).index(s)] for s in lv['step']])
      ax.errorbar(lc, lv['pred_final'], yerr=[np.array(lv['pred_final']) - lv['pred_lo'],
                                              np.array(lv['pred_hi']) - lv['pred_final']],
                  fmt='.', color='C2', alpha=0.6, ms=3, lw=0.8,
                  label='live prediction of the final eval')
    ax.axhline(y[-1], color='k', lw=0.8, ls=':', label='actual final eval')
    ax.set_xscale('log')
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(f'{name} ({run["params"]:,} params)', fontsize=9)
    ax.set_xlabel('training FLOPs', fontsize=8)
    ax.set_ylabel(res['metric'], fontsize=8)
    ax.grid(alpha=0.3)
    if i == 0:
      ax.legend(fontsize=7, loc='lower right')
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def write(points_path: str, out_dir: str) -> dict[str, Any]:
  with open(points_path, encoding='utf-8') as f:
    points = json.load(f)
  res = analyse(points)
  with open(os.path.join(out_dir, 'report.json'), 'w', encoding='utf-8') as f:
    json.dump(res, f, indent=1, allow_nan=False)
  with open(os.path.join(out_dir, 'report.md'), 'w', encoding='utf-8') as f:
    f.write(markdown(res, points))
  plot(res, points, os.path.join(out_dir, 'report.png'))
  return res
