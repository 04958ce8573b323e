"""tools.faultbench --replay SRC: the warn-mode runs an earlier invocation kept, rescored with the
monitor replayed over their metrics.jsonl under other knobs (--set), without rerunning them.
Was: no way to rescore kept runs under other knobs (--rescore refused --set)."""
import json

import numpy as np
import pytest

from tools import faultbench

ONSET = 25


def kept_run(src, name, monitor, fault='reward_noise'):
  """A kept run: SRC/runs/<name>/{config.json, metrics.jsonl}; reward 0.5 (+-0.01) that
  collapses to 0.1 at ONSET. Returns its results.jsonl record."""
  run = src / 'runs' / name
  run.mkdir(parents=True)
  (run / 'config.json').write_text(json.dumps({'monitor': monitor}))
  rng = np.random.default_rng(0)
  rewards = [0.5 + 0.01 * rng.standard_normal() if s < ONSET else 0.1 for s in range(1, 41)]
  (run / 'metrics.jsonl').write_text(''.join(
      json.dumps({'step': s, 'kind': 'train', 'reward/mean': r}) + '\n'
      for s, r in enumerate(rewards, 1)))
  mode = name.rsplit('-', 1)[1]
  return {'fault': fault, 'family': 'reward', 'seed': 3, 'onset': ONSET, 'mode': mode,
          'steps': 40, 'name': name, 'steps_done': 40, 'steps_observed': 40,
          'steps_observed_before_onset': ONSET - 1, 'final_acc': 0.9, 'error': None,
          'incidents': [{'step': 2, 'onset_step': 1, 'fault_class': 'x', 'signature': 'x',
                         'severity': 'warn'}]}   # the live run's: replaced by the replay's


@pytest.fixture(name='src')
def fixture_src(tmp_path):
  """A kept warn-mode run whose own knobs (config.json) make its monitor deaf, and an auto-mode
  run (whose training the monitor changed: not replayable)."""
  src = tmp_path / 'src'
  deaf = {'warmup': 10, 'cusum_h': 1000.0, 'z_thresh': 1000.0}
  records = [kept_run(src, 'reward_noise-s3-warn', deaf),
             kept_run(src, 'reward_noise-s3-auto', deaf)]
  (src / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  return src


def replayed(out):
  with open(out / 'results.jsonl') as f:
    return [json.loads(line) for line in f]


def test_replay_uses_the_runs_knobs_then_the_set_ones(src, tmp_path, capsys):
  out = tmp_path / 'deaf'
  assert faultbench.main(['--replay', str(src), '--out', str(out)]) == 0
  assert '(1 auto-mode or failed runs left out)' in capsys.readouterr().out
  [rec] = replayed(out)
  assert rec['name'] == 'reward_noise-s3-warn' and rec['incidents'] == []
  assert json.loads((out / 'score.json').read_text())['overall']['tp'] == 0

  out = tmp_path / 'default'
  assert faultbench.main(['--replay', str(src), '--out', str(out), '--set', 'cusum_h=8',
                          '--set', 'z_thresh=4']) == 0
  capsys.readouterr()
  [rec] = replayed(out)
  first = rec['incidents'][0]
  assert first['fault_class'] == 'reward_collapse' and ONSET <= first['step'] <= ONSET + 5
  assert set(first) == {'step', 'onset_step', 'fault_class', 'signature', 'severity'}
  assert rec['monitor'] == {'cusum_h': 8.0, 'z_thresh': 4.0}
  score = json.loads((out / 'score.json').read_text())
  assert score['overall']['tp'] == 1 and score['false_alarms']['alarms'] == 0
  assert 'Command: `python -m tools.faultbench --replay' in (out / 'report.md').read_text()
  assert len(replayed(src)) == 2   # the source's records are left as they were


@pytest.mark.parametrize('argv,message', [
    (['--out', '{src}'], 'give another --out'),
    (['--out', '{tmp}/o', '--rescore'], '--replay and --rescore: give one'),
    (['--out', '{tmp}/o', '--set', 'cusum_h=0'], 'monitor.cusum_h=0.0: must be > 0'),
])
def test_bad_replay_flags_are_usage_errors(src, tmp_path, capsys, argv, message):
  argv = [a.format(src=src, tmp=tmp_path) for a in argv]
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--replay', str(src), *argv])
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err and 'Traceback' not in err, err
  assert not (tmp_path / 'o').exists()


def test_a_kept_run_without_its_log_is_one_line(src, tmp_path, capsys):
  (src / 'runs' / 'reward_noise-s3-warn' / 'metrics.jsonl').unlink()
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--replay', str(src), '--out', str(tmp_path / 'o')])
  err = capsys.readouterr().err
  assert e.value.code == 2 and '--replay: run reward_noise-s3-warn: ' in err, err
  assert 'metrics.jsonl' in err and len(err.strip().splitlines()[-1]) < 300
  with pytest.raises(SystemExit) as e:
    faultbench.main(['--replay', str(tmp_path / 'nosuch'), '--out', str(tmp_path / 'o')])
  assert e.value.code == 2 and 'results.jsonl (--replay names' in capsys.readouterr().err
