"""Configs that validate but could never do what they ask are refused at validate (exit 2 from
the command line, --validate_only too), naming the keys: training that learns nothing, a
checkpoint floor that cannot be met, an eval set larger than its split."""
import pytest

from configs import grpo_arith, online_dpo_arith, ppo_arith
from rft_jax import config as config_lib


def _error(config) -> config_lib.ConfigError:
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert '\n' not in str(info.value)
  return info.value


# --- Greedy rollouts (rollout.temperature = 0) -------------------------------------------------

@pytest.mark.parametrize('advantage', ['grpo', 'dr_grpo', 'rloo', 'grpo_batch_norm',
                                       'reinforce_pp_baseline'])
def test_greedy_rollouts_with_a_group_baseline_are_refused(advantage):
  """Every completion of a group is the same greedy one, so its reward equals the group's mean
  and every advantage is 0: the run trained its steps and learned nothing (was: valid)."""
  config = grpo_arith.get_config('tiny')
  config.rollout.temperature, config.algo.advantage = 0.0, advantage
  error = _error(config)
  assert error.key == 'rollout.temperature', str(error)
  assert str(error).startswith('config.rollout.temperature=0.0: greedy sampling makes the G '
                               'completions of a prompt identical')
  assert f'algo.advantage={advantage!r}' in str(error) and 'nothing is learned' in str(error)


def test_greedy_online_dpo_is_refused():
  """Identical completions score the same: every prompt is skipped, no pair is ever formed."""
  config = online_dpo_arith.get_config('tiny')
  config.rollout.temperature = 0.0
  error = _error(config)
  assert error.key == 'rollout.temperature' and 'no prompt yields a pair' in str(error)


def test_greedy_rollouts_without_a_group_baseline_are_allowed():
  """REINFORCE++ (batch baseline) and PPO (a critic) get advantages that differ across prompts;
  a fault that changes the sampling temperature makes the groups differ again; greedy eval is
  always fine."""
  config = grpo_arith.get_config('tiny')
  config.rollout.temperature, config.algo.advantage = 0.0, 'reinforce_pp'
  config_lib.validate(config)
  config = ppo_arith.get_config('tiny')
  config.rollout.temperature = 0.0
  config_lib.validate(config)
  config = grpo_arith.get_config('tiny')
  config.rollout.temperature = 0.0
  config.faults = [{'type': 'temperature_anneal', 'onset_step': 1, 'strength': 0.7}]
  config_lib.validate(config)
  config = grpo_arith.get_config('tiny')
  config.eval.temperature = 0.0
  config_lib.validate(config)


def test_greedy_rollouts_with_dynamic_sampling_are_refused():
  """Dynamic sampling drops groups without reward spread: a greedy group never has any."""
  config = grpo_arith.get_config('tiny')
  config.rollout.temperature, config.algo.advantage = 0.0, 'reinforce_pp'
  config.algo.dynamic_sampling = True
  error = _error(config)
  assert error.key == 'algo.dynamic_sampling' and 'drops every group' in str(error), str(error)


# --- Checkpoints -------------------------------------------------------------------------------

def test_a_checkpoint_floor_above_the_checkpoints_kept_is_refused():
  """At most train.keep_checkpoints are on disk, so with min_good_checkpoints above it the first
  failed save (a full disk for a moment) stopped the run however many had been written."""
  config = grpo_arith.get_config('tiny')
  config.train.keep_checkpoints, config.train.min_good_checkpoints = 2, 3
  error = _error(config)
  assert error.key == 'train.min_good_checkpoints'
  assert str(error).startswith('config.train.min_good_checkpoints=3: must be <= '
                               'train.keep_checkpoints=2'), str(error)
  config.train.min_good_checkpoints = 2
  config_lib.validate(config)


# --- The eval set ------------------------------------------------------------------------------

def test_more_eval_prompts_than_the_test_split_holds_is_refused():
  """The run failed at set-up ('test split: num_prompts=100000 not in [1, 500]') after
  --validate_only had said 'config OK': the arith split's size is known from the config."""
  config = grpo_arith.get_config('tiny')
  config.eval.num_prompts = 100000
  error = _error(config)
  assert str(error) == ('config.eval.num_prompts=100000: must be <= 500, the number of records '
                        'in the arith test split (the eval set is its first eval.num_prompts)')
  config.eval.num_prompts = 500
  config_lib.validate(config)


def test_the_arith_test_split_size_is_the_datasets():
  from rft_jax import config_rules  # pylint: disable=g-import-not-at-top
  from rft_jax.data import arith  # pylint: disable=g-import-not-at-top
  assert config_rules.ARITH_NUM_TEST == arith.NUM_TEST


def test_every_reward_weight_0_is_refused():
  """Every reward is 0, so every advantage is 0: the run trained its steps at reward 0 and
  learned nothing (was: valid, exit 0)."""
  config = grpo_arith.get_config('tiny')
  for name in config.rewards.weights.keys():
    config.rewards.weights[name] = 0.0
  error = _error(config)
  assert error.key == 'rewards.weights' and 'every weight is 0' in str(error), str(error)
  config.rewards.weights['correct'] = 1.0
  config_lib.validate(config)
