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


@pytest.mark.parametrize('argv,message', [
    (['--set', 'nosuch=1'], '--set nosuch=1: expected KNOB=VALUE with a monitor knob; knobs:'),
    (['--set', 'persistence=2.5'], '--set persistence=2.5: monitor.persistence takes an int'),
    (['--set', 'cusum_h=0'], 'monitor.cusum_h=0.0: must be > 0'),
    (['--rescore', '--set', 'cusum_h=6'], '--set applies to new runs'),
])
def test_bad_monitor_knobs_are_usage_errors(tmp_path, capsys, argv, message):
  """tools.monitor_replay's --set parser and the knobs' ranges (rft_jax/monitor/knobs.py)."""
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--suite', 'ci', '--out', str(tmp_path / 'out'), *argv])
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err and 'Traceback' not in err, err
  assert not (tmp_path / 'out').exists()


def test_monitor_knobs_reach_every_run_the_record_and_the_report(tmp_path, monkeypatch, capsys):
  """--set KNOB=VALUE: each run's config.monitor.<knob> (the benchmark had no way to run with
  knobs other than the recipe's), kept in its results.jsonl record and the report's command."""
  seen = []

  def fake_run_all(specs, out, jobs, run_timeout_s):   # the configs the runs would train
    assert all(s['monitor'] == {'cusum_h': 6.0, 'persistence': 3} for s in specs)   # recorded
    seen.extend(faultbench.make_config(s).monitor for s in specs)
    return [faultbench.record(s, out, {'final_greedy_acc': 0.9}, None, 1.0) for s in specs]
  monkeypatch.setattr(faultbench, 'run_all', fake_run_all)
  argv = ['--suite', 'ci', '--out', str(tmp_path), '--faults', 'healthy,mask_shift',
          '--set', 'cusum_h=6', '--set', 'persistence=3']
  assert faultbench.main(argv) == 0
  capsys.readouterr()
  assert len(seen) == 2 and all(m.cusum_h == 6.0 and m.persistence == 3 for m in seen)
  report = (tmp_path / 'report.md').read_text()
  assert ('Command: `python -m tools.faultbench --suite ci --out '
          f'{tmp_path} --faults healthy,mask_shift --set cusum_h=6 --set persistence=3`') in report
  [spec] = faultbench.plan('ci', [1], ['healthy'])
  assert 'monitor' not in spec and 'cusum_h' not in faultbench.make_config(spec).monitor
