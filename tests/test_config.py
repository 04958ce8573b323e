"""Tests for rft_jax.config.validate and the rft_jax.main command line."""
import os
import re
import subprocess
import sys

import ml_collections
import pytest

from configs import grpo_arith, sft_arith
from rft_jax import config as config_lib
from rft_jax import main as main_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ConfigError = config_lib.ConfigError


@pytest.fixture
def assets(tmp_path):
  """A tokenizer file and an init_from directory that exist, as absolute paths."""
  tokenizer = tmp_path / 'tok.model'
  tokenizer.write_bytes(b'not read by validate')
  init_from = tmp_path / 'base'
  init_from.mkdir()
  return str(tokenizer), str(init_from)


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
  grpo.rollout.temperature = 0.0
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


# --- The command line -----------------------------------------------------------------------

def _asset_overrides(assets):
  """Points the recipes at stand-in assets for any shipped asset that does not exist yet."""
  tokenizer_path, init_from = assets
  overrides = []
  if not os.path.exists(os.path.join(REPO, grpo_arith.get_config().tokenizer.path)):
    overrides.append(f'--config.tokenizer.path={tokenizer_path}')
  if not os.path.isdir(os.path.join(REPO, grpo_arith.get_config().init_from)):
    overrides.append(f'--config.init_from={init_from}')
  return overrides


def _cli(*args):
  return subprocess.run([sys.executable, '-m', 'rft_jax.main', *args], cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)


def _assert_usage_error(result, *fragments):
  assert result.returncode == 2, result.stderr
  assert 'Traceback' not in result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
  for fragment in fragments:
    assert fragment in lines[0]
  assert result.stdout == ''


@pytest.mark.parametrize('spec', ['configs/grpo_arith.py', 'configs/grpo_arith.py:tiny',
                                  'configs/sft_arith.py', 'configs/sft_arith.py:tiny'])
def test_cli_recipes_validate(spec, assets):
  extra = _asset_overrides(assets)
  if 'sft' in spec:
    extra = [arg for arg in extra if 'init_from' not in arg]
  result = _cli('--config', spec, *extra, '--validate_only')
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == 'config OK'


@pytest.mark.parametrize('args,fragments', [
    (['--config.nosuch=1'], ["unknown config key 'nosuch' in --config.nosuch=1"]),
    (['--config.rollout.tempreature=0.5'],
     ["'rollout.tempreature'", "(did you mean 'temperature'?)"]),
    (['--config.rollout.group_size=abc'],
     ['config.rollout.group_size', "cannot parse 'abc' as int"]),
    (['--config.rollout.group_size=1'],
     ['config.rollout.group_size=1: GRPO needs at least 2 completions per prompt']),
    (['--config.rollout.prompts_per_step=4', '--config.rollout.group_size=4',
      '--config.algo.microbatches=3'], ['config.algo.microbatches=3: must divide', '= 16']),
    (['--config.rollout.top_p=1.5'], ['config.rollout.top_p=1.5: must be in (0, 1]']),
    (['--config.tokenizer.path=no/such.model'],
     ["config.tokenizer.path='no/such.model': not found"]),
], ids=['unknown_key', 'misspelt_key', 'wrong_type', 'group_size_1', 'microbatches', 'top_p',
        'missing_tokenizer'])
def test_cli_bad_override(args, fragments):
  result = _cli('--config', 'configs/grpo_arith.py', *args, '--validate_only')
  _assert_usage_error(result, *fragments)


def test_cli_missing_config_file():
  result = _cli('--config', 'configs/nope.py', '--validate_only')
  _assert_usage_error(result, "config file not found: 'configs/nope.py'")


def test_cli_unknown_recipe_variant():
  result = _cli('--config', 'configs/grpo_arith.py:tinyy', '--validate_only')
  _assert_usage_error(result, "config file 'configs/grpo_arith.py': unknown variant 'tinyy'",
                      "its variants: 'tiny'")


def test_cli_unusable_workdir_is_a_one_line_error_before_any_work(tmp_path):
  a_file = tmp_path / 'a_file'
  a_file.write_text('')
  result = _cli('--config', 'configs/grpo_arith.py:tiny', '--workdir', str(a_file))
  _assert_usage_error(result, f'--workdir={a_file}: exists and is not a directory')
  result = _cli('--config', 'configs/grpo_arith.py:tiny', '--workdir', str(a_file / 'run'))
  _assert_usage_error(result, f'--workdir={a_file / "run"}: cannot create it')
  result = _cli('--config', 'configs/grpo_arith.py:tiny', '--workdir', '--validate_only')
  _assert_usage_error(result, "--workdir needs a directory; it got the flag '--validate_only'")
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'checkpoints').write_text('')
  result = _cli('--config', 'configs/grpo_arith.py:tiny', '--workdir', str(tmp_path / 'run'))
  _assert_usage_error(result, f'--workdir={tmp_path / "run"}: {tmp_path / "run" / "checkpoints"} '
                      'exists and is not a directory')


def test_cli_config_file_that_fails_to_import(tmp_path):
  broken = tmp_path / 'broken.py'
  broken.write_text('import no_such_module_anywhere\n')
  result = _cli('--config', str(broken), '--validate_only')
  _assert_usage_error(result, 'failed to load', "No module named 'no_such_module_anywhere'")


def test_cli_recipe_file_that_registers_its_own_verifier(tmp_path):
  """The command line loads a recipe file twice (its own check, then absl): the verifier it
  registers is the same definition both times, not a second one under a taken name."""
  recipe = tmp_path / 'own_verifier.py'
  recipe.write_text(
      'from configs import grpo_arith\n'
      'from rft_jax.rewards.verifiers import register_verifier\n\n\n'
      "@register_verifier('always_one_cli_test')\n"
      'def always_one(completion, answer):\n'
      '  return 1.0\n\n\n'
      "def get_config(arg=''):\n"
      "  config = grpo_arith.get_config('tiny')\n"
      "  config.rewards.weights = {'correct': 1.0, 'always_one_cli_test': 0.5}\n"
      '  return config\n')
  result = _cli('--config', str(recipe), '--validate_only')
  assert result.returncode == 0 and result.stdout.strip() == 'config OK', result.stderr


def test_cli_config_error_does_not_import_jax():
  code = ('import sys; from rft_jax import main; '
          "rc = main.main(['main', '--config', 'configs/grpo_arith.py', "
          "'--config.rollout.group_size=1', '--validate_only']); "
          "print(rc, 'jax' in sys.modules)")
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.stdout.split() == ['2', 'False'], result.stderr


# --- main() in process ----------------------------------------------------------------------

def test_main_default_workdir_and_overrides(monkeypatch, assets):
  monkeypatch.chdir(REPO)
  argv = ['main', '--config=configs/sft_arith.py:tiny', f'--config.tokenizer.path={assets[0]}',
          '--config.optim.lr=1', '--validate_only']
  config, workdir, validate_only = main_lib.parse_command_line(argv)
  assert workdir == os.path.join('runs', 'sft_arith') and validate_only
  assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
  assert config.train.steps == 6   # the :tiny variant


def test_a_shipped_recipe_by_name_from_any_directory(monkeypatch, tmp_path):
  """--config grpo_arith:tiny (as api.load_config takes it) is the repository's recipe file,
  with overrides, also when run outside the repository; an unknown name is the usual error."""
  monkeypatch.chdir(tmp_path)
  for argv in (['main', '--config', 'grpo_arith:tiny', '--config.optim.lr=1e-3'],
               ['main', '--config=grpo_arith:tiny', '--config.optim.lr=1e-3']):
    config, _, _ = main_lib.parse_command_line(argv)
    want = main_lib.api.load_recipe(os.path.join(REPO, 'configs', 'grpo_arith.py:tiny'))
    want.optim.lr = 1e-3
    assert config.to_dict() == want.to_dict()
  with pytest.raises(main_lib.UsageError, match=r"^config file not found: "
                     r"'configs/nosuch\.py' \(from --config=nosuch:tiny; relative to "):
    main_lib.parse_command_line(['main', '--config', 'nosuch:tiny'])


def test_optional_keys_the_recipe_leaves_out_are_set_from_the_command_line(monkeypatch,
                                                                             assets):
  """Documented optional keys (config_schema.OPTIONAL_KEYS) that grpo_arith does not set are
  added by an override, parsed as their schema type; bad values, unknown keys and a key of a
  section the recipe lacks are one-line usage errors."""
  monkeypatch.chdir(REPO)
  base = ['main', '--config=configs/grpo_arith.py:tiny', f'--config.tokenizer.path={assets[0]}']
  assert not config_lib.has_key(main_lib.parse_command_line(base)[0], 'algo.tis_cap')
  config, _, _ = main_lib.parse_command_line(
      base + ['--config.algo.tis_cap=2', '--config.algo.dynamic_sampling',
              '--noconfig.algo.shared_prompt', '--config.algo.overlong=soft',
              '--config.algo.score_chunks=4', '--config.optim.lr=0.5'])
  assert config.algo.tis_cap == 2.0 and isinstance(config.algo.tis_cap, float)
  assert config.algo.dynamic_sampling is True and config.algo.shared_prompt is False
  assert config.algo.overlong == 'soft' and config.algo.score_chunks == 4
  assert config.optim.lr == 0.5
  config_lib.validate(config)
  # `--config.k v`, as absl takes it for the recipe's own keys; a bool flag takes no value.
  spaced, _, _ = main_lib.parse_command_line(
      base + ['--config.algo.dynamic_sampling', '--config.algo.tis_cap', '3',
              '--config.algo.overlong', 'soft', '--config.optim.lr', '0.25'])
  assert spaced.algo.tis_cap == 3.0 and spaced.algo.dynamic_sampling is True
  assert spaced.algo.overlong == 'soft' and spaced.optim.lr == 0.25
  for arg, message in [
      ('--config.algo.tis_cap=abc', 'config.algo.tis_cap takes a float value'),
      ('--config.algo.shared_prompt=maybe', 'config.algo.shared_prompt takes a bool value'),
      ('--config.algo.tis_capp=2', "unknown config key 'algo.tis_capp'"),
      ('--config.dpo.pairs=x', "this recipe has no 'dpo' section")]:
    with pytest.raises(main_lib.UsageError, match=re.escape(message)):
      main_lib.parse_command_line(base + [arg])


def test_main_dispatches_to_sft(monkeypatch, assets, tmp_path):
  monkeypatch.chdir(REPO)
  calls = []
  fake_sft = type(sys)('rft_jax.sft')
  fake_sft.run = lambda config, workdir: calls.append((config.name, workdir))
  monkeypatch.setitem(sys.modules, 'rft_jax.sft', fake_sft)
  monkeypatch.setattr('rft_jax.sft', fake_sft, raising=False)
  rc = main_lib.main(['main', '--config', 'configs/sft_arith.py:tiny',
                      f'--config.tokenizer.path={assets[0]}', '--workdir', str(tmp_path)])
  assert rc == 0 and calls == [('sft_arith', str(tmp_path))]


def test_monitor_mode_and_faults(grpo):
  grpo.monitor.mode = 'panic'
  assert str(_error(grpo)).startswith("config.monitor.mode='panic': must be one of off, warn")
  grpo.monitor.mode = 'auto'
  grpo.faults = [{'type': 'lr_spike', 'onset_step': 0, 'strength': 50.0}]
  assert str(_error(grpo)) == 'config.faults[0].onset_step: must be an int >= 1'
  grpo.faults = [{'type': 'gremlins', 'onset_step': 3, 'strength': 1.0}]
  assert "config.faults[0].type='gremlins': unknown fault" in str(_error(grpo))
  grpo.faults = [{'type': 'lr_spike', 'onset_step': 3, 'strength': 50.0}]
  config_lib.validate(grpo)
  grpo.monitor.max_skipped_steps = 0
  assert str(_error(grpo)) == 'config.monitor.max_skipped_steps=0: must be >= 1'
  del grpo.monitor['max_skipped_steps']   # optional: a config.json from before the key
  config_lib.validate(grpo)


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


def test_an_os_error_that_stops_a_run_is_one_line_naming_the_file(monkeypatch, assets,
                                                                    tmp_path, capsys):
  """The command line turns an OSError from the run into one line, exit 1, saying the last
  checkpoint is kept. (The telemetry sinks no longer raise one on a full disk: they report it
  and go on, tests/test_full_disk.py.)"""

  def full_disk(config, workdir):
    raise OSError(28, 'No space left on device', os.path.join(workdir, 'incidents.md'))
  monkeypatch.chdir(REPO)
  monkeypatch.setattr(main_lib.api, 'run_config', full_disk)
  rc = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny',
                      f'--config.tokenizer.path={assets[0]}', '--workdir', str(tmp_path)])
  err = capsys.readouterr().err.strip()
  assert rc == 1 and '\n' not in err
  assert err.startswith(f'error: No space left on device: {tmp_path}/incidents.md; the run '
                        'stopped with its last good checkpoint kept in')


@pytest.mark.parametrize('make,override,message', [
    (lambda d: (d / 'bad.model').write_text('not a sentencepiece model'),
     '--config.tokenizer.path={d}/bad.model',
     r'config.tokenizer.path=\S+/bad.model: cannot load a tokenizer from it \(RuntimeError: '),
    (lambda d: (d / 'a_file').write_text(''), '--config.task.data_dir={d}/a_file',
     r"config.task.data_dir='\S+/a_file': cannot prepare the arith dataset there \(File exists"),
    (lambda d: (d / 'empty').mkdir(), '--config.init_from={d}/empty',
     r'config.init_from=\S+/empty: \S+/empty is not a parameter checkpoint'),
    (lambda d: None, '--config.model.hidden_size=64',
     r'config.init_from=\S+arith_base: does not match config.model: embed_tokens/embedding is '
     r'\(18, 128\) there, \(18, 64\) in this model'),
])
def test_unusable_input_files_are_one_line_at_load(make, override, message, tmp_path,
                                                    monkeypatch, capsys):
  """A damaged tokenizer, a data_dir that is a file, an init_from that is not a checkpoint or
  does not fit the model: one line naming the key, exit 2, nothing after it (orbax's failed
  async reads used to print ~60 lines of tracebacks after the error)."""
  make(tmp_path)
  monkeypatch.chdir(REPO)
  rc = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny',
                      override.format(d=tmp_path), '--workdir', str(tmp_path / 'run')])
  err = [line for line in capsys.readouterr().err.splitlines()
         if not line.startswith('WARNING:absl:')]
  assert rc == 2 and len(err) == 1, err
  assert re.match('error: ' + message, err[0]), err[0]


def test_faults_from_the_command_line(monkeypatch):
  """A list cannot go through absl's config flags: --config.faults takes a Python literal, and
  config.validate then checks it as it checks a recipe's."""
  monkeypatch.chdir(REPO)
  spec = "[{'type': 'lr_spike', 'onset_step': 3, 'strength': 50.0}]"
  for args in (['--config.faults=' + spec], ['--config.faults', spec]):
    config, _, _ = main_lib.parse_command_line(['main', '--config', 'configs/grpo_arith.py:tiny',
                                                *args])
    assert list(config.faults) == [{'type': 'lr_spike', 'onset_step': 3, 'strength': 50.0}]
  result = _cli('--config', 'configs/grpo_arith.py:tiny', '--validate_only',
                "--config.faults=[{'type': 'lr_spike', 'onset_step': 3}]")
  _assert_usage_error(result, 'config.faults[0].strength: must be a finite number > 0')
  result = _cli('--config', 'configs/grpo_arith.py:tiny', '--validate_only',
                '--config.faults=lr_spike')
  _assert_usage_error(result, "--config.faults='lr_spike': not a Python list of fault dicts")
