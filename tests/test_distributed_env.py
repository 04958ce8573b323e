"""Multi-host variables that cannot start jax.distributed: one line naming the variable, exit 2
(were tracebacks from int() or from inside JAX, exit 1)."""
import os
import subprocess
import sys

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
