"""FaultBench report: report.md and two PNGs from score.json's dict (tools/faultbench_score.py)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top

from rft_jax import faults as faultlib  # noqa: E402

HARDWARE = '2 CPU cores, no GPU'


def _f(x, digits=2):
  if x is None:   # undefined (precision with no run flagged, a delay of no detection)
    return '—'
  return f'{x:.{digits}f}' if isinstance(x, float) else str(x)


def write(out_dir: str, scores: dict, records: list[dict], command: str) -> str:
  """Writes report.md, recall.png and delays.png into out_dir; returns the markdown."""
  o, fa, rem = scores['overall'], scores['false_alarms'], scores['remediation']
  lines = [
      '# FaultBench report', '',
      f'Command: `{command}`  ', f'Hardware: {HARDWARE}. Runs: {len(records)} '
      f"({sum(r['mode'] == 'warn' for r in records)} warn mode, "
      f"{sum(r['mode'] == 'auto' for r in records)} auto mode; "
      f"{len(scores['failed_runs'])} failed to run).", '',
      '## Detection (warn mode, run level)', '',
      '| | precision | recall | F1 | flag-everything F1 | never-flag F1 | runs (faulted) |',
      '|---|---|---|---|---|---|---|',
      f"| all faults | {_f(o['precision'])} | {_f(o['recall'])} | {_f(o['f1'])} | "
      f"{_f(o['flag_all_f1'])} | {_f(o['never_flag_f1'])} | {o['runs']} ({o['positives']}) |"]
  for fam, s in scores['families'].items():
    lines.append(f"| {fam} | {_f(s['precision'])} | {_f(s['recall'])} | {_f(s['f1'])} | "
                 f"{_f(s['flag_all_f1'])} | {_f(s['never_flag_f1'])} | {s['runs']} "
                 f"({s['positives']}) |")
  modes = '; '.join(f"{m} mode {v['alarms']} in {v['healthy_steps']}"
                    for m, v in fa.get('by_mode', {}).items())
  lines += ['', f"False alarms: {_f(fa['per_1000_steps'])} per 1,000 healthy steps "
            f"({fa['alarms']} in {fa['healthy_steps']} steps the monitor observed of healthy "
            'and benign runs and of faulted runs before their onset'
            + (f'; {modes}' if modes else '') + '; a step redone after an auto-mode restore '
            'counts each time it was observed).', '']
  on = scores.get('onset')
  if on and on['runs']:
    lines += [f"Onset of the first detection (its onset_step minus the injected onset, "
              f"{on['runs']} flagged runs): mean |error| {_f(on['mean_abs'])} steps, "
              f"{on['off_by_more_than_2']} off by more than 2.", '']
  lines += ['## Per fault type', '',
            '| fault | family | runs | detected | median delay | p90 delay | diagnosis top-1 | '
            'top-3 | first diagnoses seen | counts as right |',
            '|---|---|---|---|---|---|---|---|---|---|']
  for r in scores['faults']:
    lines.append(f"| {r['fault']} | {r['family']} | {r['runs']} | {r['detected']} | "
                 f"{_f(r['delay_median'], 0)} | {_f(r['delay_p90'], 0)} | {_f(r['top1'])} | "
                 f"{_f(r['top3'])} | {', '.join(r['first_classes'])} | "
                 f"{', '.join(faultlib.FAULTS[r['fault']].expected)} |")
  lines += ['', '## Benign changes (must raise no incident)', '',
            '| change | seed | incidents |', '|---|---|---|']
  lines += [f"| {b['fault']} | {b['seed']} | {b['incidents']} |" for b in scores['benign']]
  if rem:
    lines += ['', '## Remediation (auto mode)', '',
              f"Healthy final greedy accuracy (mean): {_f(rem['healthy_acc'], 3)}. Faulted "
              f"auto-mode runs: {rem['runs']}; finishing within 2 points of it: "
              f"{_f(rem['recovered_share'])}. Median change in severity (accuracy lost vs "
              f"healthy) from warn to auto, over {rem['severity_runs']} runs whose fault cost "
              f"at least 2 points in warn mode: {_f(rem['severity_change_median'])}."]
  if scores['failed_runs']:
    lines += ['', '## Runs that failed to run', '']
    lines += [f"- {r['fault']} seed {r['seed']} ({r['mode']}): {r['error']}"
              for r in scores['failed_runs']]
  text = '\n'.join(lines) + '\n'
  with open(os.path.join(out_dir, 'report.md'), 'w') as f:
    f.write(text)
  _plots(out_dir, scores)
  return text


def _plots(out_dir: str, scores: dict) -> None:
  rows = scores['faults']
  if not rows:
    return
  fig, ax = plt.subplots(figsize=(9, 3.5))
  names = [r['fault'] for r in rows]
  ax.bar(names, [r['recall'] for r in rows], color='tab:blue', label='detected')
  ax.bar(names, [r['top1'] for r in rows], color='tab:green', width=0.4, label='top-1 diagnosis')
  ax.set_ylim(0, 1.05)
  ax.set_ylabel('share of runs')
  ax.tick_params(axis='x', rotation=60)
  ax.legend(loc='upper right', fontsize=8)
  ax.set_title('FaultBench: detection and diagnosis per fault type')
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, 'recall.png'), dpi=110)
  plt.close(fig)
  fig, ax = plt.subplots(figsize=(9, 3.5))
  ax.bar(names, [r['delay_median'] or 0 for r in rows], color='tab:orange', label='median')
  ax.scatter(names, [r['delay_p90'] or 0 for r in rows], color='k', label='p90', zorder=3)
  ax.set_ylabel('steps from onset to first incident')
  ax.tick_params(axis='x', rotation=60)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, 'delays.png'), dpi=110)
  plt.close(fig)
