"""Reading training logs of rft_jax, verl, TRL and OpenRLHF in rft_jax metric names.

The failure monitor watches rft_jax names ('reward/mean', 'kl', 'entropy', ...). Replaying another
framework's run (`tools/monitor_replay.py`) needs its metrics renamed; the tables below are that
renaming, kept as data. For each rft_jax name a table lists the source keys to try in order; the
first one present in a record wins. Keys with no counterpart are dropped: a name is only mapped
when the two quantities mean the same thing (same estimator, same units), because the monitor's
invariant checks use absolute thresholds.

Supported files (`load_run(path, fmt)`):

  rft_jax   workdir/metrics.jsonl from `telemetry.sinks.JsonlSink` (records of kind 'train').
  verl      JSONL of the dict verl's trainer passes to its logger each step, either flat
            ({'training/global_step': 3, 'actor/entropy': ...}) or as written by verl's 'file'
            logger backend ({'step': 3, 'data': {...}}).
  trl       TRL's trainer_state.json ('log_history' list) or a JSONL of the same log dicts.
  openrlhf  JSONL of the dict OpenRLHF's PPO trainer logs each step, with or without the 'train/'
            prefix its W&B/TensorBoard loggers add.

Where the names come from (checked against the frameworks' source where noted):
  verl: verl/trainer/ppo/metric_utils.py `compute_data_metrics` (critic/score/*, critic/rewards/*,
    critic/advantages/*, response_length/*), the actor's update_policy (actor/entropy,
    actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl, actor/kl_loss, actor/grad_norm, actor/lr) and
    ray_trainer.py (training/global_step) -- verified. 'critic/kl' (KL-in-reward) -- verified in
    older ray_trainer.py `apply_kl_penalty`, not in every version.
  TRL: trl/trainer/grpo_trainer.py (reward, reward_std, frac_reward_zero_std, rewards/<f>/mean,
    rewards/<f>/std, kl, entropy, completions/mean_length|max_length|min_length|clipped_ratio,
    clip_ratio/region_mean, sampling/sampling_logp_difference/mean) and transformers' Trainer
    (loss, grad_norm, learning_rate, step) -- verified. Older TRL versions: 'completion_length',
    'clip_ratio' and 'rewards/<f>' without '/mean' -- assumed from older releases, not verified.
  OpenRLHF: openrlhf/trainer/ray/ppo_actor.py `training_step` (policy_loss, actor_lr,
    entropy_loss, ppo_clip_ratio, ppo_kl, kl) and ppo_utils/experience_maker.py (reward, return,
    response_length, total_length); 'actor_grad_norm' appears in newer versions -- verified.
    'policy_entropy', 'clip_ratio' and 'grad_norm' are accepted as aliases but NOT verified in
    OpenRLHF's source. OpenRLHF writes no JSONL itself; its W&B logger prefixes 'train/' and
    steps by 'train/global_step'.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rft_jax.telemetry.records import MONITOR_KINDS, RECORD_KINDS, drop_abandoned
from rft_jax.telemetry.sinks import read_jsonl

FORMATS = ('rft_jax', 'verl', 'trl', 'openrlhf')

# rft_jax name -> source keys, tried in order (first present wins).
VERL_NAMES: dict[str, tuple[str, ...]] = {
    # critic/score is the verifier's sequence score; critic/rewards adds the in-reward KL penalty.
    'reward/mean': ('critic/score/mean', 'critic/rewards/mean'),
    # KL to the reference policy: as a loss term (use_kl_loss) or folded into the reward.
    'kl': ('actor/kl_loss', 'critic/kl'),
    'entropy': ('actor/entropy',),
    'clip_frac': ('actor/pg_clipfrac',),
    'grad_norm': ('actor/grad_norm',),
    # verl's pg_loss excludes the KL term that rft_jax's 'loss' includes; close for small KL.
    'loss': ('actor/pg_loss',),
    'lr': ('actor/lr',),
    # Token-weighted mean over response tokens (rft_jax: per-sequence mean).
    'adv/mean': ('critic/advantages/mean',),
    'response/len_mean': ('response_length/mean',),
    'response/len_max': ('response_length/max',),
    'response/len_min': ('response_length/min',),
    'response/clip_frac': ('response_length/clip_ratio',),
    # Not mapped: 'training/rollout_probs_diff_mean' is a probability (not log-prob) difference.
}
VERL_STEP_KEYS = ('training/global_step', 'step', 'global_step')

TRL_NAMES: dict[str, tuple[str, ...]] = {
    'reward/mean': ('reward',),
    'reward/std': ('reward_std',),
    'reward/zero_std_frac': ('frac_reward_zero_std',),
    'kl': ('kl',),
    'entropy': ('entropy',),
    'clip_frac': ('clip_ratio/region_mean', 'clip_ratio'),
    'grad_norm': ('grad_norm',),
    'loss': ('loss',),
    'lr': ('learning_rate',),
    'response/len_mean': ('completions/mean_length', 'completion_length'),
    'response/len_max': ('completions/max_length',),
    'response/len_min': ('completions/min_length',),
    'response/clip_frac': ('completions/clipped_ratio',),
    # mean |old_logp - sampler_logp| over completion tokens: the same quantity as rft_jax's.
    'mismatch/logp_abs_diff': ('sampling/sampling_logp_difference/mean',),
}
TRL_STEP_KEYS = ('step', 'global_step')

OPENRLHF_NAMES: dict[str, tuple[str, ...]] = {
    'reward/mean': ('reward',),
    'kl': ('kl',),
    # OpenRLHF's 'entropy_loss' is the masked mean token entropy (logged when an entropy
    # coefficient is set); 'policy_entropy' is an unverified alias.
    'entropy': ('entropy_loss', 'policy_entropy'),
    'clip_frac': ('ppo_clip_ratio', 'clip_ratio'),
    'grad_norm': ('actor_grad_norm', 'grad_norm'),
    'loss': ('policy_loss',),
    'lr': ('actor_lr',),
    'response/len_mean': ('response_length',),
    # Not mapped: 'vllm_kl' (a KL estimate, not rft_jax's mean absolute log-prob difference).
}
OPENRLHF_STEP_KEYS = ('global_step', 'step', '_step')
# Logged through W&B (report_to='wandb' and its JSON exports), TRL's and OpenRLHF's keys carry a
# 'train/' prefix ('train/loss', 'train/global_step'); it is stripped before detection and mapping.
WANDB_PREFIX = 'train/'

TABLES: dict[str, dict[str, tuple[str, ...]]] = {
    'verl': VERL_NAMES, 'trl': TRL_NAMES, 'openrlhf': OPENRLHF_NAMES}
STEP_KEYS: dict[str, tuple[str, ...]] = {
    'verl': VERL_STEP_KEYS, 'trl': TRL_STEP_KEYS, 'openrlhf': OPENRLHF_STEP_KEYS}

# Keys whose presence identifies a format in 'auto' mode, checked in this order.
_MARKERS: tuple[tuple[str, re.Pattern], ...] = (
    ('verl', re.compile(r'^(actor|critic|response_length|training)/')),
    ('trl', re.compile(r'^(frac_reward_zero_std|reward_std|learning_rate|completions/'
                       r'|completion_length$|rewards/|clip_ratio/)')),
    ('openrlhf', re.compile(r'^(policy_loss|actor_lr|ppo_clip_ratio|entropy_loss'
                            r'|actor_grad_norm|total_length|global_step)$')),
    ('rft_jax', re.compile(r'^(reward/mean|response/len_mean|mismatch/|invariant/)')),
)

# TRL reward functions: 'rewards/<name>/mean' (current) or 'rewards/<name>' (older releases).
_TRL_REWARD_FUNC = re.compile(r'^rewards/(?P<name>.+?)(?:/(?P<stat>mean|std))?$')
_CORRECTNESS_FUNC = re.compile(r'correct|^acc', re.IGNORECASE)


def _number(value: Any) -> float | None:
  """`value` as a float (NaN/inf kept), or None when it is not a real number."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    if isinstance(value, str) and value in ('NaN', 'nan', 'Infinity', '-Infinity', 'inf', '-inf'):
      return float(value.replace('Infinity', 'inf'))
    return None
  return float(value)


def _step_of(record: Mapping[str, Any], keys: Sequence[str]) -> int | None:
  for key in keys:
    value = _number(record.get(key))
    if value is not None and math.isfinite(value):
      return int(value)
  return None


def _unwrap(record: Mapping[str, Any]) -> dict[str, Any]:
  """verl's file logger writes {'step': s, 'data': {...}}: flatten it to one dict."""
  data = record.get('data')
  if isinstance(data, Mapping):
    flat = dict(data)
    flat.setdefault('step', record.get('step'))
    return flat
  return dict(record)


def _strip_prefix(record: Mapping[str, Any], prefix: str) -> dict[str, Any]:
  return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in record.items()}


def map_record(record: Mapping[str, Any], fmt: str) -> dict[str, float]:
  """Renames one foreign log dict to rft_jax metric names (without 'step').

  Values that are not real numbers and keys without an rft_jax counterpart are dropped.
  """
  if fmt in ('openrlhf', 'trl'):
    record = _strip_prefix(record, WANDB_PREFIX)
  out: dict[str, float] = {}
  for target, sources in TABLES[fmt].items():
    for source in sources:
      value = _number(record.get(source))
      if value is not None:
        out[target] = value
        break
  if fmt == 'trl':
    out.update(_trl_reward_functions(record))
  return out


def _trl_reward_functions(record: Mapping[str, Any]) -> dict[str, float]:
  """'rewards/<f>/mean' -> 'reward/<f>/mean' (and '/std'); a correctness-like function also
  gives 'reward/correct/mean' (the first one, in key order, if several match)."""
  out: dict[str, float] = {}
  for key, raw in record.items():
    match = _TRL_REWARD_FUNC.match(key)
    value = _number(raw)
    if match is None or value is None:
      continue
    name, stat = match['name'], match['stat'] or 'mean'
    out[f'reward/{name}/{stat}'] = value
    if stat == 'mean' and _CORRECTNESS_FUNC.search(name):
      out.setdefault('reward/correct/mean', value)
  return out


class FormatMismatch(UserWarning):
  """load_run read a log as the format it was given, which is not the one its keys show."""

  def __init__(self, message: str, detected: str):
    super().__init__(message)
    self.detected = detected


def detect_format(records: Iterable[Mapping[str, Any]]) -> str | None:
  """The format whose marker keys appear in `records` (dicts already unwrapped), else None."""
  return _detect(records)[0]


def _detect(records: Iterable[Mapping[str, Any]]) -> tuple[str | None, str]:
  """(detect_format's answer, what showed it: "records of kind 'train'" or the marker key)."""
  keys: set[str] = set()
  for record in records:
    if record.get('kind') == 'train':
      return 'rft_jax', "records of kind 'train'"
    keys.update(record)
  keys |= {k[len(WANDB_PREFIX):] for k in keys if k.startswith(WANDB_PREFIX)}
  for fmt, pattern in _MARKERS:
    found = sorted(key for key in keys if pattern.search(key))
    if found:
      return fmt, f'key {found[0]!r}'
  return None, ''


def _read_json_lines(path: str) -> list[dict[str, Any]]:
  """Every JSON object line of `path` (blank, torn or non-object lines skipped)."""
  records = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(record, dict):
        records.append(record)
  return records


def _read_raw(path: str) -> tuple[list[dict[str, Any]], bool]:
  """(log dicts, came from a trainer_state.json) for a JSON document or a JSONL file."""
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except UnicodeDecodeError:
    raise ValueError(f'{path}: not a text file (a log is JSON or JSONL)') from None
  try:
    document = json.loads(text)
  except json.JSONDecodeError:
    document = None
  if isinstance(document, dict) and isinstance(document.get('log_history'), list):
    return [r for r in document['log_history'] if isinstance(r, dict)], True
  if isinstance(document, list):
    return [r for r in document if isinstance(r, dict)], False
  if isinstance(document, dict):  # a one-line JSONL file
    return [document], False
  return _read_json_lines(path), False


def _metric_names(record: Mapping[str, Any]) -> set[str]:
  return set(record) - {'step'}


def _merge_by_step(records: Iterable[dict[str, float]]) -> list[dict[str, float]]:
  """One record per step, sorted: the final trajectory. Records of one step merge, a later value
  winning (TRL logs a step's train and eval metrics apart). A record that logs a metric which a
  record before it logged for the same step or a later one starts a redo (a resume or a
  remediation restore from an earlier checkpoint: `records.drop_abandoned`): what was logged
  for its step or later is dropped first. So the redo's values replace the abandoned ones whole,
  also when the redo starts at the last abandoned step (its keys used to merge into the
  abandoned record, keeping those only it had), and the abandoned steps a redo never reached
  (it was halted or killed before them) do not stay in the result."""
  merged: dict[int, dict[str, float]] = {}
  for record in drop_abandoned(records, _metric_names):
    merged.setdefault(record['step'], {}).update(record)
  return list(merged.values())


def _load_rft_jax(path: str) -> list[dict[str, Any]]:
  """Train records in file order: after a remediation restore (monitor.mode='auto') the steps
  after the checkpoint are logged again, and the replay restores its monitor state the same
  way (monitor_replay.replay)."""
  records = []
  for record in read_jsonl(path, kind='train'):
    row = {k: v for k, v in record.items()
           if k not in ('kind', 'step') and _number(v) is not None}
    row = {k: _number(v) for k, v in row.items()}
    records.append({'step': int(record['step']), **row})
  return records


def last_per_step(records: Iterable[dict[str, float]]) -> list[dict[str, float]]:
  """One record per step, sorted: the run's final trajectory (_merge_by_step)."""
  return _merge_by_step(records)


def _log_in(directory: str) -> str:
  """The log of a run directory: rft_jax's metrics.jsonl, TRL's trainer_state.json, or that of
  its latest checkpoint-N/ (TRL writes it only there)."""
  for name in ('metrics.jsonl', 'trainer_state.json'):
    if os.path.isfile(os.path.join(directory, name)):
      return os.path.join(directory, name)
  steps = [(int(m.group(1)), n) for n in os.listdir(directory)
           if (m := re.fullmatch(r'checkpoint-(\d+)', n))
           and os.path.isfile(os.path.join(directory, n, 'trainer_state.json'))]
  if steps:
    return os.path.join(directory, max(steps)[1], 'trainer_state.json')
  raise FileNotFoundError(f'{directory}: a directory without metrics.jsonl, trainer_state.json '
                          'or checkpoint-N/trainer_state.json; pass the log file')


def load_run(path: str | os.PathLike, fmt: str = 'auto') -> list[dict[str, Any]]:
  """Reads a run's per-step metrics in rft_jax names.

  Args:
    path: an rft_jax metrics.jsonl, a verl/TRL/OpenRLHF JSONL of per-step log dicts, or TRL's
      trainer_state.json; or a run directory holding one (TRL's output_dir: the latest
      checkpoint-N/trainer_state.json).
    fmt: one of FORMATS, or 'auto' to detect it from the keys. A format other than the one
      detected is obeyed (detection goes by marker keys, and a log may carry another format's
      keys), with a FormatMismatch warning naming both.
  Returns:
    Foreign logs: one dict per logged step, sorted by step, each {'step': int, <rft_jax name>:
    float, ...}. Records without a step or without any mapped metric (TRL's end-of-training
    summary, eval lines) are skipped. rft_jax logs: the train records in file order (steps
    repeat after a remediation restore; last_per_step merges them).
  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: unknown `fmt`, a format that cannot be detected, a binary file, or no record of
      the format (one line naming the file).
  """
  path = os.fspath(path)
  if fmt != 'auto' and fmt not in FORMATS:
    raise ValueError(f'{path}: unknown format {fmt!r} (expected auto or one of '
                     f'{", ".join(FORMATS)})')
  if os.path.isdir(path):
    path = _log_in(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no such file')
  raw, from_trainer_state = _read_raw(path)
  raw = [_unwrap(r) for r in raw]
  _check_not_train_free(raw, path)
  detected, evidence = ('trl', "TRL's trainer_state.json") if from_trainer_state else _detect(raw)
  if fmt == 'auto':
    fmt = detected
    if fmt is None:
      raise ValueError(f'{path}: cannot detect the log format from its keys; pass --format '
                       f'({", ".join(FORMATS)})')
  if not raw:
    raise ValueError(f'{path}: no log records in it (an empty file?)')
  records = _records(raw, path, fmt)
  if not records:
    raise ValueError(f'{path}: no record with a step and a {fmt} metric (is it a {fmt} log?)')
  if detected not in (None, fmt):
    warnings.warn(FormatMismatch(f'{path}: its format looks like {detected} ({evidence}), not '
                                 f'{fmt}; read as {fmt}', detected), stacklevel=2)
  return records


def _check_not_train_free(raw: list[dict[str, Any]], path: str) -> None:
  """ValueError for an rft_jax file whose records (each with a JsonlSink 'kind') hold no step:
  an incidents.jsonl (the monitor's output: it said 'cannot detect the log format; pass
  --format', and --format rft_jax replayed 0 steps of its numbers), or the metrics.jsonl of a
  run stopped before its first step."""
  kinds = {r.get('kind') for r in raw}
  if not raw or 'train' in kinds or not kinds <= set(RECORD_KINDS):
    return
  if kinds <= set(MONITOR_KINDS):
    raise ValueError(f"{path}: an incidents file (the failure monitor's output), not a training "
                     "log; pass the run's metrics.jsonl or its directory")
  raise ValueError(f'{path}: an rft_jax log without train records (only {", ".join(sorted(kinds))}'
                   '): the run stopped before its first step')


def _records(raw: list[dict[str, Any]], path: str, fmt: str) -> list[dict[str, Any]]:
  """load_run's records of the unwrapped log dicts `raw` read as `fmt`."""
  if fmt == 'rft_jax':
    if any(r.get('kind') == 'train' for r in raw):
      return _load_rft_jax(path)
    # rft_jax names without JsonlSink's 'kind' field (e.g. a hand-made JSONL).
    return _merge_by_step(
        {'step': step, **{k: _number(v) for k, v in r.items()
                          if k != 'step' and _number(v) is not None}}
        for r in raw if (step := _step_of(r, ('step',))) is not None)
  records = []
  for record in raw:
    if fmt in ('openrlhf', 'trl'):
      record = _strip_prefix(record, WANDB_PREFIX)   # for its step key
    step = _step_of(record, STEP_KEYS[fmt])
    metrics = map_record(record, fmt)
    if step is not None and metrics:
      records.append({'step': step, **metrics})
  return _merge_by_step(records)
