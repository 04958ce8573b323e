"""Comparing two fitted runs (two recipes, two configs) parameter by parameter.

For each parameter q the difference d = q_a - q_b gets a percentile interval from the two
fits' bootstrap replicates paired by index (the runs are independent, so this is a joint
resample): d_j = q_a[j] - q_b[j]. Scale parameters (C_mid) are compared as ratios, through
ln C_mid. The verdict is "a higher" / "b higher" when the interval excludes 0, else
"not distinguishable"; an asymptote either fit does not identify is "not compared", with the
reason, rather than compared.

Sigmoid fits: A (asymptote, higher is better), B (efficiency exponent, steeper), C_mid
(compute to half the gain, lower is faster). Power-law fits: k (efficiency, higher is better)
and E (offset of ln(1 - acc), lower is better).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rft_jax.scaling import common

# (parameter, boot column, log scale, meaning) per fit kind.
_PARAMS = {
    'sigmoid': (('A', 0, False, 'asymptote'), ('B', 1, False, 'efficiency exponent'),
                ('C_mid', 2, True, 'compute to half the gain, lower = sooner')),
    'power_law': (('k', 0, False, 'efficiency, higher = faster'),
                  ('E', 1, False, 'offset of ln(1 - acc), lower = better')),
}


def _verdict(lo: float, hi: float) -> str:
  if lo > 0:
    return 'a higher'
  if hi < 0:
    return 'b higher'
  return 'not distinguishable'


def compare(fit_a: Any, fit_b: Any, level: float | None = None,
            names: tuple[str, str] = ('a', 'b')) -> dict[str, Any]:
  """Which run has the higher asymptote / efficiency, with intervals.

  Returns {'kind', 'names', 'level', 'params': {q: {'a', 'b', 'diff' (or 'ratio' for C_mid),
  'interval', 'verdict', 'meaning'}}, 'text': one line per parameter}.
  """
  if fit_a.kind != fit_b.kind:
    raise common.ScalingFitError(f'cannot compare a {fit_a.kind} fit with a {fit_b.kind} fit')
  if fit_a.kind not in _PARAMS:
    raise common.ScalingFitError(f'compare() takes sigmoid or power-law fits, got {fit_a.kind}')
  level = min(fit_a.level, fit_b.level) if level is None else level
  common.check_level(level)
  n = min(fit_a.boot.shape[0], fit_b.boot.shape[0])
  out: dict[str, Any] = {'kind': fit_a.kind, 'names': list(names), 'level': level, 'params': {}}
  lines = []
  for name, col, log, meaning in _PARAMS[fit_a.kind]:
    va, vb = getattr(fit_a, name), getattr(fit_b, name)
    entry: dict[str, Any] = {'meaning': meaning, names[0]: common.json_float(va),
                             names[1]: common.json_float(vb)}
    unidentified = [f'{nm}: {f.A_reason}' for nm, f in zip(names, (fit_a, fit_b))
                    if name == 'A' and not f.A_identified]
    if unidentified:
      entry.update({names[0]: None if not fit_a.A_identified else entry[names[0]],
                    names[1]: None if not fit_b.A_identified else entry[names[1]],
                    'interval': None, 'verdict': 'not compared',
                    'reason': '; '.join(unidentified)})
      lines.append(f'{name} ({meaning}): not compared ({entry["reason"]})')
      out['params'][name] = entry
      continue
    a, b = fit_a.boot[:n, col], fit_b.boot[:n, col]
    if log:
      d, point = np.log(a) - np.log(b), math.log(va) - math.log(vb)
    else:
      d, point = a - b, va - vb
    lo, hi = common.interval(d, level)
    verdict = _verdict(lo, hi) if math.isfinite(lo) else 'not distinguishable'
    if log:
      entry.update({'ratio': common.json_float(math.exp(point)),
                    'interval': [common.json_float(math.exp(lo)), common.json_float(math.exp(hi))],
                    'interval_of': f'{name}_{names[0]} / {name}_{names[1]}'})
      desc = f'ratio {math.exp(point):.3g} [{math.exp(lo):.3g}, {math.exp(hi):.3g}]'
    else:
      entry.update({'diff': common.json_float(point), 'interval': [common.json_float(lo),
                                                                   common.json_float(hi)],
                    'interval_of': f'{name}_{names[0]} - {name}_{names[1]}'})
      desc = f'diff {point:+.3g} [{lo:+.3g}, {hi:+.3g}]'
    verdict = verdict.replace('a higher', f'{names[0]} higher').replace('b higher',
                                                                        f'{names[1]} higher')
    entry['verdict'] = verdict
    out['params'][name] = entry
    lines.append(f'{name} ({meaning}): {verdict}; {desc} ({level:.0%})')
  out['text'] = lines
  return out
