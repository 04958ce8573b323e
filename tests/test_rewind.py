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


def tree(path):
  """{relative path: file bytes, or None for a directory} of everything under `path`."""
  out = {}
  for root, dirs, files in os.walk(path):
    for d in dirs:
      out[os.path.relpath(os.path.join(root, d), path)] = None
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), path)] = f.read()
  return out


def set_aside_of(out):
  """The set-aside directory a rewind's message names."""
  return re.search(r'moved to (\S+);', out)[1]


def test_an_undone_rewind_puts_the_finished_run_back_as_it_was(tmp_path, capsys):
  """A finished run rewound to step 2, then undone: every file of the run directory is back
  (checkpoints, summary.json, incidents.md, the logs), and the same command says the run is
  complete with its own summary, as if the rewind never happened."""
  workdir = str(tmp_path / 'run')
  config = tiny_config(**{'train.steps': 4, 'train.ckpt_every': 2, 'train.keep_checkpoints': 5})
  trainer.run(config, workdir)
  before = tree(workdir)
  assert {'checkpoints/2', 'checkpoints/4', 'summary.json', 'metrics.jsonl'} <= set(before)
  code, out, _ = run_tool(capsys, workdir, '--step', 2)
  assert code == 0 and f'python -m tools.checkpoint rewind {workdir} --undo' in out
  code, out, err = run_tool(capsys, workdir, '--undo')
  assert (code, err) == (0, '') and len(out.splitlines()) == 1
  assert out.startswith(f'put back the rewind of {workdir} to step 2: checkpoint(s) 4 ')
  assert 'the run finished at step 4 (summary.json) as before' in out
  assert tree(workdir) == before   # checkpoints.rewound/ gone too: nothing else was in it
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  assert trainer.run(config, workdir) == summary
  messages = [m['text'] for m in read_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                                            kind='message')]
  assert [m for m in messages if m.startswith('run already complete (4/4 steps)')]
  code, _, err = run_tool(capsys, workdir, '--undo')   # nothing left to put back
  assert code == 2 and err == ('error: nothing to put back: no set-aside rewind in '
                               f'{workdir}/{rewind.REWOUND}\n')


def test_an_undo_after_the_run_went_on_is_refused_and_says_how_to_go_back(tmp_path, capsys):
  """Checkpoint 4 written since the rewind to 2: putting 4 and 6 back would mix two histories.
  Nothing moves; the two commands the refusal names bring the set-aside run back."""
  workdir = fake_run(tmp_path / 'run')
  (tmp_path / 'run' / 'checkpoints' / '4' / 'state' / 'old').write_text('first history')
  code, out, _ = run_tool(capsys, workdir, '--step', 2)
  name = os.path.basename(set_aside_of(out))
  os.makedirs(os.path.join(workdir, 'checkpoints', '4', 'state'))   # the resumed run's
  before = tree(workdir)
  code, out, err = run_tool(capsys, workdir, '--undo')
  assert code == 2 and out == '' and len(err.splitlines()) == 1
  assert err.startswith(f'error: {workdir} went on after its rewind to step 2: checkpoint(s) 4 '
                        'were written since')
  assert tree(workdir) == before
  found = re.findall(r'python -m tools\.checkpoint rewind (\S+) (--step \d+|--undo \S+)', err)
  assert found == [(workdir, '--step 2'), (workdir, f'--undo {name}')]
  for _, args in found:
    code, _, _ = run_tool(capsys, workdir, *args.split())
    assert code == 0
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4', '6']
  assert os.listdir(os.path.join(workdir, 'checkpoints', '4', 'state')) == ['old']
  [second] = os.listdir(os.path.join(workdir, rewind.REWOUND))   # the new history, kept
  assert os.listdir(os.path.join(workdir, rewind.REWOUND, second)) == ['4']


def test_undo_puts_rewinds_back_latest_first(tmp_path, capsys):
  """Rewound to 4, then to 2: the undo puts back 4 (the later rewind), the next one 6; the
  earlier one alone first is refused (its checkpoint 4 is set aside by the later one)."""
  workdir = fake_run(tmp_path / 'run')
  _, out, _ = run_tool(capsys, workdir, '--step', 4)
  first = os.path.basename(set_aside_of(out))
  run_tool(capsys, workdir, '--step', 2)
  code, _, err = run_tool(capsys, workdir, '--undo', first)
  assert code == 2 and 'checkpoint 4, from which' in err and 'is not in' in err
  assert '--undo)' in err and len(err.splitlines()) == 1
  code, _, err = run_tool(capsys, workdir, '--undo', 'no-such')
  assert code == 2 and err.startswith('error: no set-aside rewind no-such in ')
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']
  code, out, _ = run_tool(capsys, workdir, '--undo')
  assert code == 0 and 'to step 2: checkpoint(s) 4 ' in out
  assert 'resume from step 4' in out
  code, out, _ = run_tool(capsys, workdir, '--undo')
  assert code == 0 and 'to step 4: checkpoint(s) 6 ' in out
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4', '6']
  assert not os.path.exists(os.path.join(workdir, rewind.REWOUND))


def test_undo_moves_the_files_a_resume_wrote_since_aside(tmp_path, capsys):
  """A resume that wrote no checkpoint after step 2 (it stopped first) appended to the logs and
  wrote incidents.md: the undo restores the logs from their copies and moves those files to
  <set-aside>.replaced/, deleting nothing."""
  workdir = fake_run(tmp_path / 'run')
  (tmp_path / 'run' / 'metrics.jsonl').write_text('{"kind": "train", "step": 6}\n')
  _, out, _ = run_tool(capsys, workdir, '--step', 2)
  kept = set_aside_of(out)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
    f.write('{"kind": "train", "step": 3}\n')
  (tmp_path / 'run' / 'incidents.md').write_text('the resumed run stopped')
  code, out, _ = run_tool(capsys, workdir, '--undo')
  assert code == 0 and out.rstrip().endswith(
      f'incidents.md, metrics.jsonl written since the rewind moved to {kept}.replaced')
  assert (tmp_path / 'run' / 'metrics.jsonl').read_text() == '{"kind": "train", "step": 6}\n'
  assert not os.path.exists(os.path.join(workdir, 'incidents.md'))   # the rewind's run had none
  assert tree(kept + '.replaced') == {
      'metrics.jsonl': b'{"kind": "train", "step": 6}\n{"kind": "train", "step": 3}\n',
      'incidents.md': b'the resumed run stopped'}


def test_an_undo_of_a_run_in_use_is_refused(tmp_path, capsys):
  workdir = fake_run(tmp_path / 'run')
  run_tool(capsys, workdir, '--step', 2)
  with workdir_lock.held(workdir):   # as a training process holds it
    code, _, err = run_tool(capsys, workdir, '--undo')
  assert code == 2 and err.startswith(f'error: {workdir} is in use by a running rft_jax ')
  assert err.endswith('then undo the rewind\n') and len(err.splitlines()) == 1
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == ['2']


@pytest.mark.parametrize('harm, says', [
    ('manifest', 'is damaged: checkpoint 6 (missing file state/x); nothing put back'),
    ('stray', 'is damaged: notes.txt is nothing a rewind to step 2 sets aside'),
    ('summary', 'summary.json: not valid JSON'),
    ('no checkpoint', 'is incomplete: no checkpoint after step 2 in it'),
    ('no log copy', 'is incomplete: no copy of metrics.jsonl (the run has one')])
def test_an_undo_of_a_damaged_set_aside_is_refused(harm, says, tmp_path, capsys):
  workdir = fake_run(tmp_path / 'run')
  (tmp_path / 'run' / 'metrics.jsonl').write_text('')
  (tmp_path / 'run' / 'summary.json').write_text('{"steps": 6}')
  _, out, _ = run_tool(capsys, workdir, '--step', 2)
  kept = set_aside_of(out)
  if harm == 'manifest':
    with open(os.path.join(kept, '6', 'rft_manifest.json'), 'w') as f:
      json.dump({'step': 6, 'files': {'state/x': [3, 0]}}, f)
  elif harm == 'stray':
    with open(os.path.join(kept, 'notes.txt'), 'w') as f:
      f.write('mine')
  elif harm == 'summary':
    with open(os.path.join(kept, 'summary.json'), 'w') as f:
      f.write('{"steps": ')
  elif harm == 'no checkpoint':
    os.rename(os.path.join(kept, '4'), str(tmp_path / '4'))
    os.rename(os.path.join(kept, '6'), str(tmp_path / '6'))
  else:
    os.remove(os.path.join(kept, 'metrics.jsonl'))
  before = tree(workdir)
  code, out, err = run_tool(capsys, workdir, '--undo')
  assert code == 2 and out == '' and len(err.splitlines()) == 1
  assert err.startswith(f'error: {kept} ') and says in err, err
  assert tree(workdir) == before
