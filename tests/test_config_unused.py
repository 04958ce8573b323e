"""A key set where it has no effect (read only under another setting) is one warning line at the
start of the run (config.start_warnings, via rft_jax/config_unused.py); recipe defaults left
alone are never reported."""
import glob
import importlib.util
import os
import re

import numpy as np
import pytest

from rft_jax import api
from rft_jax import config as config_lib
from rft_jax import config_unused

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _unused(config):
  return [w for w in config_lib.start_warnings(config) if 'is not used' in w]


@pytest.mark.parametrize('recipe, overrides, key, setting', [
    ('grpo_arith', {'algo.max_len': 8}, 'algo.max_len', "loss_agg='seq_mean_token_sum_norm'"),
    ('ppo_arith', {'algo.max_len': 8}, 'algo.max_len', "loss_agg='seq_mean_token_sum_norm'"),
    ('grpo_arith', {'algo.kl_target': 0.05}, 'algo.kl_target', "algo.kl_ctrl='adaptive'"),
    ('rloo_arith', {'algo.kl_horizon': 500.0}, 'algo.kl_horizon', "algo.kl_ctrl='adaptive'"),
    ('gspo_arith', {'algo.max_sampling_rounds': 2}, 'algo.max_sampling_rounds',
     'algo.dynamic_sampling=True'),
    ('cispo_arith', {'algo.dynamic_sampling_metric': 'reward'}, 'algo.dynamic_sampling_metric',
     'algo.dynamic_sampling=True'),
    ('dapo_arith', {'algo.dynamic_sampling': False, 'algo.max_sampling_rounds': 2},
     'algo.max_sampling_rounds', 'algo.dynamic_sampling=True'),
    ('dapo_arith', {'algo.overlong': 'mask', 'algo.overlong_cache': 3}, 'algo.overlong_cache',
     "algo.overlong='soft'"),
    ('dr_grpo_arith', {'algo.overlong_cache': 2}, 'algo.overlong_cache', "algo.overlong='soft'"),
    # the top-k / top-p filter: greedy sampling takes the argmax of the full logits
    ('reinforce_pp_arith', {'rollout.temperature': 0.0, 'rollout.top_k': 20}, 'rollout.top_k',
     'rollout.temperature > 0'),
    ('ppo_arith', {'rollout.temperature': 0.0, 'rollout.top_p': 0.9}, 'rollout.top_p',
     'rollout.temperature > 0'),
    # the reward workers' memory limit: inline scoring (num_workers=0) sets none
    ('grpo_arith', {'rewards.num_workers': 0, 'rewards.memory_mb': 2048}, 'rewards.memory_mb',
     'rewards.num_workers > 0'),
    # remediation's knobs: read by monitor.mode='auto' only (the recipes' mode is 'warn')
    ('grpo_arith', {'monitor.watch_steps': 5}, 'monitor.watch_steps', "monitor.mode='auto'"),
    ('grpo_arith', {'monitor.mode': 'halt', 'monitor.lr_factor': 0.5}, 'monitor.lr_factor',
     "monitor.mode='auto'"),
    ('ppo_arith', {'monitor.mode': 'off', 'monitor.max_skipped_steps': 3},
     'monitor.max_skipped_steps', "monitor.mode 'warn', 'halt' or 'auto'"),
    # the live scaling fit's settings: read with scaling.live_every > 0 only (the recipes' 0)
    ('grpo_arith', {'scaling.model': 'power_law'}, 'scaling.model', 'scaling.live_every > 0'),
    ('rloo_arith', {'scaling.exclude_first': 0.2}, 'scaling.exclude_first',
     'scaling.live_every > 0'),
    ('grpo_arith', {'scaling.n_boot': 50}, 'scaling.n_boot', 'scaling.live_every > 0'),
    ('dapo_arith', {'scaling.anomaly_sd': 2.0}, 'scaling.anomaly_sd', 'scaling.live_every > 0'),
    ('grpo_arith', {'scaling.anomaly_min_drop': 0.1}, 'scaling.anomaly_min_drop',
     'scaling.live_every > 0'),
])
def test_a_key_set_where_it_is_not_read_is_one_warning_naming_the_setting(
    recipe, overrides, key, setting):
  config = api.load_config(recipe + ':tiny', overrides)
  [line] = _unused(config)
  value = overrides[key]
  assert line.startswith(f'warning: config.{key}={value!r} is not used: '), line
  assert setting in line and '\n' not in line


@pytest.mark.parametrize('recipe, overrides', [
    ('dr_grpo_arith', {'algo.max_len': 8}),                        # Dr.GRPO reads it
    ('grpo_arith', {'algo.kl_ctrl': 'adaptive', 'algo.kl_target': 0.05}),
    ('dapo_arith', {'algo.max_sampling_rounds': 2}),
    ('dapo_arith', {'algo.overlong': 'mask'}),            # the recipe's overlong_cache, untouched
    ('dapo_arith', {'algo.dynamic_sampling': False}),     # the recipe's max_sampling_rounds
    ('grpo_arith', {'algo.kl_target': 0.1}),              # the default: no change
    ('grpo_arith', {'rollout.top_k': 20, 'rollout.top_p': 0.9}),   # sampled at temperature 1
    ('reinforce_pp_arith', {'rollout.temperature': 0.0}),  # the recipe's top_k 0, top_p 1
    ('grpo_arith', {'rewards.memory_mb': 2048}),            # two workers read it
    ('grpo_arith', {'rewards.num_workers': 0}),             # the recipe's memory_mb, untouched
    ('grpo_arith', {'monitor.mode': 'auto', 'monitor.watch_steps': 5, 'monitor.lr_factor': 0.5}),
    ('grpo_arith', {'monitor.max_skipped_steps': 3}),     # read in mode 'warn'
    ('grpo_arith', {'monitor.mode': 'off'}),              # the recipe's knobs, untouched
    # the detector knobs are read offline (tools.monitor_replay takes a run's) in any mode
    ('grpo_arith', {'monitor.mode': 'off', 'monitor.cusum_h': 4.0, 'monitor.warmup': 3}),
    ('grpo_arith', {'scaling.live_every': 1, 'scaling.n_boot': 50, 'scaling.model': 'power_law'}),
])
def test_a_key_that_is_read_or_left_at_the_recipe_default_is_not_reported(recipe, overrides):
  assert _unused(api.load_config(recipe + ':tiny', overrides)) == []


def test_without_a_recipe_file_the_code_defaults_are_the_baseline():
  config = api.load_config('dapo_arith:tiny', {'algo.overlong': 'mask'})
  del config['recipe_file']   # a config built in code: dapo's overlong_cache=2 is then a change
  [line] = _unused(config)
  assert line.startswith('warning: config.algo.overlong_cache=2 is not used')


def test_greedy_sampling_with_a_filter_is_one_warning_and_no_off_policy_notice():
  config = api.load_config('reinforce_pp_arith:tiny',
                           {'rollout.temperature': 0.0, 'rollout.top_k': 20})
  assert config_lib.sampling_notices(config) == []   # greedy: no truncated distribution
  config.faults = [{'type': 'sampler_temperature', 'onset_step': 2, 'strength': 1.0}]
  assert _unused(config) == []   # the fault samples at temperature 1: the filter applies
  [notice] = config_lib.sampling_notices(config)
  assert notice.startswith('rollout.top_k=20: ')


def test_max_len_is_not_reported_under_an_aggregation_that_reads_it(monkeypatch):
  """A registered aggregation may divide by norm_len (algo.max_len), as Dr.GRPO's does: setting
  max_len then has an effect, and a warning saying it has none would mislead."""
  from rft_jax.algorithms import losses, registry  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(registry.LOSS_AGGREGATIONS, 'my_norm', losses.seq_mean_token_sum_norm)
  config = api.load_config('grpo_arith:tiny', {'algo.loss_agg': 'my_norm', 'algo.max_len': 8})
  assert _unused(config) == []


def test_the_builtin_aggregations_said_to_ignore_max_len_are_those_that_do():
  from rft_jax.algorithms import losses, registry  # pylint: disable=g-import-not-at-top
  del losses   # imported: the built-ins are registered
  x_bl, mask_bl = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
  for name, agg in registry.LOSS_AGGREGATIONS.items():
    reads = agg(x_bl, mask_bl, norm_len=4)[0] != agg(x_bl, mask_bl, norm_len=7)[0]
    assert (name in config_unused.IGNORE_MAX_LEN) == (not reads), name


def test_the_defaults_are_the_codes():
  """Each Conditional.default is the default of the code that reads the key."""
  import inspect  # pylint: disable=g-import-not-at-top
  from rft_jax.algorithms import grpo  # pylint: disable=g-import-not-at-top
  from rft_jax.monitor import remediation  # pylint: disable=g-import-not-at-top
  from rft_jax.rewards import runner  # pylint: disable=g-import-not-at-top
  from rft_jax.sampling import sampler  # pylint: disable=g-import-not-at-top
  from rft_jax.scaling import live  # pylint: disable=g-import-not-at-top
  remediator = inspect.signature(remediation.Remediator).parameters
  with open(os.path.join(REPO, 'rft_jax', 'trainer.py'), encoding='utf-8') as f:   # (JAX)
    [skipped] = re.findall(r"monitor\.get\('max_skipped_steps', (\d+)\)", f.read())
  code = {'monitor.max_skipped_steps': int(skipped)}
  for rule in config_unused.CONDITIONAL:
    section, name = rule.key.split('.')
    if section == 'rewards':
      code[rule.key] = inspect.signature(runner.RewardRunner).parameters[name].default
    elif section == 'rollout':
      code[rule.key] = getattr(sampler.SamplingConfig, name)
    elif section == 'algo':
      code[rule.key] = getattr(grpo.GRPOConfig(), name)
    elif section == 'scaling':
      code[rule.key] = getattr(live.LiveConfig(), name)
    elif name in remediator:
      code[rule.key] = remediator[name].default
    assert code[rule.key] == rule.default, rule.key


def _shipped_recipes():
  for path in sorted(glob.glob(os.path.join(REPO, 'configs', '*.py'))):
    spec = importlib.util.spec_from_file_location('_recipe', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for variant in getattr(module, 'VARIANTS', ()):
      yield path + (f':{variant}' if variant else '')


def test_a_plain_recipe_with_no_overrides_warns_of_no_unused_key():
  """(The :tiny variants' 4-step runs do warn that monitor.warmup >= train.steps.)"""
  specs = list(_shipped_recipes())
  assert len(specs) >= 13   # every recipe in configs/, each variant
  for spec in specs:
    config = api.load_recipe(spec)   # as loaded, before validation (gsm8k's needs its data)
    assert _unused(config) == [], spec
    if ':' not in spec:   # the full recipes: nothing at all
      assert config_lib.start_warnings(config) == [], spec
