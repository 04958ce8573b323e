"""api.load_config takes the optional keys a recipe leaves out, as the CLI's --config.k=v does."""
import pytest

from rft_jax import api


@pytest.mark.parametrize('key,value,want', [
    ('algo.tis_cap', 2, 2.0),              # an int for a float, as for a recipe's own keys
    ('algo.shared_prompt', False, False),
    ('model.path', '', ''),
    ('task.bad_records', 'skip', 'skip'),
])
def test_optional_key_the_recipe_leaves_out(key, value, want):
  config = api.load_config('grpo_arith:tiny', {key: value})
  section, name = key.split('.')
  got = config[section][name]
  assert got == want and type(got) is type(want)


def test_optional_key_of_wrong_type_or_section_is_a_config_error():
  with pytest.raises(api.ConfigError, match=r"^config\.algo\.tis_cap='x': expected float"):
    api.load_config('grpo_arith:tiny', {'algo.tis_cap': 'x'})
  with pytest.raises(api.ConfigError, match=r'^config\.dpo\.rpo_alpha: unknown key'):
    api.load_config('grpo_arith:tiny', {'dpo.rpo_alpha': 1.0})   # no dpo section
