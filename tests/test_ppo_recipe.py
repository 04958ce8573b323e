"""The PPO recipe (configs/ppo_arith.py): its config checks (it changes only the algo section;
config.validate's one-line errors for the PPO keys) and a tiny end-to-end run (separate critic,
adaptive KL) that resumes exactly, critic included, and logs only documented metric names.
`assets` is the conftest fixture."""
import os

import numpy as np
import pytest

from compile_log import assert_compiled_once
from configs import grpo_arith, ppo_arith
from rft_jax import config as config_lib
from rft_jax.algorithms import ppo

# ----------------------------------------------------------------------------
# Config checks and the recipe.


def test_recipe_validates_and_changes_only_the_algo_section(assets):
  for arg in ['', 'tiny']:
    config = ppo_arith.get_config(arg)
    base = grpo_arith.get_config(arg)
    for c in (config, base):
      c.tokenizer.path, c.init_from = assets
    config_lib.validate(config)
    for section in config.keys():
      if section not in ('algo', 'name'):
        assert config[section] == base[section], section
    algo = ppo.algo_config(config)
    assert ppo.is_ppo(algo) and algo.critic == 'shared' and algo.minibatches == 2
    assert not ppo.is_ppo(ppo.algo_config(base))


@pytest.mark.parametrize('changes,message', [
    ({'algo.critic': 'none'}, "config.algo.critic='none': algo.advantage='gae' (PPO) needs a "
     "value model: set 'shared' (a value head on the policy backbone) or 'separate'"),
    ({'algo.critic': 'twin'}, "config.algo.critic='twin': must be one of 'none', 'shared', "
     "'separate'"),
    ({'algo.advantage': 'grpo'}, "config.algo.critic='shared': a critic is only used by "
     "algo.advantage in ('gae',) (PPO), not 'grpo'; set 'none'"),   # no recipe file to match
    ({'algo.lam': 1.5}, 'config.algo.lam=1.5: must be in [0, 1]'),
    ({'algo.vf_clip': -0.1}, 'config.algo.vf_clip=-0.1: must be >= 0'),
    ({'algo.minibatches': 3}, 'config.algo.minibatches=3: algo.minibatches * '
     'algo.microbatches = 3 * 1 must divide the rollout batch'),
], ids=['no_critic', 'bad_critic', 'critic_without_gae', 'lam', 'vf_clip', 'minibatches'])
def test_config_errors_are_one_line(changes, message, assets):
  config = ppo_arith.get_config()
  config.tokenizer.path, config.init_from = assets
  for key, value in changes.items():
    config[key.split('.')[0]][key.split('.')[1]] = value
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert str(info.value).startswith(message) and '\n' not in str(info.value)


def test_ppo_keys_without_gae_are_rejected(assets):
  config = grpo_arith.get_config()
  config.tokenizer.path, config.init_from = assets
  config.algo.gamma = 0.99
  with pytest.raises(config_lib.ConfigError, match=r"^config.algo.gamma=0.99: a PPO setting"):
    config_lib.validate(config)


def test_ppo_keys_are_the_ppo_configs_own_fields():
  """config_schema.PPO_KEYS (what a critic-free advantage leaves unused) = PPOConfig's fields
  beyond the GRPO family's."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from rft_jax import config_schema  # pylint: disable=g-import-not-at-top
  from rft_jax.algorithms import grpo  # pylint: disable=g-import-not-at-top
  own = ({f.name for f in dataclasses.fields(ppo.PPOConfig)}
         - {f.name for f in dataclasses.fields(grpo.GRPOConfig)})
  assert set(config_schema.PPO_KEYS) == own


@pytest.mark.parametrize('overrides', [
    {'algo.advantage': 'grpo'},
    {'algo.advantage': 'reinforce_pp', 'algo.critic': 'none'},
    {'algo.advantage': 'rloo', 'rollout.prompts_per_step': 1, 'rollout.group_size': 3},
], ids=['grpo', 'reinforce_pp_critic_none', 'rows_the_recipe_minibatches_do_not_divide'])
def test_ppo_recipe_switches_to_a_critic_free_advantage_by_flags(overrides, capsys):
  """The PPO recipe's own PPO keys (critic 'shared', gamma, vf_coef, minibatches=2, ...) are
  unused under a critic-free advantage, not errors (they were, and a dotted key cannot be
  removed from the command line): --validate_only passes, the trainer builds no critic, and
  nothing counts the recipe's minibatches (one update per epoch)."""
  # pylint: disable-next=g-import-not-at-top
  from rft_jax import api, components, config_unused, main, runs
  from rft_jax.models.llama import ModelConfig  # pylint: disable=g-import-not-at-top
  from rft_jax.parallel import memory  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry import flops  # pylint: disable=g-import-not-at-top
  flags = [f'--config.{key}={value}' for key, value in overrides.items()]
  rc = main.main(['main', '--config', 'ppo_arith:tiny', *flags, '--validate_only'])
  assert rc == 0, capsys.readouterr().err
  config = api.load_config('ppo_arith:tiny', overrides)
  assert config.algo.minibatches == 2 and not ppo.is_ppo(ppo.algo_config(config))
  assert runs.updates_per_step(config) == config.algo.updates_per_batch == 2
  assert [k for _, _, factors in components.batch_splits(config) for k, _ in factors] == [
      'algo.microbatches']
  assert config_unused.unused_warnings(config) == []   # the recipe's values: none the user set
  model = ModelConfig.from_dict(dict(config.model))
  assert memory.estimate_run(config, model, (1, 1, 1)) == memory.estimate_run(
      config, model, (1, 1, 1), minibatches=1)
  config.algo.critic = 'separate'   # as a recipe of one's own with a separate critic would hold
  assert memory.run_critic(config) == 'none'
  assert flops.step_flops_from_config(config, gen_len_mean=4.0)['critic'] == 0


@pytest.mark.parametrize('flag,message', [
    ('algo.critic=separate', "config.algo.critic='separate': a critic is only used by "
     "algo.advantage in ('gae',) (PPO), not 'grpo'; set 'none'"),
    ('algo.gamma=0.9', "config.algo.gamma=0.9: a PPO setting: it needs algo.advantage='gae' and "
     "a critic, not 'grpo'; remove it"),
    ('algo.minibatches=1', 'config.algo.minibatches=1: a PPO setting'),
], ids=['critic', 'gamma', 'minibatches'])
def test_ppo_key_changed_with_a_critic_free_advantage_is_refused(flag, message, capsys):
  """A PPO key the user changes while selecting a critic-free advantage has no effect: one line
  naming it, exit 2, at --validate_only too."""
  from rft_jax import main  # pylint: disable=g-import-not-at-top
  rc = main.main(['main', '--config', 'ppo_arith:tiny', '--config.algo.advantage=grpo',
                  f'--config.{flag}', '--validate_only'])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.startswith(f'error: {message}') and '\n' not in err


# ----------------------------------------------------------------------------
# End to end: a tiny PPO run (separate critic, adaptive KL) stopped and resumed.


def _run_config(steps):
  config = ppo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0
  config.update_from_flattened_dict({'train.steps': steps, 'train.ckpt_every': 2})
  config.algo.critic = 'separate'
  config.algo.kl_ctrl = 'adaptive'
  config.algo.kl_target = 0.003
  config.algo.kl_horizon = 32.0
  return config


def _rows(workdir):
  from rft_jax.telemetry.sinks import read_jsonl  # pylint: disable=g-import-not-at-top
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


def test_tiny_run_resumes_exactly_with_its_critic(tmp_path):
  """Steps 3..5 after a stop at step 2 equal an uninterrupted run's, critic metrics included:
  the critic's params and optimiser state and the KL controller come back from the checkpoint."""
  from rft_jax import trainer  # pylint: disable=g-import-not-at-top
  full_dir, split_dir = str(tmp_path / 'full'), str(tmp_path / 'split')
  trainer.run(_run_config(5), full_dir)
  trainer.run(_run_config(2), split_dir)
  trainer.run(_run_config(5), split_dir)
  full, split = _rows(full_dir), _rows(split_dir)
  assert sorted(split) == [1, 2, 3, 4, 5]
  keys = ('reward/mean', 'loss', 'kl', 'kl_coef', 'grad_norm', 'critic/vf_loss',
          'critic/values/mean', 'critic/vf_explained_var', 'critic/grad_norm', 'entropy')
  for s in (3, 4, 5):
    for k in keys:
      np.testing.assert_allclose(split[s][k], full[s][k], rtol=1e-6, atol=1e-8,
                                 err_msg=f'{k} at step {s}')
  assert abs(full[3]['critic/values/mean']) > 1e-3   # a fresh (zero) head would give 0
  assert full[3]['kl_coef'] != full[1]['kl_coef']     # the controller moved
  for name, metric in (('actor/pg_clipfrac', 'clip_frac'), ('actor/entropy', 'entropy'),
                       ('actor/ppo_kl', 'ppo_kl')):
    assert full[3][name] == full[3][metric]           # verl aliases
  check_documented(full[3])


def test_ppo_recipe_trains_two_steps_with_a_group_advantage_from_flags(tmp_path, capsys):
  """`--config.algo.advantage=grpo` alone on the PPO recipe trains a critic-free run: no critic
  metrics, one update per epoch (summary.json's optim_updates = steps * updates_per_batch)."""
  import json  # pylint: disable=g-import-not-at-top
  from rft_jax import main  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  rc = main.main(['main', '--config', 'ppo_arith:tiny', '--config.algo.advantage=grpo',
                  '--config.train.steps=2', '--config.rewards.num_workers=0',
                  '--config.telemetry.console=False', '--config.telemetry.tensorboard=False',
                  '--workdir', workdir])
  assert rc == 0, capsys.readouterr().err
  rows = _rows(workdir)
  assert sorted(rows) == [1, 2] and 'reward/mean' in rows[2]
  assert not {'critic/vf_loss', 'critic/values/mean', 'critic/grad_norm'} & set(rows[2])
  with open(os.path.join(workdir, 'summary.json'), encoding='utf-8') as f:
    assert json.load(f)['optim_updates'] == 2 * 2


def test_a_run_switched_to_a_group_advantage_resumes_with_critic_none_added(tmp_path):
  """The resume check compares the critic a run trains, not the unused algo.critic: a run started
  as `ppo_arith --config.algo.advantage=grpo` continues with `--config.algo.critic=none` added
  (it was refused: 'shared' recorded, 'none' given). A real change of critic is still refused."""
  from rft_jax import components, workdir_config  # pylint: disable=g-import-not-at-top
  started = ppo_arith.get_config('tiny')
  started.algo.advantage = 'grpo'
  workdir_config.record_workdir_config(started, str(tmp_path))
  resumed = ppo_arith.get_config('tiny')
  resumed.algo.advantage, resumed.algo.critic = 'grpo', 'none'
  workdir_config.check_workdir_config(resumed, str(tmp_path))
  separate = ppo_arith.get_config('tiny')
  workdir_config.record_workdir_config(separate, str(tmp_path / 'ppo'))
  separate.algo.critic = 'separate'
  with pytest.raises(components.SetupError,
                     match=r"config.algo.critic='separate' does not match .*\('shared' in its"):
    workdir_config.check_workdir_config(separate, str(tmp_path / 'ppo'))


def check_documented(row: dict) -> None:
  """Every metric name a run logs is a row of the README's metric-name table."""
  import re  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry import vocabulary  # pylint: disable=g-import-not-at-top
  readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             'README.md')).read()
  table = readme.split('### Metric names')[1].split('\n\n|')[1].split('\n\n')[0]
  patterns, verl_of = [], {}
  for line in table.splitlines()[2:]:
    cells = [c.strip() for c in line.strip('|').split('|')]
    ours = re.findall(r'`([^`]+)`', cells[0])
    for name in ours:
      patterns.append(re.compile('^' + re.sub(r'<[^>]+>', '[^/]+', re.escape(name)
                                              .replace(r'\<', '<').replace(r'\>', '>')) + '$'))
      verl_of[name] = re.findall(r'`([^`]+)`', cells[1])
  for key in row:
    if key in ('step', 'kind') or key in vocabulary.ALIASES:
      continue
    assert any(p.match(key) for p in patterns), f'{key} is not in the README metric table'
  for alias, name in vocabulary.ALIASES.items():
    assert alias in verl_of.get(name, []), f'{alias} (= {name}) missing from the table'


@pytest.mark.slow
def test_no_recompilation_after_the_first_step(tmp_path, caplog):
  """The PPO loop's jitted pieces (critic params and the in-reward KL coefficient passed each
  step) compile once."""
  from rft_jax import trainer  # pylint: disable=g-import-not-at-top
  config = _run_config(3)
  config.algo.kl_in_reward = True
  config.update_from_flattened_dict({'train.eval_every': 100, 'train.ckpt_every': 100})
  assert_compiled_once(lambda: trainer.run(config, str(tmp_path)), caplog)
  rows = _rows(str(tmp_path))
  for s in (1, 2, 3):   # the reward's KL uses the adapted coefficient of the step
    np.testing.assert_allclose(rows[s]['kl_reward/penalty'],
                               rows[s]['kl_coef'] * rows[s]['kl_reward/seq_kl'], rtol=1e-5)
