"""FaultBench scoring: pure functions from run records to the benchmark's numbers.

A run record (one line of results.jsonl, written by tools/faultbench.py) holds:
  fault        a type of rft_jax.faults.FAULTS, or 'healthy'
  family       its family ('reward', ..., 'benign', or 'healthy')
  seed, onset, mode ('warn' | 'auto'), steps (steps planned)
  steps_done   the highest step trained
  steps_observed, steps_observed_before_onset
               the steps the monitor observed (train records in metrics.jsonl), all of them and
               those before the onset: a step redone after an auto-mode restore counts again
  incidents    [{step, onset_step, fault_class, signature, severity}] in firing order (those of
               steps a restore abandoned included)
  final_acc    final held-out greedy accuracy (None if the run stopped early)
  error        why the run failed, or None

Definitions (run level):
  flagged      a faulted run is flagged when an incident fires at or after its onset; a healthy
               or benign run when any incident fires
  precision/recall/F1   faulted runs are the positives; healthy and benign runs the negatives.
               None where undefined: precision with no run flagged, recall and F1 (and the
               baselines' F1) with no faulted run; F1 = 2 TP / (2 TP + FP + FN)
  baselines    flag-everything (recall 1, precision = share of faulted runs) and never-flag (0)
  false alarms per 1,000 healthy steps   incidents in healthy and benign runs, plus incidents
               before onset in faulted runs, per step of those stretches the monitor observed,
               in both modes: a step redone after an auto-mode restore was observed (and could
               raise an alarm) once more, and counts once more; a run stopped early counts the
               steps it ran. Records without the observed counts (results.jsonl from before
               they were recorded) count steps_done, or onset - 1 at most, as before
  delay        first incident step at or after onset minus onset (flagged runs)
  onset error  that first incident's onset_step minus the run's onset (flagged runs): the
               monitor's estimate of when the fault began, which an auto-mode restore uses;
               scored as the mean |error| and the runs off by more than 2 steps
  diagnosis    top-1: the first incident at/after onset has a fault class the fault type
               counts as correct (faults.FAULTS[...].expected); top-3: one of the first three
               distinct classes does
  remediation  (mode 'auto' runs) recovered: final accuracy within 2 points of the mean final
               accuracy of the healthy runs; severity = that mean minus the run's final
               accuracy; its change = (severity with auto - severity with warn) / severity with
               warn, for fault types whose warn runs lost at least 2 points
"""
from __future__ import annotations

import collections
from typing import Any, Iterable

import numpy as np

from rft_jax import faults as faultlib


def _after_onset(r: dict) -> list[dict]:
  return [i for i in r['incidents'] if i['step'] >= r['onset']]


def flagged(r: dict) -> bool:
  if r['fault'] == 'healthy' or r['family'] == 'benign':
    return bool(r['incidents'])
  return bool(_after_onset(r))


def delay(r: dict) -> int | None:
  after = _after_onset(r)
  return after[0]['step'] - r['onset'] if after else None


def onset_error(r: dict) -> int | None:
  """The first detection's estimated onset minus the true one; None when not detected, or
  when its incident has no onset estimate (records written before onsets were logged)."""
  after = _after_onset(r)
  estimate = after[0].get('onset_step') if after else None
  return None if estimate is None else estimate - r['onset']


def onset_errors(records: list[dict]) -> dict[str, Any]:
  """Onset error of the first detection over the flagged faulted runs (see the module doc)
  whose incidents carry an onset estimate."""
  errs = [e for r in records if _is_faulted(r) and flagged(r)
          for e in [onset_error(r)] if e is not None]
  return {'runs': len(errs),
          'mean_abs': float(np.mean(np.abs(errs))) if errs else None,
          'off_by_more_than_2': sum(abs(e) > 2 for e in errs)}


def diagnosis(r: dict) -> tuple[bool, bool]:
  """(top-1 correct, top-3 correct) for a faulted run (False, False when not flagged)."""
  expected = set(faultlib.FAULTS[r['fault']].expected)
  classes = list(dict.fromkeys(i['fault_class'] for i in _after_onset(r)))
  return (bool(classes) and classes[0] in expected,
          any(c in expected for c in classes[:3]))


def prf(records: list[dict]) -> dict[str, float | None]:
  """Precision, recall, F1 with faulted runs as positives, plus the two baselines; None where
  undefined (0/0: no run flagged for precision, no faulted run for the others), not 0."""
  pos = [r for r in records if _is_faulted(r)]
  neg = [r for r in records if not _is_faulted(r)]
  tp = sum(flagged(r) for r in pos)
  fp = sum(flagged(r) for r in neg)
  share = len(pos) / len(records) if records else 0.0
  return {'runs': len(records), 'positives': len(pos), 'tp': tp, 'fp': fp,
          'precision': tp / (tp + fp) if tp + fp else None,
          'recall': tp / len(pos) if pos else None,
          'f1': 2 * tp / (tp + fp + len(pos)) if pos else None,   # 2TP / (2TP + FP + FN)
          'flag_all_f1': 2 * share / (share + 1) if pos else None,
          'never_flag_f1': 0.0 if pos else None}


def _is_faulted(r: dict) -> bool:
  return r['fault'] != 'healthy' and r['family'] != 'benign'


def healthy_steps(r: dict) -> int:
  """The healthy steps the monitor observed in run `r`: all of a healthy or benign run's, a
  faulted run's before its onset; redone steps once more (see the module doc)."""
  done = r.get('steps_done', r['steps'])
  if _is_faulted(r):
    return r.get('steps_observed_before_onset', max(0, min(r['onset'] - 1, done)))
  return r.get('steps_observed', done)


def false_alarms_per_1000(records: Iterable[dict]) -> tuple[float, int, int]:
  """(rate, false alarms, healthy steps) over healthy/benign runs and pre-onset stretches."""
  alarms = steps = 0
  for r in records:
    steps += healthy_steps(r)
    if _is_faulted(r):
      alarms += sum(i['step'] < r['onset'] for i in r['incidents'])
    else:
      alarms += len(r['incidents'])
  return (1000.0 * alarms / steps if steps else float('nan')), alarms, steps


def false_alarms(records: list[dict]) -> dict[str, Any]:
  """The false-alarm rate over `records` (both modes), and per mode."""
  def entry(rs):
    rate, alarms, steps = false_alarms_per_1000(rs)
    return {'per_1000_steps': rate, 'alarms': alarms, 'healthy_steps': steps}
  modes = dict.fromkeys(r['mode'] for r in records)
  return {**entry(records),
          'by_mode': {m: entry([r for r in records if r['mode'] == m]) for m in modes}}


def _pct(values, q):
  return float(np.percentile(values, q)) if values else None


def per_fault(records: list[dict]) -> list[dict]:
  """One row per fault type (warn-mode runs): runs, detected, median/p90 delay, diagnosis."""
  by_type = collections.defaultdict(list)
  for r in records:
    if _is_faulted(r):
      by_type[r['fault']].append(r)
  rows = []
  for name in faultlib.FAULTS:
    runs = by_type.get(name)
    if not runs:
      continue
    delays = [delay(r) for r in runs if flagged(r)]
    diag = [diagnosis(r) for r in runs]
    rows.append({'fault': name, 'family': faultlib.FAULTS[name].family, 'runs': len(runs),
                 'detected': len(delays), 'recall': len(delays) / len(runs),
                 'delay_median': _pct(delays, 50), 'delay_p90': _pct(delays, 90),
                 'top1': float(np.mean([d[0] for d in diag])),
                 'top3': float(np.mean([d[1] for d in diag])),
                 'first_classes': sorted({(_after_onset(r) or [{}])[0].get('fault_class', '-')
                                          for r in runs})})
  return rows


def per_family(records: list[dict]) -> dict[str, dict]:
  """P/R/F1 per fault family: that family's faulted runs against all negative runs."""
  neg = [r for r in records if not _is_faulted(r)]
  families = dict.fromkeys(faultlib.FAULTS[r['fault']].family for r in records
                           if _is_faulted(r))
  return {f: prf([r for r in records if _is_faulted(r) and r['family'] == f] + neg)
          for f in families}


def remediation(warn: list[dict], auto: list[dict]) -> dict[str, Any]:
  """Recovery share and median severity change of 'auto' runs (see the module doc)."""
  healthy = [r['final_acc'] for r in warn if r['fault'] == 'healthy'
             and r['final_acc'] is not None]
  if not healthy or not auto:
    return {}
  ref = float(np.mean(healthy))
  acc = lambda r: r['final_acc'] if r['final_acc'] is not None else 0.0
  faulted_auto = [r for r in auto if _is_faulted(r)]
  recovered = [acc(r) >= ref - 0.02 for r in faulted_auto]
  warn_sev = collections.defaultdict(list)
  for r in warn:
    if _is_faulted(r):
      warn_sev[r['fault']].append(ref - acc(r))
  changes = []
  for r in faulted_auto:
    before = np.mean(warn_sev.get(r['fault'], [np.nan]))
    if before >= 0.02:
      changes.append(((ref - acc(r)) - before) / before)
  return {'healthy_acc': ref, 'runs': len(faulted_auto),
          'recovered_share': float(np.mean(recovered)) if recovered else None,
          'severity_change_median': float(np.median(changes)) if changes else None,
          'severity_runs': len(changes)}


def score(records: list[dict]) -> dict[str, Any]:
  ok = [r for r in records if r.get('error') is None]
  warn = [r for r in ok if r['mode'] == 'warn']
  auto = [r for r in ok if r['mode'] == 'auto']
  return {'overall': prf(warn), 'families': per_family(warn), 'faults': per_fault(warn),
          'onset': onset_errors(warn),
          'false_alarms': false_alarms(warn + auto),
          'benign': [{'fault': r['fault'], 'seed': r['seed'], 'incidents': len(r['incidents'])}
                     for r in warn if r['family'] == 'benign'],
          'remediation': remediation(warn, auto),
          'failed_runs': [{'fault': r['fault'], 'seed': r['seed'], 'mode': r['mode'],
                           'error': r['error']} for r in records if r.get('error')]}
