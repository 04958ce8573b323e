"""Tests for rft_jax.config.validate: the recipes pass, each bad value is a one-line error.

The command line (rft_jax.main) is tested in tests/test_config_cli.py."""
import ml_collections
import pytest

from configs import grpo_arith, sft_arith
from rft_jax import config as config_lib

ConfigError = config_lib.ConfigError



def _with_assets(config, assets):
  config.tokenizer.path, config.init_from = assets
  return config


@pytest.fixture
def grpo(assets):
  return _with_assets(grpo_arith.get_config(), assets)


@pytest.fixture
def sft(assets):
  return _with_assets(sft_arith.get_config(), assets)


def _replace(config, key, value):
  """Sets config.<key> = value even if the type differs (ConfigDict is type-safe)."""
  *parents, leaf = key.split('.')
  section = config
  for part in parents:
    section = section[part]
  del section[leaf]
  section[leaf] = value


def _error(config) -> ConfigError:
  with pytest.raises(ConfigError) as info:
    config_lib.validate(config)
  message = str(info.value)
  assert '\n' not in message and message.startswith('config.')
  return info.value


# --- validate(): good configs --------------------------------------------------------------

@pytest.mark.parametrize('module', [grpo_arith, sft_arith])
@pytest.mark.parametrize('arg', ['', 'tiny'])
def test_recipes_are_valid(module, arg, assets):
  config_lib.validate(_with_assets(module.get_config(arg), assets))


def test_sft_recipe_needs_no_rl_sections(sft):
  assert config_lib.is_sft(sft) and 'rollout' not in sft
  config_lib.validate(sft)


def test_random_init_and_int_for_float_are_accepted(grpo):
  grpo.init_from = ''
  _replace(grpo, 'optim.lr', 1)            # an int where a float is expected
  _replace(grpo, 'rewards.weights.format', 0)
  config_lib.validate(grpo)


# --- validate(): keys and types -------------------------------------------------------------

def test_unknown_key_suggests_the_close_one(grpo):
  grpo.rollout.tempreature = 0.5
  error = _error(grpo)
  assert error.key == 'rollout.tempreature'
  assert str(error) == "config.rollout.tempreature: unknown key (did you mean 'temperature'?)"


def test_unknown_section(grpo):
  grpo.monitr = ml_collections.ConfigDict({'x': 1})
  assert str(_error(grpo)) == "config.monitr: unknown key (did you mean 'monitor'?)"


def test_missing_key(grpo):
  del grpo.rollout['top_k']
  assert str(_error(grpo)) == 'config.rollout.top_k: missing key'


def test_rl_recipe_needs_rewards_section(grpo):
  del grpo['rewards']
  error = _error(grpo)
  assert error.key == 'rewards' and 'missing section' in str(error)


@pytest.mark.parametrize('key,value,expected', [
    ('rollout.group_size', 'eight', 'expected int, got str'),
    ('rollout.group_size', 8.0, 'expected int, got float'),
    ('rollout.group_size', True, 'expected int, got bool'),
    ('optim.lr', True, 'expected float, got bool'),
    ('telemetry.plot', 1, 'expected bool, got int'),
    ('model.dtype', None, 'expected str, got NoneType'),
    ('rollout', 3, 'expected a section (ConfigDict), got int'),
    ('rewards.weights', 1.0, 'expected a section of name -> float, got float'),
    ('rewards.weights.correct', '1', 'expected float, got str'),
])
def test_wrong_type(grpo, key, value, expected):
  _replace(grpo, key, value)
  error = _error(grpo)
  assert error.key == key
  assert str(error) == f'config.{key}={value!r}: {expected}'


def test_unknown_verifier(grpo):
  grpo.rewards.weights.corect = 1.0
  error = _error(grpo)
  assert error.key == 'rewards.weights.corect'
  assert "unknown verifier (did you mean 'correct'?)" in str(error)
  known = str(error).split('known: ')[1].split(', ')   # other tests may register more verifiers
  assert {'correct', 'format'} <= set(known) and known == sorted(known)


def test_empty_reward_weights(grpo):
  _replace(grpo, 'rewards.weights', ml_collections.ConfigDict())
  assert _error(grpo).key == 'rewards.weights'


@pytest.mark.parametrize('field,kind', [
    ('advantage', 'advantage estimator'), ('loss', 'policy loss'),
    ('loss_agg', 'loss aggregation')])
def test_unknown_algorithm_name(grpo, field, kind):
  grpo.algo[field] = 'nosuch'
  error = _error(grpo)
  assert error.key == f'algo.{field}'
  assert str(error).startswith(f"config.algo.{field}='nosuch': unknown {kind}; known: ")


def test_misspelt_loss_message(grpo):
  grpo.algo.loss = 'ppo_clipp'
  assert str(_error(grpo)).startswith(
      "config.algo.loss='ppo_clipp': unknown policy loss (did you mean 'ppo_clip'?); known: ")


# --- validate(): values ---------------------------------------------------------------------

def test_group_size_one(grpo):
  grpo.rollout.group_size = 1
  error = _error(grpo)
  assert error.key == 'rollout.group_size'
  assert str(error) == 'config.rollout.group_size=1: GRPO needs at least 2 completions per prompt'


def test_microbatches_must_divide_rollout_batch(grpo):
  grpo.rollout.prompts_per_step, grpo.rollout.group_size = 5, 4
  grpo.algo.microbatches = 3
  error = _error(grpo)
  assert error.key == 'algo.microbatches'
  assert 'rollout.prompts_per_step * rollout.group_size = 5 * 4 = 20' in str(error)
  grpo.algo.microbatches = 4
  config_lib.validate(grpo)


@pytest.mark.parametrize('key,value', [
    ('optim.lr', 0.0), ('optim.lr', -1e-4), ('train.steps', 0),
    ('rollout.temperature', -0.1), ('rollout.top_p', 0.0), ('rollout.top_p', 1.5),
    ('rollout.top_k', -1), ('rollout.max_new_tokens', 0), ('rollout.prompts_per_step', 0),
    ('algo.clip_eps', 0.0), ('algo.kl_coef', -0.01), ('algo.updates_per_batch', 0),
    ('eval.k', 0), ('train.eval_every', 0), ('train.ckpt_every', 0),
    ('model.dtype', 'float16'), ('algo.kl_estimator', 'k4'), ('mesh.tensor', 0),
    ('mesh.data', -2), ('optim.b2', 1.0),
])
def test_impossible_value(grpo, key, value):
  config_lib.lookup(grpo, key)  # The key exists in the recipe.
  _replace(grpo, key, value)
  error = _error(grpo)
  assert error.key == key
  assert str(error).startswith(f'config.{key}={value!r}: ')


@pytest.mark.parametrize('key', ['optim.lr', 'algo.kl_coef', 'rollout.temperature',
                                 'rewards.weights.correct'])
@pytest.mark.parametrize('value', [float('inf'), float('nan')])
def test_non_finite_values_are_refused(grpo, key, value):
  _replace(grpo, key, value)
  error = _error(grpo)
  assert error.key == key and '\n' not in str(error)
  assert str(error).startswith(f'config.{key}={value!r}: must be a finite number')


def test_sft_teacher_error_rate_is_a_fraction(sft):
  sft.sft.teacher_error_rate = 1.5
  assert str(_error(sft)).startswith('config.sft.teacher_error_rate=1.5: must be in [0, 1]')


def test_edge_values_are_allowed(grpo):
  grpo.rollout.temperature = 0.0   # greedy: with a group baseline it learns nothing (refused)
  grpo.algo.advantage = 'reinforce_pp'
  grpo.rollout.top_p = 1.0
  grpo.rollout.top_k = 0
  grpo.algo.kl_coef = 0.0
  grpo.mesh.data, grpo.mesh.fsdp = 1, -1
  config_lib.validate(grpo)


def test_heads_must_be_divisible_by_kv_heads(grpo):
  grpo.model.num_attention_heads, grpo.model.num_key_value_heads = 4, 3
  error = _error(grpo)
  assert error.key == 'model.num_key_value_heads'
  assert 'must divide model.num_attention_heads=4' in str(error)


def test_prompt_and_completion_must_fit_positions(grpo):
  grpo.task.max_prompt_len, grpo.model.max_position_embeddings = 10, 64
  grpo.rollout.max_new_tokens = 55
  error = _error(grpo)
  assert error.key == 'rollout.max_new_tokens'
  assert str(error) == ('config.rollout.max_new_tokens=55: task.max_prompt_len + '
                        'rollout.max_new_tokens = 10 + 55 = 65 exceeds '
                        'model.max_position_embeddings=64')
  grpo.rollout.max_new_tokens = 54
  config_lib.validate(grpo)


def test_sft_prompt_and_answer_must_fit_positions(sft):
  sft.task.max_prompt_len, sft.sft.answer_len = 10, 8
  sft.model.max_position_embeddings = 17
  error = _error(sft)
  assert error.key == 'sft.answer_len'
  assert 'task.max_prompt_len + sft.answer_len = 10 + 8 = 18' in str(error)
  sft.model.max_position_embeddings = 18
  config_lib.validate(sft)


def test_sft_does_not_apply_rl_rules(sft):
  sft.sft.batch_size = 0
  assert _error(sft).key == 'sft.batch_size'


def test_at_most_one_flexible_mesh_axis(grpo):
  grpo.mesh.fsdp = -1
  error = _error(grpo)
  assert error.key == 'mesh.fsdp' and 'mesh.data is already -1' in str(error)


# --- validate(): files ----------------------------------------------------------------------

def test_tokenizer_path_is_relative_to_cwd(grpo, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  grpo.tokenizer.path = 'tok.model'      # tmp_path/tok.model exists (the assets fixture)
  config_lib.validate(grpo)
  grpo.tokenizer.path = 'missing/tok.model'
  error = _error(grpo)
  assert error.key == 'tokenizer.path'
  assert str(error).startswith("config.tokenizer.path='missing/tok.model': not found")
  assert str(tmp_path) in str(error)


def test_init_from_must_be_a_directory(grpo, assets):
  grpo.init_from = assets[0]   # a file, not a directory
  assert _error(grpo).key == 'init_from'
  grpo.init_from = '/no/such/dir'
  assert str(_error(grpo)).startswith("config.init_from='/no/such/dir': no such directory")


def test_a_leading_tilde_in_a_path_is_the_home_directory(grpo, assets, tmp_path, monkeypatch):
  """`--config.model.path=~/m` reaches the config unexpanded (the shell expands `~` only at the
  start of a word): validate expands it in every path key, as the tokenizer loader does."""
  monkeypatch.setenv('HOME', str(tmp_path))
  grpo.tokenizer.path, grpo.init_from = '~/tok.model', '~/base'   # the assets, under tmp_path
  config_lib.validate(grpo)
  assert (grpo.tokenizer.path, grpo.init_from) == assets
  (tmp_path / 'm').mkdir()
  (tmp_path / 'm' / 'config.json').write_text('{}')
  grpo.model.path = '~/m'
  config_lib.validate(grpo)
  assert grpo.model.path == str(tmp_path / 'm')
  grpo.task.name, grpo.task.manual_dir = 'gsm8k', '~/base'
  config_lib.validate(grpo)
  assert grpo.task.manual_dir == assets[1]


# --- validate(): monitor, telemetry and rules ----------------------------------------------

def test_monitor_mode_and_faults(grpo):
  grpo.monitor.mode = 'panic'
  assert str(_error(grpo)).startswith("config.monitor.mode='panic': must be one of off, warn")
  grpo.monitor.mode = 'auto'
  grpo.faults = [{'type': 'lr_spike', 'onset_step': 0, 'strength': 50.0}]
  assert str(_error(grpo)) == 'config.faults[0].onset_step: must be an int >= 1'
  grpo.faults = [{'type': 'gremlins', 'onset_step': 3, 'strength': 1.0}]
  assert "config.faults[0].type='gremlins': unknown fault" in str(_error(grpo))
  grpo.faults = [{'type': 'truncation', 'onset_step': 3,   # the recipe's own max_new_tokens
                  'strength': float(grpo.rollout.max_new_tokens)}]
  assert str(_error(grpo)).startswith('config.faults[0].strength: truncation to ')
  grpo.faults = [{'type': 'lr_spike', 'onset_step': 3, 'strength': 50.0}]
  config_lib.validate(grpo)
  grpo.monitor.max_skipped_steps = 0
  assert str(_error(grpo)) == 'config.monitor.max_skipped_steps=0: must be >= 1'
  del grpo.monitor['max_skipped_steps']   # optional: a config.json from before the key
  config_lib.validate(grpo)


def test_a_monitor_warmup_as_long_as_the_run_is_a_one_line_warning(grpo):
  """monitor.warmup >= train.steps is legal (short smoke runs) but the monitor then scores no
  signal: start_warnings says so in one line naming both keys; not below, nor without the
  monitor."""
  grpo.train.steps, grpo.monitor.warmup = 10, 10
  config_lib.validate(grpo)   # a warning, not an error
  [line] = config_lib.start_warnings(grpo)
  assert line.startswith('warning: config.monitor.warmup=10 >= config.train.steps=10: ')
  assert '\n' not in line
  grpo.monitor.warmup = 9
  assert config_lib.start_warnings(grpo) == []
  grpo.monitor.warmup, grpo.monitor.mode = 10, 'off'
  assert config_lib.start_warnings(grpo) == []
  del grpo['monitor']
  assert config_lib.start_warnings(grpo) == []


def test_wandb_without_the_package_is_a_one_line_error(grpo, monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == 'wandb' else real(name, *a))
  grpo.telemetry.wandb_project = 'my-project'
  assert "config.telemetry.wandb_project='my-project': Weights & Biases logging needs" in str(
      _error(grpo))


def test_max_invalid_frac_range(grpo):
  grpo.rewards.max_invalid_frac = 1.5
  assert str(_error(grpo)) == 'config.rewards.max_invalid_frac=1.5: must be in [0, 1]'


def test_config_rules_name_the_choices_the_code_has():
  """config_rules keeps its own copies of two choice lists (it imports no JAX): they must stay
  equal to the code's."""
  from rft_jax import config_rules  # pylint: disable=g-import-not-at-top
  from rft_jax.models.llama import REMAT_POLICIES  # pylint: disable=g-import-not-at-top
  from rft_jax.parallel.mesh import SAMPLING_LAYOUTS  # pylint: disable=g-import-not-at-top
  assert config_rules.WEIGHTS_LAYOUTS == SAMPLING_LAYOUTS
  assert set(config_rules.REMAT) == {'none', *REMAT_POLICIES}
