"""A short real RL run compiles everything in its first step and nothing after it.

Compilations are counted with jax.monitoring's backend-compile events (one per XLA program
built or loaded from the persistent cache, reported on the thread that compiles it), read by a
hook after every step. With one update per batch the loop runs the fused GRPO step
(rft_jax/algorithms/grpo_fused.py), with two prepare_batch + train_step; their programs are
compiled ahead on a thread (rft_jax/compile_ahead.py), which the process waits for at exit.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import pytest
import xla_flags

from configs import grpo_arith, ppo_arith
from rft_jax import programs, trainer
from rft_jax.telemetry.hooks import Hook

BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


class CompileCounter(Hook):
  """Programs compiled so far, and the count seen after each step."""

  def __init__(self):
    self.names, self.threads, self.after_step, self.metrics = [], [], {}, {}

  def listen(self, event, duration_secs, **kwargs):
    del duration_secs
    if event == BACKEND_COMPILE:
      self.names.append(kwargs.get('fun_name', '?'))
      self.threads.append(threading.current_thread().name)

  def on_step(self, step, metrics):
    self.after_step[step] = len(self.names)
    self.metrics[step] = dict(metrics)


@pytest.fixture(autouse=True)
def compile_ahead_on(monkeypatch):
  """The suite turns the compile-ahead thread off (tests/conftest.py); these tests are its."""
  monkeypatch.setenv('RFT_JAX_COMPILE_AHEAD', '1')


@pytest.fixture
def counter():
  programs.clear()   # programs an earlier test's run built are built again here
  c = CompileCounter()
  jax.monitoring.register_event_duration_secs_listener(c.listen)
  yield c
  jax.monitoring.unregister_event_duration_listener(c.listen)


@pytest.mark.parametrize('recipe, updates', [(grpo_arith, 1), (grpo_arith, 2), (ppo_arith, 2)])
def test_no_recompilation_after_the_first_step_of_a_run(tmp_path, counter, recipe, updates):
  """One GRPO update per batch runs the fused step, two (or PPO, with its critic) run
  prepare_batch + train_step: either way steps 2-4 compile nothing, and the train programs
  compiled once, on the thread that compiles them while the run evaluates and samples
  (rft_jax/compile_ahead.py): the steps' calls found those executables."""
  config = recipe.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0
  config.update_from_flattened_dict({'train.steps': 4, 'train.eval_every': 100,
                                     'train.ckpt_every': 100, 'algo.updates_per_batch': updates})
  trainer.run(config, str(tmp_path), hooks_extra=(counter,))
  first, last = counter.after_step[1], counter.after_step[4]
  assert first > 0                                  # step 1 compiled the step's programs
  assert last == first, counter.names[first:last]   # steps 2-4 reused them
  names = ['fused_step'] if updates == 1 else ['prepare_batch', 'train_step']
  for name in names:
    assert compiled_on(name, counter.names, counter.threads) == [AHEAD], counter.names
  if updates == 1:   # the fused step's old log-probs are the update's own: the ratio is 1
    assert all(m['ppo_kl'] == 0.0 and m['ratio/abs_dev'] == 0.0
               for m in counter.metrics.values())


AHEAD = 'rft_jax-compile-ahead'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compiled_on(name, names, threads) -> list:
  """The threads on which jit(<name>)'s program was compiled, one per compile."""
  return [t for n, t in zip(names, threads) if n == f'jit({name})']


# A command whose run fails at its base evaluation while the first step's programs compile on
# the thread (the failure waits for the compile to begin; the compile is then held for HOLD_S).
FAILS_WHILE_COMPILING = """
import sys, threading, time
from rft_jax import compile_ahead, runs
from rft_jax import main
compiling, compile_step = threading.Event(), compile_ahead.compile_step
def held(*args):
  compiling.set()
  compile_step(*args)
  time.sleep(float(sys.argv[2]))
  print('compiled', flush=True)
def fails(*args):
  compiling.wait()
  raise runs.TrainingError('the base evaluation broke')
compile_ahead.compile_step, runs.ensure_base_eval = held, fails
sys.exit(main.main(['rft_jax.main', '--config', 'configs/grpo_arith.py:tiny', '--workdir',
                    sys.argv[1], '--config.rewards.num_workers=0']))
"""


@pytest.mark.parametrize('ctrl_c', [False, True], ids=['exit', 'ctrl_c'])
def test_a_run_that_fails_before_its_first_step_reports_at_once_and_exits_cleanly(tmp_path,
                                                                                   ctrl_c):
  """The run does not wait for the compile thread: its error line comes first. The process
  waits for the thread at exit (one exiting under an XLA compile aborts: 'terminate called',
  exit 134) and exits with the run's status 1; a Ctrl-C during that wait exits at once with 130.
  An empty compilation cache, so the compile is XLA's (seconds), not a load."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_COMPILATION_CACHE_DIR=str(tmp_path / 'cache'))
  proc = subprocess.Popen(
      [sys.executable, '-c', FAILS_WHILE_COMPILING, str(tmp_path / 'run'),
       '60' if ctrl_c else '0'], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT)
  lines = []
  for line in proc.stdout:
    lines.append(line.rstrip())
    if ctrl_c and line.startswith('error: '):   # main then returns; at exit the process waits
      time.sleep(1.0)
      proc.send_signal(signal.SIGINT)
  proc.wait(timeout=120)
  out = '\n'.join(lines)
  errors = [i for i, l in enumerate(lines) if l == 'error: the base evaluation broke']
  assert errors and 'terminate called' not in out, out
  if ctrl_c:
    assert proc.returncode == 130 and 'compiled' not in lines, out
  else:
    assert proc.returncode == 1 and lines.index('compiled') > errors[0], out


def test_a_failed_compile_ahead_is_a_message_and_the_run_trains(tmp_path, monkeypatch):
  """An error on the thread (here: in the compile) is not raised there: the first step says so
  in one message and compiles its programs itself."""
  from rft_jax import compile_ahead  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry.sinks import read_jsonl  # pylint: disable=g-import-not-at-top

  def broken(*args):
    raise ValueError('no shapes today')
  monkeypatch.setattr(compile_ahead, 'compile_step', broken)
  config = grpo_arith.get_config('tiny')
  config.telemetry.console = False
  config.rewards.num_workers = 0
  config.update_from_flattened_dict({'train.steps': 2, 'train.eval_every': 100,
                                     'train.ckpt_every': 100})
  trainer.run(config, str(tmp_path))
  messages = [r['text'] for r in read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='message')]
  assert ('the train programs compiled ahead failed (ValueError: no shapes today); compiling '
          'them at the first call') in messages, messages
  assert len(read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='train')) == 2


TWO_DEVICE_RUN = """
import json, sys, threading, jax
from configs import grpo_arith, ppo_arith
from rft_jax import trainer
seen = []
def listen(event, secs, fun_name='?', **_):
  if event == '/jax/core/compile/backend_compile_duration':
    seen.append((fun_name, threading.current_thread().name))
jax.monitoring.register_event_duration_secs_listener(listen)
config = grpo_arith.get_config('tiny')
config.telemetry.console = False
config.rewards.num_workers = 0
config.update_from_flattened_dict({'train.steps': 2, 'train.eval_every': 100,
    'train.ckpt_every': 100, 'algo.updates_per_batch': 1, 'mesh.data': 1, 'mesh.fsdp': 2})
trainer.run(config, sys.argv[1])
print('SEEN ' + json.dumps(seen))
"""


def test_the_fused_step_compiled_ahead_is_the_one_a_sharded_run_calls(tmp_path):
  """On a (1, 2, 1) mesh (the sampler's outputs come out as P('fsdp',), the batch sharding it
  was compiled for is P(('data', 'fsdp'))) the program compiled ahead on its thread is the one
  the steps call: compiled once, never on the main thread."""
  done = subprocess.run(
      [sys.executable, '-c', TWO_DEVICE_RUN, str(tmp_path / 'run')], capture_output=True,
      text=True, timeout=600, check=False, cwd=REPO,
      env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
               XLA_FLAGS=xla_flags.with_cpu_devices(2)))
  assert done.returncode == 0, done.stderr[-3000:]
  seen = json.loads(done.stdout.split('SEEN ', 1)[1])
  assert compiled_on('fused_step', *zip(*seen)) == [AHEAD], seen
