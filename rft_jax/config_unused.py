"""Warnings for algorithm keys that a user set but that have no effect under the other settings.

Some algo keys are read only under another setting: algo.max_len only by Dr.GRPO's
aggregation, kl_target and kl_horizon only by the adaptive KL controller, and so on (CONDITIONAL).
Such a key set where it is not read is legal (validation accepts it) but was silently ignored;
`unused_warnings(config)` gives one line for each, which config.start_warnings prints when the
run starts, as it does for an unused algo.clip_eps.

Only keys the user changed are reported: a key counts as set when its value differs from the
recipe's own (the recipe file config.recipe_file, variant config.variant, loaded anew), so a
recipe default left alone is never reported, not even after a setting it depends on changed
(dapo_arith's overlong_cache with --config.algo.overlong=mask). A config not made from a recipe
file is compared with the code's defaults (rft_jax/algorithms/grpo.py GRPOConfig).
No JAX import.
"""
import os
from typing import Any, Callable, NamedTuple

import ml_collections


class Conditional(NamedTuple):
  """`key` (in config.algo) is read only when `matters(algo)` holds, i.e. with `setting`."""
  key: str
  default: Any   # GRPOConfig's default (tests/test_config_unused.py checks they agree)
  matters: Callable[[ml_collections.ConfigDict], bool]
  setting: str


def _adaptive_kl(algo) -> bool:
  return algo.get('kl_ctrl', 'fixed') == 'adaptive'


def _dynamic_sampling(algo) -> bool:
  return algo.get('dynamic_sampling', False)


CONDITIONAL = (
    Conditional('max_len', 0, lambda algo: algo.loss_agg == 'seq_mean_token_sum_norm',
                "algo.loss_agg='seq_mean_token_sum_norm' (Dr.GRPO's aggregation)"),
    Conditional('kl_target', 0.1, _adaptive_kl, "algo.kl_ctrl='adaptive'"),
    Conditional('kl_horizon', 10000.0, _adaptive_kl, "algo.kl_ctrl='adaptive'"),
    Conditional('max_sampling_rounds', 4, _dynamic_sampling, 'algo.dynamic_sampling=True'),
    Conditional('dynamic_sampling_metric', 'accuracy', _dynamic_sampling,
                'algo.dynamic_sampling=True'),
    Conditional('overlong_cache', 0, lambda algo: algo.get('overlong', 'none') == 'soft',
                "algo.overlong='soft' (the soft overlong punishment)"),
)


def recipe_algo(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict | None:
  """The algo section of the recipe `config` was made from (config.recipe_file, with
  config.variant), before any override; None without a readable recipe file or algo section."""
  from rft_jax import recipes  # pylint: disable=g-import-not-at-top  (recipes imports config)
  path = config.get('recipe_file', '')
  if not path or not os.path.isfile(path):
    return None
  variant = config.get('variant', '')
  try:
    recipe = recipes.load_recipe(path + (f':{variant}' if variant else ''))
  except recipes.RecipeError:
    return None
  return recipe.get('algo')


def unused_warnings(config: ml_collections.ConfigDict) -> list[str]:
  """One 'warning: config.algo.<key>=<value> is not used: ...' line for each CONDITIONAL key
  that is set, differs from the recipe's value (or the default), and is not read under the
  config's other settings. [] for SFT and DPO configs (no algo section)."""
  algo = config.get('algo')
  if algo is None:
    return []
  recipe = recipe_algo(config)
  out = []
  for rule in CONDITIONAL:
    if rule.key not in algo or rule.matters(algo):
      continue
    before = recipe.get(rule.key, rule.default) if recipe is not None else rule.default
    if algo[rule.key] == before:
      continue
    out.append(f'warning: config.algo.{rule.key}={algo[rule.key]!r} is not used: it is read '
               f'only with {rule.setting}')
  return out
