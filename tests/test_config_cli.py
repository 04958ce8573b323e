"""Tests for the rft_jax.main command line: overrides, usage errors, main() in process.

validate() itself is tested in tests/test_config.py."""
import os
import re
import subprocess
import sys

import pytest

from configs import grpo_arith
from rft_jax import config as config_lib
from rft_jax import main as main_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.mark.parametrize('relative', [False, True])
def test_cli_recipe_file_that_registers_its_own_verifier(tmp_path, relative):
  """The command line loads a recipe file twice (its own check, then absl): the verifier it
  registers is the same definition both times, not a second one under a taken name. Also with
  the file named relative to the current directory (`--config own_verifier.py`), which absl
  loads by that relative path: that was 'verifier ... is registered twice', exit 2."""
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
  if relative:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (
        REPO, os.environ.get('PYTHONPATH')))))
    result = subprocess.run(
        [sys.executable, '-m', 'rft_jax.main', '--config', recipe.name, '--validate_only'],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
  else:
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


def test_a_leading_tilde_in_the_workdir_and_paths_is_expanded(monkeypatch, assets, tmp_path):
  """`--workdir=~/w` and `--config.tokenizer.path=~/tok.model` reach main unexpanded (the shell
  expands `~` only at the start of a word); main expands them (was a directory named `~`)."""
  monkeypatch.chdir(REPO)
  monkeypatch.setenv('HOME', str(tmp_path))
  argv = ['main', '--config=configs/sft_arith.py:tiny', '--config.tokenizer.path=~/tok.model',
          '--workdir=~/w']
  config, workdir, _ = main_lib.parse_command_line(argv)
  assert (config.tokenizer.path, workdir) == (assets[0], str(tmp_path / 'w'))


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


@pytest.mark.parametrize('make,override,message', [
    (lambda d: None, '--config.mesh.data=TWICE',
     r"config.mesh=\{'data': TWICE, 'fsdp': 1, 'tensor': 1\} needs TWICE devices "
     r'\(data\*fsdp\*tensor\) but only NDEV are present \(NDEV x cpu on this machine\)'),
    (lambda d: None, '--config.model.hidden_size=64',
     r'config.init_from=\S+arith_base: does not match config.model: embed_tokens/embedding is '
     r'\(18, 128\) there, \(18, 64\) in this model'),
    (lambda d: (d / 'empty').mkdir(), '--config.init_from={d}/empty',
     r'config.init_from=\S+/empty: \S+/empty is not a parameter checkpoint \(no orbax '
     r'_CHECKPOINT_METADATA\)'),
])
def test_validate_only_checks_the_mesh_and_init_from(make, override, message, tmp_path,
                                                     monkeypatch, capsys):
  """--validate_only said 'config OK' for a mesh larger than the machine and for an init_from
  that does not fit the model; the run then exited 2. Now the same one line, from the devices
  and init_from's orbax metadata (no array read, nothing compiled)."""
  import jax  # pylint: disable=g-import-not-at-top
  n = jax.device_count()
  make(tmp_path)
  monkeypatch.chdir(REPO)
  monkeypatch.delenv('JAX_COORDINATOR_ADDRESS', raising=False)
  monkeypatch.delenv('RFT_DISTRIBUTED', raising=False)
  rc = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny', '--validate_only',
                      override.format(d=tmp_path).replace('TWICE', str(2 * n))])
  err = [line for line in capsys.readouterr().err.splitlines()
         if not line.startswith('WARNING:absl:')]
  assert rc == 2 and len(err) == 1, err
  message = message.replace('TWICE', str(2 * n)).replace('NDEV', str(n))
  assert re.fullmatch('error: ' + message, err[0]), err[0]


def test_validate_only_leaves_the_device_count_to_a_multi_process_run(monkeypatch, capsys):
  """With jax.distributed's variables set, the other hosts' devices are not known before it
  starts: a mesh larger than this machine passes (the fixed axes still meet the model), and
  'config OK' says so (main._UNCHECKED_WITH_SEVERAL_PROCESSES)."""
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(REPO)
  monkeypatch.setenv('RFT_DISTRIBUTED', '1')
  rc = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny', '--validate_only',
                      f'--config.mesh.data={2 * jax.device_count()}'])
  out = capsys.readouterr().out.strip()
  assert rc == 0 and out == 'config OK' + main_lib._UNCHECKED_WITH_SEVERAL_PROCESSES, out
  rc = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny', '--validate_only',
                      '--config.mesh.tensor=3'])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.startswith('error: config.mesh.tensor=3 does not divide model '), err


@pytest.mark.parametrize('how', ['cli', 'api'])
@pytest.mark.parametrize('before', [None, 'true'])
def test_validate_starts_jax_without_preallocating_accelerator_memory(monkeypatch, capsys, how,
                                                                      before):
  """--validate_only and api.validate count the devices (config.mesh), which starts JAX's
  backend: on a GPU a run already trains on, JAX's default preallocation (75% of the memory)
  would fail or take it. Both start it with XLA_PYTHON_CLIENT_PREALLOCATE=false (api.validate
  did not: a notebook's check took the GPU), a user's own setting kept, the variable restored
  after. Seen where components.check_setup runs (this process's backend is already up)."""
  from rft_jax import api, components  # pylint: disable=g-import-not-at-top
  seen, real = [], components.check_setup
  monkeypatch.setattr(components, 'check_setup', lambda config: (
      seen.append(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')), real(config))[1])
  if before is None:
    monkeypatch.delenv('XLA_PYTHON_CLIENT_PREALLOCATE', raising=False)
  else:
    monkeypatch.setenv('XLA_PYTHON_CLIENT_PREALLOCATE', before)
  monkeypatch.chdir(REPO)
  if how == 'cli':
    assert main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny',
                          '--validate_only']) == 0
    assert capsys.readouterr().out.strip() == 'config OK'
  else:
    assert api.validate(api.load_config('grpo_arith:tiny')) is None
  assert seen == [before or 'false']
  assert os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE') == before
