"""config.monitor's detector knobs: the MonitorConfig fields a run may set, their ranges, and the
one mapping from a run's config.monitor to its MonitorConfig.

  monitor_config(config.monitor)   # the trainer's live monitor (and so a resumed run's)
  monitor_config(json['monitor'])  # tools.monitor_replay, from the run's config.json

`monitor.warmup` is a required key of a recipe's monitor section; every other knob is optional
(config_schema.OPTIONAL_KEYS) and defaults to MonitorConfig's, which were tuned on the synthetic
traces of synthetic.py (tools/monitor_false_alarms) and scored on FaultBench. The fields and
what they do: MonitorConfig's docstring (detectors.py). `invariant_score` is not a knob: it
only ranks a violated exact check above drift evidence.

No JAX import at module level: rft_jax/config_schema.py reads KNOBS before anything heavy loads.
MonitorConfig is static under jit, so a changed knob compiles another monitor program; the
monitor state's shapes depend on `warmup` alone (the warm-up window), so a checkpointed state
restores under any other knob values (a changed warmup resets it: checkpoint.RESETTABLE_FIELDS).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

# name -> (type, predicate, requirement). The ranges keep each knob meaningful: a value outside
# one disables a detector (cusum_cap < 1: the CUSUM never reaches its threshold; not_up_max 0:
# no 'not_up' gate holds) or breaks its arithmetic (cusum_h 0: a division by zero).
Knob = tuple[type, Callable[[Any], bool], str]


def _at_least(low) -> tuple[Callable[[Any], bool], str]:
  return (lambda v: v >= low), f'must be >= {low}'


def _above(low) -> tuple[Callable[[Any], bool], str]:
  return (lambda v: v > low), f'must be > {low}'


def _fraction(low_open: bool = False) -> tuple[Callable[[Any], bool], str]:
  if low_open:
    return (lambda v: 0 < v <= 1), 'must be in (0, 1]'
  return (lambda v: 0 <= v <= 1), 'must be in [0, 1]'


KNOBS: dict[str, Knob] = {
    'warmup': (int, *_at_least(2)),               # the robust fit needs 2 observations
    'cusum_k': (float, *_at_least(0)),
    'cusum_h': (float, *_above(0)),
    'cusum_cap': (float, lambda v: v >= 1,
                  'must be >= 1 (the CUSUM ceiling in units of cusum_h: below 1 the CUSUM '
                  'never reaches its threshold)'),
    'z_clip': (float, *_above(0)),                 # and > cusum_k: see problem()
    'ewma_alpha': (float, *_fraction(low_open=True)),
    'z_thresh': (float, *_above(0)),
    'persistence': (int, *_at_least(1)),
    'baseline_rate': (float, *_fraction()),
    'trend_rate': (float, *_fraction()),
    'frozen_rate': (float, *_fraction()),
    'trend_shrink': (float, *_at_least(0)),
    'var_rate': (float, *_fraction(low_open=True)),
    'small_sample': (float, *_at_least(0)),
    'eps_rel': (float, *_at_least(0)),
    'not_up_max': (float, lambda v: v > 0, "must be > 0 (at 0 no 'not_up' gate could hold)"),
    'release': (float, lambda v: 0 < v <= 1,
                'must be in (0, 1] (an active signature stays active down to this strength; '
                '1 = no hysteresis)'),
    'stall_persistence': (int, *_at_least(1)),
    'credit_persistence': (int, *_at_least(1)),
    'additive_trend_damping': (float, *_fraction()),
    'min_trend_warmup': (int, *_at_least(0)),
    'onset_reset': (float, *_at_least(0)),
    'log_warmup_trend': (float, *_fraction()),
    'log_trend_fast': (int, lambda v: v in (0, 1), 'must be 0 or 1'),
    'onset_lead': (int, *_at_least(-1)),
}
OPTIONAL = tuple(name for name in KNOBS if name != 'warmup')   # warmup: a required key


def _type_ok(value: Any, want: type) -> bool:
  """As the schema's check (config.py): an int is a float, a bool is neither."""
  if isinstance(value, bool):
    return False
  return isinstance(value, (int, float) if want is float else int)


def problem(monitor: Any, blame: Sequence[str] = ()) -> tuple[str, str] | None:
  """(knob, what is wrong) for the first bad knob that `monitor` (a ConfigDict or a dict: the
  run's config.monitor) sets, or None; keys that are not knobs are left to the schema. A pair
  that does not fit (cusum_k, z_clip) is blamed on the one in `blame` (a tool's flags)."""
  for name, (want, ok, requirement) in KNOBS.items():
    if name not in monitor:
      continue
    value = monitor[name]
    if not _type_ok(value, want):
      return name, f'expected {want.__name__}, got {type(value).__name__}'
    if not math.isfinite(value):   # config.json may hold NaN or Infinity
      return name, 'must be a finite number'
    if not ok(value):
      return name, requirement
  if 'z_clip' in monitor or 'cusum_k' in monitor:   # the defaults (JAX) only when one is set
    z_clip = monitor['z_clip'] if 'z_clip' in monitor else _default('z_clip')
    k = monitor['cusum_k'] if 'cusum_k' in monitor else _default('cusum_k')
    if z_clip <= k:   # a clipped step never adds to the CUSUM: no drift would be detected
      pair = [name for name in ('cusum_k', 'z_clip') if name in blame]
      return (pair[0] if pair else 'cusum_k' if 'cusum_k' in monitor else 'z_clip',
              f'must keep cusum_k < z_clip (cusum_k={k}, z_clip={z_clip}): else the CUSUM '
              'never grows')
  return None


def parse_set(items: Sequence[str], flag: str = '--set') -> dict[str, Any]:
  """A tool's `--set KNOB=VALUE` flags (tools.monitor_replay, monitor_false_alarms, faultbench):
  ['cusum_h=4', 'persistence=2'] -> {'cusum_h': 4.0, 'persistence': 2}, each parsed as its
  knob's type; ValueError('--set ...: ...') for an unknown knob or a value of another type.
  Ranges are monitor_config's to check (with the run's other knobs)."""
  from rft_jax.config_schema import did_you_mean  # pylint: disable=g-import-not-at-top
  out = {}
  for item in items:
    name, sep, text = item.partition('=')
    if name not in KNOBS or not sep:
      hint = did_you_mean(name, KNOBS) if sep else ''
      raise ValueError(f'{flag} {item}: expected KNOB=VALUE with a monitor knob{hint}; knobs: '
                       + ', '.join(KNOBS))
    kind = KNOBS[name][0]
    try:
      out[name] = kind(text)
    except ValueError:
      raise ValueError(f'{flag} {item}: monitor.{name} takes '
                       f'{"an int" if kind is int else "a float"} value') from None
  return out


class KnobError(ValueError):
  """A bad knob value: str() is 'monitor.<knob>=<value>: <what is wrong>'; .knob names it."""

  def __init__(self, knob: str, message: str):
    super().__init__(message)
    self.knob = knob


def _default(name: str):
  from rft_jax.monitor.detectors import MonitorConfig  # pylint: disable=g-import-not-at-top
  return getattr(MonitorConfig, name)


def monitor_config(monitor: Any = None, **overrides: Any):
  """The MonitorConfig of a run's config.monitor (a ConfigDict, or config.json's dict; None: the
  defaults): its warmup and every other knob it sets, MonitorConfig's defaults for the rest;
  `overrides` (knob -> value: a tool's flags) win. An int is taken for a float knob.

  Raises KnobError (a ValueError: 'monitor.<knob>=<value>: <what is wrong>') for a bad or
  unknown knob (a validated config has none; config.json and a tool's flags may); keys of
  `monitor` that are not knobs (mode, watch_steps, ...) are ignored.
  """
  from rft_jax.monitor.detectors import MonitorConfig  # pylint: disable=g-import-not-at-top
  values = {name: monitor[name] for name in KNOBS if monitor is not None and name in monitor}
  unknown = sorted(set(overrides) - set(KNOBS))
  if unknown:
    raise KnobError(unknown[0], f'monitor.{unknown[0]}: not a monitor knob; knobs: '
                    + ', '.join(KNOBS))
  values.update(overrides)
  bad = problem(values, blame=tuple(overrides))
  if bad:
    raise KnobError(bad[0], f'monitor.{bad[0]}={values[bad[0]]!r}: {bad[1]}')
  return MonitorConfig(**{name: KNOBS[name][0](value) for name, value in values.items()})
