"""What a resume must keep (rft_jax/workdir_config.py): the recipe, the model, the algorithm and
the held-out eval; other settings may change. Checked on recorded configs, no training (the
refusal of another recipe or model by a run: test_trainer.py)."""
import re

import pytest

from configs import dpo_arith, grpo_arith, online_dpo_arith
from rft_jax import components, workdir_config


def tiny_config(**overrides):
  config = grpo_arith.get_config('tiny')
  config.update_from_flattened_dict(overrides)
  return config


@pytest.mark.parametrize('key,value', [('eval.k', 4), ('eval.num_prompts', 64),
                                       ('eval.temperature', 0.5)])
def test_a_workdir_refuses_another_eval(tmp_path, key, value):
  """summary.json compares the base eval of step 0 with the final one: resumed with another
  eval.k a finished extension crashed on the base eval's missing mean@k (KeyError, and no k
  could finish the workdir after), with another eval set it compared accuracies on different
  prompts. Refused in one line before anything is touched, as another algorithm is."""
  workdir_config.record_workdir_config(tiny_config(), str(tmp_path))
  with pytest.raises(components.SetupError,
                     match=rf'^config.{re.escape(key)}={value!r} does not match the run in '):
    workdir_config.check_workdir_config(tiny_config(**{key: value}), str(tmp_path))
  workdir_config.check_workdir_config(tiny_config(**{'train.steps': 9}), str(tmp_path))
  # Reading the run's weights (an export, api.load_policy) does not depend on its eval.
  workdir_config.check_workdir_config(tiny_config(**{key: value}), str(tmp_path),
                                      training=False)


@pytest.mark.parametrize('recipe', [dpo_arith, online_dpo_arith])
def test_a_workdir_refuses_another_dpo_loss_type(tmp_path, recipe):
  """sigmoid, IPO and hinge are different algorithms (README): resuming one's workdir with
  another continued it silently; refused in one line as another algo.loss is."""
  workdir_config.record_workdir_config(recipe.get_config('tiny'), str(tmp_path))
  other = recipe.get_config('tiny')
  other.dpo.loss_type = 'hinge'
  with pytest.raises(components.SetupError,
                     match=r"^config.dpo.loss_type='hinge' does not match the run in .*\("
                           r"'sigmoid' in its config.json\)"):
    workdir_config.check_workdir_config(other, str(tmp_path))
  other.dpo.loss_type, other.dpo.beta = 'sigmoid', 0.5   # its beta may change
  workdir_config.check_workdir_config(other, str(tmp_path))


def test_a_directory_named_as_a_shipped_recipe_does_not_hide_it(tmp_path, monkeypatch):
  """`--config grpo_arith --workdir grpo_arith` run twice: the first run made ./grpo_arith, and
  the bare name must still be the shipped recipe, not 'a directory'."""
  from rft_jax import recipes  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'grpo_arith').mkdir()
  assert recipes.resolve_recipe('grpo_arith:tiny').endswith('configs/grpo_arith.py:tiny')
  (tmp_path / 'mine').mkdir()   # no recipe of that name: said to be a directory
  with pytest.raises(recipes.RecipeError, match=r"^config file 'mine' is a directory"):
    recipes.load_recipe(recipes.resolve_recipe('mine'))


def test_an_extension_cut_short_is_evaluated_at_its_own_last_checkpoint(tmp_path):
  """A run finished at step 2, extended to 4 and cut short after checkpoint 3 (here: checkpoint
  4 and the summary removed), resumed with train.steps=3: its summary's final accuracy is the
  step-3 policy's, evaluated then. The extension's checkpoints carried step 2's final eval, so
  it was reported 'already complete' with step 2's accuracies under steps=3."""
  import os  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from rft_jax import trainer  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry.sinks import read_jsonl  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  common = {'train.eval_every': 100, 'train.ckpt_every': 1, 'rewards.num_workers': 0}
  trainer.run(tiny_config(**common, **{'train.steps': 2}), workdir)
  trainer.run(tiny_config(**common, **{'train.steps': 4}), workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '4'))
  os.remove(os.path.join(workdir, 'summary.json'))
  summary = trainer.run(tiny_config(**common, **{'train.steps': 3}), workdir)
  [step3] = [r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='eval')
             if r['step'] == 3]
  assert summary['steps'] == 3 and summary['final_greedy_acc'] == step3['eval/greedy_acc']
