"""tools.monitor_replay's arguments: a bad --warmup is one line and exit 2, never a traceback."""
import json

import pytest

from tools import monitor_replay


@pytest.mark.parametrize('warmup', ['1', '0', '-3'])
def test_a_warmup_below_the_monitors_minimum_is_one_line(tmp_path, capsys, warmup):
  """The monitor's robust warm-up fit needs 2 observations (monitor.warmup must be >= 2 in a
  config too); --warmup 1 used to end in a JAX gather TypeError traceback."""
  log = tmp_path / 'metrics.jsonl'
  log.write_text(''.join(json.dumps({'step': s, 'kind': 'train', 'reward/mean': 0.5,
                                     'kl': 0.01}) + '\n' for s in range(1, 6)))
  assert monitor_replay.main([str(log), '--warmup', warmup,
                              '--out', str(tmp_path / 'out')]) == 2
  err = capsys.readouterr().err
  assert err == f'error: --warmup={warmup}: must be at least 2 (as monitor.warmup)\n', err
