"""Tests for the arithmetic TFDS builder and the grain pipelines."""

import json
import os
import tempfile
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from rft_jax import tokenizer as tok_lib
from rft_jax.data import arith
from rft_jax.data import pipeline
from rft_jax.parallel import hostdata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P = 8  # max_prompt_len: BOS + up to "99+99=" (6) fits.
A = 5  # answer_len: up to "-99"/"891" (3) + EOS fits.


def reference_answer(prompt: str) -> str:
  """Plain-python reference: parse "a op b=" and evaluate."""
  m = re.fullmatch(r'(\d+)([+*-])(\d+)=', prompt)
  assert m, prompt
  a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
  return str({'+': a + b, '-': a - b, '*': a * b}[op])


def as_str(x):
  return x.decode() if isinstance(x, bytes) else str(x)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='module')
def tok():
  return tok_lib.load_tokenizer()


@pytest.fixture(scope='module')
def test_split(data_dir):
  return arith.load_split('test', data_dir)


@pytest.fixture(scope='module')
def train_split(data_dir):
  return arith.load_split('train', data_dir)


def all_records(source):
  return source.__getitems__(list(range(len(source))))


# ----------------------------------------------------------------- builder --


def test_split_sizes_and_ids(test_split, train_split):
  assert len(test_split) == arith.NUM_TEST == 500
  # 100*100 (+) + 100*100 (-) + 100*10 (*) distinct problems.
  assert len(test_split) + len(train_split) == 21_000
  assert [int(test_split[i]['id']) for i in range(10)] == list(range(10))
  assert int(train_split[0]['id']) == 500


def test_splits_are_disjoint_and_cover_all(test_split, train_split):
  test_prompts = {as_str(r['prompt']) for r in all_records(test_split)}
  train_prompts = {as_str(r['prompt']) for r in all_records(train_split)}
  assert len(test_prompts) == 500 and len(train_prompts) == 20_500
  assert not test_prompts & train_prompts
  everything = {p.prompt for p in arith.enumerate_problems()}
  assert test_prompts | train_prompts == everything


def test_every_test_answer_is_correct(test_split):
  ops = set()
  for r in all_records(test_split):
    prompt, answer, op = (as_str(r['prompt']), as_str(r['answer']),
                          as_str(r['op']))
    assert answer == reference_answer(prompt), prompt
    a, b = (int(x) for x in prompt[:-1].split(op, 1))
    assert prompt == f'{a}{op}{b}='
    assert 0 <= a <= 99 and 0 <= b <= (9 if op == '*' else 99)
    ops.add(op)
  assert ops == {'+', '-', '*'}


def test_builder_is_deterministic(data_dir, test_split, tmp_path):
  other = arith.load_split('test', str(tmp_path))
  assert all_records(other) == all_records(test_split)
  for name in ('arith-test.array_record-00000-of-00001',
               'arith-train.array_record-00000-of-00001'):
    paths = [os.path.join(d, 'arith', 'base', '1.0.0', name)
             for d in (data_dir, str(tmp_path))]
    with open(paths[0], 'rb') as f0, open(paths[1], 'rb') as f1:
      assert f0.read() == f1.read(), name


def test_preparing_in_a_new_data_dir_leaves_nothing_in_the_temp_dir(monkeypatch, tmp_path):
  """TFDS's lookup of precomputed metadata on its GCS bucket made an empty temporary
  directory (tmp*tfds) it never removed, one per dataset prepared in a new data dir."""
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(scratch))
  assert len(arith.load_split('test', str(tmp_path / 'tfds'))) == arith.NUM_TEST
  assert not [p.name for p in scratch.iterdir() if p.name.endswith('tfds')]


def test_data_dir_resolution(monkeypatch, tmp_path):
  monkeypatch.delenv(arith.DATA_DIR_ENV, raising=False)
  assert arith.resolve_data_dir('') == os.path.expanduser(
      '~/.cache/rft_jax/tfds')
  monkeypatch.setenv(arith.DATA_DIR_ENV, str(tmp_path))
  assert arith.resolve_data_dir('') == str(tmp_path)
  assert arith.resolve_data_dir('/x/y') == '/x/y'


def test_config_ranges_and_bad_split():
  assert arith.Arith.BUILDER_CONFIGS[0].name == 'base'
  small = arith.ArithConfig(name='small', max_a=3, max_b=2, max_b_mul=1)
  assert len(arith.enumerate_problems(small)) == 4 * 3 * 2 + 4 * 2
  with pytest.raises(ValueError, match='unknown split'):
    arith.load_split('validation')


# ---------------------------------------------------------------- pipeline --


def check_left_padded(tokens_bp, mask_bp, tok):
  """Every row: pads, then BOS, then real tokens (no EOS), mask marks them."""
  for row, mrow in zip(tokens_bp, mask_bp):
    n = int(mrow.sum())
    np.testing.assert_array_equal(mrow, [0] * (len(row) - n) + [1] * n)
    assert (row[:len(row) - n] == tok.pad_id).all()
    assert row[len(row) - n] == tok.bos_id
    assert tok.eos_id not in row and tok.pad_id not in row[len(row) - n:]


def test_prompt_batches_layout(test_split, tok):
  it = pipeline.prompt_batches(test_split, tok, max_prompt_len=P,
                               batch_size=16, seed=0)
  for _ in range(3):
    batch = next(it)
    assert batch['prompt_tokens'].shape == (16, P)
    assert batch['prompt_tokens'].dtype == np.int32
    assert batch['prompt_mask'].shape == (16, P)
    assert batch['prompt_mask'].dtype == np.int32
    assert batch['answer'].shape == batch['prompt'].shape == (16,)
    check_left_padded(batch['prompt_tokens'], batch['prompt_mask'], tok)
    for toks, prompt, answer in zip(batch['prompt_tokens'], batch['prompt'],
                                    batch['answer']):
      assert isinstance(prompt, str) and isinstance(answer, str)
      assert tok.decode(toks) == prompt
      assert answer == reference_answer(prompt)


def test_sft_batches_layout(train_split, tok):
  it = pipeline.sft_batches(train_split, tok, max_prompt_len=P, answer_len=A,
                            batch_size=32, seed=1)
  batch = next(it)
  for key in ('tokens', 'mask', 'loss_mask'):
    assert batch[key].shape == (32, P + A) and batch[key].dtype == np.int32
  check_left_padded(batch['tokens'][:, :P], batch['mask'][:, :P], tok)
  assert not batch['loss_mask'][:, :P].any()
  for toks, mask, loss, prompt, answer in zip(
      batch['tokens'], batch['mask'], batch['loss_mask'], batch['prompt'],
      batch['answer']):
    assert answer == reference_answer(prompt)
    n = len(answer) + 1  # one piece per character, plus EOS
    np.testing.assert_array_equal(loss[P:], [1] * n + [0] * (A - n))
    assert tok.decode(toks[loss == 1]) == answer
    assert toks[P + n - 1] == tok.eos_id
    assert (toks[P + n:] == tok.pad_id).all()
    np.testing.assert_array_equal(mask[P:], loss[P:])
    assert tok.decode(toks[mask == 1]) == prompt + answer


def test_iterator_state_resumes_exactly(train_split, tok):
  def make():
    return pipeline.sft_batches(train_split, tok, max_prompt_len=P,
                                answer_len=A, batch_size=8, seed=3)
  it = make()
  for _ in range(3):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(2)]
  fresh = make()
  fresh.set_state(state)
  for want in expected:
    got = next(fresh)
    assert got.keys() == want.keys()
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
  # A different seed gives a different stream.
  other = pipeline.sft_batches(train_split, tok, max_prompt_len=P,
                               answer_len=A, batch_size=8, seed=4)
  assert not np.array_equal(next(other)['id'], next(make())['id'])


def test_process_shares_put_together_are_the_one_process_batches(tok):
  """Two processes reading 4 rows each of every global batch of 8 see, concatenated in process
  order, exactly the batches one process reading 8 at a time sees; one epoch covers the source."""
  source = [{'id': i, 'prompt': f'{i}+1='.encode(), 'answer': str(i + 1)}
            for i in range(24)]
  whole = list(pipeline.prompt_batches(source, tok, max_prompt_len=P, batch_size=8, seed=0,
                                       num_epochs=1))
  shares = [list(pipeline.prompt_batches(source, tok, max_prompt_len=P, batch_size=4, seed=0,
                                         num_epochs=1, shard_index=shard, shard_count=2))
            for shard in range(2)]
  assert len(whole) == len(shares[0]) == len(shares[1]) == 3
  for k, batch in enumerate(whole):
    for key in ('prompt_tokens', 'prompt_mask', 'id', 'prompt', 'answer'):
      np.testing.assert_array_equal(
          np.concatenate([shares[0][k][key], shares[1][k][key]]), batch[key])
    assert batch['prompt'].tolist() == [f'{i}+1=' for i in batch['id']]  # bytes -> str
  assert sorted(np.concatenate([b['id'] for b in whole]).tolist()) == list(range(24))
  assert shares[0][0]['id'].tolist() != shares[1][0]['id'].tolist()


def test_global_batches_state_is_the_one_process_position(tok):
  """With one process GlobalBatches is the plain iterator, state included (old checkpoints)."""
  source = [{'id': i, 'prompt': f'{i}+1=', 'answer': str(i + 1)} for i in range(24)]
  make = lambda: pipeline.prompt_batches(source, tok, max_prompt_len=P, batch_size=4, seed=1)
  it = hostdata.GlobalBatches(make())
  next(it), next(it)
  plain = make()
  next(plain), next(plain)
  assert it.get_state() == plain.get_state() == {'next_index': 8}
  again = hostdata.GlobalBatches(make())
  again.set_state(it.get_state())
  np.testing.assert_array_equal(next(again)['id'], next(plain)['id'])


def test_eval_prompts_first_records_in_order(test_split, tok):
  batch = pipeline.eval_prompts(test_split, tok, max_prompt_len=P,
                                num_prompts=50)
  assert batch['prompt_tokens'].shape == (50, P)
  assert batch['id'].tolist() == list(range(50))
  assert batch['prompt'].tolist() == [as_str(test_split[i]['prompt'])
                                      for i in range(50)]
  check_left_padded(batch['prompt_tokens'], batch['prompt_mask'], tok)
  first = next(pipeline.prompt_batches(test_split, tok, max_prompt_len=P,
                                       batch_size=50, seed=0, shuffle=False))
  for key in batch:
    np.testing.assert_array_equal(batch[key], first[key])
  with pytest.raises(ValueError, match='num_prompts'):
    pipeline.eval_prompts(test_split, tok, max_prompt_len=P, num_prompts=501)


def test_too_long_prompt_and_answer_raise(tok):
  source = [{'id': 7, 'prompt': '12+34=', 'answer': '46'}]
  with pytest.raises(ValueError, match=r'id=7.*7 tokens.*max_prompt_len=5'):
    pipeline.eval_prompts(source, tok, max_prompt_len=5, num_prompts=1)
  it = pipeline.prompt_batches(source, tok, max_prompt_len=5, batch_size=1,
                               seed=0)
  with pytest.raises(ValueError, match='id=7'):
    next(it)
  it = pipeline.sft_batches(source, tok, max_prompt_len=P, answer_len=2,
                            batch_size=1, seed=0)
  with pytest.raises(ValueError, match=r'id=7.*3 tokens.*answer_len=2'):
    next(it)


def _mixed_source():
  good = [{'id': i, 'prompt': f'{i}+1=', 'answer': str(i + 1)} for i in range(10)]
  bad = [{'id': 100, 'prompt': '1+1='},                          # no answer
         {'id': 101, 'prompt': '   ', 'answer': '0'},             # empty prompt
         {'id': 102, 'prompt': '12345+67890=', 'answer': '0'},    # too long for P=8
         {'id': 'x', 'prompt': '1+2=', 'answer': '3'}]            # id not an integer
  return good[:3] + bad[:2] + good[3:6] + bad[2:] + good[6:]


def test_bad_records_raise_naming_them_by_default(tok):
  with pytest.raises(ValueError, match=r"record id=100: missing field 'answer'"):
    pipeline.normalize_record({'id': 100, 'prompt': '1+1='})
  with pytest.raises(ValueError, match='record id=101: empty prompt'):
    pipeline.normalize_record({'id': 101, 'prompt': ' ', 'answer': '0'})
  it = pipeline.prompt_batches(_mixed_source(), tok, max_prompt_len=8, batch_size=14, seed=0,
                               shuffle=False)
  with pytest.raises(ValueError, match='record id='):
    next(it)


def test_bad_records_skipped_and_reported_when_asked(tok):
  bad = pipeline.BadRecords('arith train split')
  it = pipeline.prompt_batches(_mixed_source(), tok, max_prompt_len=8, batch_size=5, seed=0,
                               shuffle=False, num_epochs=1, bad_records=bad)
  batches = list(it)
  ids = [int(i) for b in batches for i in b['id']]
  assert ids == list(range(10))                      # every good record, in order, none bad
  assert bad.total == 4
  reasons = bad.drain()
  assert len(reasons) == 4 and bad.drain() == []
  assert all(r.startswith('arith train split: record id=') for r in reasons)
  assert any("id=100: missing field 'answer'" in r for r in reasons)
  assert any('id=102' in r and 'max_prompt_len=8' in r for r in reasons)


def test_skipping_pipeline_resumes_exactly(tok):
  make = lambda: pipeline.prompt_batches(_mixed_source() * 3, tok, max_prompt_len=8,
                                         batch_size=3, seed=1, bad_records=pipeline.BadRecords())
  it = make()
  next(it), next(it)
  state = it.get_state()
  want = [next(it)['id'].tolist() for _ in range(3)]
  again = make()
  again.set_state(state)
  assert [next(again)['id'].tolist() for _ in range(3)] == want


def test_two_processes_read_their_shares_and_gather_the_global_batch(tok):
  """jax.distributed on localhost: every process ends with the one-process batches (ids,
  tokens, non-ASCII answer strings), and the saved position is the one-process position."""
  sock = socket.socket()
  sock.bind(('localhost', 0))
  port = sock.getsockname()[1]
  sock.close()
  script = os.path.join(REPO, 'tests', 'multiprocess_data_check.py')
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  procs = [subprocess.Popen([sys.executable, script, str(i), str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  results = [json.loads([line for line in out.splitlines() if line.startswith('RESULT ')][-1]
                        [len('RESULT '):]) for out, _ in outs]
  source = [{'id': i, 'prompt': f'{i}+{i % 7}=', 'answer': 'é' * (i % 3) + str(i)}
            for i in range(40)]
  one = pipeline.prompt_batches(source, tok, max_prompt_len=12, batch_size=8, seed=3)
  want = [next(one) for _ in range(3)]
  for got in results:
    assert got['ids'] == [b['id'].tolist() for b in want]
    assert got['answers'] == [b['answer'].tolist() for b in want]
    assert got['tokens'] == [b['prompt_tokens'].tolist() for b in want]
    assert got['dtypes'] == [str(want[0]['id'].dtype), str(want[0]['prompt_tokens'].dtype)]
    assert got['state'] == one.get_state() == {'next_index': 24}
    assert got['after_resume'] == want[2]['id'].tolist()


def test_a_damaged_prepared_dataset_is_one_line_at_load(tmp_path):
  """A truncated array_record file of the prepared arith dataset fails at load (SetupError
  naming the directory and what to delete), not at step 1 inside the input pipeline."""
  import glob   # pylint: disable=g-import-not-at-top
  import ml_collections   # pylint: disable=g-import-not-at-top
  from rft_jax import components   # pylint: disable=g-import-not-at-top
  task = ml_collections.ConfigDict({'name': 'arith', 'data_dir': str(tmp_path)})
  config = ml_collections.ConfigDict({'task': task})
  train, test = components.load_task(config, tokenizer=None)
  assert len(train) > 0 and len(test) > 0
  victim = sorted(glob.glob(str(tmp_path / 'arith' / '**' / '*train*array_record*'),
                            recursive=True))[0]
  with open(victim, 'r+b') as f:
    f.truncate(os.path.getsize(victim) // 2)
  with pytest.raises(components.SetupError,
                     match=rf"^config.task.data_dir='{tmp_path}': the prepared arith dataset in "
                           rf'{tmp_path} cannot be read \(.*\); delete {tmp_path}/arith to '
                           'prepare it again$'):
    components.load_task(config, tokenizer=None)
