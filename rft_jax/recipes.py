"""Recipe files and dotted overrides: what `api.load_config` and the CLI's `--config` share.

A recipe is a Python file whose get_config([arg]) returns an ml_collections.ConfigDict; a shipped
one may be named without its path ('grpo_arith:tiny'). Errors are one line: RecipeError for the
file, rft_jax.config.ConfigError for an override. Imports no JAX.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any

import ml_collections

from rft_jax import config as config_lib
from rft_jax.config import ConfigError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RecipeError(ValueError):
  """A recipe file that is missing, fails to import or returns no ConfigDict (one line)."""


def resolve_recipe(recipe: str) -> str:
  """'grpo_arith[:arg]' or 'configs/grpo_arith.py[:arg]' -> 'path.py[:arg]'.

  A bare name is configs/<name>.py under the current directory, else under the repository
  this package was installed from. The shipped recipes find their assets (tokenizer, base
  policy) from any directory (configs/common.py shipped_asset); other paths are relative to
  the current directory, as for the CLI.
  """
  name, sep, arg = recipe.partition(':')
  if name.endswith('.py') or os.sep in name:
    return recipe
  for root in ('', REPO_ROOT):
    path = os.path.join(root, 'configs', name + '.py')
    if os.path.isfile(path):
      return path + sep + arg
  if os.path.isdir(name):   # load_recipe says it is one (not 'configs/<name>.py not found')
    return recipe
  return os.path.join('configs', name + '.py') + sep + arg


def load_recipe(spec: str, origin: str | None = None) -> ml_collections.ConfigDict:
  """Imports `path.py[:arg]` and returns its get_config(arg), unvalidated.

  origin: how the user named it, for the error message (the CLI passes '--config=...').
  Raises RecipeError (one line) for a missing file, an import error or a wrong return type.
  """
  path, *arg = spec.split(':', 1)
  if os.path.isdir(path):
    raise RecipeError(f'config file {path!r} is a directory (from {origin or repr(spec)}); give '
                      'a recipe file in it, e.g. configs/grpo_arith.py')
  if not os.path.isfile(path):
    raise RecipeError(f'config file not found: {path!r} (from {origin or repr(spec)}; relative '
                      f'to {os.getcwd()}){_shipped_hint(path)}')
  _add_import_root(path)
  try:
    module_spec = importlib.util.spec_from_file_location('_rft_jax_recipe', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    raise RecipeError(f'config file {path!r} failed to load{_line_of(e, path)}: '
                      f'{type(e).__name__}: {one_line(str(e))}{_beside_hint(e, path)}') from None
  # A recipe that lists its VARIANTS (the shipped ones do) rejects any other `:arg`, so a typo
  # such as ':tinyy' cannot silently run the full recipe.
  variants, variant = getattr(module, 'VARIANTS', None), arg[0] if arg else ''
  if variants is not None and variant not in variants:
    known = ', '.join(repr(v) for v in variants if v) or 'none'
    bare = ' (or no variant)' if '' in variants else ''
    raise RecipeError(f'config file {path!r}: unknown variant {variant!r} (from '
                      f'{origin or repr(spec)}); its variants: {known}{bare}')
  try:
    config = module.get_config(*arg)
  except Exception as e:  # pylint: disable=broad-except
    raise RecipeError(f'config file {path!r} failed to load{_line_of(e, path)}: '
                      f'{type(e).__name__}: {one_line(str(e))}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise RecipeError(f'config file {path!r}: get_config() returned {type(config).__name__}, '
                      'not a ConfigDict')
  record_recipe(config, spec)
  return config


RECORDED_KEYS = ('variant', 'recipe_file')   # what record_recipe may add to a recipe's config


def record_recipe(config: ml_collections.ConfigDict, spec: str) -> None:
  """Records in `config` the recipe `spec` ('path.py[:arg]') that made it, for the run's
  records (config.json, summary.json, the log's start record and console banner): recipe_file
  is the file, absolute (as config.json records file paths: every record names the same file,
  from any directory); variant its get_config argument ('' = none), unless the config has one
  (the shipped recipes set it; so may an override). A recipe of one's own need not say either."""
  path, _, arg = spec.partition(':')
  with config.unlocked():
    config.recipe_file = os.path.abspath(os.path.expanduser(path))
    if 'variant' not in config:
      config.variant = arg


def _line_of(e: Exception, path: str) -> str:
  """' at line N' of the recipe file's innermost frame in e's traceback ('' when none: a
  SyntaxError names its line itself)."""
  lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__)
           if os.path.abspath(frame.filename) == os.path.abspath(path)]
  return f' at line {lines[-1]}' if lines else ''


def _beside_hint(e: Exception, path: str) -> str:
  """For a module the recipe imports that sits beside it (a user's verifiers, myrewards.py
  next to my_recipe.py): a recipe is loaded from its path, not run as a script, so its
  directory is not on sys.path, and 'No module named' alone reads as a typo; for one that does
  not, the name of a module beside it that is close (a typo)."""
  top = (getattr(e, 'name', None) or '').partition('.')[0] if isinstance(
      e, ModuleNotFoundError) else ''
  directory = os.path.dirname(os.path.abspath(path))
  if not top:
    return ''
  if not (os.path.isfile(os.path.join(directory, top + '.py'))
          or os.path.isdir(os.path.join(directory, top))):   # a typo? ('myrewardz')
    beside = [f.removesuffix('.py') for f in os.listdir(directory) if f.endswith('.py')]
    return config_lib.did_you_mean(top, beside)
  return (f' ({top} is beside the recipe, but a recipe is not run as a script: its directory '
          f'is not on the import path; PYTHONPATH={directory} adds it)')


def _shipped_hint(path: str) -> str:
  """'; shipped recipes: ...' (closest first when one is close), for a recipe not found."""
  shipped = sorted(f[:-3] for f in os.listdir(os.path.join(REPO_ROOT, 'configs'))
                   if f.endswith('.py') and f not in ('__init__.py', 'common.py'))
  name = os.path.basename(path).removesuffix('.py')
  return f'{config_lib.did_you_mean(name, shipped)}; shipped recipes: {", ".join(shipped)}'


def _add_import_root(path: str) -> None:
  """Lets a recipe in a package dir (configs/) import its siblings as `configs.common`."""
  directory = os.path.dirname(os.path.abspath(path))
  if os.path.isfile(os.path.join(directory, '__init__.py')):
    root = os.path.dirname(directory)
    if root not in sys.path:
      sys.path.insert(0, root)


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Sets dotted keys ({'optim.lr': 1e-4}) in place; returns `config`.

  Raises ConfigError naming the key: an unknown key (with a did-you-mean hint), a section
  replaced by a value, or a value of the wrong type (an int is accepted for a float). An
  optional key the recipe leaves out (config_schema.OPTIONAL_KEYS) is added, as on the CLI.
  A dict for a section merges into it key by key ({'monitor': {'mode': 'warn'}} is
  {'monitor.mode': 'warn'}: the section's other keys stay); a dict for a free mapping of names
  (rewards.weights) replaces it.
  """
  for key, value in _dotted(overrides):
    value = config_lib.plain_value(value)   # np.int64(3) -> 3
    section, _, name = key.rpartition('.')
    if key in config_lib.OPTIONAL_KEYS and section in config and name not in config[section]:
      with config.unlocked():   # an optional key the recipe leaves out, set as the CLI sets it
        config[section][name] = config_lib.optional_value(key, value)
      continue
    node, parts = config, key.split('.')
    for i, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict):
        raise ConfigError('.'.join(parts[:i]), f'is a value, not a section (in override {key!r})',
                          node)
      if part not in node:
        raise ConfigError(key, 'unknown key' + config_lib.key_hint(parts[:i + 1], node.keys()))
      node = node[part]
    if isinstance(node, ml_collections.ConfigDict) and not isinstance(value, Mapping):
      raise ConfigError(key, f'is a section; got {config_lib.type_name(value)}', value)
    try:
      config.update_from_flattened_dict({key: value})
    except (TypeError, ValueError):
      raise ConfigError(key, f'expected {config_lib.type_name(node)}, got '
                        f'{config_lib.type_name(value)}', value) from None
  return config


def _dotted(overrides: Mapping[str, Any], prefix: str = ''):
  """(dotted key, value) pairs of `overrides`, a dict given for a schema section (SCHEMA)
  spread into its keys, recursively: {'monitor': {'mode': 'warn'}} -> ('monitor.mode', 'warn').
  Any other value, a dict for an unknown key or rewards.weights included, is one pair."""
  for key, value in overrides.items():
    key = prefix + key
    if isinstance(value, (Mapping, ml_collections.ConfigDict)) and _is_section(key):
      yield from _dotted(dict(value.items()), key + '.')
    else:
      yield key, value


def _is_section(key: str) -> bool:
  try:
    return isinstance(config_lib.lookup(config_lib.SCHEMA, key), dict)
  except (KeyError, TypeError):
    return False


def one_line(text: str) -> str:
  """The first line of an error message; when it only announces what follows ('Error whilst
  parsing config file:'), with the last line, where a traceback names the exception."""
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  if len(lines) > 1 and lines[0].endswith(':'):
    return f'{lines[0]} {lines[-1]}'
  return lines[0] if lines else text.strip()
