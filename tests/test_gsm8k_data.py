"""GSM8K TFDS builder from local JSONL files, and its prompts through chat templates."""
import json
import os
import re

import ml_collections
import numpy as np
import pytest

from rft_jax import components
from rft_jax.data import gsm8k, pipeline
from rft_jax.tokenizer import load_tokenizer
import tokenizer_fixtures as fx

TRAIN = [
    {'question': 'Natalia sold clips to 48 of her friends in April, and then she sold half as '
                 'many clips in May. How many clips did Natalia sell altogether in April and May?',
     'answer': 'Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = '
               '<<48+24=72>>72 clips altogether in April and May.\n#### 72'},
    {'question': 'Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of '
                 'babysitting. How much did she earn?',
     'answer': 'Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned '
               '0.2 x 50 = $<<0.2*50=10>>10.\n#### 10'},
    {'question': '  A shop sold 1,000 pens and then 234 more. How many pens?  ',
     'answer': '1000 + 234 = 1234\n#### 1,234'},
]
TEST = [{'question': 'Janet has 3 ducks and loses 6. How many ducks does she have?',
         'answer': '3 - 6 = -3\n#### -3'}]


def write_jsonl(path, rows, raw_lines=()):
  with open(path, 'w', encoding='utf-8') as f:
    for row in rows:
      f.write(json.dumps(row) + '\n')
    for line in raw_lines:
      f.write(line + '\n')


@pytest.fixture
def manual_dir(tmp_path):
  directory = tmp_path / 'gsm8k_files'
  directory.mkdir()
  write_jsonl(directory / 'train.jsonl', TRAIN)
  write_jsonl(directory / 'test.jsonl', TEST)
  return str(directory)


def text(value):
  return value.decode() if isinstance(value, bytes) else str(value)


def test_builder_reads_official_layout(manual_dir, tmp_path):
  train = gsm8k.load_split('train', manual_dir, str(tmp_path / 'tfds'))
  test = gsm8k.load_split('test', manual_dir, str(tmp_path / 'tfds'))
  assert (len(train), len(test)) == (3, 1)
  got = [{k: (int(v) if k == 'id' else text(v)) for k, v in train[i].items()} for i in range(3)]
  assert got[0] == {'id': 0, 'prompt': TRAIN[0]['question'], 'answer': '72',
                    'solution': TRAIN[0]['answer']}
  assert got[1]['answer'] == '10'
  assert got[2]['prompt'] == 'A shop sold 1,000 pens and then 234 more. How many pens?'
  assert got[2]['answer'] == '1,234'
  assert text(test[0]['answer']) == '-3'
  # The prepared dataset is named by the files' hash: a second load reuses it.
  prepared = os.listdir(tmp_path / 'tfds' / 'gsm8k')
  assert prepared == [f'files_{gsm8k.files_digest(manual_dir)}']


def test_changed_files_make_a_new_dataset(manual_dir, tmp_path):
  data_dir = str(tmp_path / 'tfds')
  assert len(gsm8k.load_split('train', manual_dir, data_dir)) == 3
  write_jsonl(os.path.join(manual_dir, 'train.jsonl'), TRAIN[:2])
  assert len(gsm8k.load_split('train', manual_dir, data_dir)) == 2
  assert len(os.listdir(os.path.join(data_dir, 'gsm8k'))) == 2


def test_missing_files_name_directory_and_files(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    gsm8k.load_split('train', str(tmp_path / 'nope'), str(tmp_path / 'tfds'))
  message = str(e.value)
  assert '\n' not in message
  assert str(tmp_path / 'nope') in message and 'train.jsonl and test.jsonl' in message
  (tmp_path / 'half').mkdir()
  write_jsonl(tmp_path / 'half' / 'train.jsonl', TRAIN)
  with pytest.raises(FileNotFoundError, match='missing test.jsonl'):
    gsm8k.load_split('train', str(tmp_path / 'half'), str(tmp_path / 'tfds'))


@pytest.mark.parametrize('line,reason', [
    ('{"question": "Q?"}', "line 3 \\(record 2\\): missing field 'answer'"),
    ('{"answer": "#### 1"}', "line 3 \\(record 2\\): missing field 'question'"),
    ('{"question": "   ", "answer": "#### 1"}', 'line 3 \\(record 2\\): empty question'),
    ('{"question": "Q?", "answer": "it is 4"}', "line 3 \\(record 2\\): answer has no '####'"),
    ('{"question": "Q?", "answer": "4 ####  "}', "nothing after '####'"),
    ('{"question": "Q?", "answer": 4}', "field 'answer' is int, not a string"),
    ('["Q?", "#### 4"]', 'expected a JSON object, got list'),
    ('{"question": "Q?", "answer": "#### 4"', 'line 3 \\(record 2\\): not valid JSON '
     "\\(Expecting ',' delimiter at column 38\\)$"),
])
def test_malformed_record_is_one_line_error(manual_dir, tmp_path, line, reason):
  path = os.path.join(manual_dir, 'test.jsonl')
  write_jsonl(path, TEST * 2, [line])
  with pytest.raises(ValueError, match=reason) as e:
    gsm8k.load_split('train', manual_dir, str(tmp_path / 'tfds'))
  assert '\n' not in str(e.value)
  assert str(e.value).startswith(path)
  assert not os.path.exists(tmp_path / 'tfds' / 'gsm8k')   # nothing half-written


def test_skip_leaves_out_malformed_train_lines_only(manual_dir, tmp_path):
  """task.bad_records='skip': a malformed train line is left out and reported; one in the
  held-out test file still stops the load; the default mode still refuses the train line once
  a skipping load has prepared the dataset."""
  data_dir = str(tmp_path / 'tfds')
  write_jsonl(os.path.join(manual_dir, 'train.jsonl'), TRAIN, ['{"question": "Q?"}'])
  skipped = []
  plain = {'chat_template': False}
  train, _ = components.load_task(
      task_config(manual_dir, data_dir, bad_records='skip', **plain), tokenizer=None,
      skipped=skipped)
  assert len(train) == 3 and text(train[2]['answer']) == '1,234'
  assert len(skipped) == 1 and skipped[0].endswith(
      "train.jsonl line 4 (record 3): missing field 'answer'"), skipped
  with pytest.raises(components.SetupError, match="line 4 \\(record 3\\): missing field"):
    components.load_task(task_config(manual_dir, data_dir, **plain), tokenizer=None)
  write_jsonl(os.path.join(manual_dir, 'test.jsonl'), TEST, ['{"question": "Q?"}'])
  with pytest.raises(components.SetupError, match="test.jsonl line 2 \\(record 1\\)"):
    components.load_task(task_config(manual_dir, data_dir, bad_records='skip', **plain),
                         tokenizer=None)


def task_config(manual_dir, data_dir, **task):
  config = ml_collections.ConfigDict({
      'task': {'name': 'gsm8k', 'data_dir': data_dir, 'max_prompt_len': 256,
               'manual_dir': manual_dir, **task},
      'eval': {'num_prompts': 1}})
  return config


def test_chat_prompts_through_components(manual_dir, tmp_path):
  tok = load_tokenizer(fx.write_qwen2_tokenizer(str(tmp_path / 'qwen')))
  instruction = 'Please reason step by step, and put your final answer within \\boxed{}.'
  config = task_config(manual_dir, str(tmp_path / 'tfds'), instruction=instruction)
  train, test = components.load_task(config, tok)
  rendered = tok.apply_chat_template(
      [{'role': 'user', 'content': TRAIN[1]['question'] + '\n' + instruction}])
  assert rendered.endswith('<|im_start|>assistant\n')
  assert train[1]['prompt'] == rendered
  assert train[1]['question'] == TRAIN[1]['question'] and train[1]['answer'] == '10'
  batch = next(pipeline.prompt_batches(train, tok, max_prompt_len=256, batch_size=3, seed=0,
                                       shuffle=False))
  ids = tok.encode(rendered)   # Qwen2: no BOS
  assert batch['prompt_tokens'][1, -len(ids):].tolist() == ids
  assert batch['prompt_mask'][1].sum() == len(ids)
  assert (batch['prompt_tokens'][1, :-len(ids)] == tok.pad_id).all()
  assert batch['answer'].tolist() == ['72', '10', '1,234']
  c = components.Components(None, tok, None, None, None, None, train, test)
  evb = components.eval_batch(c, config)
  assert evb['verifier'] == 'gsm8k' and evb['answer'].tolist() == ['-3']


def test_llama_chat_prompt_has_one_bos_and_plain_prompt_gets_one(manual_dir, tmp_path):
  tok = load_tokenizer(fx.write_llama3_tokenizer(str(tmp_path / 'llama3')))
  data_dir = str(tmp_path / 'tfds')
  chat, _ = components.load_task(task_config(manual_dir, data_dir), tok)
  plain, _ = components.load_task(task_config(manual_dir, data_dir, chat_template=False), tok)
  for source in (chat, plain):
    row = pipeline.eval_prompts(source, tok, max_prompt_len=256, num_prompts=1)
    ids = row['prompt_tokens'][0][row['prompt_mask'][0] == 1].tolist()
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
  assert text(plain[0]['prompt']) == TRAIN[0]['question']   # the raw source: no rendering


def test_setup_errors_name_the_config_key(manual_dir, tmp_path):
  tok = load_tokenizer(fx.write_qwen2_tokenizer(str(tmp_path / 'qwen')))
  data_dir = str(tmp_path / 'tfds')
  with pytest.raises(components.SetupError, match='config.task.manual_dir: GSM8K manual_dir'):
    components.load_task(task_config(str(tmp_path / 'nope'), data_dir), tok)
  spm = load_tokenizer()   # the arithmetic SentencePiece model has no chat template
  with pytest.raises(components.SetupError, match='config.task.chat_template=True'):
    components.load_task(task_config(manual_dir, data_dir), spm)
  train, _ = components.load_task(task_config(manual_dir, data_dir), tok)
  with pytest.raises(ValueError, match=r'train\.jsonl line 1 \(record 0\): prompt .* \d+ '
                                       r'tokens > max_prompt_len=8'):   # no BOS
    pipeline.eval_prompts(train, tok, max_prompt_len=8, num_prompts=1)


def test_arith_prompts_unchanged():
  tok = load_tokenizer()
  record = {'id': 3, 'prompt': '37+48=', 'answer': '85'}
  out = pipeline.encode_prompt(record, tok, max_prompt_len=8)
  ids = [tok.bos_id] + tok.encode('37+48=')
  assert out['prompt_tokens'].tolist() == [tok.pad_id] * (8 - len(ids)) + ids
  assert pipeline.formatted([record], tok, pipeline.PromptFormat()) == [record]
  assert np.array_equal(out['prompt_mask'], [0] * (8 - len(ids)) + [1] * len(ids))


def test_a_line_that_is_not_utf8_is_one_malformed_line(manual_dir, tmp_path):
  """A stray Latin-1 byte names its file and line (it was a bare UnicodeDecodeError naming
  neither); in train.jsonl under task.bad_records='skip' that line alone is left out."""
  data_dir = str(tmp_path / 'tfds')
  path = os.path.join(manual_dir, 'test.jsonl')
  with open(path, 'ab') as f:
    f.write(b'{"question": "Caf\xe9 bill?", "answer": "#### 3"}\n')
  with pytest.raises(ValueError) as e:
    gsm8k.load_split('test', manual_dir, data_dir)
  assert str(e.value) == f'{path} line 2 (record 1): not UTF-8 (byte 0xe9 at column 18)'
  write_jsonl(path, TEST)
  with open(os.path.join(manual_dir, 'train.jsonl'), 'ab') as f:
    f.write(b'{"question": "\xff?", "answer": "#### 3"}\n')
  skipped = []
  train, _ = components.load_task(
      task_config(manual_dir, data_dir, bad_records='skip', chat_template=False),
      tokenizer=None, skipped=skipped)
  assert len(train) == 3
  assert len(skipped) == 1 and skipped[0].endswith('train.jsonl line 4 (record 3): not UTF-8 '
                                                   '(byte 0xff at column 15)'), skipped


def test_a_byte_order_mark_is_read_past(manual_dir, tmp_path):
  """A file saved 'UTF-8 with BOM' (Windows editors) reads as without it."""
  path = os.path.join(manual_dir, 'test.jsonl')
  with open(path, 'rb') as f:
    body = f.read()
  with open(path, 'wb') as f:
    f.write(b'\xef\xbb\xbf' + body)
  assert gsm8k.read_split(manual_dir, 'test')[0]['answer'] == '-3'


def test_a_split_file_that_is_a_directory_is_named_so(manual_dir, tmp_path):
  os.remove(os.path.join(manual_dir, 'train.jsonl'))
  os.mkdir(os.path.join(manual_dir, 'train.jsonl'))
  with pytest.raises(FileNotFoundError) as e:
    gsm8k.read_split(manual_dir, 'test')
  assert f'manual_dir {manual_dir}: train.jsonl is a directory, not a file;' in str(e.value)


def test_manual_dir_that_is_a_file_is_named_so(manual_dir):
  """config.task.manual_dir naming train.jsonl itself: 'a file, not a directory' (it said 'no
  such directory'), and no '(relative to CWD)' after an absolute path."""
  from rft_jax import config_rules  # pylint: disable=g-import-not-at-top
  config = task_config(os.path.join(manual_dir, 'train.jsonl'), '')
  with pytest.raises(config_rules.ConfigError) as e:
    config_rules.check_task(config)
  assert str(e.value).startswith('config.task.manual_dir=')   # the value, shortened
  assert str(e.value).endswith(": a file, not a directory; it must be the directory holding "
                               'train.jsonl and test.jsonl')
  config.task.manual_dir = 'no/such/dir'
  with pytest.raises(config_rules.ConfigError, match=r'no such directory \(relative to '):
    config_rules.check_task(config)


def test_no_custom_configuration_warning_on_each_load(manual_dir, tmp_path, caplog):
  """TFDS warned 'Using custom data configuration: Gsm8kConfig(...)' on every run (every build
  is one): a long line that read as a problem with the files."""
  with caplog.at_level('INFO'):
    gsm8k.load_split('train', manual_dir, str(tmp_path / 'tfds'))
    gsm8k.load_split('test', manual_dir, str(tmp_path / 'tfds'))
  assert not [r for r in caplog.records if 'custom data configuration' in r.getMessage()]


def test_a_bad_record_in_the_training_stream_names_its_file_and_line(manual_dir, tmp_path):
  """A prompt too long for max_prompt_len, read by the training stream (error or skip mode),
  or an answer too long for SFT: the message names train.jsonl and the 1-based line, as the
  load-time errors do (it said only 'record id=0', the 0-based line, and no file)."""
  tok = load_tokenizer(fx.write_qwen2_tokenizer(str(tmp_path / 'qwen')))
  train, _ = components.load_task(task_config(manual_dir, str(tmp_path / 'tfds')), tok)
  where = os.path.join(manual_dir, 'train.jsonl') + ' line 1 (record 0): '
  with pytest.raises(ValueError) as e:
    next(pipeline.prompt_batches(train, tok, max_prompt_len=8, batch_size=1, seed=0,
                                 shuffle=False))
  assert str(e.value).startswith(where + 'prompt ') and 'max_prompt_len=8' in str(e.value)
  bad = pipeline.BadRecords('gsm8k train split')
  next(pipeline.prompt_batches(train, tok, max_prompt_len=90, batch_size=1, seed=0,   # 95 88 88
                               shuffle=False, num_epochs=1, bad_records=bad))
  assert [r.startswith('gsm8k train split: ' + where + 'prompt ') for r in bad.drain()] == [True]
  raw = gsm8k.load_split('train', manual_dir, str(tmp_path / 'tfds'))
  with pytest.raises(ValueError) as e:
    next(pipeline.sft_batches(raw, tok, max_prompt_len=256, answer_len=1, batch_size=3, seed=0))
  got = re.match(re.escape(os.path.join(manual_dir, 'train.jsonl')) +
                 r" line (\d) \(record (\d)\): answer '", str(e.value))
  assert got and int(got[1]) == int(got[2]) + 1, str(e.value)


def test_a_bad_held_out_record_names_its_file_and_line(manual_dir, tmp_path):
  """A held-out prompt too long for max_prompt_len: the eval batch's error names test.jsonl and
  the 1-based line, as the training stream's do (it said 'record id=0')."""
  tok = load_tokenizer(fx.write_qwen2_tokenizer(str(tmp_path / 'qwen')))
  _, test = components.load_task(task_config(manual_dir, str(tmp_path / 'tfds')), tok)
  with pytest.raises(ValueError) as e:
    pipeline.eval_prompts(test, tok, max_prompt_len=8, num_prompts=1)
  where = os.path.join(manual_dir, 'test.jsonl') + ' line 1 (record 0): prompt '
  assert str(e.value).startswith(where) and 'max_prompt_len=8' in str(e.value), str(e.value)
