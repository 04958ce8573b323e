"""Config helpers shared by the config-validation tests."""
import pytest

from rft_jax import config as config_lib


def config_error(config, changes) -> str:
  """Sets each 'section.leaf' of changes on config (replacing the leaf, whatever its type),
  validates it, and returns the ConfigError's message, asserted to be one line."""
  for key, value in changes.items():
    section, leaf = key.split('.')
    if leaf in config[section]:
      del config[section][leaf]
    config[section][leaf] = value
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert '\n' not in str(info.value), str(info.value)
  return str(info.value)
