"""SIGTERM stops a run cleanly after the current step, with a checkpoint and exit code 75; the
same command then resumes and finishes with the metrics of an uninterrupted run."""
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from rft_jax.telemetry.sinks import read_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 30
GROUP_STEPS = 200   # long enough that SIGTERM finds the run still going


def command(workdir):
  return [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/grpo_arith.py:tiny',
          f'--config.train.steps={STEPS}', '--config.train.eval_every=100',
          '--config.train.ckpt_every=100', '--config.telemetry.console=False',
          '--config.telemetry.tensorboard=False', '--config.rewards.num_workers=0',
          '--workdir', workdir]


def train_rows(workdir):
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


def children(pid: int) -> list[int]:
  with open(f'/proc/{pid}/task/{pid}/children') as f:
    return [int(c) for c in f.read().split()]


def sigterm_after_three_steps(cmd, workdir, env, children_first: bool = False):
  """Starts cmd, sends SIGTERM once it has logged 3 steps, checks exit status 75; -> (stdout,
  stderr).
  children_first: SIGTERM its child processes (the reward workers) 2 s before it, as when
  `timeout`, SLURM's scancel or systemd signal the whole process group and the workers act
  first."""
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(os.path.join(workdir, 'metrics.jsonl')) and len(train_rows(workdir)) >= 3:
      break
    time.sleep(0.2)
  assert proc.poll() is None, proc.communicate()
  if children_first:
    workers = children(proc.pid)
    assert len(workers) >= 2, workers
    for pid in workers:
      os.kill(pid, signal.SIGTERM)
    time.sleep(2.0)   # steps go on meanwhile: they need the workers
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 75, err
  return out, err


def test_sigterm_checkpoints_exits_75_and_resumes_exactly(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  stopped, full = str(tmp_path / 'stopped'), str(tmp_path / 'full')
  _, err = sigterm_after_three_steps(command(stopped), stopped, env)
  assert err.strip().splitlines()[-1].startswith('stopped: SIGTERM after step')
  k = max(train_rows(stopped))
  assert 3 <= k < STEPS
  assert sorted(int(d) for d in os.listdir(os.path.join(stopped, 'checkpoints'))
                if d.isdigit()) == [k]
  assert os.path.isfile(os.path.join(stopped, 'run.png'))   # drawn at a stop too

  resumed = subprocess.run(command(stopped), cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=300)
  assert resumed.returncode == 0, resumed.stderr
  uninterrupted = subprocess.run(command(full), cwd=REPO, env=env, capture_output=True,
                                 text=True, timeout=300)
  assert uninterrupted.returncode == 0, uninterrupted.stderr
  a, b = train_rows(stopped), train_rows(full)
  assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
  for step in range(k + 1, STEPS + 1):
    for key in ('reward/mean', 'loss', 'kl', 'entropy', 'grad_norm'):
      np.testing.assert_allclose(a[step][key], b[step][key], rtol=1e-6, atol=1e-8,
                                 err_msg=f'{key} at step {step}')


def test_sigterm_to_the_process_group_spares_the_reward_workers(tmp_path):
  """The reward workers get the group's SIGTERM too; they ignore it, so the steps go on, the
  run checkpoints and exits 75 (it used to end as a reward failure: workers died, exit 1).
  The recipe's own verifier runs in the workers (the built-in ones are inline)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  workdir = str(tmp_path / 'group')
  recipe = tmp_path / 'own_verifier.py'
  recipe.write_text(
      'from configs import grpo_arith\n'
      'from rft_jax.rewards.verifiers import register_verifier\n\n\n'
      "@register_verifier('short_preemption_test')\n"
      'def short(completion, answer):\n'
      '  return float(len(completion) < 8)\n\n\n'
      "def get_config(arg=''):\n"
      "  config = grpo_arith.get_config('tiny')\n"
      "  config.rewards.weights = {'correct': 1.0, 'format': 0.1, 'short_preemption_test': 0.0}\n"
      '  return config\n')
  swap = {'--config.rewards.num_workers=0': '--config.rewards.num_workers=2',
          f'--config.train.steps={STEPS}': f'--config.train.steps={GROUP_STEPS}',
          'configs/grpo_arith.py:tiny': str(recipe)}
  cmd = [swap.get(a, a) for a in command(workdir)]
  _, err = sigterm_after_three_steps(cmd, workdir, env, children_first=True)
  assert err.strip().splitlines()[-1].startswith('stopped: SIGTERM after step'), err
  assert 'reward' not in err, err


def test_sigterm_to_one_process_stops_all_after_the_same_step(tmp_path):
  """Multi-process (jax.distributed on CPU, 2 processes): only process 1 gets SIGTERM; both
  leave their loop after the same step."""
  sock = socket.socket()
  sock.bind(('localhost', 0))
  port = sock.getsockname()[1]
  sock.close()
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  script = os.path.join(REPO, 'tests', 'multiprocess_stop_check.py')
  outs = [str(tmp_path / f'p{i}') for i in range(2)]
  procs = [subprocess.Popen([sys.executable, script, str(i), str(port), outs[i]], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  deadline = time.time() + 120
  while time.time() < deadline and not all(os.path.exists(o) for o in outs):
    assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
    time.sleep(0.1)
  time.sleep(0.5)
  procs[1].send_signal(signal.SIGTERM)
  results = [p.communicate(timeout=60) for p in procs]
  assert [p.returncode for p in procs] == [75, 75], results
  # Gloo may print its own lines to stdout; ours start with 'stopped after step'.
  lines = [[line[line.index('stopped after step'):] for line in out.splitlines()
            if 'stopped after step' in line][-1] for out, _ in results]
  step = lambda line: int(line.split()[3].rstrip(':'))
  assert step(lines[0]) == step(lines[1]), lines
  assert lines[0].endswith('stop on another process') and lines[1].endswith('SIGTERM'), lines


def test_sigterm_stops_an_sft_run_with_a_checkpoint(tmp_path):
  """With the console on, the stop is one line (the console had printed a second one saying the
  same): the step, its checkpoint, how to resume."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  workdir = str(tmp_path / 'sft')
  cmd = [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/sft_arith.py:tiny',
         '--config.train.steps=100000', '--config.train.eval_every=100000',
         '--config.train.ckpt_every=100000', '--config.telemetry.console=True',
         '--config.telemetry.tensorboard=False', '--workdir', workdir]
  out, err = sigterm_after_three_steps(cmd, workdir, env)
  k = max(train_rows(workdir))
  assert sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints'))
                if d.isdigit()) == [k]
  assert os.path.isfile(os.path.join(workdir, 'run.png'))   # drawn at a stop as at the end
  stops = [line for line in (out + err).splitlines() if 'stopped' in line]
  assert stops == [f'stopped: SIGTERM after step {k}; its checkpoint is '
                   f'{os.path.join(workdir, "checkpoints", str(k))}; run the same command again '
                   'to resume'], out + err
  logged = [r['text'] for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                                          kind='message')]
  assert stops[0].removeprefix('stopped: ') in logged   # the log says why the run ended


def test_sigterm_during_setup_exits_75_at_once(tmp_path):
  """SIGTERM before the step loop (here: while the base eval compiles and runs) has no step to
  finish: the run stops at once with exit 75 and says so (was: killed by the signal, exit 143,
  nothing said; Ctrl-C there ended in a crash at exit)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  workdir = str(tmp_path / 'setup')
  cmd = command(workdir)
  cmd[cmd.index('--config.telemetry.console=False')] = '--config.telemetry.console=True'
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  for line in proc.stdout:   # printed after the model is built, before the base eval
    if 'memory estimate' in line:
      break
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 75, err
  assert err.strip().splitlines()[-1].startswith('stopped: SIGTERM outside the step loop'), err
  assert not os.path.isdir(os.path.join(workdir, 'checkpoints', '1'))


# `python -m rft_jax.main ARGS` that signals itself (argv[2]) as it starts importing module
# argv[1]: in the imports (absl, at the top of main.py) or just before the set-up's handler takes
# over (rft_jax.runs, imported right before it): a deterministic point, no timing race.
_SIGNAL_ON_IMPORT = """
import importlib.abc, os, runpy, signal, sys
module, sig = sys.argv[1:3]
# as typed in a terminal: a suite started in the background (`make test &`) passes SIGINT on
# ignored, and the command rightly keeps it so (stop_signals.install_start_handlers)
signal.signal(signal.SIGINT, signal.default_int_handler)
class SignalOnImport(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == module:
      sys.meta_path.remove(self)
      os.kill(os.getpid(), getattr(signal, sig))   # its handler runs here, in the import
    return None
sys.meta_path.insert(0, SignalOnImport())
sys.argv = ['main'] + sys.argv[3:]
runpy.run_module('rft_jax.main', run_name='__main__', alter_sys=True)
"""


@pytest.mark.parametrize('module, sig, status', [('absl', 'SIGTERM', 75),
                                                 ('rft_jax.runs', 'SIGTERM', 75),
                                                 ('absl', 'SIGINT', 130)])
def test_a_signal_while_the_command_starts_stops_it_with_one_line(tmp_path, module, sig, status):
  """SIGTERM in the command's imports and config checks, before the set-up's handler, stops it
  at once as in the set-up: exit 75 and the one 'stopped:' line (was: killed by the signal, exit
  143, nothing said; Ctrl-C: a KeyboardInterrupt traceback). Ctrl-C there: the same line, 130."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  workdir = str(tmp_path / 'start')
  proc = subprocess.run([sys.executable, '-c', _SIGNAL_ON_IMPORT, module, sig,
                         *command(workdir)[3:]], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=240)
  assert proc.returncode == status, (proc.returncode, proc.stderr)
  assert proc.stderr.splitlines() == [f'stopped: {sig} outside the step loop (set-up or '
                                      'wrap-up): nothing new to save; run the same command '
                                      'again to resume'], proc.stderr
  assert not os.path.isdir(os.path.join(workdir, 'checkpoints'))


def test_a_stopped_rl_run_writes_its_incident_report(tmp_path):
  """A SIGTERM (or Ctrl-C) stop writes incidents.md of the steps run, as the end of a run or
  an error does (it used to be missing after a stop), next to run.png; in process: a hook
  signals the run after its second step."""
  from configs import grpo_arith   # pylint: disable=g-import-not-at-top
  from rft_jax import runs, trainer   # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry.hooks import Hook   # pylint: disable=g-import-not-at-top

  class Term(Hook):
    def on_step(self, step, metrics):
      if step == 2:
        os.kill(os.getpid(), signal.SIGTERM)

  config = grpo_arith.get_config('tiny')
  config.telemetry.console = config.telemetry.tensorboard = False
  config.rewards.num_workers = 0
  with pytest.raises(runs.Preempted, match='SIGTERM after step 2'):
    trainer.run(config, str(tmp_path), hooks_extra=[Term()])
  with open(tmp_path / 'incidents.md') as f:
    assert f.read().startswith('# Failure monitor report: grpo_arith\n\n0 incident(s)')
  assert os.path.isfile(tmp_path / 'run.png')
  messages = [r['text'] for r in read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='message')]
  assert 'failure monitor: 0 incident(s)' in messages


def test_a_setup_sigterm_that_python_drops_still_stops_before_the_first_step(tmp_path, capsys):
  """SIGTERM in set-up can land while a gc callback runs (jax registers one), where Python
  drops the exception the handler raises (it printed 'Exception ignored in
  <function _xla_gc_callback>' and a traceback): the run then trained to the end and exited 0.
  Now the step loop does not start: exit 75, no checkpoint, the usual line and no traceback.
  In process: a gc callback sends the signal once the set-up handler is in place."""
  import gc   # pylint: disable=g-import-not-at-top
  from rft_jax import main, runs   # pylint: disable=g-import-not-at-top
  sent = []

  def in_gc(phase, info):
    del info
    if phase == 'start' and not sent and signal.getsignal(signal.SIGTERM) is runs.preempt_at_once:
      sent.append(1)
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(1000):   # the handler runs here, inside the callback
        pass

  workdir = str(tmp_path / 'w')
  gc.callbacks.append(in_gc)
  try:
    status = main.main(['main', *command(workdir)[3:], '--config.train.steps=2'])
  finally:
    gc.callbacks.remove(in_gc)
  err = capsys.readouterr().err
  assert sent and status == 75, err
  assert err.strip().splitlines()[-1].startswith('stopped: SIGTERM outside the step loop'), err
  assert 'Traceback' not in err and 'Exception ignored' not in err, err
  assert not os.path.isdir(os.path.join(workdir, 'checkpoints', '1'))
