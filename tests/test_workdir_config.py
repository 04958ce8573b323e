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
