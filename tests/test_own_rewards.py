"""A user's own rewards and prompts, at load and in training: a verifier of the wrong
signature, a prompt option the task would ignore, held-out accuracy by one's own verifier
(eval.verifier), a verifier failing on some samples (said once, the run goes on), the recipe
file a run records. The files of the GSM8K task (a user's own JSONL) are tested in
tests/test_gsm8k_data.py."""
import json
import os
import sys

import ml_collections
import numpy as np
import pytest

from configs import grpo_arith, sft_arith
from rft_jax import config as config_lib
from rft_jax import api, trainer
from rft_jax import main as main_lib
from rft_jax.telemetry.sinks import read_jsonl

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:   # reward_fixtures registers test-only verifiers
  sys.path.insert(0, _TESTS_DIR)
import reward_fixtures  # noqa: E402  pylint: disable=g-import-not-at-top
from test_config import _error  # noqa: E402  (validate's one-line ConfigError)


@pytest.fixture
def grpo(assets):
  config = grpo_arith.get_config()
  config.tokenizer.path, config.init_from = assets
  return config


@pytest.fixture
def sft(assets):
  config = sft_arith.get_config()
  config.tokenizer.path, config.init_from = assets
  return config


def tiny_config(**overrides):
  config = grpo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0     # inline scoring: no worker start-up in short tests
  config.update_from_flattened_dict(overrides)
  return config


def train_rows(workdir):
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


def test_a_verifier_of_the_wrong_signature_is_refused_at_load(grpo):
  """A verifier that cannot be called as fn(completion, answer) is a one-line ConfigError
  naming its key and function (it was every sample's TypeError at the first step, after the
  model load and base eval); extra arguments with defaults are fine."""
  from rft_jax.rewards import verifiers  # pylint: disable=g-import-not-at-top

  @verifiers.register_verifier('test_one_argument')
  def one_argument(completion):
    return float(bool(completion))

  @verifiers.register_verifier('test_with_defaults')
  def with_defaults(completion, answer, *, scale=1.0):
    return scale * (completion == answer)

  grpo.rewards.weights.test_one_argument = 1.0
  error = _error(grpo)
  assert error.key == 'rewards.weights.test_one_argument'
  assert str(error) == (
      f'config.rewards.weights.test_one_argument: verifier {one_argument.__module__}.'
      f'{one_argument.__qualname__}(completion) cannot be called as fn(completion, answer) '
      '(too many positional arguments)')
  del grpo.rewards.weights['test_one_argument']
  grpo.rewards.weights.test_with_defaults = 1.0
  config_lib.validate(grpo)


@pytest.mark.parametrize('task,key,said', [
    ({'instruction': 'Answer:'}, 'task.instruction', "has no effect on task 'arith'"),
    ({'system_prompt': 'Be brief.'}, 'task.system_prompt', "has no effect on task 'arith'"),
    ({'manual_dir': '/data'}, 'task.manual_dir', "has no effect on task 'arith'"),
    ({'chat_template': True}, 'task.chat_template', "has no effect on task 'arith'"),
    ({'name': 'gsm8k', 'manual_dir': '.', 'chat_template': False, 'system_prompt': 'Be brief.'},
     'task.system_prompt', 'has no effect with task.chat_template=False (a plain-text prompt '
     'has no system turn)'),
])
def test_a_prompt_option_the_task_would_ignore_is_refused(grpo, task, key, said):
  """These were dropped without a word: arith renders raw problems, a plain-text prompt has
  no system turn. task.chat_template=False and bad_records on arith are fine."""
  with grpo.unlocked():
    grpo.task.update(task)
  error = _error(grpo)
  assert error.key == key and said in str(error), error
  with grpo.unlocked():
    grpo.task = ml_collections.ConfigDict({**grpo_arith.get_config().task, 'bad_records': 'skip',
                                           'chat_template': False})
  config_lib.validate(grpo)


def test_eval_verifier_scores_held_out_accuracy_by_a_verifier_of_ones_own(grpo, sft):
  """eval.verifier (optional): held-out accuracy by the user's verifier, for answers the task's
  own (arith 'correct', GSM8K's number match) would score 0; checked as rewards.weights are,
  for SFT and DPO recipes too. Without it, the task's verifier, as before."""
  import types  # pylint: disable=g-import-not-at-top
  from rft_jax import components  # pylint: disable=g-import-not-at-top
  from rft_jax.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  c = types.SimpleNamespace(test_source=[{'id': 0, 'prompt': '1+1=', 'answer': 'two'}],
                            tokenizer=load_tokenizer())   # the arith SentencePiece
  grpo.eval.num_prompts = 1
  assert components.eval_batch(c, grpo)['verifier'] == 'correct'
  for config in (grpo, sft):
    with config.unlocked():
      config.eval.verifier = 'formatt'
    error = _error(config)
    assert error.key == 'eval.verifier' and "unknown verifier (did you mean 'format'?)" in str(
        error), error
  grpo.eval.verifier = 'format'
  config_lib.validate(grpo)
  assert components.eval_batch(c, grpo)['verifier'] == 'format'


def test_a_verifier_failing_on_some_samples_is_said_once_and_the_run_goes_on(tmp_path):
  """Below rewards.max_invalid_frac the run trains on; the first failure of each verifier is
  one message naming it, its first error and the count (it showed only in reward/errors/<name>,
  nothing on the console); later failures are counted, not said again."""
  reward_fixtures.EVERY_8TH_CALLS[0] = 0
  config = tiny_config(**{'train.steps': 3})
  config.rewards.weights = {'correct': 1.0, 'test_raises_every_8th': 0.0}
  trainer.run(config, str(tmp_path))
  rows = train_rows(str(tmp_path))
  assert [rows[s]['reward/errors/test_raises_every_8th'] for s in (1, 2, 3)] == [2.0] * 3
  records = [r for r in read_jsonl(os.path.join(tmp_path, 'metrics.jsonl'), kind='message')
             if 'test_raises_every_8th' in r['text']]
  assert [r['step'] for r in records] == [1]   # the step it names, not the last completed (0)
  said = [r['text'] for r in records]
  assert len(said) == 1 and said[0].startswith(
      "step 1: verifier 'test_raises_every_8th' left 2 of 16 samples unscored (2 raised or gave "
      'no finite number, the first: RuntimeError: call 8 [sample 7, completion '), said
  assert said[0].endswith(']); they are left out of the loss (reward/errors/test_raises_every_8th'
                          ', reward/timeouts/test_raises_every_8th; said once per verifier)')


def test_unscored_notes_name_the_timeout_key():
  from rft_jax.rewards.result import RewardResult  # pylint: disable=g-import-not-at-top
  from rft_jax import rollouts  # pylint: disable=g-import-not-at-top
  n, reported = 8, {'seen'}
  rewards = RewardResult(total=np.zeros(n, np.float32), per_verifier={},
                         valid=np.zeros(n, bool), errors={'slow': 0, 'seen': 3},
                         timeouts={'slow': 3, 'seen': 0})
  assert rollouts.unscored_notes(rewards, n, 2.0, reported) == [
      "verifier 'slow' left 3 of 8 samples unscored (3 ran past config.rewards.timeout_s=2.0 s); "
      'they are left out of the loss (reward/errors/slow, reward/timeouts/slow; said once per '
      'verifier)']
  assert reported == {'seen', 'slow'} and rollouts.unscored_notes(rewards, n, 2.0, reported) == []


def test_the_readmes_own_data_recipe_trains_and_scores_with_its_verifier(tmp_path):
  """experiments/own_data/recipe.py, the README's "Your own data and reward": its JSONL files
  load, its verifier scores the rollouts and the held-out accuracy (eval.verifier)."""
  config = api.load_config(os.path.join(_TESTS_DIR, '..', 'experiments', 'own_data', 'recipe.py'),
                           {'train.steps': 2, 'rewards.num_workers': 0,
                            'task.data_dir': str(tmp_path / 'tfds'), 'telemetry.console': False,
                            'telemetry.tensorboard': False, 'telemetry.plot': False})
  assert config.eval.verifier == 'exact_answer'
  trainer.run(config, str(tmp_path / 'run'))
  rows = train_rows(str(tmp_path / 'run'))
  assert sorted(rows) == [1, 2] and 'reward/exact_answer/mean' in rows[1]
  assert all(r['reward/invalid_frac'] == 0.0 for r in rows.values())
  evals = read_jsonl(str(tmp_path / 'run' / 'metrics.jsonl'), kind='eval')
  assert [e['step'] for e in evals][-1] == 2 and 0 < evals[0]['eval/base_greedy_acc'] < 1


def test_a_run_records_a_recipe_file_of_ones_own(tmp_path):
  """A recipe of one's own (a file outside configs/) that sets no config.variant, loaded by the
  CLI or the Python API: the run's records named neither its file nor its get_config argument
  (summary.json 'variant': null, no variant in the log's start record). Now config.json,
  summary.json and the start record (the console banner) name the file, and the variant is the
  argument it was loaded with ('' = none)."""
  recipe = tmp_path / 'my_recipe.py'
  recipe.write_text('from configs import grpo_arith\n\n\ndef get_config():\n'
                    "  config = grpo_arith.get_config('tiny')\n"
                    "  config.name = 'mine'\n  del config['variant']\n  return config\n")
  cli_config, _, _ = main_lib.parse_command_line(['main', f'--config={recipe}'])
  assert (cli_config.recipe_file, cli_config.variant) == (str(recipe), '')
  config = api.load_config(str(recipe), {
      'train.steps': 1, 'train.eval_every': 1, 'monitor.mode': 'off', 'rewards.num_workers': 0,
      'telemetry.console': False, 'telemetry.tensorboard': False, 'telemetry.plot': False})
  workdir = tmp_path / 'run'
  summary = trainer.run(config, str(workdir))
  assert (summary['recipe'], summary['recipe_file'], summary['variant']) == (
      'mine', str(recipe), '')
  assert json.loads((workdir / 'config.json').read_text())['recipe_file'] == str(recipe)
  assert json.loads((workdir / 'summary.json').read_text())['recipe_file'] == str(recipe)
  [start] = read_jsonl(str(workdir / 'metrics.jsonl'), kind='start')
  assert start['config']['recipe_file'] == str(recipe) and start['config']['variant'] == ''


def test_a_recipe_of_ones_own_takes_a_variant_from_the_command_line(tmp_path):
  """record_recipe keeps a variant an override sets; on a recipe that sets none, the CLI's
  `--config.variant=v` (or `--config.variant v`) was refused: 'unknown config key in overrides'
  (absl's copy of the config lacks the key record_recipe adds), before that 'this recipe has no
  'variant' section'."""
  recipe = tmp_path / 'my_recipe.py'
  recipe.write_text('from configs import grpo_arith\n\n\ndef get_config(arg=""):\n'
                    "  config = grpo_arith.get_config('tiny')\n"
                    "  del config['variant']\n  return config\n")
  for tail in (['--config.variant=small'], ['--config.variant', 'small']):
    config, _, _ = main_lib.parse_command_line(['main', f'--config={recipe}:x'] + tail)
    assert (config.variant, config.recipe_file) == ('small', str(recipe))
  config, _, _ = main_lib.parse_command_line(['main', f'--config={recipe}:x'])
  assert config.variant == 'x'


def test_the_recipe_file_is_recorded_absolute_in_every_record(monkeypatch):
  """A recipe given by a relative path (or a shipped one by name, found under the current
  directory) was recorded as given in summary.json and the log's start record, but absolute in
  config.json: two records of one run named the file differently, and the relative one could
  not be found from another directory."""
  monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  want = os.path.abspath(os.path.join('configs', 'grpo_arith.py'))
  for spec in ('configs/grpo_arith.py:tiny', 'grpo_arith:tiny'):
    assert api.load_config(spec).recipe_file == want, spec
    assert main_lib.parse_command_line(['main', '--config', spec])[0].recipe_file == want, spec
