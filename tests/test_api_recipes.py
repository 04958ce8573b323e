"""rft_jax.api without a run: recipes and overrides, and the README's examples run verbatim.
A run, its policy and choose_mesh are tested in tests/test_api.py."""
import ast
import glob
import importlib.util
import os
import re
import subprocess
import sys

import ml_collections
import pytest

from rft_jax import api

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- Recipes and overrides -------------------------------------------------------------------

def test_recipe_names_resolve_to_the_same_config():
  by_name = api.load_config('grpo_arith:tiny')
  by_path = api.load_config('configs/grpo_arith.py:tiny')
  assert by_name.to_dict() == by_path.to_dict()
  assert by_name.train.steps == 4 and api.load_config('grpo_arith').train.steps == 150


def test_shipped_recipes_find_their_assets_from_any_directory(monkeypatch, tmp_path):
  """A notebook or script started outside the repository loads the arithmetic recipes (the
  shipped tokenizer and base policy by absolute path); from the repository they stay relative."""
  names = ('grpo_arith', 'sft_arith', 'ppo_arith', 'dpo_arith', 'online_dpo_arith')
  monkeypatch.chdir(REPO)
  here = {n: api.load_config(n) for n in names}
  assert all(c.tokenizer.path == 'rft_jax/assets/arith_spm.model' for c in here.values())
  assert here['grpo_arith'].init_from == 'rft_jax/assets/arith_base'
  monkeypatch.chdir(tmp_path)
  for name in names:
    config = api.load_config(name)   # validates: the files exist
    assert config.tokenizer.path == os.path.join(REPO, here[name].tokenizer.path), name
    if here[name].init_from:
      assert config.init_from == os.path.join(REPO, here[name].init_from), name


def test_overrides_dotted_and_keyword():
  config = api.load_config('grpo_arith:tiny', {'optim.lr': 1}, train__steps=7)
  assert config.train.steps == 7
  assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)   # int for a float: ok


def test_bad_value_is_the_clis_one_line_error():
  with pytest.raises(api.ConfigError) as e:
    api.load_config('configs/grpo_arith.py', {'rollout.group_size': 1})
  cli = subprocess.run(
      [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/grpo_arith.py',
       '--config.rollout.group_size=1', '--validate_only'],
      cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert cli.returncode == 2
  assert cli.stderr.strip() == f'error: {e.value}'
  assert str(e.value) == 'config.rollout.group_size=1: GRPO needs at least 2 completions per prompt'


def test_validate_runs_the_clis_validate_only_checks():
  """api.validate is --validate_only in Python (it had none): the config, then the files and
  devices it names (components.check_setup), with the CLI's one-line errors; config untouched."""
  config = api.load_config('grpo_arith:tiny')
  before = config.to_dict()
  assert api.validate(config) is None and config.to_dict() == before
  not_a_tokenizer = os.path.join(REPO, 'README.md')
  bad = api.load_config('grpo_arith:tiny', {'tokenizer.path': not_a_tokenizer})
  with pytest.raises(api.SetupError) as e:
    api.validate(bad)
  cli = subprocess.run(
      [sys.executable, '-m', 'rft_jax.main', '--config', 'grpo_arith:tiny',
       f'--config.tokenizer.path={not_a_tokenizer}', '--validate_only'],
      cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert cli.returncode == 2
  assert cli.stderr.strip().splitlines()[-1] == f'error: {e.value}'
  assert str(e.value).startswith('config.tokenizer.path: unsupported tokenizer file')
  config.rollout.group_size = 1   # set after load_config: validate checks the config too
  with pytest.raises(api.ConfigError, match=r'^config\.rollout\.group_size=1: GRPO needs'):
    api.validate(config)
  with pytest.raises(TypeError, match=r"^validate: expected a ConfigDict, got str; pass "):
    api.validate('grpo_arith:tiny')


@pytest.mark.parametrize('overrides,message', [
    ({'rollout.tempreature': 0.5},
     "config.rollout.tempreature: unknown key (did you mean 'temperature'?)"),
    ({'nosuch.key': 1}, 'config.nosuch.key: unknown key'),
    ({'rollout.group_size': 'four'}, "config.rollout.group_size='four': expected int, got str"),
    ({'rollout': 3}, 'config.rollout=3: is a section; got int'),
    ({'rollout.group_size.x': 3},
     "config.rollout.group_size=4: is a value, not a section (in override 'rollout.group_size.x')"),
])
def test_bad_overrides_name_the_key(overrides, message):
  with pytest.raises(api.ConfigError) as e:
    api.load_config('grpo_arith:tiny', overrides)
  assert str(e.value) == message


def test_recipe_errors_are_one_line(tmp_path):
  with pytest.raises(api.RecipeError, match=r"^config file not found: 'configs/nope\.py' "
                     r"\(from 'nope'; relative to "):
    api.load_config('nope')
  # A misspelt shipped recipe: the closest one and the list (was only 'not found ... relative
  # to <cwd>', though a bare name is looked up in the checkout too).
  with pytest.raises(api.RecipeError, match=r"\(did you mean 'grpo_arith'\?\); shipped recipes: "
                     r"cispo_arith, .*, grpo_arith, .*sft_arith$"):
    api.load_config('grpo_arth:tiny')
  broken = tmp_path / 'broken.py'
  broken.write_text('def get_config(arg=None):\n  return {"not": "a ConfigDict"}\n')
  with pytest.raises(api.RecipeError, match='get_config\\(\\) returned dict, not a ConfigDict'):
    api.load_config(str(broken))
  # An error in the user's recipe names its line, at import and in get_config (was only
  # 'failed to load: ZeroDivisionError: division by zero'); a directory is said to be one (was
  # 'config file not found: .../configs/configs.py').
  broken.write_text('import math\nBAD = 1 / 0\n')
  with pytest.raises(api.RecipeError, match=r"broken\.py' failed to load at line 2: "
                     r'ZeroDivisionError: division by zero$'):
    api.load_config(str(broken))
  broken.write_text('def get_config(arg=None):\n  x = 1\n  return x / 0\n')
  with pytest.raises(api.RecipeError, match=r'failed to load at line 3: ZeroDivisionError'):
    api.load_config(str(broken))
  with pytest.raises(api.RecipeError, match=rf"^config file '{re.escape(str(tmp_path))}' is a "
                     r'directory \(from .*\); give a recipe file in it'):
    api.load_config(str(tmp_path))
  # An absolute path that does not exist is not said to be relative to the current directory.
  with pytest.raises(api.ConfigError, match=r"init_from='/no/such/dir': no such directory; "):
    api.load_config('grpo_arith:tiny', {'init_from': '/no/such/dir'})


def test_a_module_beside_the_recipe_that_cannot_be_imported_is_explained(tmp_path):
  """A recipe importing the user's verifiers from the file beside it: outside the import path
  the error says why and what adds it, a misspelt name gets the close one (both said only 'No
  module named ...', which reads as a typo in the first case)."""
  (tmp_path / 'my_verifiers_beside.py').write_text('')
  recipe = tmp_path / 'mine.py'
  recipe.write_text('import my_verifiers_beside\n\ndef get_config(arg=None):\n  return None\n')
  with pytest.raises(api.RecipeError) as e:
    api.load_config(str(recipe))
  assert str(e.value) == (
      f"config file '{recipe}' failed to load at line 1: ModuleNotFoundError: No module named "
      "'my_verifiers_beside' (my_verifiers_beside is beside the recipe, but a recipe is not run "
      f'as a script: its directory is not on the import path; PYTHONPATH={tmp_path} adds it)')
  recipe.write_text('import my_verifiers_besid\n\ndef get_config(arg=None):\n  return None\n')
  with pytest.raises(api.RecipeError) as e:
    api.load_config(str(recipe))
  assert str(e.value).endswith("No module named 'my_verifiers_besid' (did you mean "
                               "'my_verifiers_beside'?)"), e.value


def test_an_unknown_recipe_variant_is_a_one_line_error_and_every_listed_one_loads():
  """'grpo_arith:tinyy' used to run the full recipe; every shipped recipe lists its VARIANTS."""
  with pytest.raises(api.RecipeError, match=r"^config file '.*grpo_arith\.py': unknown variant "
                     r"'tinyy' \(from 'grpo_arith:tinyy'\); its variants: 'tiny' \(or no "
                     r"variant\)$"):
    api.load_config('grpo_arith:tinyy')
  recipes = [p for p in sorted(glob.glob(os.path.join(REPO, 'configs', '*.py')))
             if os.path.basename(p) not in ('__init__.py', 'common.py')]
  assert len(recipes) >= 12, recipes
  for path in recipes:
    name = os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert '' in module.VARIANTS, name
    for variant in module.VARIANTS:
      assert isinstance(api.load_recipe(path + (':' + variant if variant else '')),
                        ml_collections.ConfigDict), (name, variant)
    # Called directly (a notebook's `grpo_arith.get_config('tinyy')`), the recipe itself refuses.
    with pytest.raises(ValueError, match=r"^unknown variant 'tinyy'; this recipe's variants: "):
      module.get_config('tinyy')


def test_the_wrong_object_is_a_one_line_type_error_saying_what_to_pass():
  """A recipe name, a Run or a config where the call wants a config or a policy (was an
  AttributeError from deep inside, e.g. "'Run' object has no attribute 'components'")."""
  config = api.load_config('grpo_arith:tiny')
  run = api.Run(config=config, workdir='/nowhere', summary={}, records=[])
  calls = [
      (lambda: api.train('grpo_arith:tiny'),
       "train: expected a ConfigDict, got str; pass api.load_config('grpo_arith:tiny')"),
      (lambda: api.train(run), 'train: expected a ConfigDict, got Run; pass run.config'),
      (lambda: api.load_policy(run),
       'load_policy: expected a ConfigDict, got Run; pass run.config'),
      (lambda: api.choose_mesh(None), 'choose_mesh: expected a ConfigDict, got NoneType; pass '
                                      'api.load_config(recipe, overrides)'),
      (lambda: api.sample(run, ['12+7=']), 'sample: expected a Policy, got Run; pass run.policy'),
      (lambda: api.evaluate(config), 'evaluate: expected a Policy, got ConfigDict; pass '
                                     'run.policy or api.load_policy(config)'),
  ]
  for call, message in calls:
    with pytest.raises(TypeError) as e:
      call()
    assert str(e.value) == message


def test_a_workdir_the_run_cannot_write_is_a_one_line_setup_error(tmp_path):
  """As the CLI's --workdir check (was a raw FileExistsError / NotADirectoryError)."""
  config = api.load_config('grpo_arith:tiny')
  a_file = tmp_path / 'notes.txt'
  a_file.write_text('')
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'checkpoints').write_text('')
  for workdir, problem in ((a_file, 'exists and is not a directory'),
                           (a_file / 'run', 'cannot create it (Not a directory)'),
                           (tmp_path / 'run', f'{tmp_path}/run/checkpoints exists and is not '
                                              'a directory')):
    with pytest.raises(api.SetupError) as e:
      api.train(config, str(workdir), progress=False)
    assert str(e.value) == f'train: workdir={str(workdir)!r}: {problem}'


def test_importing_the_api_does_not_import_jax():
  code = ('import sys\nfrom rft_jax import api\nimported = "jax" in sys.modules\ntry:\n'
          '  api.load_config("grpo_arith:tiny", {"rollout.group_size": 1})\n'
          'except api.ConfigError:\n  print(imported, "jax" in sys.modules)')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.stdout.split() == ['False', 'False'], result.stderr


# --- The README ------------------------------------------------------------------------------

def readme_example(index: int = 0) -> str:
  """The index-th python block of the README's Python API section."""
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    readme = f.read()
  section = readme.split('\n## Python API\n', 1)[1].split('\n## ', 1)[0]
  return re.findall(r'```python\n(.*?)```', section, re.S)[index]


def test_readme_example_runs_verbatim(tmp_path):
  code = readme_example()
  assert 10 >= len(code.strip().splitlines()) >= 8
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'TMPDIR': str(tmp_path)}
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  last = result.stdout.strip().splitlines()[-2:]
  samples, evaluated = ast.literal_eval(last[0]), ast.literal_eval(last[1])
  assert len(samples) == 2 and all(len(group) == 4 for group in samples)
  assert set(evaluated) == {'eval/greedy_acc', 'eval/mean@2_acc'}
  assert os.listdir(tmp_path), 'the run did not go to a temporary workdir'


def test_readme_verifier_example_registers_and_validates(tmp_path):
  """The README's own-verifier block, run as a notebook runs it (no __main__ file): the config
  validates with the new name, and the verifier scores in a reward worker."""
  code = ('from rft_jax import api\n' + readme_example(1) +
          "print(sorted(config.rewards.weights.items()))\n"
          'from rft_jax.rewards.runner import RewardRunner\n'
          "with RewardRunner(dict(config.rewards.weights), num_workers=1) as r:\n"
          "  print(r(['7', '1234'], ['7', '7']).total.tolist())\n")
  result = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  weights, totals = result.stdout.strip().splitlines()[-2:]
  assert weights == "[('correct', 1.0), ('short', 0.1)]"
  assert ast.literal_eval(totals) == pytest.approx([1.1, 0.0])


def test_progress_is_live_in_a_terminal_and_in_jupyter_with_ipywidgets(monkeypatch):
  import importlib.util  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  from rich.console import Console  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry import console as console_lib  # pylint: disable=g-import-not-at-top
  assert console_lib.live_display(Console(force_terminal=True))
  assert not console_lib.live_display(Console(file=io.StringIO(), force_terminal=False))
  real = importlib.util.find_spec
  for has_widgets in (True, False):
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a, w=has_widgets: (
        (object() if w else None) if name == 'ipywidgets' else real(name, *a)))
    jupyter = Console(force_jupyter=True)
    # Without ipywidgets rich's live display shows nothing in Jupyter: plain lines instead.
    assert console_lib.live_display(jupyter) == has_widgets
    sink = console_lib.ConsoleSink(console=jupyter)
    assert sink._live == has_widgets  # pylint: disable=protected-access
