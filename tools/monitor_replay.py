"""Replays a recorded training log through the failure-signature monitor.

  python -m tools.monitor_replay RUN.jsonl [--format auto|rft_jax|verl|trl|openrlhf] [--out DIR]
                                  [--warmup N] [--set cusum_h=4 ...]

RUN is an rft_jax metrics.jsonl, a JSONL of verl / TRL / OpenRLHF per-step log dicts, or TRL's
trainer_state.json (see `rft_jax.monitor.formats`). Each logged step's metrics, renamed to rft_jax
names, go through the same jitted `monitor_update` the trainer runs (a signal the log lacks is
NaN, which the monitor treats as 'not observed'; see `step_inputs`). Prints one line per incident
and a count, and writes DIR/incidents.jsonl (one {"step", "kind": "incident", ...} object per
line, the trainer's format) and DIR/replay.png (the run's signals with the incidents marked).
DIR defaults to <RUN's directory>/monitor_replay.

RUN may also be a run directory (its metrics.jsonl, or TRL's latest checkpoint-N/
trainer_state.json). The monitor is the run's own when an rft_jax config.json sits beside the
log: its `monitor.warmup` and detector knobs (monitor.cusum_h, ...), turned into a MonitorConfig
by the trainer's function (rft_jax/monitor/knobs.py); `--warmup` and `--set KNOB=VALUE` override
them (to see what another setting would have reported). An rft_jax log is replayed in file order:
steps logged again after a remediation restore restart from the monitor state of the step
before, as in the live run.

--format reads the log as that format even when its keys show another (detection goes by
marker keys, and a log may carry another format's keys: rft_jax logs verl's `actor/*` names too),
with a one-line warning on stderr naming the format detected.

Exit status: 0 after a replay (whether or not it found incidents); 2 with a one-line error when
the file is missing, holds no records of its format, or its format is unknown, or a knob (from
config.json or --set) is unknown or out of its range (as in a config); 1 when the
output cannot be written.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rft_jax.monitor import detectors, formats, knobs, monitor, signals
from rft_jax.telemetry import plot, sinks
from tools import cli

_TOP_EVIDENCE = 3


@functools.lru_cache(maxsize=None)
def _jitted_update(cfg: detectors.MonitorConfig):
  """The monitor update jitted once per config (cfg static), as the trainer runs it."""
  return jax.jit(functools.partial(monitor.monitor_update, cfg=cfg))


def _invariant_sources() -> frozenset[str]:
  return frozenset(k for keys in signals.INVARIANT_SOURCES.values() for k in keys)


def step_inputs(record: Mapping[str, Any]) -> dict[str, np.float32]:
  """One logged step as the monitor's input: every watched signal as a float32 scalar, NaN
  where the log lacks it (the detector then skips it). Keys read by the exact invariant checks
  (loss, grad_norm, invariant/*, ...) are passed only when logged, since a NaN there means a
  non-finite loss, not a missing one; a recorded NaN still reaches the check."""
  names = dict.fromkeys(signals.SIGNALS)
  names.update(dict.fromkeys(sorted(_invariant_sources())))
  inputs = {}
  for name in names:
    if name in record:
      inputs[name] = np.float32(_as_float(record[name]))
    elif name not in _invariant_sources():
      inputs[name] = np.float32(math.nan)
  return inputs


def replay(records: Sequence[Mapping[str, Any]],
           cfg: detectors.MonitorConfig | None = None) -> list[dict[str, Any]]:
  """Runs the monitor over `records` (rft_jax names, each with 'step'), in order. A step that
  does not follow the one before (a remediation restore: rft_jax logs the steps after the
  checkpoint again) restarts from the monitor's state after the step before it, as the trainer
  restores the monitor with the checkpoint.

  Returns the incidents (`monitor.incidents_from_alarms` dicts) in the order they were raised,
  with steps and onsets in the log's step numbering.
  """
  cfg = detectors.MonitorConfig() if cfg is None else cfg
  update = _jitted_update(cfg)
  state = monitor.init_monitor(cfg)
  after: dict[int, monitor.MonitorState] = {}   # the monitor's state after each step
  incidents: list[dict[str, Any]] = []
  last = None
  for record in records:
    step = int(record['step'])
    if last is not None and step <= last:   # a restore: the run went on from step - 1's state
      state = after.get(step - 1, monitor.init_monitor(cfg))
    state, alarms = update(state, step_inputs(record))
    after[step], last = state, step
    if bool(jax.device_get(alarms.fired).any()):  # the only host round-trip on healthy steps
      incidents.extend(monitor.incidents_from_alarms(jax.device_get(alarms),
                                                     int(record['step'])))
  return incidents


def unwatched(records: Sequence[Mapping[str, Any]]) -> list[str]:
  """The monitor's signals (signals.SIGNALS) that no record logs, in their order."""
  logged = {key for record in records for key in record}
  return [name for name in signals.SIGNALS if name not in logged]


def _as_float(value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
    return math.nan
  return float(value)


def _evidence_text(evidence: Sequence[Mapping[str, Any]]) -> str:
  """The top evidence signals in the console's words (sinks.evidence_text), highest score
  first: 'name direction score', an exact check 'invariant/name value (limit L)'; then the
  signature's 'not_up' gates ('name not up (up-score 0.38 < 0.5)', the test the gate passed)."""
  items, gates = [], []
  for item in evidence:
    if item.get('direction') == 'not_up':  # a gate, not evidence of the fault: after it
      gates.append(sinks.evidence_text(item))
      continue
    score = item.get('score')
    items.append((score if isinstance(score, (int, float)) else 0.0, sinks.evidence_text(item)))
  items.sort(key=lambda it: -it[0])
  return ', '.join([text for _, text in items[:_TOP_EVIDENCE]] + gates)


def format_incident(incident: Mapping[str, Any]) -> str:
  """One console line: step, fault class, severity, onset, score, top evidence signals."""
  score = incident.get('score')
  score_text = f'{score:.3g}' if isinstance(score, (int, float)) else str(score)
  return (f'step {incident.get("step")}: {sinks.incident_name(incident)}  '
          f'severity={incident.get("severity")}  onset={incident.get("onset_step")}  '
          f'score={score_text}  evidence: {_evidence_text(incident.get("evidence", ()))}')


def write_incidents(path: str, incidents: Sequence[Mapping[str, Any]]) -> None:
  """Writes `incidents` as the trainer does: {"step", "kind": "incident", ...} per line."""
  if os.path.exists(path):
    os.remove(path)
  sink = sinks.JsonlSink(path)
  try:
    for incident in incidents:
      sink.write(int(incident['step']), 'incident',
                 {k: v for k, v in incident.items() if k != 'step'})
  finally:
    sink.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = cli.ArgumentParser(
      prog='python -m tools.monitor_replay',
      description='Replay a recorded RL training log through the rft_jax failure monitor.')
  parser.add_argument('run', help='metrics JSONL (rft_jax/verl/TRL/OpenRLHF) or '
                                  "TRL's trainer_state.json")
  parser.add_argument('--format', default='auto',
                      help='auto (default), ' + ', '.join(formats.FORMATS))
  parser.add_argument('--out', default=None,
                      help='output directory (default: <run dir>/monitor_replay)')
  parser.add_argument('--warmup', type=int, default=None,
                      help="the monitor's warm-up steps (default: the run's monitor.warmup from "
                           'config.json beside an rft_jax log, else '
                           f'{detectors.MonitorConfig.warmup})')
  parser.add_argument('--set', action='append', default=[], metavar='KNOB=VALUE',
                      help='a monitor knob as config.monitor.KNOB sets it, e.g. --set cusum_h=4 '
                           "(default: the run's, from config.json, else MonitorConfig's)")
  return parser.parse_args(argv)


def run_monitor_section(run_dir: str) -> dict[str, Any]:
  """config.monitor of the rft_jax config.json in `run_dir`; {} without one (a verl or TRL run,
  or an unreadable file; a HF model's config.json has no monitor section)."""
  path = os.path.join(run_dir, 'config.json')
  try:
    with open(path, encoding='utf-8') as f:
      section = json.load(f).get('monitor', {})
  except (OSError, ValueError, AttributeError):
    return {}
  return section if isinstance(section, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(argv)
  if args.warmup is not None and args.warmup < 2:   # the warm-up fit needs 2 (config.py)
    print(f'error: --warmup={args.warmup}: must be at least 2 (as monitor.warmup)',
          file=sys.stderr)
    return 2
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always', formats.FormatMismatch)
      records = formats.load_run(args.run, args.format)
  except (FileNotFoundError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for warning in caught:
    if issubclass(warning.category, formats.FormatMismatch):
      print(f'warning: {warning.message}, as --format asks (leave --format out to read it as '
            f'{warning.message.detected})', file=sys.stderr)
    else:
      warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
  run_dir = args.run if os.path.isdir(args.run) else os.path.dirname(os.path.abspath(args.run))
  section = run_monitor_section(run_dir)
  try:
    flags = knobs.parse_set(args.set)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if args.warmup:
    flags['warmup'] = args.warmup
  try:   # the trainer's mapping, the run's knobs overridden by the flags
    cfg = knobs.monitor_config(section, **flags)
  except knobs.KnobError as e:
    where = 'from --set/--warmup' if e.knob in flags else f'in {run_dir}/config.json'
    print(f'error: {e} ({where})', file=sys.stderr)
    return 2

  incidents = replay(records, cfg)
  for incident in incidents:
    print(format_incident(incident))
  steps = formats.last_per_step(records)
  again = (f' (+{len(records) - len(steps)} records of steps abandoned by restores)'
           if len(records) > len(steps) else '')
  changed = ''.join(f', {name}={getattr(cfg, name)}' for name in knobs.OPTIONAL
                    if getattr(cfg, name) != getattr(detectors.MonitorConfig, name))
  print(f'{len(incidents)} incident(s) over {len(steps)} logged steps{again} of {args.run} '
        f'(monitor warm-up {cfg.warmup} steps{changed})')
  missing = unwatched(records)
  if missing:   # e.g. an SFT or DPO log: no reward, KL, entropy or length to watch
    print(f'the log lacks {len(missing)} of the {len(signals.SIGNALS)} signals the monitor '
          f'watches, so the signatures on them could not fire: {", ".join(missing)}')

  out = args.out or os.path.join(run_dir, 'monitor_replay')
  incidents_path = os.path.join(out, 'incidents.jsonl')
  png_path = os.path.join(out, 'replay.png')
  try:
    os.makedirs(out, exist_ok=True)
    write_incidents(incidents_path, incidents)
    plot.plot_records(steps, png_path, title=f'replay: {os.path.basename(args.run)}',
                      incidents=incidents)
  except OSError as e:
    print(f'error: cannot write the replay to {out}: {e.strerror or e}', file=sys.stderr)
    return 1
  print(f'wrote {incidents_path} and {png_path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
