"""Warnings for config keys that a user set but that have no effect under the other settings.

Some keys are read only under another setting (CONDITIONAL): algo.max_len only by Dr.GRPO's
aggregation (or a registered one; never by the built-ins in IGNORE_MAX_LEN), kl_target and
kl_horizon only by the adaptive KL controller, monitor.watch_steps and lr_factor only by
monitor.mode='auto' remediation, monitor.max_skipped_steps not with mode 'off',
rollout.top_k and top_p not in greedy sampling, rewards.memory_mb not with
rewards.num_workers=0, the scaling.* fit settings only with scaling.live_every > 0, and so on.
Such a key set where it is not read is legal (validation accepts it) but was silently ignored;
`unused_warnings(config)` gives one line for each, which config.start_warnings prints when the
run starts, as it does for an unused algo.clip_eps. Keys that a tool reads offline from a
run's config.json are not listed (the monitor's detector knobs: tools.monitor_replay).

Only keys the user changed are reported: a key counts as set when its value differs from the
recipe's own (the recipe file config.recipe_file, variant config.variant, loaded anew), so a
recipe default left alone is never reported, not even after a setting it depends on changed
(dapo_arith's overlong_cache with --config.algo.overlong=mask). A config not made from a recipe
file is compared with the code's defaults (Conditional.default: rft_jax/algorithms/grpo.py
GRPOConfig, Remediator, LiveConfig, ...: the test checks them).
No JAX import.
"""
import os
from typing import Any, Callable, NamedTuple

import ml_collections

from rft_jax import config_rules


class Conditional(NamedTuple):
  """`key` ('section.name') is read only when `matters(config)` holds, i.e. with `setting`."""
  key: str
  default: Any   # the code's default (tests/test_config_unused.py checks they agree)
  matters: Callable[[ml_collections.ConfigDict], bool]
  setting: str


def _adaptive_kl(config) -> bool:
  return config.algo.get('kl_ctrl', 'fixed') == 'adaptive'


def _dynamic_sampling(config) -> bool:
  return config.algo.get('dynamic_sampling', False)


def _monitor_auto(config) -> bool:
  return config.monitor.get('mode', 'off') == 'auto'


def _sampled(config) -> bool:
  """The sampler draws at a temperature > 0 (greedy takes the argmax of the full logits) or an
  injected fault moves its temperature."""
  return config.rollout.get('temperature', 1.0) > 0 or config_rules.moves_temperature(config)


def _live_fit(config) -> bool:
  return config.scaling.get('live_every', 0) > 0


_LIVE = 'scaling.live_every > 0 (the live scaling fit)'
# The built-in loss aggregations that ignore norm_len (algo.max_len; rft_jax/algorithms/
# losses.py). Any other, a registered one (registry.register_loss_agg) included, may read it.
IGNORE_MAX_LEN = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum')

CONDITIONAL = (
    Conditional('algo.max_len', 0, lambda config: config.algo.loss_agg not in IGNORE_MAX_LEN,
                "algo.loss_agg='seq_mean_token_sum_norm' (Dr.GRPO's aggregation) or an "
                'aggregation registered to read norm_len'),
    Conditional('algo.kl_target', 0.1, _adaptive_kl, "algo.kl_ctrl='adaptive'"),
    Conditional('algo.kl_horizon', 10000.0, _adaptive_kl, "algo.kl_ctrl='adaptive'"),
    Conditional('algo.max_sampling_rounds', 4, _dynamic_sampling, 'algo.dynamic_sampling=True'),
    Conditional('algo.dynamic_sampling_metric', 'accuracy', _dynamic_sampling,
                'algo.dynamic_sampling=True'),
    Conditional('algo.overlong_cache', 0,
                lambda config: config.algo.get('overlong', 'none') == 'soft',
                "algo.overlong='soft' (the soft overlong punishment)"),
    # sampling/sampler.py choose: the top-k / top-p filter applies to sampled tokens only
    Conditional('rollout.top_k', 0, _sampled, 'rollout.temperature > 0 (greedy ignores it)'),
    Conditional('rollout.top_p', 1.0, _sampled, 'rollout.temperature > 0 (greedy ignores it)'),
    # rewards/runner.py: the address-space limit is set in each worker process, not inline
    Conditional('rewards.memory_mb', 0, lambda config: config.rewards.get('num_workers', 2) > 0,
                'rewards.num_workers > 0 (the limit is set in each reward worker process)'),
    # Remediation's knobs (monitor/remediation.py: 'off', 'warn' and 'halt' take no action).
    # The detector knobs (warmup, cusum_h, ...) are not here: tools.monitor_replay reads them
    # from a run's config.json whatever its mode.
    Conditional('monitor.watch_steps', 10, _monitor_auto,
                "monitor.mode='auto' (remediation's watch)"),
    Conditional('monitor.lr_factor', 0.1, _monitor_auto,
                "monitor.mode='auto' (remediation's lower_lr)"),
    # With mode 'off' one step with a non-finite loss or gradient stops the run (trainer.py).
    Conditional('monitor.max_skipped_steps', 5,
                lambda config: config.monitor.get('mode', 'off') != 'off',
                "monitor.mode 'warn', 'halt' or 'auto' (with 'off' the first skipped step "
                'stops the run)'),
    # scaling/live.py LiveConfig; tools.scaling takes its own flags, not config.scaling.
    Conditional('scaling.model', 'sigmoid', _live_fit, _LIVE),
    Conditional('scaling.exclude_first', 0.1, _live_fit, _LIVE),
    Conditional('scaling.n_boot', 200, _live_fit, _LIVE),
    Conditional('scaling.anomaly_sd', 3.0, _live_fit, _LIVE),
    Conditional('scaling.anomaly_min_drop', 0.05, _live_fit, _LIVE),
)


def recipe_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict | None:
  """The config of the recipe `config` was made from (config.recipe_file, with config.variant),
  before any override; None without a readable recipe file."""
  from rft_jax import recipes  # pylint: disable=g-import-not-at-top  (recipes imports config)
  path = config.get('recipe_file', '')
  if not path or not os.path.isfile(path):
    return None
  variant = config.get('variant', '')
  try:
    return recipes.load_recipe(path + (f':{variant}' if variant else ''))
  except recipes.RecipeError:
    return None


def _value(config, key: str, default: Any = None) -> Any:
  """config's value at 'section.name'; `default` where the section or the key is missing."""
  section, name = key.split('.')
  part = config.get(section) if config is not None else None
  return part.get(name, default) if part is not None else default


def changed_from_recipe(config: ml_collections.ConfigDict, keys) -> list[str]:
  """The keys ('section.name') that config holds with a value other than its recipe's, in the
  order given: one the recipe lacks counts as changed, and so does every held key of a config
  without a readable recipe file (recipe_config). The recipe is loaded only if a key is held."""
  missing = object()
  held = [key for key in keys if _value(config, key, missing) is not missing]
  recipe = recipe_config(config) if held else None
  return [key for key in held if _value(recipe, key, missing) != _value(config, key)]


def unused_warnings(config: ml_collections.ConfigDict) -> list[str]:
  """One 'warning: config.<key>=<value> is not used: ...' line for each CONDITIONAL key that is
  set, differs from the recipe's value (or the default), and is not read under the config's
  other settings. A section the config lacks (algo in SFT and DPO) has nothing to report."""
  rules = [rule for rule in CONDITIONAL
           if rule.key.split('.')[1] in (config.get(rule.key.split('.')[0]) or {})]
  if not rules:
    return []
  recipe, missing, out = recipe_config(config), object(), []
  for rule in rules:
    if rule.matters(config):
      continue
    before = _value(recipe, rule.key, missing) if recipe is not None else missing
    if before is missing:   # no recipe file, or a key the recipe left out
      before = rule.default
    value = _value(config, rule.key)
    if value == before:
      continue
    out.append(f'warning: config.{rule.key}={value!r} is not used: it is read only with '
               f'{rule.setting}')
  return out
