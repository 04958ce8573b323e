"""Schema checks for a loaded recipe config, with one-line errors that name the key.

A recipe (`configs/*.py`) returns an `ml_collections.ConfigDict`. `validate(config)` checks it
before anything heavy is imported or built, and raises `ConfigError` on the first problem found:

  config.rollout.group_size=1: GRPO needs at least 2 completions per prompt
  config.rollout.tempreature: unknown key (did you mean 'temperature'?)

The checks run in this order: unknown, missing and wrongly typed keys (against `SCHEMA` in
rft_jax/config_schema.py); value ranges and constraints between keys (rft_jax/config_rules.py);
files on disk; and last the registered names (verifiers, advantage estimators, losses), which
import their implementation modules.

A recipe with a `sft` section is a supervised fine-tuning recipe; one with a `dpo` section a
direct-preference recipe (offline: `dpo.pairs` names a pair dataset; online: pairs built from
`rollout` samples scored by `rewards`); any other is an RL (GRPO family) recipe and must have
`rollout`, `rewards` and `algo` sections. Checks that depend on the devices (e.g. the batch
dividing the data-parallel axes) happen where the mesh is built.
"""
import inspect
import os
from typing import Any

import ml_collections

from rft_jax import config_rules as rules
from rft_jax import config_unused
from rft_jax.config_rules import is_online_dpo
from rft_jax.config_schema import (  # noqa: F401  (re-exported: callers use config.X)
    CRITIC_ADVANTAGES, DPO_LOSS_TYPES, DPO_PAIR_SOURCES, GROUP_FREE_ADVANTAGES, MONITOR_MODES,
    NAME_TO_FLOAT, OPTIONAL_KEYS, OPTIONAL_SECTIONS, RL_SECTIONS, SCHEMA, SFT_SECTIONS,
    DPO_SECTIONS, ConfigError, did_you_mean, has_key, key_hint, lookup, optional_value,
    plain_value, ppo_minibatches, type_name)
from rft_jax.monitor import knobs as monitor_knobs


def is_sft(config: ml_collections.ConfigDict) -> bool:
  """True for a supervised fine-tuning recipe (one with a `sft` section), else RL."""
  return 'sft' in config


def is_dpo(config: ml_collections.ConfigDict) -> bool:
  """True for a direct-preference recipe (one with a `dpo` section)."""
  return 'dpo' in config


def is_grpo_family(config: ml_collections.ConfigDict) -> bool:
  """An RL recipe trained without a critic (GRPO, DAPO, RLOO, REINFORCE++, ...): not SFT, DPO
  (no algo section) or PPO (a critic advantage)."""
  return 'algo' in config and config.algo.get('advantage') not in CRITIC_ADVANTAGES


# Config keys that name files or directories: a leading `~` is expanded (expand_user_paths).
PATH_KEYS = ('tokenizer.path', 'init_from', 'model.path', 'task.data_dir', 'task.manual_dir')


def expand_user_paths(config: ml_collections.ConfigDict) -> None:
  """Expands a leading `~` in config's PATH_KEYS in place, as a shell would: the shell leaves
  `--config.model.path=~/m` alone, and a recipe or notebook string is never expanded."""
  for key in PATH_KEYS:
    section, _, name = key.rpartition('.')
    holder = config.get(section) if section else config
    value = holder.get(name) if isinstance(holder, ml_collections.ConfigDict) else None
    if isinstance(value, str) and value.startswith('~'):
      holder[name] = os.path.expanduser(value)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first bad key of `config`; returns None if it is usable.
  Its one change to `config`: a leading `~` in a path is expanded (expand_user_paths)."""
  expand_user_paths(config)
  if is_sft(config) or is_dpo(config):   # run only by the RL loop: here they would do nothing
    for name in OPTIONAL_SECTIONS:
      if name in config:
        raise ConfigError(name, 'run only by the RL loop; SFT and DPO recipes do not use it')
  _check_section(config, SCHEMA, '',
                 optional=RL_SECTIONS + SFT_SECTIONS + DPO_SECTIONS + OPTIONAL_SECTIONS)
  required = SFT_SECTIONS if is_sft(config) else RL_SECTIONS
  kind = 'SFT' if is_sft(config) else 'GRPO/RL (no `sft` section)'
  if is_dpo(config):
    if is_sft(config):
      raise ConfigError('dpo', 'a recipe has a `sft` or a `dpo` section, not both')
    online = is_online_dpo(config)
    required = DPO_SECTIONS + (('rollout', 'rewards') if online else ())
    kind = 'online DPO' if online else 'offline DPO'
  for name in required:
    if name not in config:
      raise ConfigError(name, f'missing section; {kind} recipes need it')
  rules.check_finite(config)

  ranges = rules.COMMON_RULES + (rules.SFT_RULES if is_sft(config) else
                                 rules.dpo_rules(config) if is_dpo(config) else rules.RL_RULES)
  for key, ok, requirement in ranges:
    if key in OPTIONAL_KEYS and not has_key(config, key):
      continue
    value = lookup(config, key)
    if not ok(value):
      raise ConfigError(key, requirement, value)
  rules.check_model(config)
  rules.check_mesh(config)
  rules.check_train(config)
  if is_sft(config):
    rules.check_sft(config)
  elif is_dpo(config):
    rules.check_dpo(config)
  else:
    rules.check_rollout(config)
  _check_paths(config)
  _check_monitor_and_faults(config)
  _check_wandb(config)
  _check_eval_verifier(config)
  if is_online_dpo(config):
    _check_verifier_names(config)
  elif not is_sft(config) and not is_dpo(config):
    _check_verifier_names(config)
    _check_algo_names(config)


def start_warnings(config: ml_collections.ConfigDict) -> list[str]:
  """Settings that are legal (a short smoke run must still work) but likely not meant: one line
  each, printed when the run starts (rft_jax/runs.py open_run). Among them the keys set
  where they are not read (rft_jax/config_unused.py: algo, monitor, scaling), as algo.clip_eps
  beside both bounds."""
  m, steps, out = config.get('monitor'), config.train.steps, []
  if m is not None and m.mode != 'off' and m.get('warmup', 10) >= steps:
    out.append(f'warning: config.monitor.warmup={m.get("warmup", 10)} >= config.train.steps='
               f'{steps}: the failure monitor learns its baselines over the whole run and '
               'scores no signal (only its invariant checks run); lower monitor.warmup or raise '
               'train.steps')
  algo = config.get('algo')
  if algo is not None and 'clip_eps_low' in algo and 'clip_eps_high' in algo:
    out.append(f'warning: config.algo.clip_eps={algo.clip_eps} is not used: algo.clip_eps_low '
               'and algo.clip_eps_high are both set, and they are the clip bounds')
  if (algo is not None and algo.get('kl_estimator') == 'k1' and algo.get('kl_coef', 0) > 0
      and not algo.get('kl_in_reward', False)):
    out.append("warning: config.algo.kl_estimator='k1' with the KL in the loss: its gradient, "
               'kl_coef * grad log pi of the sampled tokens, is 0 in expectation, so the '
               "penalty only adds noise; use 'k2' (the gradient of KL(pi || ref)), 'k3' "
               "(GRPO's: that of KL(ref || pi)), or algo.kl_in_reward=True")
  out += config_unused.unused_warnings(config)   # e.g. monitor.watch_steps without auto
  return out


def sampling_notices(config: ml_collections.ConfigDict) -> list[str]:
  """Start-up notices (not errors) about the rollout settings of a GRPO-family or PPO recipe.

  With rollout.top_k > 0 or rollout.top_p < 1 the sampler draws from the truncated,
  renormalised distribution, while the update scores the tokens under the full softmax (at the
  sampling temperature, as verl does): the policy gradient is then off-policy by the mass the
  filter removes. The gap is reported as mismatch/k3; algo.tis_cap > 0 reweights the sampled
  tokens by pi_full / pi_truncated (capped), but tokens the filter removed are never sampled.
  """
  rollout = config.rollout
  if not rollout.temperature and not rules.moves_temperature(config):
    return []   # greedy: the argmax of the full logits, no filter (config_unused warns of them)
  where = [f'rollout.top_k={rollout.top_k}'] if rollout.top_k > 0 else []
  where += [f'rollout.top_p={rollout.top_p}'] if rollout.top_p < 1 else []
  if not where:
    return []
  return [f'{", ".join(where)}: completions are sampled from the truncated distribution but the '
          'update scores them under the full one, so the policy gradient is off-policy by the '
          'mass the filter removes (reported as mismatch/k3; algo.tis_cap > 0 reweights the '
          'sampled tokens but cannot restore the removed ones); for on-policy training leave '
          'top_k=0 and top_p=1.0']


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
    for key, low in (('watch_steps', 1), ('max_skipped_steps', 1)):
      if key in m and m[key] < low:
        raise ConfigError(f'monitor.{key}', f'must be >= {low}', m[key])
    bad = monitor_knobs.problem(m)   # warmup, cusum_h, ...: rft_jax/monitor/knobs.py
    if bad:
      raise ConfigError(f'monitor.{bad[0]}', bad[1], m[bad[0]])
    if not 0 < m.lr_factor < 1:
      raise ConfigError('monitor.lr_factor', 'must be in (0, 1)', m.lr_factor)
  if 'faults' in config:
    from rft_jax import faults  # pylint: disable=g-import-not-at-top  (no JAX inside)
    try:
      faults.check_faults(list(config.faults), total_steps=config.train.steps,
                          max_new_tokens=config.get('rollout', {}).get('max_new_tokens'))
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
        raise ConfigError(path, f'expected a section (ConfigDict), got {type_name(value)}',
                          value)
      _check_section(value, want, path + '.')
    elif want is NAME_TO_FLOAT:
      _check_name_to_float(value, path)
    elif not _has_type(value, want):
      raise ConfigError(path, f'expected {want.__name__}, got {type_name(value)}', value)
  for key in schema:
    if key not in section and key not in optional and prefix + key not in OPTIONAL_KEYS:
      raise ConfigError(prefix + key, 'missing key')


def _check_name_to_float(value: Any, path: str) -> None:
  if not isinstance(value, ml_collections.ConfigDict):
    raise ConfigError(path, f'expected a section of name -> float, got {type_name(value)}',
                      value)
  for name in value.keys():
    if not _has_type(value[name], float):
      raise ConfigError(f'{path}.{name}', f'expected float, got {type_name(value[name])}',
                        value[name])


def _has_type(value: Any, want: type) -> bool:
  if want is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if want is int:
    return isinstance(value, int) and not isinstance(value, bool)
  return isinstance(value, want)


def _check_paths(config: ml_collections.ConfigDict) -> None:
  """Files the run reads; relative paths are relative to the current directory."""
  path = config.tokenizer.path
  if not path and not config.model.get('path', ''):
    raise ConfigError('tokenizer.path', "required (a tokenizer file or HF model dir; '' = "
                      'config.model.path, which is not set either)', path)
  if path and not os.path.exists(path):
    raise ConfigError('tokenizer.path', f'not found{rules.relative_to_cwd(path)}', path)
  rules.check_task(config)
  _check_prompt_options(config.task)
  if config.init_from and not os.path.isdir(config.init_from):
    raise ConfigError('init_from',
                      f"no such directory{rules.relative_to_cwd(config.init_from)}; '' = "
                      "model.path's weights, or a random init without model.path",
                      config.init_from)


# Task keys only GSM8K reads (rft_jax/components.py load_task): arith's prompts are the raw
# problems, which its tokenizer and base policy were trained on.
_FILE_TASK_KEYS = ('manual_dir', 'system_prompt', 'instruction')


def _check_prompt_options(task) -> None:
  """A prompt option the task would ignore is refused (it was dropped without a word): a
  system prompt without the chat template (a plain-text prompt has no system turn), and the
  file-task keys, or the chat template, on arith."""
  if task.name == 'arith':
    for key in _FILE_TASK_KEYS:
      if task.get(key, ''):
        raise ConfigError(f'task.{key}', "has no effect on task 'arith' (its prompts are the "
                          "raw problems); it is read by task 'gsm8k'", task[key])
    if task.get('chat_template', False):
      raise ConfigError('task.chat_template', "has no effect on task 'arith' (its prompts are "
                        "the raw problems); it is read by task 'gsm8k'", True)
  elif task.get('system_prompt', '') and not task.get('chat_template', True):
    raise ConfigError('task.system_prompt', 'has no effect with task.chat_template=False (a '
                      'plain-text prompt has no system turn); put the text in task.instruction '
                      'or use the chat template', task.system_prompt)


# --- Registered names ------------------------------------------------------------------------

def _check_verifier_names(config: ml_collections.ConfigDict) -> None:
  from rft_jax.rewards.verifiers import VERIFIERS  # pylint: disable=g-import-not-at-top
  weights = config.rewards.weights
  if not weights.keys():
    raise ConfigError('rewards.weights', 'needs at least one verifier name -> weight')
  for name in weights.keys():
    _check_verifier(f'rewards.weights.{name}', name, VERIFIERS)
  if not any(weights[name] for name in weights.keys()):
    raise ConfigError('rewards.weights', f'{dict(weights)}: every weight is 0, so every reward '
                      'is 0 and nothing is learned; give at least one verifier a weight')


def _check_eval_verifier(config: ml_collections.ConfigDict) -> None:
  """eval.verifier, when set: held-out accuracy by a verifier of one's own (for answers only it
  reads, which the task's own verifier would score 0), registered and of the right signature."""
  from rft_jax.rewards.verifiers import VERIFIERS  # pylint: disable=g-import-not-at-top
  if config.eval.get('verifier', ''):
    _check_verifier('eval.verifier', config.eval.verifier, VERIFIERS, config.eval.verifier)


def _check_verifier(key: str, name: str, verifiers, *shown) -> None:
  """ConfigError naming `key` (and the value `shown`, if given) unless `name` is registered in
  `verifiers` and its function can be called as fn(completion, answer): found here in one line
  before anything is built, not as every sample's TypeError at the first step (a reward
  failure, after the model load and the base eval)."""
  if name not in verifiers:
    raise ConfigError(key, 'unknown verifier' + did_you_mean(name, verifiers) + '; known: '
                      + ', '.join(sorted(verifiers)), *shown)
  fn = verifiers[name]
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):   # a builtin or C callable without one: nothing to check
    return
  try:
    signature.bind('', '')
  except TypeError as e:
    where = f'{getattr(fn, "__module__", "?")}.{getattr(fn, "__qualname__", repr(fn))}'
    raise ConfigError(key, f'verifier {where}{signature} cannot be called as '
                      f'fn(completion, answer) ({e})') from None


_ALGO_KINDS = (('advantage', 'advantage estimator'), ('loss', 'policy loss'),
               ('loss_agg', 'loss aggregation'))


def _check_algo_names(config: ml_collections.ConfigDict) -> None:
  # Imports the implementations (and with them JAX): keep this check last.
  from rft_jax.algorithms import registry  # pylint: disable=g-import-not-at-top
  known = registry.names()
  known['advantage'] = sorted(known['advantage'] + list(CRITIC_ADVANTAGES))   # PPO's 'gae'
  for field, kind in _ALGO_KINDS:
    value = config.algo[field]
    if value not in known[field]:
      raise ConfigError(f'algo.{field}', f'unknown {kind}' + did_you_mean(value, known[field])
                        + '; known: ' + ', '.join(known[field]), value)


