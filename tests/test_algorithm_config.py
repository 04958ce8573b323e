"""Tests for the configuration of the GRPO-family algorithm choices: the recipes (each changes
only the algo section and validates), the GRPO recipe's defaults, and config.validate's one-line
errors for the algo section. `assets` is the conftest fixture."""
import numpy as np
import pytest

from config_fixtures import config_error
from configs import (cispo_arith, dapo_arith, dr_grpo_arith, grpo_arith, gspo_arith,
                     reinforce_pp_arith, rloo_arith)
from rft_jax import config as config_lib
from rft_jax.algorithms import grpo, registry

RECIPES = [dapo_arith, dr_grpo_arith, gspo_arith, cispo_arith, rloo_arith, reinforce_pp_arith]


def _with_assets(config, assets):
  config.tokenizer.path, config.init_from = assets
  return config


@pytest.mark.parametrize('module', RECIPES, ids=lambda m: m.__name__.split('.')[-1])
def test_recipes_validate_and_change_only_the_algo_section(module, assets):
  for arg in ['', 'tiny']:
    config = _with_assets(module.get_config(arg), assets)
    config_lib.validate(config)
    base = _with_assets(grpo_arith.get_config(arg), assets)
    for section in config.keys():
      if section not in ('algo', 'name'):
        assert config[section] == base[section], section
    algo = grpo.GRPOConfig.from_config(config)
    assert algo.loss in registry.names()['loss']


def test_grpo_recipe_keeps_its_defaults():
  algo = grpo.GRPOConfig.from_config(grpo_arith.get_config())
  assert (algo.clip_eps_low, algo.clip_eps_high, algo.clip_c, algo.entropy_coef,
          algo.kl_in_reward) == (None, None, 0.0, 0.0, False)
  assert algo.loss_options() == dict(clip_eps=0.2, clip_eps_low=None, clip_eps_high=None,
                                     clip_c=0.0)
  assert algo.max_len == grpo_arith.get_config().rollout.max_new_tokens


@pytest.mark.parametrize('changes,message', [
    ({'rollout.group_size': 1, 'algo.advantage': 'rloo'},
     "config.rollout.group_size=1: GRPO needs at least 2 completions per prompt "
     "(algo.advantage='rloo' uses a group baseline; with 1 use 'reinforce_pp')"),
    ({'algo.clip_c': 1.0}, 'config.algo.clip_c=1.0: dual-clip constant must be > 1'),
    ({'algo.clip_c': 3.0, 'algo.loss': 'cispo'},
     "config.algo.clip_c=3.0: dual-clip applies to the ppo_clip and gspo losses, not "
     "algo.loss='cispo'; set it to 0"),
    ({'algo.clip_eps_high': -0.1}, 'config.algo.clip_eps_high=-0.1: must be >= 0'),
    ({'algo.clip_eps_low': -1}, 'config.algo.clip_eps_low=-1: must be >= 0'),
    ({'algo.entropy_coef': -0.01}, 'config.algo.entropy_coef=-0.01: must be >= 0'),
    ({'algo.kl_in_reward': 1}, 'config.algo.kl_in_reward=1: expected bool, got int'),
    ({'algo.loss_agg': 'seq_mean'}, "config.algo.loss_agg='seq_mean': unknown loss aggregation"),
    # Used to train with no KL at all, silently (grpo.assemble_batch skips it at kl_coef 0).
    ({'algo.kl_in_reward': True, 'algo.kl_coef': 0.0},
     'config.algo.kl_in_reward=True: puts algo.kl_coef * KL in the reward, and algo.kl_coef '
     'is 0'),
], ids=['rloo_group_1', 'dual_clip_1', 'dual_clip_cispo', 'eps_high', 'eps_low', 'entropy',
        'kl_in_reward_type', 'unknown_agg', 'kl_in_reward_no_coef'])
def test_algo_validation_errors(changes, message, assets):
  error = config_error(_with_assets(grpo_arith.get_config(), assets), changes)
  assert error.startswith(message), error
  if 'unknown' in message:
    assert all(n in error for n in registry.names()['loss_agg'])


def test_group_free_estimator_accepts_group_size_one(assets):
  config = _with_assets(reinforce_pp_arith.get_config('tiny'), assets)
  config.rollout.group_size = 1
  config_lib.validate(config)


def test_dr_grpo_normaliser_follows_the_generation_budget():
  """Dr.GRPO divides token sums by the generation budget (README: max_len); the recipe used to
  copy rollout.max_new_tokens into algo.max_len at load, so --config.rollout.max_new_tokens=10
  left the normaliser at 6."""
  from rft_jax import api   # pylint: disable=g-import-not-at-top
  config = api.load_config('dr_grpo_arith', {'rollout.max_new_tokens': 10})
  assert grpo.GRPOConfig.from_config(config).max_len == 10
  config = api.load_config('dr_grpo_arith', {'algo.max_len': 8})   # a constant of one's own
  assert grpo.GRPOConfig.from_config(config).max_len == 8


@pytest.mark.parametrize('name', ['dapo_arith', 'gspo_arith', 'cispo_arith'])
def test_clip_eps_override_moves_the_lower_bound(name):
  """--config.algo.clip_eps used to change nothing on these recipes (they set both
  clip_eps_low and clip_eps_high); now the lower bound follows it, the recipe's bounds are as
  before, and setting both says in one line that clip_eps is unused."""
  from rft_jax import api   # pylint: disable=g-import-not-at-top
  def bounds(config):   # losses._bounds: each side defaults to clip_eps
    algo = grpo.GRPOConfig.from_config(config)
    low, high = algo.clip_eps_low, algo.clip_eps_high
    return (1 - (algo.clip_eps if low is None else low),
            1 + (algo.clip_eps if high is None else high))
  want = {'dapo_arith': (0.8, 1.28), 'gspo_arith': (1 - 3e-4, 1 + 4e-4),
          'cispo_arith': (0.0, 1.28)}[name]
  config = api.load_config(name)
  np.testing.assert_allclose(bounds(config), want, rtol=1e-9)
  assert not [w for w in config_lib.start_warnings(config) if 'clip_eps' in w]
  np.testing.assert_allclose(bounds(api.load_config(name, {'algo.clip_eps': 0.1}))[0], 0.9)
  both = api.load_config(name, {'algo.clip_eps_low': 0.1})
  [line] = [w for w in config_lib.start_warnings(both) if 'clip_eps' in w]
  assert line.startswith('warning: config.algo.clip_eps=') and 'clip_eps_low' in line


def test_a_k1_kl_in_the_loss_is_one_warning_and_in_the_reward_none():
  """k1 = log pi - log ref in the loss has the gradient kl_coef * grad log pi, whose expectation
  under pi is 0 (a penalty that only adds noise); in the reward k1 is the usual choice."""
  from rft_jax import api   # pylint: disable=g-import-not-at-top
  [line] = [w for w in config_lib.start_warnings(
      api.load_config('grpo_arith', {'algo.kl_estimator': 'k1'})) if 'kl_estimator' in w]
  assert line.startswith("warning: config.algo.kl_estimator='k1' with the KL in the loss")
  for name, overrides in (('grpo_arith', {}), ('grpo_arith', {'algo.kl_estimator': 'k2'}),
                          ('grpo_arith', {'algo.kl_estimator': 'k1', 'algo.kl_coef': 0.0}),
                          ('rloo_arith', {'algo.kl_estimator': 'k1'})):
    config = api.load_config(name, overrides)
    assert not [w for w in config_lib.start_warnings(config) if 'kl_estimator' in w], overrides
