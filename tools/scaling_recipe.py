"""tools.scaling's recipes: the config a run's FLOPs are counted from when its log has none
logged (--config FILE[:ARG], else the recipe file and variant the log's start record names)."""

from __future__ import annotations

import ast
import os
import sys

FLOPS_KEY = 'compute/flops_cumulative'


class UsageError(Exception):
  """Bad command-line input; main prints it on one line and exits 2."""


def load_config(spec: str):
  """configs/x.py[:arg] (or a shipped recipe's name, 'grpo_arith:tiny', as rft_jax.main takes
  it) -> its get_config(arg), loaded as the CLI loads it (rft_jax.recipes: a one-line
  RecipeError, a ValueError, for a missing file, a failed import or an unknown variant)."""
  from rft_jax import recipes  # pylint: disable=g-import-not-at-top
  return recipes.load_recipe(recipes.resolve_recipe(spec), origin=repr(spec))


def warn_recipe_guess(run: str, spec: str, config, start: dict) -> None:
  """One line on stderr when the FLOPs counted from the recipe named in the log's start record
  may not be what ran: its variant unrecorded (a log written before runs recorded it: the full
  recipe is used, while `:tiny` has other batch sizes), or its step count not the log's
  (overrides, which the log does not record)."""
  logged, steps = start.get('total_steps'), config.get('train', {}).get('steps')
  differs = (f'; the log\'s run had {logged} steps, the recipe has {steps}, so it was not '
             f'{spec} as it stands' if logged and steps and logged != steps else '')
  if 'variant' in start.get('config', {}):
    if differs:
      print(f'warning: {run}: no config.json beside the log, so FLOPs are counted from {spec}, '
            f'the recipe and variant named in the log, without any overrides the run used'
            f'{differs}; pass --config FILE[:ARG] with what the run ran', file=sys.stderr)
    return
  print(f'warning: {run}: no config.json beside the log, so FLOPs are counted from {spec}, the '
        f'full recipe named in the log, not any variant (e.g. :tiny) or overrides the run '
        f'used{differs}; pass --config FILE[:ARG] with what the run ran', file=sys.stderr)


def logged_recipe(run: str, named: dict) -> str:
  """'FILE[:variant]' of the recipe the log's start record names: its recorded `recipe_file`
  (a recipe of one's own too, wherever it lies), else configs/<recipe>.py of a log written
  before runs recorded the file."""
  recipe, variant = named.get('recipe'), named.get('variant')
  path = named.get('recipe_file') or f'configs/{recipe}.py'
  if not os.path.isfile(path):
    here = '' if os.path.isabs(path) else f', relative to {os.getcwd()}'
    where = (f'the recipe file {path!r} the log records is not found{here}'
             if named.get('recipe_file') else f'recipe {recipe!r}' if recipe
             else 'the log has no start record naming its recipe')
    raise UsageError(f'{run}: no {FLOPS_KEY} logged and no config to compute it from '
                     f'({where}); pass --config FILE[:ARG]')
  return path + (f':{variant}' if variant and _takes_variant(path) else '')


def _takes_variant(path: str) -> bool:
  """Whether the recipe file's get_config takes an argument (read, not imported). A recipe of
  one's own built on a shipped one's variant (grpo_arith.get_config('tiny')) records that
  variant, while its own get_config() takes none."""
  try:
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read(), path)
  except (SyntaxError, ValueError):
    return True   # loading it says what is wrong, on one line
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == 'get_config':
      return bool(node.args.args or node.args.posonlyargs or node.args.vararg)
  return True   # none found statically: loading it says what is wrong
