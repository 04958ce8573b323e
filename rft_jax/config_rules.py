"""Value ranges and constraints between keys of a recipe config (run by rft_jax/config.validate).

A Rule is (dotted key, predicate, requirement): the value at the key must satisfy the predicate,
else ConfigError says the requirement. The _check_* functions test what one key alone cannot.
No JAX import: these run before anything heavy is loaded.
"""
import math
import os
from typing import Any, Callable

import ml_collections

from rft_jax.config_schema import (
    CRITIC_ADVANTAGES, CRITIC_MODES, DPO_LOSS_TYPES, DPO_MODES, DPO_OFFLINE_KEYS,
    DPO_PAIR_SOURCES, DTYPES, DUAL_CLIP_LOSSES, DYNAMIC_SAMPLING_METRICS, GROUP_FREE_ADVANTAGES,
    KL_CTRLS, KL_ESTIMATORS, OVERLONG_MODES, PPO_KEYS, SCHEMA, ConfigError, did_you_mean, lookup,
    ppo_minibatches, relative_to_cwd)
from rft_jax.hf_hub import snapshot_hint


def is_online_dpo(config: ml_collections.ConfigDict) -> bool:
  """A DPO recipe whose pairs come from the policy's own scored samples."""
  return 'dpo' in config and config.dpo.get('mode') == 'online'


# --- Value ranges ----------------------------------------------------------------------------

Rule = tuple[str, Callable[[Any], bool], str]


def _at_least(key: str, low: float) -> Rule:
  return (key, lambda v: v >= low, f'must be >= {low}')


def _above(key: str, low: float) -> Rule:
  return (key, lambda v: v > low, f'must be > {low}')


REMAT = ('none', 'full', 'dots', 'dots_no_batch')   # rft_jax/models/llama.py REMAT_POLICIES
WEIGHTS_LAYOUTS = ('train', 'no_fsdp')   # rft_jax/parallel/mesh.py SAMPLING_LAYOUTS

COMMON_RULES: list[Rule] = [
    ('name', lambda v: bool(v.strip()), 'must be a non-empty name (it names the workdir)'),
    _at_least('task.max_prompt_len', 1),
    *[_at_least(f'model.{key}', 1) for key in (
        'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
        'num_attention_heads', 'num_key_value_heads', 'head_dim', 'max_position_embeddings')],
    _above('model.rope_theta', 0),
    _above('model.rms_norm_eps', 0),
    ('model.dtype', lambda v: v in DTYPES, f'must be one of {", ".join(map(repr, DTYPES))}'),
    ('model.remat', lambda v: v in REMAT, f'must be one of {", ".join(map(repr, REMAT))}'),
    ('rollout.weights_layout', lambda v: v in WEIGHTS_LAYOUTS,
     f'must be one of {", ".join(map(repr, WEIGHTS_LAYOUTS))}'),
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

RL_RULES: list[Rule] = [
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
    ('algo.dynamic_sampling_metric', lambda v: v in DYNAMIC_SAMPLING_METRICS,
     f'must be one of {", ".join(map(repr, DYNAMIC_SAMPLING_METRICS))}'),
    ('algo.overlong', lambda v: v in OVERLONG_MODES,
     f'must be one of {", ".join(map(repr, OVERLONG_MODES))}'),
    ('algo.overlong_cache', lambda v: v >= 0,
     'must be >= 0 (0 = max(1, rollout.max_new_tokens // 5))'),
    ('algo.tis_cap', lambda v: v == 0 or v >= 1,
     'truncated importance sampling cap must be >= 1 (e.g. 2), or 0 for off'),
    ('algo.score_chunks', lambda v: v >= 0, 'must be >= 0 (0 = algo.microbatches)'),
    ('algo.kl_ctrl', lambda v: v in KL_CTRLS, f'must be one of {", ".join(map(repr, KL_CTRLS))}'),
    _above('algo.kl_target', 0),
    _above('algo.kl_horizon', 0),
    ('algo.critic', lambda v: v in CRITIC_MODES,
     f'must be one of {", ".join(map(repr, CRITIC_MODES))}'),
    ('algo.gamma', lambda v: 0 <= v <= 1, 'must be in [0, 1]'),
    ('algo.lam', lambda v: 0 <= v <= 1, 'must be in [0, 1]'),
    _at_least('algo.vf_coef', 0),
    _at_least('algo.vf_clip', 0),
    _at_least('algo.critic_lr', 0),
    _at_least('algo.minibatches', 1),
    # Live scaling fit (rft_jax/scaling/live.py LiveConfig checks the same ranges).
    ('scaling.live_every', lambda v: v >= 0, 'must be >= 0 (fit every k-th eval; 0 = off)'),
    ('scaling.model', lambda v: v in ('sigmoid', 'power_law'),
     "must be 'sigmoid' or 'power_law'"),
    ('scaling.exclude_first', lambda v: 0 <= v < 1, 'must be in [0, 1)'),
    _at_least('scaling.n_boot', 20),
    _at_least('scaling.anomaly_sd', 0),
    _at_least('scaling.anomaly_min_drop', 0),
]

SFT_RULES: list[Rule] = [
    _at_least('sft.batch_size', 1),
    _at_least('sft.answer_len', 1),
    ('sft.teacher_error_rate', lambda v: 0 <= v <= 1, 'must be in [0, 1] (a fraction of answers)'),
]


def check_finite(config: ml_collections.ConfigDict, prefix: str = '') -> None:
  """Every float in the config (nested sections, reward weights) is finite: an inf learning
  rate passes 'lr > 0' and makes the warm-up's 0 * inf a NaN; a NaN weight scores NaN rewards."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      check_finite(value, f'{prefix}{key}.')
    elif isinstance(value, float) and not math.isfinite(value):
      raise ConfigError(f'{prefix}{key}', 'must be a finite number', value)


# --- Constraints between keys ----------------------------------------------------------------

def check_model(config: ml_collections.ConfigDict) -> None:
  model = config.model
  if model.num_attention_heads % model.num_key_value_heads:
    raise ConfigError('model.num_key_value_heads',
                      f'must divide model.num_attention_heads={model.num_attention_heads}',
                      model.num_key_value_heads)
  path = model.get('path', '')
  if path and not os.path.isfile(os.path.join(path, 'config.json')):
    raise ConfigError('model.path', 'not a HF model directory with a config.json'
                      f"{relative_to_cwd(path)}; '' = the model config.model describes"
                      + snapshot_hint(path), path)


def check_train(config: ml_collections.ConfigDict) -> None:
  """A failed save goes on only with >= min_good_checkpoints good ones on disk, and at most
  keep_checkpoints are kept (rft_jax/runs.py save_checkpoint): a floor above that always stops."""
  train = config.train
  need, keep = train.get('min_good_checkpoints', 1), train.keep_checkpoints
  if need > keep:
    raise ConfigError('train.min_good_checkpoints', f'must be <= train.keep_checkpoints={keep}: '
                      f'at most {keep} checkpoint(s) are kept, so any failed save would stop the '
                      'run; lower it or raise train.keep_checkpoints', need)


def check_mesh(config: ml_collections.ConfigDict) -> None:
  flexible = [axis for axis in config.mesh.keys() if config.mesh[axis] == -1]
  if len(flexible) > 1:
    raise ConfigError(f'mesh.{flexible[1]}',
                      f'at most one mesh axis may be -1 (mesh.{flexible[0]} is already -1; give '
                      f'it a size, e.g. --config.mesh.{flexible[0]}=1)', -1)


def _check_algo(config: ml_collections.ConfigDict) -> None:
  """Algorithm choices that do not fit together (no JAX import: names are checked later)."""
  rollout, algo = config.rollout, config.algo
  _check_critic(config)
  group_free = GROUP_FREE_ADVANTAGES + CRITIC_ADVANTAGES   # a critic needs no group baseline
  if rollout.group_size < 2 and algo.advantage not in group_free:
    reason = 'GRPO needs at least 2 completions per prompt'
    if algo.advantage != 'grpo':
      reason += (f' (algo.advantage={algo.advantage!r} uses a group baseline; with 1 use '
                 + ' or '.join(map(repr, GROUP_FREE_ADVANTAGES)) + ')')
    raise ConfigError('rollout.group_size', reason, rollout.group_size)
  if (not rollout.temperature and algo.advantage not in group_free
      and not moves_temperature(config)):
    raise ConfigError('rollout.temperature', 'greedy sampling makes the G completions of a '
                      f'prompt identical, so algo.advantage={algo.advantage!r} (a group '
                      'baseline) is 0 for every completion and nothing is learned; sample at a '
                      "temperature > 0 (e.g. 1.0), or use 'reinforce_pp' or 'gae' (PPO)", 0.0)
  if algo.get('clip_c', 0) and algo.loss not in DUAL_CLIP_LOSSES:
    raise ConfigError('algo.clip_c', f'dual-clip applies to the {" and ".join(DUAL_CLIP_LOSSES)} '
                      f'losses, not algo.loss={algo.loss!r}; set it to 0', algo.clip_c)


def moves_temperature(config: ml_collections.ConfigDict) -> bool:
  """An injected fault (rft_jax/faults.py) samples at another temperature than the recipe's."""
  moving = ('sampler_temperature', 'temperature_anneal', 'kl_removed_low_temp')
  return any(hasattr(f, 'get') and f.get('type') in moving for f in config.get('faults', ()))


def _check_critic(config: ml_collections.ConfigDict) -> None:
  """PPO (a critic-based advantage) needs a critic. Any other advantage reads no PPO_KEYS: they
  may keep the recipe's values, unused (a PPO recipe switched by --config.algo.advantage alone),
  and critic may be 'none'; one changed from the recipe's (config_unused.changed_from_recipe) is
  refused. Adaptive KL needs a coefficient to adapt, and so does the KL in the reward."""
  from rft_jax import config_unused  # pylint: disable=g-import-not-at-top  (it imports this)
  algo = config.algo
  critic, ppo = algo.get('critic', 'none'), algo.advantage in CRITIC_ADVANTAGES
  if ppo and critic == 'none':
    raise ConfigError('algo.critic', f'algo.advantage={algo.advantage!r} (PPO) needs a value '
                      "model: set 'shared' (a value head on the policy backbone) or 'separate' "
                      '(a second model)', critic)
  keys = () if ppo else [f'algo.{k}' for k in PPO_KEYS if k != 'critic' or critic != 'none']
  for key in config_unused.changed_from_recipe(config, keys)[:1]:   # the first, in PPO_KEYS order
    why, fix = ((f'a critic is only used by algo.advantage in {CRITIC_ADVANTAGES} (PPO)', "set "
                 "'none'") if key == 'algo.critic' else
                ("a PPO setting: it needs algo.advantage='gae' and a critic", 'remove it'))
    raise ConfigError(key, f"{why}, not {algo.advantage!r}; {fix} (the recipe's own value is "
                      'allowed, unused)', lookup(config, key))
  if algo.get('kl_in_reward', False) and not algo.kl_coef:
    raise ConfigError('algo.kl_in_reward', 'puts algo.kl_coef * KL in the reward, and '
                      'algo.kl_coef is 0, so there is no KL term at all: set algo.kl_coef > 0 '
                      'or algo.kl_in_reward=False', True)
  if algo.get('kl_ctrl', 'fixed') == 'adaptive' and not algo.kl_coef:
    raise ConfigError('algo.kl_ctrl', 'the adaptive controller adapts algo.kl_coef, which is 0: '
                      'set algo.kl_coef > 0 (the initial coefficient)', 'adaptive')


def check_rollout(config: ml_collections.ConfigDict) -> None:
  _check_algo(config)
  rollout, algo = config.rollout, config.algo
  batch = rollout.prompts_per_step * rollout.group_size
  if batch % algo.microbatches:
    raise ConfigError(
        'algo.microbatches',
        f'must divide the rollout batch rollout.prompts_per_step * rollout.group_size = '
        f'{rollout.prompts_per_step} * {rollout.group_size} = {batch}', algo.microbatches)
  minibatches = ppo_minibatches(algo)
  if batch % (minibatches * algo.microbatches):
    raise ConfigError(
        'algo.minibatches', f'algo.minibatches * algo.microbatches = {minibatches} * '
        f'{algo.microbatches} must divide the rollout batch rollout.prompts_per_step * '
        f'rollout.group_size = {batch}', minibatches)
  _check_fits(config, 'rollout.max_new_tokens')
  _check_dapo_extras(config)


def _check_dapo_extras(config: ml_collections.ConfigDict) -> None:
  """Dynamic sampling, overlong cache and scoring chunks against the rollout shape."""
  rollout, algo = config.rollout, config.algo
  if algo.get('dynamic_sampling', False) and rollout.group_size < 2:
    raise ConfigError('algo.dynamic_sampling', 'needs rollout.group_size >= 2 (it drops groups '
                      f'without reward spread; a group of {rollout.group_size} never has any)',
                      True)
  if (algo.get('dynamic_sampling', False) and not rollout.temperature
      and not moves_temperature(config)):
    raise ConfigError('algo.dynamic_sampling', 'drops every group: greedy sampling '
                      '(rollout.temperature=0) gives a group no reward spread', True)
  cache = algo.get('overlong_cache', 0)
  if cache > rollout.max_new_tokens:
    raise ConfigError('algo.overlong_cache', f'must be <= rollout.max_new_tokens='
                      f'{rollout.max_new_tokens} (the punishment starts at max_new_tokens - '
                      'overlong_cache)', cache)
  model = config.model
  if algo.get('shared_prompt', False) and (model.get('remat', 'none') != 'none'
                                           or model.get('scan_layers', False)):
    raise ConfigError('algo.shared_prompt', 'cannot be combined with model.remat or '
                      'model.scan_layers (the shared-prompt pass runs the layers unrolled, '
                      'without remat); leave it unset to score prompts per row', True)
  chunks, batch = algo.get('score_chunks', 0), rollout.prompts_per_step * rollout.group_size
  if chunks and batch % chunks:
    raise ConfigError('algo.score_chunks', f'must divide the rollout batch rollout.'
                      f'prompts_per_step * rollout.group_size = {batch}', chunks)


def check_sft(config: ml_collections.ConfigDict) -> None:
  _check_fits(config, 'sft.answer_len')


DPO_RULES: list[Rule] = [
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


def dpo_rules(config: ml_collections.ConfigDict) -> list[Rule]:
  """DPO ranges; online DPO also samples, so the RL rollout and rewards ranges apply."""
  if not is_online_dpo(config):
    return DPO_RULES
  return DPO_RULES + [r for r in RL_RULES if r[0].split('.')[0] in ('rollout', 'rewards')]


def check_dpo(config: ml_collections.ConfigDict) -> None:
  """Sections and keys that fit the DPO mode; an offline recipe needs a known pair source."""
  dpo = config.dpo
  for name in ('algo',) + (() if is_online_dpo(config) else ('rollout', 'rewards')):
    if name in config:
      raise ConfigError(name, f'not used by a DPO recipe with dpo.mode={dpo.mode!r} '
                        '(its loss settings are in config.dpo); remove this section')
  if dpo.label_smoothing and dpo.loss_type != 'sigmoid':
    raise ConfigError('dpo.label_smoothing', "label smoothing (cDPO) applies to "
                      f"dpo.loss_type='sigmoid' only, not {dpo.loss_type!r}; set it to 0",
                      dpo.label_smoothing)
  if is_online_dpo(config):
    for key in DPO_OFFLINE_KEYS:
      if key in dpo:
        raise ConfigError(f'dpo.{key}', 'offline DPO only: online DPO makes one pair per prompt '
                          'of rollout.prompts_per_step from sampled completions', dpo[key])
    if config.rollout.group_size < 2:
      raise ConfigError('rollout.group_size', 'online DPO needs at least 2 completions per '
                        'prompt to form a pair', config.rollout.group_size)
    if not config.rollout.temperature:
      raise ConfigError('rollout.temperature', 'greedy sampling makes the G completions of a '
                        'prompt identical, so no prompt yields a pair (every one is skipped) and '
                        'nothing is learned; sample at a temperature > 0 (e.g. 1.0)', 0.0)
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
ARITH_NUM_TEST = 500   # = rft_jax/data/arith.py NUM_TEST (that module imports tfds)


def eval_size_error(config: ml_collections.ConfigDict, available: int) -> ConfigError | None:
  """The eval set is the first eval.num_prompts records of the task's test split of
  `available` records: the error when it asks for more (check_task raises it for arith;
  rft_jax/components.py for GSM8K's file at --validate_only and for any task at run time)."""
  if config.eval.num_prompts <= available:
    return None
  return ConfigError('eval.num_prompts', f'must be <= {available}, the number of records in the '
                     f'{config.task.name} test split (the eval set is its first '
                     'eval.num_prompts)', config.eval.num_prompts)


def check_task(config: ml_collections.ConfigDict) -> None:
  task = config.task
  if task.name not in TASKS:
    raise ConfigError('task.name', 'unknown task' + did_you_mean(task.name, TASKS) + '; known: '
                      + ', '.join(TASKS), task.name)
  if task.name == 'arith' and eval_size_error(config, ARITH_NUM_TEST):
    raise eval_size_error(config, ARITH_NUM_TEST)
  if task.name == 'gsm8k':
    manual_dir = task.get('manual_dir', '')
    if not manual_dir:
      raise ConfigError('task.manual_dir', 'required for task gsm8k: the directory holding the '
                        'official train.jsonl and test.jsonl', manual_dir)
    path = os.path.expanduser(manual_dir)
    if not os.path.isdir(path):
      what = 'a file, not a directory' if os.path.exists(path) else 'no such directory'
      raise ConfigError('task.manual_dir', f'{what}{relative_to_cwd(path)}; it must be the '
                        'directory holding train.jsonl and test.jsonl', manual_dir)
