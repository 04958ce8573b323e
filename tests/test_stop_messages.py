"""What a stopped run says about its checkpoints: the one it keeps, or that it has none yet."""
import numpy as np
import pytest

from rft_jax import rollouts, runs
from rft_jax.rewards.result import RewardResult


class _Checkpoints:
  def __init__(self, steps):
    self.steps = steps

  def latest_step(self):
    return self.steps[-1] if self.steps else None


@pytest.mark.parametrize('steps, said', [
    ([], 'stopped before its first checkpoint, so none is kept in /w; the same command starts '
         'the run over'),
    ([2, 4], 'stopped with the last good checkpoint (step 4) kept in /w')])
def test_non_finite_parameters_name_the_checkpoint_kept_or_that_there_is_none(steps, said):
  """Step 1 of a run whose learning rate blows the parameters up: there is no checkpoint yet,
  which the error used to word as 'the last good checkpoint (step none) kept'."""
  with pytest.raises(runs.TrainingError) as stopped:
    runs.check_finite({'param_norm': float('inf'), 'grad_norm': 2.0}, 1, _Checkpoints(steps),
                      '/w')
  assert str(stopped.value).endswith(said), stopped.value


def test_a_reward_failure_before_any_checkpoint_does_not_claim_one_is_kept():
  """A custom verifier that raises on every sample stops the run at step 1 (before any
  checkpoint); the error used to end 'the last good checkpoint is kept'."""
  n = 4
  rewards = RewardResult(total=np.zeros(n, np.float32),
                         per_verifier={'boom': np.full(n, np.nan, np.float32)},
                         valid=np.zeros(n, bool), errors={'boom': n}, timeouts={'boom': 0},
                         error_messages={'boom': 'RuntimeError: exploded'})
  with pytest.raises(runs.TrainingError) as stopped:
    rollouts.check_rewards(rewards, 0.5, 1, ['1'] * n,
                           lambda: runs.kept_note(_Checkpoints([]), '/w'), 2.0)
  message = str(stopped.value)
  assert "verifier 'boom': RuntimeError: exploded" in message
  assert message.endswith('stopped before its first checkpoint, so none is kept in /w; the '
                          'same command starts the run over'), message


def test_a_reward_failure_by_timeouts_names_the_timeout_key():
  """A verifier that hangs on every sample: the stop names config.rewards.timeout_s (it said only
  'timed out')."""
  n = 4
  rewards = RewardResult(total=np.zeros(n, np.float32),
                         per_verifier={'slow': np.full(n, np.nan, np.float32)},
                         valid=np.zeros(n, bool), errors={'slow': 0}, timeouts={'slow': n})
  with pytest.raises(runs.TrainingError) as stopped:
    rollouts.check_rewards(rewards, 0.5, 1, ['1'] * n,
                           lambda: runs.kept_note(_Checkpoints([]), '/w'), 2.0)
  assert ("verifier 'slow': timed out (> config.rewards.timeout_s=2.0 s); stopped before"
          in str(stopped.value)), stopped.value
