"""`python -m tools.checkpoint rewind RUN --step N`: back to a checkpoint, resumed exactly."""
import json
import os
import re

import numpy as np
import pytest

from rft_jax import incidents, rewind, trainer, workdir_lock
from rft_jax.telemetry.sinks import read_jsonl
from test_trainer import tiny_config, train_rows
from tools import checkpoint as checkpoint_tool

KEYS = ('reward/mean', 'loss', 'kl', 'entropy', 'grad_norm', 'response/len_mean',
        'compute/flops_cumulative')


def run_tool(capsys, *args):
  """tools.checkpoint rewind ARGS -> (exit status, stdout, stderr)."""
  code = 0
  try:
    checkpoint_tool.main(['rewind', *map(str, args)])
  except SystemExit as e:
    code = e.code
  out, err = capsys.readouterr()
  return code, out, err


def fake_run(path, steps=(2, 4, 6)):
  """A run directory as rewind sees it: config.json and checkpoint step directories (without
  manifests: unverified, as an older rft_jax wrote them)."""
  os.makedirs(path)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump({'name': 'grpo_arith', 'train': {'steps': 6}}, f)
  for s in steps:
    os.makedirs(os.path.join(path, 'checkpoints', str(s), 'state'))
  return str(path)


def test_a_rewound_finished_run_trains_again_exactly_from_the_step(tmp_path, capsys):
  """A finished 4-step run rewound to its step-2 checkpoint: the same command trains steps 3-4
  again (not 'already complete'), with the metrics of the uninterrupted run (kept, with its
  checkpoint 4 and summary, in checkpoints.rewound/)."""
  workdir = str(tmp_path / 'run')
  config = tiny_config(**{'train.steps': 4, 'train.ckpt_every': 2, 'train.keep_checkpoints': 5})
  first = trainer.run(config, workdir)
  code, out, err = run_tool(capsys, workdir, '--step', 2)
  assert (code, err) == (0, '')
  assert len(out.splitlines()) == 1 and out.startswith(f'rewound {workdir} to checkpoint 2: ')
  assert 'run the same training command' in out
  [kept] = os.listdir(os.path.join(workdir, rewind.REWOUND))
  kept = os.path.join(workdir, rewind.REWOUND, kept)
  assert kept in out
  assert sorted(os.listdir(kept)) == ['4', 'incidents.md', 'metrics.jsonl', 'summary.json']
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']
  assert not os.path.exists(os.path.join(workdir, 'summary.json'))
  full = train_rows(kept)   # the uninterrupted run's records

  again = trainer.run(config, workdir)
  messages = [m['text'] for m in read_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                                            kind='message')]
  assert 'resumed from checkpoint at step 2' in messages
  assert not [m for m in messages if 'already complete' in m]
  rows = train_rows(workdir)
  assert sorted(rows) == [1, 2, 3, 4]
  steps = [r['step'] for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')]
  assert steps == [1, 2, 3, 4]   # steps 3-4 once: the set-aside run's records were dropped
  for step in (3, 4):
    for k in KEYS:
      np.testing.assert_allclose(rows[step][k], full[step][k], rtol=1e-5, atol=1e-7,
                                 err_msg=f'{k} at step {step}')
  for name in ('summary.json', 'incidents.md'):   # the trained-again run's own
    assert os.path.exists(os.path.join(workdir, name)), name
  assert again['steps'] == 4
  for k in ('base_greedy_acc', 'final_greedy_acc'):
    assert again[k] == first[k], k


def test_a_rewind_to_a_step_that_is_no_checkpoint_is_refused(tmp_path, capsys):
  workdir = fake_run(tmp_path / 'run')
  code, out, err = run_tool(capsys, workdir, '--step', 3)
  assert code == 2 and out == ''
  assert err == (f'error: no checkpoint at step 3 in {workdir}/checkpoints (there: 2, 4, 6)\n')
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4', '6']
  assert not os.path.exists(os.path.join(workdir, rewind.REWOUND))


def test_a_rewind_of_a_directory_that_is_no_run_is_refused(tmp_path, capsys):
  other = tmp_path / 'notes'
  os.makedirs(other / 'checkpoints' / '2')
  (other / 'config.json').write_text('{"architectures": ["Qwen2ForCausalLM"]}')
  code, _, err = run_tool(capsys, other, '--step', 2)
  assert code == 2 and err == f'error: {other} is not a run directory (no config.json of an ' \
                              'rft_jax run)\n'
  code, _, err = run_tool(capsys, tmp_path / 'missing', '--step', 2)
  assert code == 2 and 'is not a run directory' in err and len(err.splitlines()) == 1
  assert os.listdir(other / 'checkpoints') == ['2']


def test_a_rewind_of_a_run_in_use_is_refused(tmp_path, capsys):
  workdir = fake_run(tmp_path / 'run')
  with workdir_lock.held(workdir):   # as a training process holds it
    code, _, err = run_tool(capsys, workdir, '--step', 2)
  assert code == 2 and err.startswith(f'error: {workdir} is in use by a running rft_jax ')
  assert len(err.splitlines()) == 1
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4', '6']


def test_a_rewind_to_a_damaged_checkpoint_is_refused(tmp_path, capsys):
  workdir = fake_run(tmp_path / 'run')
  with open(os.path.join(workdir, 'checkpoints', '4', 'rft_manifest.json'), 'w') as f:
    json.dump({'step': 4, 'files': {'state/x': [3, 0]}}, f)
  code, _, err = run_tool(capsys, workdir, '--step', 4)
  assert code == 2 and 'checkpoint 4 in' in err and 'damaged (missing file state/x)' in err
  code, out, _ = run_tool(capsys, workdir, '--step', 2)   # one before it: 4 and 6 set aside
  assert code == 0 and 'checkpoint(s) 4, 6 moved to' in out
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == ['2']
  code, out, _ = run_tool(capsys, workdir, '--step', 2)   # again: nothing left to set aside
  assert code == 0 and 'nothing set aside' in out


def test_a_rewind_of_a_finished_run_to_its_latest_checkpoint_says_it_finished(tmp_path, capsys):
  """Nothing to set aside; 'run the same command to resume' was wrong there: that command
  answers 'run already complete'."""
  workdir = fake_run(tmp_path / 'run')
  with open(os.path.join(workdir, 'summary.json'), 'w') as f:
    json.dump({'steps': 6}, f)
  code, out, _ = run_tool(capsys, workdir, '--step', 6)
  assert code == 0 and 'nothing set aside; the run finished there (summary.json)' in out, out
  assert 'resume' not in out and os.path.isfile(os.path.join(workdir, 'summary.json'))


def test_the_halt_message_names_the_rewind_to_the_checkpoint_before_the_onset():
  text = incidents.halt_checkpoints([4, 8, 12], 10, '/runs/a')
  assert text.endswith('; checkpoint(s) 12 from after it may carry the fault; to resume from '
                       'step 8 instead (e.g. with a lower --config.optim.lr), first: '
                       'python -m tools.checkpoint rewind /runs/a --step 8')
  # nothing after the onset (the same command resumes from step 8), or nothing before it
  assert 'rewind' not in incidents.halt_checkpoints([4, 8], 10, '/runs/a')
  assert 'rewind' not in incidents.halt_checkpoints([12], 10, '/runs/a')


@pytest.mark.parametrize('argv', [['rewind', '/x'], ['rewind', '/x', '--step', 'two']])
def test_rewind_arguments_are_checked_in_one_line(argv, capsys):
  with pytest.raises(SystemExit) as e:
    checkpoint_tool.main(argv)
  assert e.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1


def test_a_halted_run_rewound_as_its_message_says_resumes_before_the_onset(tmp_path, capsys):
  """The halt names the rewind to the latest checkpoint before the fault's onset; after it, the
  same command with a lower learning rate (and here the injected fault gone) resumes from that
  checkpoint, and the incidents of the steps set aside are no longer the run's."""
  from test_monitor_live import faulty_config  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  with pytest.raises(trainer.TrainingError) as e:
    trainer.run(faulty_config('halt'), workdir)
  found = re.search(r'first: python -m tools\.checkpoint rewind (\S+) --step (\d+);', str(e.value))
  assert found, str(e.value)
  assert found[1] == workdir
  step = int(found[2])
  halted = [x for x in read_jsonl(os.path.join(workdir, 'incidents.jsonl'))
            if x['kind'] == 'incident']
  assert step < min(x['onset_step'] for x in halted)
  capsys.readouterr()
  code, out, _ = run_tool(capsys, workdir, '--step', step)
  assert code == 0 and f'resume from step {step}' in out
  config = faulty_config('halt')
  config.faults = []
  config.optim.lr = config.optim.lr / 10
  summary = trainer.run(config, workdir)
  assert summary['steps'] == config.train.steps
  messages = [m['text'] for m in read_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                                            kind='message')]
  assert f'resumed from checkpoint at step {step}' in messages
  kept = [x for x in read_jsonl(os.path.join(workdir, 'incidents.jsonl'))
          if x['kind'] == 'incident']
  assert not [x for x in kept if x in halted and x['step'] > step]
