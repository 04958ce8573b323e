"""tools.bench_layers: a bad flag is one usage line, exit 2, before anything compiles (were
tracebacks for --layers x / 0 and --remat bogus; --repeats 0 printed nan step times)."""
import pytest

from tools import bench_layers


@pytest.mark.parametrize('argv,message', [
    (['--layers', 'x'], "--layers='x': expected comma-separated integers >= 1"),
    (['--layers', '0'], "--layers='0': expected comma-separated integers >= 1"),
    (['--remat', 'none,bogus'], "--remat='none,bogus': unknown ['bogus']"),
    (['--repeats', '0'], '--repeats=0: must be >= 1'),
    (['--seq', '0'], '--seq=0: must be >= 1'),
])
def test_bad_flags_are_usage_errors(capsys, argv, message):
  with pytest.raises(SystemExit) as e:
    bench_layers.main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err, err
