"""What a recipe config may contain: every key with its type, the optional keys and sections, and
the closed sets of names some keys take; plus ConfigError, the one-line error every check raises,
and the small lookup helpers the checks share. rft_jax/config.py runs the checks.
"""
import difflib
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from rft_jax.monitor import knobs as monitor_knobs   # no JAX: the monitor's detector knobs


class _NameToFloat:
  """Schema marker for a free mapping of names to float weights (`rewards.weights`)."""


NAME_TO_FLOAT = _NameToFloat()

# Every key a recipe may set, with its Python type. A nested dict is a section (a ConfigDict).
# ints are accepted where a float is expected; a bool is never accepted as an int or float.
SCHEMA: dict[str, Any] = {
    'name': str,
    'variant': str,   # the recipe's get_config(arg) argument, e.g. 'tiny' ('' = the full recipe)
    'recipe_file': str,   # the recipe's file (recipes.record_recipe; unset for a built config)
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
        'remat': str,  # optional: 'none' (default) | 'full' | 'dots' | 'dots_no_batch'
        'scan_layers': bool,   # optional, default False: one lax.scan over the layers
    },
    'rollout': {
        'prompts_per_step': int, 'group_size': int, 'max_new_tokens': int,
        'temperature': float, 'top_k': int, 'top_p': float,
        'weights_layout': str,   # optional, default 'train': see parallel/mesh.sampling_shardings
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
        'dynamic_sampling': bool, 'max_sampling_rounds': int, 'dynamic_sampling_metric': str,
        'overlong': str,
        'overlong_cache': int, 'tis_cap': float, 'score_chunks': int,
        'shared_prompt': bool,   # models/functional.forward_completions
        # KL coefficient control (optional; rft_jax/algorithms/kl_control.py):
        'kl_ctrl': str, 'kl_target': float, 'kl_horizon': float,
        # PPO with a critic (optional; advantage 'gae'; rft_jax/algorithms/ppo.py PPOConfig):
        'critic': str, 'gamma': float, 'lam': float, 'vf_coef': float, 'vf_clip': float,
        'critic_lr': float, 'minibatches': int, 'adv_whiten': bool,
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
    'eval': {'num_prompts': int, 'k': int, 'temperature': float,
             'verifier': str},   # optional: the 0/1 verifier of held-out accuracy
    'mesh': {'data': int, 'fsdp': int, 'tensor': int},
    'telemetry': {'console': bool, 'jsonl': bool, 'tensorboard': bool, 'plot': bool,
                  'wandb_project': str},
    # warmup and the other detector knobs (optional; rft_jax/monitor/knobs.py KNOBS, defaults
    # and meaning in rft_jax/monitor/detectors.py MonitorConfig)
    'monitor': {'mode': str, 'watch_steps': int, 'lr_factor': float, 'max_skipped_steps': int,
                **{name: kind for name, (kind, _, _) in monitor_knobs.KNOBS.items()}},
    'faults': list,   # [{type, onset_step, strength[, duration]}], see rft_jax/faults.py
    # Live scaling fit after held-out evals (rft_jax/scaling/live.py); every key optional.
    'scaling': {'live_every': int, 'model': str, 'exclude_first': float, 'n_boot': int,
                'anomaly_sd': float, 'anomaly_min_drop': float},
}

RL_SECTIONS = ('rollout', 'rewards', 'algo')
OPTIONAL_SECTIONS = ('monitor', 'faults', 'scaling')
# Keys a recipe may leave out; code reading them uses config.<section>.get(key, default).
OPTIONAL_KEYS = frozenset({
    'variant',                      # unknown when left out (a recipe of one's own may not say)
    'recipe_file',                  # set when the config is loaded from a file
    'model.path',                   # default '' (the model config.model describes)
    'model.remat',                  # default 'none': see rft_jax/models/llama.py ModelConfig
    'model.scan_layers',            # default False: see rft_jax/models/llama.py ModelConfig
    'rollout.weights_layout',       # default 'train': see rft_jax/parallel/mesh.py
    'dpo.pairs', 'dpo.batch_size', 'dpo.answer_len', 'dpo.max_pairs',   # offline DPO only
    'dpo.rpo_alpha',                # default 0: no NLL term (rft_jax/algorithms/dpo.py)
    # task options, defaults in rft_jax/data/pipeline.py PromptFormat / rft_jax/components.py:
    'task.manual_dir', 'task.chat_template', 'task.system_prompt', 'task.instruction',
    'task.bad_records',             # 'error' (default) or 'skip': see rft_jax/data/pipeline.py
    'train.min_good_checkpoints',   # default 1: see rft_jax/runs.py save_checkpoint
    'monitor.max_skipped_steps',    # default 5: see rft_jax/runs.py check_skipped_streak
    # the detector knobs but warmup (cusum_h, z_thresh, ...): MonitorConfig's defaults
    *(f'monitor.{name}' for name in monitor_knobs.OPTIONAL),
    'rewards.memory_mb',            # default 0 (no limit): see rft_jax/rewards/runner.py
    'eval.verifier',                # default '': the task's (components.TASK_VERIFIERS)
    # algo options (GRPOConfig defaults: clip_eps_low/high = clip_eps, clip_c 0 = no dual-clip,
    # entropy_coef 0, kl_in_reward False, max_len 0 = rollout.max_new_tokens)
    'algo.clip_eps_low', 'algo.clip_eps_high', 'algo.clip_c', 'algo.entropy_coef',
    'algo.kl_in_reward', 'algo.max_len',
    # dynamic_sampling False, max_sampling_rounds 4, dynamic_sampling_metric 'accuracy',
    # overlong 'none', overlong_cache 0 = max(1, max_new_tokens // 5), tis_cap 0 = off,
    # score_chunks 0 = algo.microbatches
    'algo.dynamic_sampling', 'algo.max_sampling_rounds', 'algo.dynamic_sampling_metric',
    'algo.overlong', 'algo.overlong_cache',
    'algo.tis_cap', 'algo.score_chunks',
    # shared_prompt True: each group's prompt scored once (off by itself with model.remat/scan)
    'algo.shared_prompt',
    # kl_ctrl 'fixed', kl_target 0.1, kl_horizon 10000; PPO: critic 'none' (PPOConfig: 'shared'),
    # gamma 1, lam 0.95, vf_coef 0.5, vf_clip 0.2, critic_lr 0 = optim.lr, minibatches 1,
    # adv_whiten True
    'algo.kl_ctrl', 'algo.kl_target', 'algo.kl_horizon', 'algo.critic', 'algo.gamma',
    'algo.lam', 'algo.vf_coef', 'algo.vf_clip', 'algo.critic_lr', 'algo.minibatches',
    'algo.adv_whiten',
    # live_every 0 (off), model 'sigmoid', exclude_first 0.1, n_boot 200, anomaly_sd 3.0,
    # anomaly_min_drop 0.05: rft_jax/scaling/live.py LiveConfig
    'scaling.live_every', 'scaling.model', 'scaling.exclude_first', 'scaling.n_boot',
    'scaling.anomaly_sd', 'scaling.anomaly_min_drop',
})
MONITOR_MODES = ('off', 'warn', 'halt', 'auto')
SFT_SECTIONS = ('sft',)
DPO_SECTIONS = ('dpo',)
DPO_MODES = ('offline', 'online')
DPO_LOSS_TYPES = ('sigmoid', 'ipo', 'hinge')   # = rft_jax.algorithms.dpo.DPO_LOSS_TYPES
# Offline pair datasets -> the task whose prompts they hold (rft_jax/dpo_trainer.py PAIR_SOURCES).
DPO_PAIR_SOURCES = {'arith_slips': 'arith'}
DPO_OFFLINE_KEYS = ('pairs', 'batch_size', 'answer_len', 'max_pairs')
DTYPES = ('float32', 'bfloat16')
KL_ESTIMATORS = ('k1', 'k2', 'k3')   # as in rft_jax.algorithms.losses.kl_penalty
# Advantage estimators that work with fewer than 2 completions per prompt (no group baseline);
# must match the registry's min_group_size (checked by tests/test_advantages.py). Kept here
# so that this check runs without importing JAX.
GROUP_FREE_ADVANTAGES = ('reinforce_pp',)
DUAL_CLIP_LOSSES = ('ppo_clip', 'gspo')   # losses that implement algo.clip_c
DYNAMIC_SAMPLING_METRICS = ('accuracy', 'reward')   # rft_jax/rollouts.py
OVERLONG_MODES = ('none', 'mask', 'soft')   # as rft_jax/algorithms/corrections.OVERLONG_MODES
KL_CTRLS = ('fixed', 'adaptive')   # as rft_jax/algorithms/kl_control.KL_CTRLS
# Advantage estimators that need a critic (not registry entries: they read values, not just
# rewards): rft_jax/algorithms/ppo.py CRITIC_ADVANTAGES; and the critic layouts (critic.py).
CRITIC_ADVANTAGES = ('gae',)
CRITIC_MODES = ('none', 'shared', 'separate')
# The keys only PPO reads (ppo.PPOConfig's own fields): with any other advantage a recipe's
# values are unused (config_rules._check_critic refuses changed ones).
PPO_KEYS = ('critic', 'gamma', 'lam', 'vf_coef', 'vf_clip', 'critic_lr', 'minibatches',
            'adv_whiten')


def ppo_minibatches(algo) -> int:
  """Optimiser updates per epoch: algo.minibatches for a critic advantage (PPO), else 1 (the
  GRPO family makes one, whatever a PPO recipe switched to another advantage still holds)."""
  if algo.get('advantage') not in CRITIC_ADVANTAGES:
    return 1
  return int(algo.get('minibatches', 1))


def critic_layout(algo) -> str:
  """The critic layout ppo.algo_config reads: algo.critic (PPOConfig's default 'shared') for a
  critic advantage (PPO), else 'none' (a PPO recipe switched to another advantage)."""
  if algo.get('advantage') not in CRITIC_ADVANTAGES:
    return 'none'
  return algo.get('critic', 'shared')


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
      message = f'config.{key}={short_repr(value)}: {reason}'
    super().__init__(message)


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


def optional_value(key: str, value: Any) -> Any:
  """`value` for the optional key `key` (OPTIONAL_KEYS), an int made a float where the schema
  wants one (as a recipe's float field takes an int); config.validate checks its type."""
  wants_float = lookup(SCHEMA, key) is float
  return float(value) if wants_float and type(value) is int else value   # not bool


def plain_value(value: Any) -> Any:
  """An override's value with NumPy (or JAX) scalars as the Python numbers they hold, in a
  dict's values too: np.int64(3) -> 3, which an int key takes; anything else as it is."""
  if isinstance(value, Mapping):
    return {k: plain_value(v) for k, v in value.items()}
  return value.item() if getattr(value, 'shape', None) == () else value


def key_hint(parts, present) -> str:
  """did_you_mean for the unknown key whose path is `parts` (['monitor', 'cusum_hh']), among
  the keys `present` in its section and the section's OPTIONAL_KEYS (a recipe may omit them)."""
  section, name = '.'.join(parts[:-1]), parts[-1]
  optional = [key.rpartition('.')[2] for key in OPTIONAL_KEYS if key.rpartition('.')[0] == section]
  return did_you_mean(name, sorted(set(present) | set(optional)))


def relative_to_cwd(path: str) -> str:
  """' (relative to <cwd>)' for a relative path, '' for an absolute one: for file errors."""
  return '' if os.path.isabs(path) else f' (relative to {os.getcwd()})'


def did_you_mean(name: str, candidates) -> str:
  """" (did you mean 'x'?)" for the closest of `candidates` to `name`, or ''."""
  close = difflib.get_close_matches(name, list(candidates), n=1)
  return f' (did you mean {close[0]!r}?)' if close else ''


def type_name(value: Any) -> str:
  return type(value).__name__


def short_repr(value: Any, limit: int = 80) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit - 3] + '...'
