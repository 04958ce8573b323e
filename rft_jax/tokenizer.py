"""Tokenizers behind one small interface.

Every tokenizer exposes ``vocab_size``, the special ids ``bos_id``,
``eos_id``, ``pad_id`` and ``encode``/``decode``. ``decode`` drops pad, BOS and
EOS ids but does not cut at EOS: callers that decode sampled completions cut
at the first EOS themselves.

The built-in arithmetic tokenizer (``rft_jax/assets/arith_spm.model``) is a
SentencePiece model trained by ``tools/build_tokenizer.py`` with ids
``pad=0, unk=1, bos=2, eos=3`` and one piece per digit.
"""

import io
import os
from typing import Iterable, Protocol, Sequence, runtime_checkable

import sentencepiece as spm

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

ASSETS_DIR = os.path.join(os.path.dirname(__file__), 'assets')
ARITH_SPM_PATH = os.path.join(ASSETS_DIR, 'arith_spm.model')


@runtime_checkable
class Tokenizer(Protocol):
  """What the data pipeline, sampler and verifiers need from a tokenizer."""

  vocab_size: int
  bos_id: int
  eos_id: int
  pad_id: int

  def encode(self, text: str, add_bos: bool = False,
             add_eos: bool = False) -> list[int]:
    """Token ids of ``text``, optionally with BOS first / EOS last."""
    ...

  def decode(self, ids: Iterable[int]) -> str:
    """Text of ``ids``, skipping pad/BOS/EOS ids (does not stop at EOS)."""
    ...


class SentencePieceTokenizer:
  """``Tokenizer`` over a SentencePiece ``.model`` file."""

  def __init__(self, path: str):
    self.path = os.fspath(path)
    self._sp = spm.SentencePieceProcessor(model_file=self.path)
    self.vocab_size = int(self._sp.get_piece_size())
    self.bos_id = int(self._sp.bos_id())
    self.eos_id = int(self._sp.eos_id())
    self.pad_id = int(self._sp.pad_id())
    self.unk_id = int(self._sp.unk_id())
    self._skip = frozenset({self.bos_id, self.eos_id, self.pad_id})

  def encode(self, text: str, add_bos: bool = False,
             add_eos: bool = False) -> list[int]:
    ids = list(self._sp.encode(text))
    if add_bos:
      ids = [self.bos_id] + ids
    if add_eos:
      ids = ids + [self.eos_id]
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of ids, skipping pad/BOS/EOS. Ids outside the vocabulary (a model whose embedding
    table is padded past vocab_size can sample them) decode as the unknown piece."""
    ids = [int(i) for i in ids if int(i) not in self._skip]
    return self._sp.decode([i if 0 <= i < self.vocab_size else self.unk_id for i in ids])

  def pieces(self, text: str) -> list[str]:
    """The string pieces of ``text`` (for inspection and tests)."""
    return list(self._sp.encode(text, out_type=str))

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def __repr__(self) -> str:
    return (f'SentencePieceTokenizer({self.path!r}, '
            f'vocab_size={self.vocab_size})')


def load_tokenizer(path: str = ARITH_SPM_PATH) -> Tokenizer:
  """Loads the tokenizer at ``path`` (a SentencePiece ``.model`` file).

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: the file type is not supported.
  """
  path = os.path.expanduser(os.fspath(path))
  if not os.path.isfile(path):
    raise FileNotFoundError(f'tokenizer file not found: {path}')
  if path.endswith('.model'):
    return SentencePieceTokenizer(path)
  raise ValueError(f'unsupported tokenizer file (expected .model): {path}')


def train_sentencepiece(texts: Sequence[str], model_prefix: str,
                        vocab_size: int) -> str:
  """Trains a SentencePiece model on ``texts``; returns ``model_prefix.model``.

  Deterministic: sentences are deduplicated and sorted, training is
  single-threaded with no sentence sampling, and the model bytes are written
  by us (so they do not embed ``model_prefix``). Options: unigram model,
  ``pad=0, unk=1, bos=2, eos=3``, digits split into single pieces, no byte
  fallback, no dummy prefix, identity normalisation (exact round trips for
  characters seen in ``texts``). ``vocab_size`` is exact: SentencePiece
  errors if the corpus cannot fill it.
  """
  sentences = sorted(set(texts))
  if not sentences:
    raise ValueError('train_sentencepiece needs at least one text')
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=model,
      model_type='unigram',
      vocab_size=vocab_size,
      pad_id=PAD_ID,
      unk_id=UNK_ID,
      bos_id=BOS_ID,
      eos_id=EOS_ID,
      split_digits=True,
      byte_fallback=False,
      add_dummy_prefix=False,
      remove_extra_whitespaces=False,
      normalization_rule_name='identity',
      character_coverage=1.0,
      num_threads=1,
      input_sentence_size=0,
      shuffle_input_sentence=False,
      minloglevel=2,
  )
  path = os.fspath(model_prefix) + '.model'
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(model.getvalue())
  return path
