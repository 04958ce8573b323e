"""Schema checks for a loaded recipe config, with one-line errors that name the key.

A recipe (`configs/*.py`) returns an `ml_collections.ConfigDict`. `validate(config)` checks it
before anything heavy is imported or built, and raises `ConfigError` on the first problem found:

  config.rollout.group_size=1: GRPO needs at least 2 completions per prompt
  config.rollout.tempreature: unknown key (did you mean 'temperature'?)

The checks run in this order: unknown, missing and wrongly typed keys (against `SCHEMA`); value
ranges (`_COMMON_RULES`, `_RL_RULES`, `_SFT_RULES`, `_DPO_RULES`); constraints between keys;
files on disk; and last the registered names (verifiers, advantage estimators, losses), which
import their implementation modules.

A recipe with a `sft` section is a supervised fine-tuning recipe; one with a `dpo` section a
direct-preference recipe (offline: `dpo.pairs` names a pair dataset; online: pairs built from
`rollout` samples scored by `rewards`); any other is an RL (GRPO family) recipe and must have
`rollout`, `rewards` and `algo` sections. Checks that depend on the devices (e.g. the batch
dividing the data-parallel axes) happen where the mesh is built.
"""
import difflib
import os
from typing import Any, Callable

import ml_collections


class _NameToFloat:
  """Schema marker for a free mapping of names to float weights (`rewards.weights`)."""


NAME_TO_FLOAT = _NameToFloat()

# Every key a recipe may set, with its Python type. A nested dict is a section (a ConfigDict).
# ints are accepted where a float is expected; a bool is never accepted as an int or float.
SCHEMA: dict[str, Any] = {
    'name': str,
    'seed': int,
    'init_from': str,   # orbax params dir; '' = random init
    'task': {'name': str, 'data_dir': str, 'max_prompt_len': int,
             # Optional (OPTIONAL_KEYS), for tasks read from files and chat models (gsm8k):
             'manual_dir': str, 'chat_template': bool, 'system_prompt': str,
             'instruction': str, 'bad_records': str},
    'tokenizer': {'path': str},   # '' = config.model.path (an HF model dir holds its tokenizer)
    'model': {
        'vocab_size': int, 'hidden_size': int, 'intermediate_size': int,
        'num_hidden_layers': int, 'num_attention_heads': int, 'num_key_value_heads': int,
        'head_dim': int, 'rope_theta': float, 'rms_norm_eps': float,
        'tie_word_embeddings': bool, 'attention_bias': bool,
        'max_position_embeddings': int, 'dtype': str,
        'path': str,   # optional (OPTIONAL_KEYS): a local HF model dir; see components.model_config
    },
    'rollout': {
        'prompts_per_step': int, 'group_size': int, 'max_new_tokens': int,
        'temperature': float, 'top_k': int, 'top_p': float,
    },
    'rewards': {'weights': NAME_TO_FLOAT, 'timeout_s': float, 'num_workers': int,
                'max_invalid_frac': float, 'memory_mb': int},
    'algo': {
        'advantage': str, 'loss': str, 'loss_agg': str, 'clip_eps': float, 'kl_coef': float,
        'kl_estimator': str, 'updates_per_batch': int, 'microbatches': int,
        # Optional (see OPTIONAL_KEYS; defaults in rft_jax/algorithms/grpo.py GRPOConfig):
        'clip_eps_low': float, 'clip_eps_high': float, 'clip_c': float, 'entropy_coef': float,
        'kl_in_reward': bool, 'max_len': int,
        # DAPO extras and mismatch correction (optional; rft_jax/algorithms/corrections.py,
        # dynamic_sampling.py; score_chunks: grpo.score_logprobs):
        'dynamic_sampling': bool, 'max_sampling_rounds': int, 'overlong': str,
        'overlong_cache': int, 'tis_cap': float, 'score_chunks': int,
    },
    'sft': {'batch_size': int, 'answer_len': int, 'teacher_error_rate': float},
    # Direct preference optimisation (rft_jax/dpo_trainer.py). pairs, batch_size, answer_len and
    # max_pairs are offline-only (OPTIONAL_KEYS): online DPO makes one pair per rollout prompt.
    'dpo': {'mode': str, 'loss_type': str, 'beta': float, 'label_smoothing': float,
            'microbatches': int, 'pairs': str, 'batch_size': int, 'answer_len': int,
            'max_pairs': int, 'rpo_alpha': float},
    'optim': {
        'lr': float, 'warmup_steps': int, 'b1': float, 'b2': float,
        'weight_decay': float, 'grad_clip': float,
    },
    'train': {'steps': int, 'eval_every': int, 'ckpt_every': int, 'keep_checkpoints': int,
              'min_good_checkpoints': int},
    'eval': {'num_prompts': int, 'k': int, 'temperature': float},
    'mesh': {'data': int, 'fsdp': int, 'tensor': int},
    'telemetry': {'console': bool, 'jsonl': bool, 'tensorboard': bool, 'plot': bool,
                  'wandb_project': str},
    'monitor': {'mode': str, 'warmup': int, 'watch_steps': int, 'lr_factor': float},
    'faults': list,   # [{type, onset_step, strength[, duration]}], see rft_jax/faults.py
}

RL_SECTIONS = ('rollout', 'rewards', 'algo')
OPTIONAL_SECTIONS = ('monitor', 'faults')
# Keys a recipe may leave out; code reading them uses config.<section>.get(key, default).
OPTIONAL_KEYS = frozenset({
    'model.path',                   # default '' (the model config.model describes)
    'dpo.pairs', 'dpo.batch_size', 'dpo.answer_len', 'dpo.max_pairs',   # offline DPO only
    'dpo.rpo_alpha',                # default 0: no NLL term (rft_jax/algorithms/dpo.py)
    # task options, defaults in rft_jax/data/pipeline.py PromptFormat / rft_jax/components.py:
    'task.manual_dir', 'task.chat_template', 'task.system_prompt', 'task.instruction',
    'task.bad_records',             # 'error' (default) or 'skip': see rft_jax/data/pipeline.py
    'train.min_good_checkpoints',   # default 1: see rft_jax/runs.py save_checkpoint
    'rewards.memory_mb',            # default 0 (no limit): see rft_jax/rewards/runner.py
    # algo options (GRPOConfig defaults: clip_eps_low/high = clip_eps, clip_c 0 = no dual-clip,
    # entropy_coef 0, kl_in_reward False, max_len 0 = rollout.max_new_tokens)
    'algo.clip_eps_low', 'algo.clip_eps_high', 'algo.clip_c', 'algo.entropy_coef',
    'algo.kl_in_reward', 'algo.max_len',
    # dynamic_sampling False, max_sampling_rounds 4, overlong 'none', overlong_cache 0 =
    # max(1, max_new_tokens // 5), tis_cap 0 = off, score_chunks 0 = algo.microbatches
    'algo.dynamic_sampling', 'algo.max_sampling_rounds', 'algo.overlong', 'algo.overlong_cache',
    'algo.tis_cap', 'algo.score_chunks',
})
MONITOR_MODES = ('off', 'warn', 'halt', 'auto')
SFT_SECTIONS = ('sft',)
DPO_SECTIONS = ('dpo',)
DPO_MODES = ('offline', 'online')
DPO_LOSS_TYPES = ('sigmoid', 'ipo', 'hinge')   # = rft_jax.algorithms.dpo.DPO_LOSS_TYPES
# Offline pair datasets -> the task whose prompts they hold (rft_jax/dpo_trainer.py PAIR_SOURCES).
DPO_PAIR_SOURCES = {'arith_slips': 'arith'}
_DPO_OFFLINE_KEYS = ('pairs', 'batch_size', 'answer_len', 'max_pairs')
DTYPES = ('float32', 'bfloat16')
KL_ESTIMATORS = ('k1', 'k2', 'k3')   # as in rft_jax.algorithms.losses.kl_penalty
# Advantage estimators that work with fewer than 2 completions per prompt (no group baseline);
# must match the registry's min_group_size (checked by tests/test_algorithm_suite.py). Kept here
# so that this check runs without importing JAX.
GROUP_FREE_ADVANTAGES = ('reinforce_pp',)
DUAL_CLIP_LOSSES = ('ppo_clip', 'gspo')   # losses that implement algo.clip_c
OVERLONG_MODES = ('none', 'mask', 'soft')   # as rft_jax/algorithms/corrections.OVERLONG_MODES

_NO_VALUE = object()


class ConfigError(ValueError):
  """A config problem. `key` is the dotted path inside the config, e.g. 'rollout.group_size'.

  `str(error)` is one line: 'config.<key>=<value!r>: <reason>' (or 'config.<key>: <reason>'
  when there is no single value to show).
  """

  def __init__(self, key: str, reason: str, value: Any = _NO_VALUE):
    self.key = key
    self.reason = reason
    self.value = value
    if value is _NO_VALUE or isinstance(value, ml_collections.ConfigDict):
      message = f'config.{key}: {reason}'
    else:
      message = f'config.{key}={_short_repr(value)}: {reason}'
    super().__init__(message)


def is_sft(config: ml_collections.ConfigDict) -> bool:
  """True for a supervised fine-tuning recipe (one with a `sft` section), else RL."""
  return 'sft' in config


def is_dpo(config: ml_collections.ConfigDict) -> bool:
  """True for a direct-preference recipe (one with a `dpo` section)."""
  return 'dpo' in config


def _is_online_dpo(config: ml_collections.ConfigDict) -> bool:
  return is_dpo(config) and config.dpo.get('mode') == 'online'


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first bad key of `config`; returns None if it is usable."""
  _check_section(config, SCHEMA, '',
                 optional=RL_SECTIONS + SFT_SECTIONS + DPO_SECTIONS + OPTIONAL_SECTIONS)
  required = SFT_SECTIONS if is_sft(config) else RL_SECTIONS
  kind = 'SFT' if is_sft(config) else 'GRPO/RL (no `sft` section)'
  if is_dpo(config):
    if is_sft(config):
      raise ConfigError('dpo', 'a recipe has a `sft` or a `dpo` section, not both')
    online = _is_online_dpo(config)
    required = DPO_SECTIONS + (('rollout', 'rewards') if online else ())
    kind = 'online DPO' if online else 'offline DPO'
  for name in required:
    if name not in config:
      raise ConfigError(name, f'missing section; a {kind} recipe needs it')

  rules = _COMMON_RULES + (_SFT_RULES if is_sft(config) else
                           _dpo_rules(config) if is_dpo(config) else _RL_RULES)
  for key, ok, requirement in rules:
    if key in OPTIONAL_KEYS and not has_key(config, key):
      continue
    value = lookup(config, key)
    if not ok(value):
      raise ConfigError(key, requirement, value)
  _check_model(config)
  _check_mesh(config)
  if is_sft(config):
    _check_sft(config)
  elif is_dpo(config):
    _check_dpo(config)
  else:
    _check_rollout(config)
  _check_paths(config)
  _check_monitor_and_faults(config)
  _check_wandb(config)
  if _is_online_dpo(config):
    _check_verifier_names(config)
  elif not is_sft(config) and not is_dpo(config):
    _check_verifier_names(config)
    _check_algo_names(config)


def _check_wandb(config) -> None:
  import importlib.util  # pylint: disable=g-import-not-at-top
  if config.telemetry.wandb_project and importlib.util.find_spec('wandb') is None:
    raise ConfigError('telemetry.wandb_project', 'Weights & Biases logging needs the wandb '
                      "package (pip install wandb), or set it to ''",
                      config.telemetry.wandb_project)


def _check_monitor_and_faults(config) -> None:
  if 'monitor' in config:
    m = config.monitor
    if m.mode not in MONITOR_MODES:
      raise ConfigError('monitor.mode', 'must be one of ' + ', '.join(MONITOR_MODES), m.mode)
    for key, low in (('warmup', 2), ('watch_steps', 1)):
      if m[key] < low:
        raise ConfigError(f'monitor.{key}', f'must be >= {low}', m[key])
    if not 0 < m.lr_factor < 1:
      raise ConfigError('monitor.lr_factor', 'must be in (0, 1)', m.lr_factor)
  if 'faults' in config:
    from rft_jax import faults  # pylint: disable=g-import-not-at-top  (no JAX inside)
    try:
      faults.check_faults(list(config.faults))
    except ValueError as e:
      key, _, reason = str(e).partition(': ')
      raise ConfigError(key, reason) from None


# --- Structure and types ---------------------------------------------------------------------

def _check_section(section: ml_collections.ConfigDict, schema: dict, prefix: str,
                   optional: tuple[str, ...] = ()) -> None:
  """Checks one section's keys against `schema`, recursing into subsections."""
  for key in section.keys():
    path = prefix + key
    if key not in schema:
      raise ConfigError(path, 'unknown key' + did_you_mean(key, schema))
    want, value = schema[key], section[key]
    if isinstance(want, dict):
      if not isinstance(value, ml_collections.ConfigDict):
        raise ConfigError(path, f'expected a section (ConfigDict), got {_type_name(value)}',
                          value)
      _check_section(value, want, path + '.')
    elif want is NAME_TO_FLOAT:
      _check_name_to_float(value, path)
    elif not _has_type(value, want):
      raise ConfigError(path, f'expected {want.__name__}, got {_type_name(value)}', value)
  for key in schema:
    if key not in section and key not in optional and prefix + key not in OPTIONAL_KEYS:
      raise ConfigError(prefix + key, 'missing key')


def _check_name_to_float(value: Any, path: str) -> None:
  if not isinstance(value, ml_collections.ConfigDict):
    raise ConfigError(path, f'expected a section of name -> float, got {_type_name(value)}',
                      value)
  for name in value.keys():
    if not _has_type(value[name], float):
      raise ConfigError(f'{path}.{name}', f'expected float, got {_type_name(value[name])}',
                        value[name])


def _has_type(value: Any, want: type) -> bool:
  if want is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if want is int:
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, want)


# --- Value ranges ----------------------------------------------------------------------------

Rule = tuple[str, Callable[[Any], bool], str]


def _at_least(key: str, low: float) -> Rule:
  return (key, lambda v: v >= low, f'must be >= {low}')


def _above(key: str, low: float) -> Rule:
  return (key, lambda v: v > low, f'must be > {low}')


_COMMON_RULES: list[Rule] = [
    ('name', lambda v: bool(v.strip()), 'must be a non-empty name (it names the workdir)'),
    _at_least('task.max_prompt_len', 1),
    *[_at_least(f'model.{key}', 1) for key in (
        'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
        'num_attention_heads', 'num_key_value_heads', 'head_dim', 'max_position_embeddings')],
    _above('model.rope_theta', 0),
    _above('model.rms_norm_eps', 0),
    ('model.dtype', lambda v: v in DTYPES, f'must be one of {", ".join(map(repr, DTYPES))}'),
    _above('optim.lr', 0),
    _at_least('optim.warmup_steps', 0),
    ('optim.b1', lambda v: 0 <= v < 1, 'must be in [0, 1)'),
    ('optim.b2', lambda v: 0 <= v < 1, 'must be in [0, 1)'),
    _at_least('optim.weight_decay', 0),
    _at_least('optim.grad_clip', 0),
    _at_least('train.steps', 1),
    _at_least('train.eval_every', 1),
    _at_least('train.ckpt_every', 1),
    _at_least('train.keep_checkpoints', 1),
    _at_least('train.min_good_checkpoints', 0),
    _at_least('eval.num_prompts', 1),
    _at_least('eval.k', 1),
    _at_least('eval.temperature', 0),
    *[(f'mesh.{axis}', lambda v: v == -1 or v >= 1,
       'must be -1 (all devices not used by the other axes) or >= 1')
      for axis in SCHEMA['mesh']],
]

_RL_RULES: list[Rule] = [
    ('rewards.max_invalid_frac', lambda v: 0 <= v <= 1, 'must be in [0, 1]'),
    _at_least('rollout.prompts_per_step', 1),
    _at_least('rollout.group_size', 1),   # >= 2 for group baselines: see _check_algo
    _at_least('rollout.max_new_tokens', 1),
    _at_least('rollout.temperature', 0),
    _at_least('rollout.top_k', 0),
    ('rollout.top_p', lambda v: 0 < v <= 1, 'must be in (0, 1]'),
    _above('rewards.timeout_s', 0),
    _at_least('rewards.num_workers', 0),
    _at_least('rewards.memory_mb', 0),
    ('task.bad_records', lambda v: v in ('error', 'skip'), "must be 'error' or 'skip'"),
    _above('algo.clip_eps', 0),
    _at_least('algo.kl_coef', 0),
    ('algo.kl_estimator', lambda v: v in KL_ESTIMATORS,
     f'must be one of {", ".join(map(repr, KL_ESTIMATORS))}'),
    _at_least('algo.updates_per_batch', 1),
    _at_least('algo.microbatches', 1),
    _at_least('algo.clip_eps_low', 0),
    _at_least('algo.clip_eps_high', 0),
    ('algo.clip_c', lambda v: v == 0 or v > 1,
     'dual-clip constant must be > 1 (Ye et al. 2020), or 0 for no dual-clip'),
    _at_least('algo.entropy_coef', 0),
    ('algo.max_len', lambda v: v >= 0, 'must be >= 0 (0 = rollout.max_new_tokens)'),
    _at_least('algo.max_sampling_rounds', 1),
    ('algo.overlong', lambda v: v in OVERLONG_MODES,
     f'must be one of {", ".join(map(repr, OVERLONG_MODES))}'),
    ('algo.overlong_cache', lambda v: v >= 0,
     'must be >= 0 (0 = max(1, rollout.max_new_tokens // 5))'),
    ('algo.tis_cap', lambda v: v == 0 or v >= 1,
     'truncated importance sampling cap must be >= 1 (e.g. 2), or 0 for off'),
    ('algo.score_chunks', lambda v: v >= 0, 'must be >= 0 (0 = algo.microbatches)'),
]

_SFT_RULES: list[Rule] = [
    _at_least('sft.batch_size', 1),
    _at_least('sft.answer_len', 1),
]


# --- Constraints between keys ----------------------------------------------------------------

def _check_model(config: ml_collections.ConfigDict) -> None:
  model = config.model
  if model.num_attention_heads % model.num_key_value_heads:
    raise ConfigError('model.num_key_value_heads',
                      f'must divide model.num_attention_heads={model.num_attention_heads}',
                      model.num_key_value_heads)
  path = model.get('path', '')
  if path and not os.path.isfile(os.path.join(path, 'config.json')):
    raise ConfigError('model.path', f'not a HF model directory with a config.json (relative to '
                      f"{os.getcwd()}); '' = the model config.model describes", path)


def _check_mesh(config: ml_collections.ConfigDict) -> None:
  flexible = [axis for axis in config.mesh.keys() if config.mesh[axis] == -1]
  if len(flexible) > 1:
    raise ConfigError(f'mesh.{flexible[1]}',
                      f'at most one mesh axis may be -1 (mesh.{flexible[0]} is already -1)', -1)


def _check_algo(config: ml_collections.ConfigDict) -> None:
  """Algorithm choices that do not fit together (no JAX import: names are checked later)."""
  rollout, algo = config.rollout, config.algo
  if rollout.group_size < 2 and algo.advantage not in GROUP_FREE_ADVANTAGES:
    reason = 'GRPO needs at least 2 completions per prompt'
    if algo.advantage != 'grpo':
      reason += (f' (algo.advantage={algo.advantage!r} uses a group baseline; with 1 use '
                 + ' or '.join(map(repr, GROUP_FREE_ADVANTAGES)) + ')')
    raise ConfigError('rollout.group_size', reason, rollout.group_size)
  if algo.get('clip_c', 0) and algo.loss not in DUAL_CLIP_LOSSES:
    raise ConfigError('algo.clip_c', f'dual-clip applies to the {" and ".join(DUAL_CLIP_LOSSES)} '
                      f'losses, not algo.loss={algo.loss!r}; set it to 0', algo.clip_c)


def _check_rollout(config: ml_collections.ConfigDict) -> None:
  _check_algo(config)
  rollout, algo = config.rollout, config.algo
  batch = rollout.prompts_per_step * rollout.group_size
  if batch % algo.microbatches:
    raise ConfigError(
        'algo.microbatches',
        f'must divide the rollout batch rollout.prompts_per_step * rollout.group_size = '
        f'{rollout.prompts_per_step} * {rollout.group_size} = {batch}', algo.microbatches)
  _check_fits(config, 'rollout.max_new_tokens')
  _check_dapo_extras(config)


def _check_dapo_extras(config: ml_collections.ConfigDict) -> None:
  """Dynamic sampling, overlong cache and scoring chunks against the rollout shape."""
  rollout, algo = config.rollout, config.algo
  if algo.get('dynamic_sampling', False) and rollout.group_size < 2:
    raise ConfigError('algo.dynamic_sampling', 'needs rollout.group_size >= 2 (it drops groups '
                      f'without reward spread; a group of {rollout.group_size} never has any)',
                      True)
  cache = algo.get('overlong_cache', 0)
  if cache > rollout.max_new_tokens:
    raise ConfigError('algo.overlong_cache', f'must be <= rollout.max_new_tokens='
                      f'{rollout.max_new_tokens} (the punishment starts at max_new_tokens - '
                      'overlong_cache)', cache)
  chunks, batch = algo.get('score_chunks', 0), rollout.prompts_per_step * rollout.group_size
  if chunks and batch % chunks:
    raise ConfigError('algo.score_chunks', f'must divide the rollout batch rollout.'
                      f'prompts_per_step * rollout.group_size = {batch}', chunks)


def _check_sft(config: ml_collections.ConfigDict) -> None:
  _check_fits(config, 'sft.answer_len')


_DPO_RULES: list[Rule] = [
    ('dpo.mode', lambda v: v in DPO_MODES, f'must be one of {", ".join(map(repr, DPO_MODES))}'),
    ('dpo.loss_type', lambda v: v in DPO_LOSS_TYPES,
     f'must be one of {", ".join(map(repr, DPO_LOSS_TYPES))}'),
    _above('dpo.beta', 0),
    ('dpo.label_smoothing', lambda v: 0 <= v < 0.5, 'must be in [0, 0.5)'),
    _at_least('dpo.microbatches', 1),
    _at_least('dpo.batch_size', 1),
    _at_least('dpo.answer_len', 1),
    ('dpo.max_pairs', lambda v: v >= 0, 'must be >= 0 (0 = every pair of the source)'),
    _at_least('dpo.rpo_alpha', 0),
]


def _dpo_rules(config: ml_collections.ConfigDict) -> list[Rule]:
  """DPO ranges; online DPO also samples, so the RL rollout and rewards ranges apply."""
  if not _is_online_dpo(config):
    return _DPO_RULES
  return _DPO_RULES + [r for r in _RL_RULES if r[0].split('.')[0] in ('rollout', 'rewards')]


def _check_dpo(config: ml_collections.ConfigDict) -> None:
  """Sections and keys that fit the DPO mode; an offline recipe needs a known pair source."""
  dpo = config.dpo
  for name in ('algo',) + (() if _is_online_dpo(config) else ('rollout', 'rewards')):
    if name in config:
      raise ConfigError(name, f'not used by a DPO recipe with dpo.mode={dpo.mode!r} '
                        '(its loss settings are in config.dpo); remove this section')
  if dpo.label_smoothing and dpo.loss_type != 'sigmoid':
    raise ConfigError('dpo.label_smoothing', "label smoothing (cDPO) applies to "
                      f"dpo.loss_type='sigmoid' only, not {dpo.loss_type!r}; set it to 0",
                      dpo.label_smoothing)
  if _is_online_dpo(config):
    for key in _DPO_OFFLINE_KEYS:
      if key in dpo:
        raise ConfigError(f'dpo.{key}', 'offline DPO only: online DPO makes one pair per prompt '
                          'of rollout.prompts_per_step from sampled completions', dpo[key])
    if config.rollout.group_size < 2:
      raise ConfigError('rollout.group_size', 'online DPO needs at least 2 completions per '
                        'prompt to form a pair', config.rollout.group_size)
    batch_key, batch = 'rollout.prompts_per_step', config.rollout.prompts_per_step
    _check_fits(config, 'rollout.max_new_tokens')
  else:
    pairs = dpo.get('pairs', '')
    if not pairs:
      raise ConfigError('dpo.pairs', 'offline DPO needs a preference-pair source (known: '
                        + ', '.join(map(repr, DPO_PAIR_SOURCES)) + "); or set dpo.mode='online' "
                        'to build pairs from sampled completions', pairs)
    if pairs not in DPO_PAIR_SOURCES:
      raise ConfigError('dpo.pairs', 'unknown pair source' + did_you_mean(pairs, DPO_PAIR_SOURCES)
                        + '; known: ' + ', '.join(DPO_PAIR_SOURCES), pairs)
    if DPO_PAIR_SOURCES[pairs] != config.task.name:
      raise ConfigError('dpo.pairs', f'pairs of task {DPO_PAIR_SOURCES[pairs]!r}, but '
                        f'task.name={config.task.name!r}', pairs)
    for key in ('batch_size', 'answer_len'):
      if key not in dpo:
        raise ConfigError(f'dpo.{key}', 'missing key; offline DPO needs it')
    batch_key, batch = 'dpo.batch_size', dpo.batch_size
    _check_fits(config, 'dpo.answer_len')
  if batch % dpo.microbatches:
    raise ConfigError('dpo.microbatches', f'must divide the pairs per step {batch_key}={batch}',
                      dpo.microbatches)


def _check_fits(config: ml_collections.ConfigDict, completion_key: str) -> None:
  """Prompt plus completion must fit in the model's position embeddings."""
  prompt_len, completion_len = config.task.max_prompt_len, lookup(config, completion_key)
  limit = config.model.max_position_embeddings
  if prompt_len + completion_len > limit:
    raise ConfigError(
        completion_key,
        f'task.max_prompt_len + {completion_key} = {prompt_len} + {completion_len} = '
        f'{prompt_len + completion_len} exceeds model.max_position_embeddings={limit}',
        completion_len)


TASKS = ('arith', 'gsm8k')   # rft_jax/components.py load_task


def _check_task(config: ml_collections.ConfigDict) -> None:
  task = config.task
  if task.name not in TASKS:
    raise ConfigError('task.name', 'unknown task' + did_you_mean(task.name, TASKS) + '; known: '
                      + ', '.join(TASKS), task.name)
  if task.name == 'gsm8k':
    manual_dir = task.get('manual_dir', '')
    if not manual_dir:
      raise ConfigError('task.manual_dir', 'required for task gsm8k: the directory holding the '
                        'official train.jsonl and test.jsonl', manual_dir)
    if not os.path.isdir(os.path.expanduser(manual_dir)):
      raise ConfigError('task.manual_dir', f'no such directory (relative to {os.getcwd()}); it '
                        'must hold train.jsonl and test.jsonl', manual_dir)


def _check_paths(config: ml_collections.ConfigDict) -> None:
  """Files the run reads; relative paths are relative to the current directory."""
  path = config.tokenizer.path
  if not path and not config.model.get('path', ''):
    raise ConfigError('tokenizer.path', "required (a tokenizer file or HF model dir; '' = "
                      'config.model.path, which is not set either)', path)
  if path and not os.path.exists(path):
    raise ConfigError('tokenizer.path', f'not found (relative to {os.getcwd()})', path)
  _check_task(config)
  if config.init_from and not os.path.isdir(config.init_from):
    raise ConfigError('init_from',
                      f"no such directory (relative to {os.getcwd()}); '' = random init",
                      config.init_from)


# --- Registered names ------------------------------------------------------------------------

def _check_verifier_names(config: ml_collections.ConfigDict) -> None:
  from rft_jax.rewards.verifiers import VERIFIERS  # pylint: disable=g-import-not-at-top
  weights = config.rewards.weights
  if not weights.keys():
    raise ConfigError('rewards.weights', 'needs at least one verifier name -> weight')
  for name in weights.keys():
    if name not in VERIFIERS:
      raise ConfigError(f'rewards.weights.{name}',
                        'unknown verifier' + did_you_mean(name, VERIFIERS) + '; known: '
                        + ', '.join(sorted(VERIFIERS)))


_ALGO_KINDS = (('advantage', 'advantage estimator'), ('loss', 'policy loss'),
               ('loss_agg', 'loss aggregation'))


def _check_algo_names(config: ml_collections.ConfigDict) -> None:
  # Imports the implementations (and with them JAX): keep this check last.
  from rft_jax.algorithms import registry  # pylint: disable=g-import-not-at-top
  known = registry.names()
  for field, kind in _ALGO_KINDS:
    value = config.algo[field]
    if value not in known[field]:
      raise ConfigError(f'algo.{field}', f'unknown {kind}' + did_you_mean(value, known[field])
                        + '; known: ' + ', '.join(known[field]), value)


# --- Helpers ---------------------------------------------------------------------------------

def lookup(config: ml_collections.ConfigDict, key: str) -> Any:
  """The value at dotted `key` (e.g. 'rollout.top_p'); KeyError if a part is missing."""
  value = config
  for part in key.split('.'):
    value = value[part]
  return value


def has_key(config: ml_collections.ConfigDict, key: str) -> bool:
  try:
    lookup(config, key)
  except (KeyError, AttributeError):
    return False
  return True


def did_you_mean(name: str, candidates) -> str:
  """" (did you mean 'x'?)" for the closest of `candidates` to `name`, or ''."""
  close = difflib.get_close_matches(name, list(candidates), n=1)
  return f' (did you mean {close[0]!r}?)' if close else ''


def _type_name(value: Any) -> str:
  return type(value).__name__


def _short_repr(value: Any, limit: int = 80) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + '...'
