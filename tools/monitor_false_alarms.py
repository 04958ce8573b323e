"""False-alarm rate and detection delay of the failure monitor on synthetic GRPO traces.

  python -m tools.monitor_false_alarms [--traces 200 --steps 300 --seed 0 --window 10]
                                       [--set cusum_h=8 ...]
  --steps: at least warmup + 71 (81 with the default warmup=10), so that fault onsets fit.

1. Runs the monitor over `traces` healthy traces (rft_jax.monitor.synthetic.healthy_trace) and
   prints false alarms per 1,000 steps, in total and by signature (target: <= 1 in total), and
   the share of traces with any alarm; then the same for `traces` healthy traces whose reward
   rises within the warm-up and levels off (healthy_trace(early_rise=True)), and for `traces`
   runs from the reference under an lr warm-up (KL exactly 0 at the first step, then a steep
   rise to a plateau: healthy_trace(from_reference=True)).
2. For every fault class, injects it into `traces` fresh healthy traces at a random onset in
   [warmup + 30, steps - 40) and prints: detection rate (a signature of the right class fires
   within `window` steps of onset), median and 90th-percentile delay of the detections, the
   fraction where the right class is the first diagnosis (earliest firing, ties broken by
   signatures.rank_key), false alarms per 1,000 steps before onset, and the onset error of the
   first detection (its incident's onset_step minus the injected onset, as FaultBench scores
   it; a ramp first shows one step after its onset): mean |error| and the share of first
   detections dated more than 2 steps early. Then the same with faults injected into runs from
   the reference.

All traces of a batch run as one monitor batch ([N] per signal) in one jitted lax.scan over steps.
A bad --steps, --traces (< 1), --window, --seed (< 0) or --set is one line on stderr, exit 2.
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from rft_jax.monitor import knobs
from rft_jax.monitor import signatures as sigs
from rft_jax.monitor import synthetic
from rft_jax.monitor.monitor import MonitorConfig, run_monitor
from tools import cli
from tools.cli import usage_exit


# (label, synthetic.healthy_trace keywords) of the healthy trace families.
FAMILIES = (('', {}), (', reward rising within the warm-up', {'early_rise': True}),
            (', from the reference under an lr warm-up', {'from_reference': True}))


@functools.partial(jax.jit, static_argnames='cfg')
def _fired_scores(stacked, cfg):
  """{name: [N, T]} -> (fired [N, T, K] bool, score [N, T, K] f32, onset [N, T, K] int32)."""
  _, alarms = run_monitor(stacked, cfg)
  return alarms.fired, alarms.score, alarms.onset


def fired_matrix(traces, cfg: MonitorConfig, onsets: bool = False):
  """(fired, score) [N, T, K] of the monitor over `traces`; with onsets=True also each step's
  latched onset estimate [N, T, K] (trace steps)."""
  fired, score, onset = _fired_scores(synthetic.stack_traces(traces), cfg)
  out = (np.asarray(fired), np.asarray(score))
  return out + (np.asarray(onset),) if onsets else out


def first_diagnosis(fired_tk: np.ndarray, score_tk: np.ndarray, start: int):
  """(step, signature index) of the first firing at or after `start`, or (None, None)."""
  steps = np.flatnonzero(fired_tk[start:].any(-1))
  if not len(steps):
    return None, None
  t = start + steps[0]
  ks = np.flatnonzero(fired_tk[t])
  best = min(ks, key=lambda k: sigs.rank_key(sigs.SIGNATURES[k], float(score_tk[t, k])))
  return t, best


def false_alarms(cfg: MonitorConfig, n: int, steps: int, seed: int, **family):
  """-> (alarms per 1,000 steps, {signature: alarms per 1,000 steps}, share of traces with any
  alarm) on n healthy traces (synthetic.healthy_trace(..., **family): early_rise,
  from_reference)."""
  rng = np.random.default_rng(seed)
  fired, _ = fired_matrix([synthetic.healthy_trace(rng, steps, **family) for _ in range(n)], cfg)
  per_sig = fired.sum((0, 1)) * 1000.0 / (n * steps)
  return (float(per_sig.sum()), dict(zip(sigs.SIGNATURE_NAMES, per_sig.tolist())),
          float(fired.any((1, 2)).mean()))


def detection(cfg: MonitorConfig, fault: str, n: int, steps: int, seed: int, window: int = 10,
              **family):
  """Detection statistics of one fault class over n faulty traces (see module doc), injected
  into synthetic.healthy_trace(..., **family)."""
  rng = np.random.default_rng(seed)
  onsets = rng.integers(cfg.warmup + 30, steps - 40, n)
  traces = [synthetic.inject(synthetic.healthy_trace(rng, steps, **family), fault, int(o), rng=rng)
            for o in onsets]
  fired, score, est = fired_matrix(traces, cfg, onsets=True)
  is_class = np.array([s.fault_class == fault for s in sigs.SIGNATURES])
  delays, first_ok, pre, errors = [], 0, 0, []
  for i, onset in enumerate(onsets):
    hits = np.flatnonzero(fired[i, onset:][:, is_class].any(1))
    if len(hits) and hits[0] <= window:
      delays.append(int(hits[0]))
    t, k = first_diagnosis(fired[i], score[i], int(onset))
    first_ok += k is not None and sigs.SIGNATURES[k].fault_class == fault
    if k is not None:
      errors.append(int(est[i, t, k]) - int(onset))
    pre += int(fired[i, :onset].sum())
  errors = np.array(errors, np.float64)
  return {
      'detected': len(delays) / n,
      'median_delay': float(np.median(delays)) if delays else float('nan'),
      'p90_delay': float(np.percentile(delays, 90)) if delays else float('nan'),
      'first_correct': first_ok / n,
      'pre_onset_false_per_1k': pre * 1000.0 / float(onsets.sum()),
      'onset_mae': float(np.abs(errors).mean()) if len(errors) else float('nan'),
      'onset_early2': float((errors < -2).mean()) if len(errors) else float('nan'),
  }


def main(argv=None):
  parser = cli.ArgumentParser(prog='python -m tools.monitor_false_alarms',
                              description=__doc__.split('\n')[0])
  parser.add_argument('--traces', type=int, default=200)
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--window', type=int, default=10)
  parser.add_argument('--set', action='append', default=[], metavar='KNOB=VALUE',
                      help='a monitor knob as config.monitor.KNOB sets it (rft_jax/monitor/'
                           'knobs.py), e.g. --set cusum_h=6')
  args = parser.parse_args(argv)
  for flag, value, low in (('traces', args.traces, 1), ('window', args.window, 0),
                           ('seed', args.seed, 0)):   # was an IndexError / numpy traceback
    if value < low:
      raise usage_exit(f'--{flag}={value}: must be at least {low}')
  try:   # the knobs' parser and ranges, as a run's config and tools.monitor_replay check them
    cfg = knobs.monitor_config(None, **knobs.parse_set(args.set))
  except ValueError as e:   # was a traceback (unknown field, no '=', a value of another type)
    raise usage_exit(str(e)) from None
  min_steps = cfg.warmup + 71   # fault onsets are drawn from [warmup + 30, steps - 40)
  if args.steps < min_steps:
    raise usage_exit(f'--steps={args.steps}: at least {min_steps} (faults start in [warmup + 30, '
                     f'steps - 40) with warmup={cfg.warmup})')

  for label, family in FAMILIES:
    total, per_sig, runs = false_alarms(cfg, args.traces, args.steps, args.seed, **family)
    print(f'healthy{label}: {args.traces} traces x {args.steps} steps')
    print(f'false_alarms_per_1k_steps {total:.3f} (traces with an alarm: {runs:.3f})')
    for name, rate in per_sig.items():
      if rate > 0:
        print(f'  {name:28s} {rate:.3f}')
  for label, family in (FAMILIES[0], FAMILIES[2]):
    print(f'faulty{label}: {args.traces} traces per class, detection window {args.window} steps')
    print(f'{"fault_class":20s} {"detected":>8s} {"median":>6s} {"p90":>5s} {"first_ok":>8s} '
          f'{"pre_fa/1k":>9s} {"onset|e|":>8s} {"early>2":>7s}')
    for j, fault in enumerate(synthetic.FAULT_CLASSES):
      r = detection(cfg, fault, args.traces, args.steps, args.seed + 1 + j, args.window, **family)
      print(f'{fault:20s} {r["detected"]:8.3f} {r["median_delay"]:6.1f} {r["p90_delay"]:5.1f} '
            f'{r["first_correct"]:8.3f} {r["pre_onset_false_per_1k"]:9.3f} '
            f'{r["onset_mae"]:8.2f} {r["onset_early2"]:7.3f}')


if __name__ == '__main__':
  main()
