"""tools.bench_mesh refuses what it cannot time in one usage line, exit 2 (--repeats 0 was a
StatisticsError traceback; an SFT, DPO or PPO recipe an AttributeError/KeyError traceback)."""
import jax  # noqa: F401  (first: importing tools.bench_mesh without JAX would set XLA_FLAGS)
import pytest

from tools import bench_mesh


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
