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


def test_numpy_scalars_are_the_numbers_they_hold():
  """A value a notebook computed with NumPy (np.int64 from np.arange, np.float32) is accepted
  as the int, float or bool it holds, stored as a plain Python one (config.json is JSON); it
  was 'expected int, got int64'. A NumPy array is still refused, naming the key."""
  np = pytest.importorskip('numpy')
  config = api.load_config('grpo_arith:tiny', {
      'train.steps': np.int64(3), 'optim.lr': np.float32(0.5), 'algo.tis_cap': np.float32(2),
      'algo.shared_prompt': np.bool_(False), 'rewards.weights': {'correct': np.float32(1)}})
  for got, want in ((config.train.steps, 3), (config.optim.lr, 0.5), (config.algo.tis_cap, 2.0),
                    (config.algo.shared_prompt, False), (config.rewards.weights.correct, 1.0)):
    assert got == want and type(got) is type(want)
  with pytest.raises(api.ConfigError, match=r'^config\.train\.steps=array\(\[3\]\): expected int'):
    api.load_config('grpo_arith:tiny', {'train.steps': np.array([3])})


def test_a_dict_for_a_section_merges_into_it_as_dotted_keys_do():
  """{'monitor': {'mode': 'halt'}} replaced the whole monitor section (its other keys lost: a
  'missing key' error, or a dropped optional knob); it now is {'monitor.mode': 'halt'}, nested
  sections and optional keys included. rewards.weights, a free name -> weight mapping, is still
  replaced by the dict given for it (the verifiers to score with)."""
  plain = api.load_config('grpo_arith:tiny')
  config = api.load_config('grpo_arith:tiny', {
      'monitor': {'mode': 'halt', 'cusum_h': 9.0}, 'algo': {'tis_cap': 2},
      'rewards': {'weights': {'correct': 1.0}, 'timeout_s': 3.0}}, train={'steps': 5})
  assert config.monitor.to_dict() == {**plain.monitor.to_dict(), 'mode': 'halt', 'cusum_h': 9.0}
  assert config.algo.to_dict() == {**plain.algo.to_dict(), 'tis_cap': 2.0}
  assert config.rewards.weights.to_dict() == {'correct': 1.0}
  assert (config.rewards.timeout_s, config.train.steps) == (3.0, 5)
  assert config.train.eval_every == plain.train.eval_every


@pytest.mark.parametrize('overrides, error', [
    ({'monitor': {'mdoe': 'halt'}},
     r"^config\.monitor\.mdoe: unknown key \(did you mean 'mode'\?\)"),
    ({'algo': {'kl_coef': 'x'}}, r"^config\.algo\.kl_coef='x': expected float"),
    ({'optim': {'lr': {'x': 1}}}, r"^config\.optim\.lr={'x': 1}: expected float, got dict"),
])
def test_a_bad_key_in_a_section_dict_is_a_config_error_naming_it(overrides, error):
  with pytest.raises(api.ConfigError, match=error):
    api.load_config('grpo_arith:tiny', overrides)
