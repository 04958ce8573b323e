"""Tests for rft_jax.tokenizer and the shipped arithmetic SentencePiece."""

import pytest

from rft_jax import tokenizer as tok_lib
from rft_jax.data import arith
from tools import build_tokenizer


@pytest.fixture(scope='module')
def tok():
  return tok_lib.load_tokenizer(tok_lib.ARITH_SPM_PATH)


def test_special_ids_and_vocab(tok):
  assert isinstance(tok, tok_lib.Tokenizer)
  assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
  assert tok.vocab_size == 18 <= 32
  pieces = {tok.id_to_piece(i) for i in range(tok.vocab_size)}
  assert set('0123456789+-*=') <= pieces


def test_round_trip_every_task_string(tok):
  texts = arith.make_corpus()
  assert len(texts) > 20_000
  for text in texts + [p.prompt + p.answer for p in arith.enumerate_problems()]:
    assert tok.decode(tok.encode(text)) == text, text


def test_specific_strings(tok):
  for text in ['37+48=', '-33', '37*8=', '0', '99-99=', '891']:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.pieces(text) == list(text)  # one piece per character
    assert tok.unk_id not in ids


def test_digits_are_single_pieces(tok):
  for d in '0123456789':
    assert len(tok.encode(d)) == 1
  assert tok.pieces('1234567890') == list('1234567890')
  assert len({tok.encode(d)[0] for d in '0123456789'}) == 10
  for text in arith.make_corpus():
    assert len(tok.encode(text)) == len(text), text


def test_bos_eos_and_decode_skips_specials(tok):
  ids = tok.encode('12+3=')
  assert tok.encode('12+3=', add_bos=True) == [tok.bos_id] + ids
  assert tok.encode('12+3=', add_eos=True) == ids + [tok.eos_id]
  both = tok.encode('12+3=', add_bos=True, add_eos=True)
  assert both == [tok.bos_id] + ids + [tok.eos_id]
  padded = [tok.pad_id, tok.pad_id] + both + [tok.pad_id]
  assert tok.decode(padded) == '12+3='
  # decode does not cut at EOS: callers do.
  assert tok.decode(ids + [tok.eos_id] + tok.encode('7')) == '12+3=7'


def test_missing_file_is_one_line_error(tmp_path):
  missing = tmp_path / 'nope.model'
  with pytest.raises(FileNotFoundError) as err:
    tok_lib.load_tokenizer(str(missing))
  message = str(err.value)
  assert str(missing) in message
  assert '\n' not in message


def test_rebuild_is_deterministic_and_matches_shipped_asset(tmp_path):
  path_a = build_tokenizer.build(str(tmp_path / 'a' / 'spm'))
  path_b = build_tokenizer.build(str(tmp_path / 'b' / 'other_name'))
  with open(path_a, 'rb') as fa, open(path_b, 'rb') as fb:
    bytes_a, bytes_b = fa.read(), fb.read()
  assert bytes_a == bytes_b
  with open(tok_lib.ARITH_SPM_PATH, 'rb') as f:
    assert f.read() == bytes_a, 'run: python -m tools.build_tokenizer'
  rebuilt = tok_lib.load_tokenizer(path_a)
  assert rebuilt.vocab_size == build_tokenizer.VOCAB_SIZE
  assert rebuilt.encode('37*8=') == tok_lib.load_tokenizer().encode('37*8=')


def test_train_sentencepiece_rejects_too_large_vocab(tmp_path):
  with pytest.raises(RuntimeError, match='Vocabulary size too high'):
    tok_lib.train_sentencepiece(['1+2=', '3'], str(tmp_path / 'm'), 32)
