"""tools.faultbench's flags: a value that would crash, hang or run nothing is a usage error
(exit 2) before any run starts. Were: tracebacks (--faults nosuch, --seeds x, --rescore of a
missing dir), a hang (--jobs 0), and exit 0 with an empty report (--modes bogus, or filters
that leave none of the suite's runs)."""
import json

import pytest

from tools import faultbench


@pytest.mark.parametrize('argv,message', [
    (['--faults', 'nosuch'], "--faults: unknown ['nosuch']"),
    (['--seeds', 'x'], "--seeds='x': expected comma-separated integers"),
    (['--seeds', ''], "--seeds='': expected comma-separated integers"),
    (['--jobs', '0'], '--jobs=0: must be >= 1'),
    (['--run-timeout-s', '0'], '--run-timeout-s=0: must be > 0'),
    (['--modes', 'bogus'], "--modes='bogus': the modes are warn and auto"),
    (['--faults', 'healthy', '--modes', 'auto'], 'leave no run of the ci suite'),
])
def test_bad_flags_are_usage_errors(tmp_path, capsys, argv, message):
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--suite', 'ci', '--out', str(tmp_path / 'out'), *argv])
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err, err
  assert not (tmp_path / 'out').exists()   # nothing ran, no empty report


def test_rescore_of_a_missing_dir_is_a_usage_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--rescore', '--out', str(tmp_path)])
  assert e.value.code == 2 and '--rescore: no ' in capsys.readouterr().err


def test_the_reports_command_is_the_module_command(tmp_path, capsys):
  """Command: `python -m tools.faultbench ...` with the arguments given (was sys.argv joined:
  the script's path, or pytest's own arguments when main(argv) ran in process)."""
  (tmp_path / 'results.jsonl').write_text(json.dumps(
      {'fault': 'healthy', 'family': 'healthy', 'seed': 1, 'onset': 20, 'mode': 'warn',
       'steps': 60, 'final_acc': 0.9, 'error': None, 'incidents': []}) + '\n')
  assert faultbench.main(['--rescore', '--out', str(tmp_path)]) == 0
  capsys.readouterr()
  report = (tmp_path / 'report.md').read_text()
  assert f'Command: `python -m tools.faultbench --rescore --out {tmp_path}`' in report, report


def test_a_folder_of_a_runs_name_that_is_not_a_run_is_refused_not_deleted(tmp_path, capsys):
  """Each run's workdir <out>/runs/<name> was rmtree'd whatever it held: a folder of the user's
  with that name was deleted. Now only a run directory an earlier invocation left (it has a
  run's config.json, or no file at all) is; anything else is refused, exit 2, before any run."""
  [spec] = faultbench.plan('ci', [1], ['healthy'])
  victim = tmp_path / 'runs' / spec['name']
  victim.mkdir(parents=True)
  (victim / 'config.json').write_text('{"architectures": ["LlamaForCausalLM"]}')   # a HF model
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--suite', 'ci', '--out', str(tmp_path), '--faults', 'healthy'])
  err = capsys.readouterr().err
  assert e.value.code == 2 and f'{victim} exists and is not a run directory' in err, err
  assert (victim / 'config.json').exists() and not (tmp_path / 'results.jsonl').exists()
