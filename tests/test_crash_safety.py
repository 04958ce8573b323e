"""kill -9 at random moments, some of them while a checkpoint is being written: after each
restart the run goes on from its last complete checkpoint, and the finished run's metrics equal
those of a run that was never interrupted. The default suite kills the run 3 times (one
kill during a checkpoint write); `make test-all` also kills it 10 times (>= 3 during
writes)."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rft_jax.telemetry.sinks import read_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 24   # ~60 ms each: the run's cost is its processes' start-ups, one per kill
KEYS = ('reward/mean', 'loss', 'kl', 'entropy', 'grad_norm', 'response/len_mean')


def command(workdir):
  return [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/grpo_arith.py:tiny',
          f'--config.train.steps={STEPS}', '--config.train.eval_every=12',
          '--config.train.ckpt_every=3', '--config.telemetry.console=False',
          '--config.telemetry.tensorboard=False', '--config.rewards.num_workers=0',
          '--workdir', workdir]


def train_rows(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return {}
  return {r['step']: r for r in read_jsonl(path, kind='train')}


def writing_checkpoint(ckpt_dir):
  """True while orbax's temporary directory exists or a step has no manifest yet."""
  if not os.path.isdir(ckpt_dir):
    return False
  for name in os.listdir(ckpt_dir):
    if 'tmp' in name:
      return True
    if name.isdigit() and not os.path.exists(os.path.join(ckpt_dir, name, 'rft_manifest.json')):
      return True
  return False


def kill_at(proc, workdir, during_write: bool, delay: float, rows_before: int):
  """SIGKILLs proc while a checkpoint is written, or `delay` s after it logs a new step.
  Returns a label of when, or None if the run finished first."""
  ckpt_dir = os.path.join(workdir, 'checkpoints')
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if during_write and writing_checkpoint(ckpt_dir):
      proc.send_signal(signal.SIGKILL)
      return 'during a checkpoint write'
    if not during_write and len(train_rows(workdir)) > rows_before:
      time.sleep(delay)
      proc.send_signal(signal.SIGKILL)
      return f'{delay:.2f}s after a step'
    time.sleep(0.002 if during_write else 0.05)
  return None


@pytest.mark.parametrize('kill_count', [3, pytest.param(10, marks=pytest.mark.slow)])
def test_sigkill_repeatedly_then_the_run_matches_an_uninterrupted_one(tmp_path, kill_count):
  """Every third kill (k = 1, 4, 7) lands while a checkpoint is written."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  crashed, clean = str(tmp_path / 'crashed'), str(tmp_path / 'clean')
  rng = random.Random(20261202)
  kills = []
  for k in range(kill_count):
    proc = subprocess.Popen(command(crashed), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    when = kill_at(proc, crashed, during_write=k % 3 == 1, delay=rng.uniform(0.0, 0.5),
                   rows_before=len(train_rows(crashed)))
    _, err = proc.communicate(timeout=120)
    if when is None:   # it finished before the kill: fine, but it must have finished cleanly
      assert proc.returncode == 0, err
      break
    assert proc.returncode == -signal.SIGKILL
    kills.append(when)
  # the run is long enough to be killed (nearly) every time: 3 of 3, 8 of 10
  assert len(kills) >= kill_count - kill_count // 5, kills
  assert sum(w.startswith('during') for w in kills) >= kill_count // 3, kills

  final = subprocess.run(command(crashed), cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
  assert final.returncode == 0, final.stderr
  reference = subprocess.run(command(clean), cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
  assert reference.returncode == 0, reference.stderr

  a, b = train_rows(crashed), train_rows(clean)
  assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    for key in KEYS:
      np.testing.assert_allclose(a[step][key], b[step][key], rtol=1e-6, atol=1e-8,
                                 err_msg=f'{key} at step {step} (kills: {kills})')
  with open(os.path.join(crashed, 'summary.json')) as f:
    s_crashed = json.load(f)
  with open(os.path.join(clean, 'summary.json')) as f:
    s_clean = json.load(f)
  for key in ('final_greedy_acc', 'final_mean@2_acc', 'base_greedy_acc', 'steps'):
    assert s_crashed[key] == s_clean[key], key
  evals = lambda d: [(r['step'], r['eval/greedy_acc']) for r in
                     read_jsonl(os.path.join(d, 'metrics.jsonl'), kind='eval')
                     if 'eval/greedy_acc' in r]
  assert evals(crashed) == evals(clean)
