"""HFTokenizer against transformers.AutoTokenizer on the same small checkpoint directories.

The directories are built offline by tests/tokenizer_fixtures.py: a Qwen2-style and a Llama 3-style
tokenizer.json, and a Llama 2-style SentencePiece tokenizer.model.
"""
import json
import os

import pytest

from rft_jax import tokenizer as tok_lib
import tokenizer_fixtures as fx

transformers = pytest.importorskip('transformers')

KINDS = {'qwen2': fx.write_qwen2_tokenizer, 'llama3': fx.write_llama3_tokenizer,
         'llama2_spm': fx.write_llama2_spm_tokenizer}

TEXTS = [
    'Natalia sold 48 clips.',
    'How many clips did Natalia sell altogether in April and May?',
    'Weng earns $12 an hour.\n#### 10',
    'The answer is \\boxed{1,234}.',
    'Héllo wörld 😀 — unseen characters 中文',
    '\nleading newline and trailing space ',
    '',
]

MESSAGES = [
    [{'role': 'user', 'content': 'How many clips did Natalia sell?'}],
    [{'role': 'system', 'content': 'Be brief.'},
     {'role': 'user', 'content': 'Weng earns $12 an hour. How much did she earn?'}],
]


@pytest.fixture(scope='module', params=sorted(KINDS))
def pair(request, tmp_path_factory):
  """(ours, transformers' AutoTokenizer, kind) over one tokenizer directory."""
  directory = KINDS[request.param](str(tmp_path_factory.mktemp(request.param)))
  ours = tok_lib.load_tokenizer(directory)
  ref = transformers.AutoTokenizer.from_pretrained(directory)
  return ours, ref, request.param


def test_load_tokenizer_dispatches_on_path(pair, tmp_path):
  ours, _, _ = pair
  assert isinstance(ours, tok_lib.HFTokenizer)
  assert isinstance(ours, tok_lib.Tokenizer)
  assert isinstance(tok_lib.load_tokenizer(tok_lib.ARITH_SPM_PATH),
                    tok_lib.SentencePieceTokenizer)


def test_special_ids_match_transformers(pair):
  ours, ref, kind = pair
  assert ours.vocab_size == len(ref)
  assert ours.bos_id == ref.bos_token_id
  assert ours.eos_id == ref.eos_token_id
  if kind == 'qwen2':
    assert ours.bos_id is None
    assert ours.pad_id == ref.pad_token_id == ref.convert_tokens_to_ids('<|endoftext|>')
    assert ours.eos_id == ref.convert_tokens_to_ids('<|im_end|>')
  else:   # Llama has no pad token: we pad with EOS.
    assert ref.pad_token_id is None
    assert ours.pad_id == ours.eos_id


@pytest.mark.parametrize('text', TEXTS)
def test_encode_matches_transformers(pair, text):
  ours, ref, _ = pair
  assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
  # transformers' default adds BOS where the checkpoint has one (Llama), nothing for Qwen2.
  assert ours.encode(text, add_bos=True) == ref.encode(text)
  assert ours.encode(text, add_eos=True) == (
      ref.encode(text, add_special_tokens=False) + [ref.eos_token_id])


@pytest.mark.parametrize('text', TEXTS[:-2])
def test_decode_matches_transformers(pair, text):
  ours, ref, _ = pair
  ids = ref.encode(text, add_special_tokens=False)
  assert ours.decode(ids) == ref.decode(ids) == text
  # pad/BOS/EOS are dropped, and ids past the vocabulary (padded embedding rows) too.
  extra = [i for i in (ours.bos_id, ours.eos_id, ours.pad_id) if i is not None]
  assert ours.decode(extra + ids + [ours.eos_id, ours.vocab_size + 5]) == text


@pytest.mark.parametrize('messages', MESSAGES)
def test_chat_template_matches_transformers(pair, messages):
  ours, ref, kind = pair
  text = ours.apply_chat_template(messages, add_generation_prompt=True)
  want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert text == want
  want_ids = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
  if isinstance(want_ids, dict) or hasattr(want_ids, 'keys'):   # BatchEncoding in transformers 5
    want_ids = want_ids['input_ids']
  assert ours.encode(text) == list(want_ids)
  if kind != 'qwen2':   # the template writes BOS; encoding it must not add a second one
    assert ours.encode(text)[:2] == [ours.bos_id, ours.encode(text)[1]]
    assert ours.encode(text).count(ours.bos_id) == 1
  no_prompt = ours.apply_chat_template(messages, add_generation_prompt=False)
  assert no_prompt == ref.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=False)
  assert text.startswith(no_prompt) and text != no_prompt or kind == 'llama2_spm'


def test_qwen2_chat_text_is_exact(tmp_path):
  ours = tok_lib.load_tokenizer(fx.write_qwen2_tokenizer(str(tmp_path)))
  assert ours.apply_chat_template([{'role': 'user', 'content': 'Hi?'}]) == (
      '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful '
      'assistant.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n')


def test_template_raise_exception_and_sandbox(tmp_path):
  ours = tok_lib.load_tokenizer(fx.write_llama2_spm_tokenizer(str(tmp_path)))
  import jinja2
  with pytest.raises(jinja2.exceptions.TemplateError, match='must alternate'):
    ours.apply_chat_template([{'role': 'assistant', 'content': 'x'}])
  ours.chat_template = "{{ messages.__class__.__mro__ }}"
  with pytest.raises(jinja2.exceptions.SecurityError):
    ours.apply_chat_template([])


def test_llama3_stop_ids_from_generation_config(tmp_path):
  ours = tok_lib.load_tokenizer(fx.write_llama3_tokenizer(str(tmp_path)))
  eot = ours.encode('<|eot_id|>')
  end = ours.encode('<|end_of_text|>')
  assert len(eot) == len(end) == 1
  assert ours.eos_id == eot[0]
  assert set(ours.stop_ids) == {eot[0], end[0]} and ours.stop_ids[0] == ours.eos_id


def test_special_ids_fall_back_to_generation_and_model_config(tmp_path):
  directory = fx.write_qwen2_tokenizer(str(tmp_path))
  path = os.path.join(directory, 'tokenizer_config.json')
  with open(path) as f:
    config = json.load(f)
  for key in ('eos_token', 'pad_token', 'chat_template'):
    del config[key]
  with open(path, 'w') as f:
    json.dump(config, f)
  os.remove(os.path.join(directory, 'generation_config.json'))
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump({'eos_token_id': 7, 'bos_token_id': 3}, f)
  ours = tok_lib.load_tokenizer(directory)
  assert (ours.eos_id, ours.pad_id) == (7, 7)
  assert ours.bos_id is None   # tokenizer_config.json says bos_token: null, which wins
  with open(os.path.join(directory, 'chat_template.jinja'), 'w') as f:
    f.write('{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}')
  ours = tok_lib.load_tokenizer(directory)
  assert ours.apply_chat_template([{'role': 'user', 'content': 'q'}]) == '<user>q'


def test_missing_files_are_one_line_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='no tokenizer.json or tokenizer.model in') as e:
    tok_lib.load_tokenizer(str(tmp_path))
  assert '\n' not in str(e.value)
  directory = fx.write_qwen2_tokenizer(str(tmp_path / 'q'))
  path = os.path.join(directory, 'tokenizer_config.json')
  with open(path) as f:
    config = json.load(f)
  del config['chat_template']
  with open(path, 'w') as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match='has no chat_template'):
    tok_lib.load_tokenizer(directory).apply_chat_template([{'role': 'user', 'content': 'q'}])
  with open(path, 'w') as f:
    f.write('{broken')
  with pytest.raises(ValueError, match='tokenizer_config.json: not valid JSON'):
    tok_lib.load_tokenizer(directory)


def test_damaged_tokenizer_json_is_one_line_error(tmp_path):
  """A tokenizer.json cut short: ValueError naming it (was the tokenizers library's bare
  Exception, a traceback and exit 1 from rft_jax.main)."""
  directory = fx.write_qwen2_tokenizer(str(tmp_path / 'q'))
  path = os.path.join(directory, 'tokenizer.json')
  with open(path) as f:
    text = f.read()
  with open(path, 'w') as f:
    f.write(text[:len(text) // 2])
  with pytest.raises(ValueError, match=r'tokenizer.json: cannot load it \(') as e:
    tok_lib.load_tokenizer(directory)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('value,stop', [('null', None), ('-1', None), ('"abc"', 'error'),
                                        ('[2, null]', 'error')])
def test_generation_config_eos_ids_null_negative_or_bad(tmp_path, value, stop):
  """eos_token_id null or negative means none (null was a TypeError traceback); a string or a
  null in the list is a ValueError naming the file (was an int() error without it)."""
  directory = fx.write_llama3_tokenizer(str(tmp_path / 'l'))
  eos = tok_lib.load_tokenizer(directory).eos_id
  with open(os.path.join(directory, 'generation_config.json'), 'w') as f:
    f.write('{"eos_token_id": %s, "pad_token_id": -1}' % value)
  if stop == 'error':
    with pytest.raises(ValueError, match=r'generation_config.json: eos_token_id=.*: expected a '
                                         r'token id or a list of ids'):
      tok_lib.load_tokenizer(directory)
    return
  tok = tok_lib.load_tokenizer(directory)
  assert tok.stop_ids == (eos,) and tok.pad_id == eos   # pad -1: none, so EOS pads


def test_generation_config_eos_id_that_is_no_token_is_refused(tmp_path):
  """An eos_token_id at or past the vocabulary could never be sampled: a ValueError naming the
  file and key (was kept silently as a stop id). Real checkpoints' ids are tokens (Llama 3:
  128001/128008/128009 of 128256; Qwen2.5: 151643/151645 of 151665, its model rows 151936)."""
  directory = fx.write_llama3_tokenizer(str(tmp_path / 'l'))
  tok = tok_lib.load_tokenizer(directory)
  with open(os.path.join(directory, 'generation_config.json'), 'w') as f:
    json.dump({'eos_token_id': [tok.eos_id, 0, tok.vocab_size - 1]}, f)   # the last id is one
  assert tok.vocab_size - 1 in tok_lib.load_tokenizer(directory).stop_ids
  with open(os.path.join(directory, 'generation_config.json'), 'w') as f:
    json.dump({'eos_token_id': [tok.eos_id, tok.vocab_size]}, f)
  with pytest.raises(ValueError, match=rf'^{directory}/generation_config.json: eos_token_id='
                     rf'\[{tok.eos_id}, {tok.vocab_size}\]: {tok.vocab_size} is not a token '
                     rf'\(the vocabulary has {tok.vocab_size} ids\)$'):
    tok_lib.load_tokenizer(directory)
