"""Fault injection into live runs, driven by `config.faults` (inactive and free when empty).

Each fault is a dict {type, onset_step, strength[, duration]}: active for steps
onset_step <= step < onset_step + duration (duration 0 or absent = until the end).
Types implemented so far:

  lr_spike   the learning rate is multiplied by `strength` (e.g. 50) while active

The trainer asks `lr_multiplier(faults, step)` each step and multiplies it into the lr_scale
control, so an injected fault and a remediation compose like they would in a real run.
"""
from typing import Any, Mapping, Sequence

FAULT_TYPES = ('lr_spike',)


def check_faults(faults: Sequence[Mapping[str, Any]]) -> None:
  """Raises ValueError('faults[i].key: reason') for the first malformed fault."""
  for i, f in enumerate(faults):
    if not isinstance(f, Mapping):
      raise ValueError(f'faults[{i}]: expected a dict {{type, onset_step, strength}}')
    if f.get('type') not in FAULT_TYPES:
      raise ValueError(f'faults[{i}].type={f.get("type")!r}: unknown fault; known: '
                       + ', '.join(FAULT_TYPES))
    if not isinstance(f.get('onset_step'), int) or f['onset_step'] < 1:
      raise ValueError(f'faults[{i}].onset_step: must be an int >= 1')
    if not isinstance(f.get('strength'), (int, float)) or f['strength'] <= 0:
      raise ValueError(f'faults[{i}].strength: must be a number > 0')
    if not isinstance(f.get('duration', 0), int) or f.get('duration', 0) < 0:
      raise ValueError(f'faults[{i}].duration: must be an int >= 0 (0 = until the end)')


def active(fault: Mapping[str, Any], step: int) -> bool:
  start, duration = fault['onset_step'], fault.get('duration', 0)
  return step >= start and (duration == 0 or step < start + duration)


def lr_multiplier(faults: Sequence[Mapping[str, Any]], step: int) -> float:
  """Product of the strengths of the lr_spike faults active at `step` (1.0 when none)."""
  m = 1.0
  for f in faults:
    if f['type'] == 'lr_spike' and active(f, step):
      m *= float(f['strength'])
  return m
