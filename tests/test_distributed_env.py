"""Multi-host variables that cannot start jax.distributed: one line naming the variable, exit 2
(were tracebacks from int() or from inside JAX, exit 1)."""
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from rft_jax.parallel import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('env,message', [
    ({'JAX_NUM_PROCESSES': 'two', 'JAX_PROCESS_ID': '0'},
     "JAX_NUM_PROCESSES='two': expected an integer >= 1"),
    ({'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '-1'},
     "JAX_PROCESS_ID='-1': expected an integer >= 0"),
    ({'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '2'},
     'JAX_PROCESS_ID=2: must be below JAX_NUM_PROCESSES=2'),
])
def test_bad_variable_is_named(env, message):
  with pytest.raises(distributed.DistributedEnvError) as e:
    distributed.initialize_from_env({'JAX_COORDINATOR_ADDRESS': 'localhost:1', **env})
  assert str(e.value) == message


def test_no_variables_is_one_process():
  assert not distributed.initialize_from_env({})


@pytest.mark.parametrize('variables', [
    {'RFT_DISTRIBUTED': '1'},
    # Without the address these two were ignored: every host trained alone, all of them in the
    # same shared workdir.
    {'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '1'}])
def test_main_exits_2_when_no_cluster_is_found(tmp_path, variables):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('JAX_COORDINATOR', 'JAX_NUM_PROC', 'JAX_PROCESS', 'SLURM_',
                              'OMPI_', 'TPU_', 'RFT_DISTRIBUTED'))}
  result = subprocess.run(
      [sys.executable, '-m', 'rft_jax.main', '--config', 'grpo_arith:tiny', '--workdir',
       str(tmp_path / 'run')], cwd=ROOT, env={**env, **variables, 'JAX_PLATFORMS': 'cpu'},
      capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  names = ' '.join(f'{k}={v!r}' for k, v in variables.items())
  assert result.stderr.startswith(f'error: {names}: jax.distributed cannot start'), (
      result.stderr[-2000:])
  assert 'Traceback' not in result.stderr


def _alone(process_id: int, **extra) -> subprocess.Popen:
  """`python -m rft_jax.main` as process process_id of 2, the other never started."""
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if not k.startswith(('JAX_', 'RFT_DISTRIBUTED'))}
  env.update(JAX_PLATFORMS='cpu', JAX_COORDINATOR_ADDRESS=f'localhost:{port}',
             JAX_NUM_PROCESSES='2', JAX_PROCESS_ID=str(process_id), **extra)
  return subprocess.Popen(
      [sys.executable, '-m', 'rft_jax.main', '--config', 'grpo_arith:tiny', '--workdir',
       os.devnull + '-unused'], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def test_a_process_whose_peers_never_come_exits_2_with_one_line():
  """JAX waited 300 s, then aborted the process from C++ (a 'Check failure' stack dump, no
  exit status of ours); now RFT_DISTRIBUTED_TIMEOUT_S bounds the wait with one line."""
  proc = _alone(0, RFT_DISTRIBUTED_TIMEOUT_S='2')
  try:
    _, err = proc.communicate(timeout=150)
  finally:
    proc.kill()
  assert proc.returncode == 2, err[-2000:]
  assert err.splitlines()[-1].startswith(
      'error: JAX_COORDINATOR_ADDRESS=localhost:') and (
      'JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0: not every process connected within 2 s') in err
  assert 'Check failure' not in err and 'Traceback' not in err


def test_sigterm_while_waiting_for_the_other_processes_stops_at_once():
  """jax.distributed.initialize blocks in C++, where Python's signal handlers never ran: a
  SIGTERM (timeout, scancel) left the process waiting out JAX's 300 s."""
  proc = _alone(1)
  lines: queue.Queue = queue.Queue()
  reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True)
  reader.start()
  deadline, seen = time.monotonic() + 120, []
  try:
    while not any(x.startswith('waiting for every process') for x in seen):
      seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
  finally:
    proc.kill()
  reader.join(timeout=30)   # stderr closed: it has read what was left
  while not lines.empty():
    seen.append(lines.get())
  assert seen[-1].startswith('stopped: SIGTERM'), seen


@pytest.mark.parametrize('env, want', [
    ({}, False), ({'RFT_DISTRIBUTED': '0'}, False), ({'RFT_DISTRIBUTED': '1'}, True),
    ({'RFT_DISTRIBUTED': 'true'}, True), ({'JAX_COORDINATOR_ADDRESS': 'h:1'}, True),
    ({'JAX_NUM_PROCESSES': '2'}, True), ({'JAX_PROCESS_ID': '1'}, True),
    ({'JAX_NUM_PROCESSES': '1', 'JAX_PROCESS_ID': '0'}, False)])
def test_one_rule_says_whether_a_run_is_multi_process(env, want, monkeypatch):
  """distributed.requested: initialize_from_env starts jax.distributed exactly when it says so,
  and --validate_only's mesh check (components.check_mesh) leaves the device count open then."""
  import jax  # pylint: disable=g-import-not-at-top
  from rft_jax import api, components  # pylint: disable=g-import-not-at-top
  assert distributed.requested(env) is want
  if not want:
    assert distributed.initialize_from_env(env) is False
  for name in ('JAX_COORDINATOR_ADDRESS', 'RFT_DISTRIBUTED', 'JAX_NUM_PROCESSES',
               'JAX_PROCESS_ID'):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  config = api.load_config('grpo_arith:tiny', {'mesh.data': 2 * jax.device_count()})
  if want:   # the other hosts' devices are not known here
    components.check_mesh(config, components.model_config(config))
  else:
    with pytest.raises(components.SetupError, match='devices'):
      components.check_mesh(config, components.model_config(config))


@pytest.mark.parametrize('recipe,message', [
    ('grpo_arith:tiny', 'config.rollout.prompts_per_step=4'),
    ('sft_arith:tiny', 'config.sft.batch_size=64'),
    ('dpo_arith:tiny', 'config.dpo.batch_size=16'),
    ('online_dpo_arith:tiny', 'config.rollout.prompts_per_step='),
])
def test_validate_names_a_batch_the_processes_cannot_split(recipe, message, monkeypatch,
                                                           capsys):
  """A process count that does not divide the batch each process reads a share of was caught
  only when the run started (components.process_share); --validate_only and api.validate now
  say so in one line naming the key, with JAX_NUM_PROCESSES set for a run about to start."""
  from rft_jax import api, main as main_lib  # pylint: disable=g-import-not-at-top
  for name in ('JAX_COORDINATOR_ADDRESS', 'RFT_DISTRIBUTED', 'JAX_PROCESS_ID'):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('JAX_NUM_PROCESSES', '3')
  monkeypatch.chdir(ROOT)
  assert main_lib.main(['main', '--config', recipe, '--validate_only']) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: {message}') and err.count('\n') == 1, err
  assert err.rstrip().endswith(' is not divisible by the 3 processes of JAX_NUM_PROCESSES (each '
                               'reads an equal share of every batch); make it a multiple of 3')
  with pytest.raises(api.SetupError) as e:
    api.validate(api.load_config(recipe))
  assert f'error: {e.value}\n' == err


@pytest.mark.parametrize('env,count', [({'JAX_NUM_PROCESSES': '2'}, 2), ({}, None),
                                       ({'RFT_DISTRIBUTED': '1'}, None)])
def test_validate_passes_a_batch_the_processes_split_or_an_unknown_count(env, count,
                                                                         monkeypatch):
  """4 prompts over 2 processes pass; with the count not known before jax.distributed starts
  (RFT_DISTRIBUTED=1 alone) the run checks it as it starts."""
  from rft_jax import api  # pylint: disable=g-import-not-at-top
  for name in ('JAX_COORDINATOR_ADDRESS', 'RFT_DISTRIBUTED', 'JAX_NUM_PROCESSES',
               'JAX_PROCESS_ID'):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  assert distributed.known_process_count()[0] == (count or (None if env else 1))
  assert api.validate(api.load_config('grpo_arith:tiny')) is None


def test_validate_uses_the_process_count_of_an_initialised_jax_distributed(monkeypatch):
  """After jax.distributed.initialize (a notebook on a pod) the count is jax.process_count()."""
  import jax  # pylint: disable=g-import-not-at-top
  from rft_jax import api  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('RFT_DISTRIBUTED', '1')   # its variables, read no more
  monkeypatch.setattr(jax.distributed, 'is_initialized', lambda: True)
  monkeypatch.setattr(jax, 'process_count', lambda: 8)
  assert distributed.known_process_count() == (8, '')
  with pytest.raises(api.SetupError, match=r'^config.rollout.prompts_per_step=4 is not '
                     r'divisible by the 8 processes \(each reads'):
    api.validate(api.load_config('grpo_arith:tiny'))
  monkeypatch.setenv('JAX_NUM_PROCESSES', 'x')   # not read either: no error (no init_from:
  # orbax reads it through the jax.distributed this test only pretends to have)
  assert api.validate(api.load_config('grpo_arith:tiny', {'rollout.prompts_per_step': 8,
                                                          'init_from': ''})) is None


def test_validate_names_a_bad_process_count_variable(monkeypatch):
  from rft_jax import api  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('JAX_NUM_PROCESSES', 'x')
  with pytest.raises(api.SetupError, match=r"^JAX_NUM_PROCESSES='x': expected an integer >= 1$"):
    api.validate(api.load_config('grpo_arith:tiny'))


def test_validate_only_says_the_mesh_is_not_checked_against_other_hosts_devices(
    monkeypatch, capsys):
  """With JAX_NUM_PROCESSES=2, a mesh of 16 devices (1 here) printed a bare 'config OK' (the
  other hosts' devices are not known before jax.distributed starts); the run then exited 2."""
  from rft_jax import main as main_lib  # pylint: disable=g-import-not-at-top
  for name in ('JAX_COORDINATOR_ADDRESS', 'RFT_DISTRIBUTED', 'JAX_PROCESS_ID'):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('JAX_NUM_PROCESSES', '2')
  monkeypatch.chdir(ROOT)
  assert main_lib.main(['main', '--config', 'grpo_arith:tiny', '--config.mesh.data=16',
                        '--validate_only']) == 0
  out = capsys.readouterr().out
  assert out.startswith('config OK (') and 'against the devices of all the processes when ' \
      'the run starts' in out, out
  monkeypatch.delenv('JAX_NUM_PROCESSES')   # one process: the devices are checked, no note
  assert main_lib.main(['main', '--config', 'grpo_arith:tiny', '--validate_only']) == 0
  assert capsys.readouterr().out == 'config OK\n'
