"""A short real RL run compiles everything in its first step and nothing after it.

Compilations are counted with jax.monitoring's backend-compile events (one per XLA program
built or loaded from the persistent cache), read by a hook after every step. The recipe takes
one update per batch, so the loop runs the fused GRPO step (rft_jax/algorithms/grpo_fused.py);
tests/test_trainer.py covers the two-pass path (prepare_batch + train_step) the same way.
"""
import jax
import pytest

from configs import grpo_arith
from rft_jax import programs, trainer
from rft_jax.telemetry.hooks import Hook

BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


class CompileCounter(Hook):
  """Programs compiled so far, and the count seen after each step."""

  def __init__(self):
    self.names, self.after_step, self.metrics = [], {}, {}

  def listen(self, event, duration_secs, **kwargs):
    del duration_secs
    if event == BACKEND_COMPILE:
      self.names.append(kwargs.get('fun_name', '?'))

  def on_step(self, step, metrics):
    self.after_step[step] = len(self.names)
    self.metrics[step] = dict(metrics)


@pytest.fixture
def counter():
  programs.clear()   # programs an earlier test's run built are built again here
  c = CompileCounter()
  jax.monitoring.register_event_duration_secs_listener(c.listen)
  yield c
  jax.monitoring.unregister_event_duration_listener(c.listen)


def test_no_recompilation_after_the_first_step_of_a_fused_grpo_run(tmp_path, counter):
  config = grpo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0
  config.update_from_flattened_dict({'train.steps': 4, 'train.eval_every': 100,
                                     'train.ckpt_every': 100, 'algo.updates_per_batch': 1})
  trainer.run(config, str(tmp_path), hooks_extra=(counter,))
  first, last = counter.after_step[1], counter.after_step[4]
  assert first > 0                                  # step 1 compiled the step's programs
  assert last == first, counter.names[first:last]   # steps 2-4 reused them
  # The fused step ran: its old log-probs are the update's own, so the ratio is exactly 1.
  assert all(m['ppo_kl'] == 0.0 and m['ratio/abs_dev'] == 0.0 for m in counter.metrics.values())
