"""tools.bench_mesh refuses what it cannot time in one usage line, exit 2 (--repeats 0 was a
StatisticsError traceback; an SFT, DPO or PPO recipe an AttributeError/KeyError traceback)."""
import os
import subprocess
import sys

import jax  # noqa: F401  (first: importing tools.bench_mesh without JAX would set XLA_FLAGS)
import pytest

from tools import bench_mesh
import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('args,message', [
    (['--repeats', '0'], '--repeats=0: must be >= 1'),
    (['--config', 'configs/sft_arith.py:tiny'], 'for the GRPO-family recipes'),
    (['--config', 'configs/dpo_arith.py:tiny'], 'for the GRPO-family recipes'),
    (['--config', 'configs/ppo_arith.py:tiny'], 'for the GRPO-family recipes'),
])
def test_bad_arguments_are_usage_errors(monkeypatch, capsys, args, message):
  monkeypatch.setattr('sys.argv', ['bench_mesh', '--meshes', '1x1x1', *args])
  with pytest.raises(SystemExit) as e:
    bench_mesh.main()
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err, err


def test_a_mesh_the_runs_microbatches_cannot_split_is_skipped_with_the_runs_message(tmp_path):
  """bench_mesh skips a mesh by the trainer's own rule (components.check_batch_splits): 16 rollout
  rows over data=8 in algo.microbatches=4 cannot be split (its own check counted data*fsdp only,
  and the train step then failed inside jit)."""
  recipe = tmp_path / 'mb4.py'
  recipe.write_text(
      'from configs import grpo_arith\n\n\ndef get_config(arg=""):\n'
      '  config = grpo_arith.get_config("tiny")\n  config.algo.microbatches = 4\n'
      '  return config\n')
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu',
             XLA_FLAGS=xla_flags.with_cpu_devices(8))
  done = subprocess.run(
      [sys.executable, '-m', 'tools.bench_mesh', '--config', str(recipe), '--meshes', '8x1x1',
       '--repeats', '1'], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  line = [l for l in done.stdout.splitlines() if l.strip().startswith('8x1x1')]
  assert line and 'skipped' in line[0] and 'algo.microbatches=4' in line[0], done.stdout
