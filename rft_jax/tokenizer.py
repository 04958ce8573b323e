"""Tokenizers behind one small interface.

Every tokenizer exposes ``vocab_size``, the special ids ``bos_id``, ``eos_id``, ``pad_id`` and
``encode``/``decode``. ``decode`` drops pad, BOS and EOS ids but does not cut at EOS: callers
that decode sampled completions cut at the first EOS themselves. ``bos_id`` is None for a
tokenizer without a BOS token (Qwen2); ``add_bos`` is then a no-op.

The built-in arithmetic tokenizer (``rft_jax/assets/arith_spm.model``) is a SentencePiece model
trained by ``tools/build_tokenizer.py`` with ids ``pad=0, unk=1, bos=2, eos=3`` and one piece
per digit.

``HFTokenizer`` reads a Hugging Face model directory (Qwen2, Llama 2/3, Mistral): see its
docstring for where each special token comes from. ``load_tokenizer(path)`` picks the class: a
``.model`` file is a SentencePieceTokenizer, a directory is an HFTokenizer.
"""

import datetime
import functools
import io
import json
import os
import re
from typing import Iterable, Protocol, Sequence, runtime_checkable

import sentencepiece as spm

from rft_jax import jsonfile

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
  bos_id: int | None
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


class HFTokenizer:
  """``Tokenizer`` over a Hugging Face model directory.

  Text is encoded by ``tokenizer.json`` (the ``tokenizers`` library: Qwen2, Llama 3, and most
  current checkpoints) or, when that file is absent, by a SentencePiece ``tokenizer.model``
  (Llama 2, Mistral). ``encode`` never adds the special tokens that ``tokenizer.json``'s
  post-processor would add (like ``add_special_tokens=False`` in transformers): BOS/EOS only
  come from ``add_bos``/``add_eos``, or from special-token text such as a chat template's
  ``<|begin_of_text|>``, which is split out and mapped to its id as transformers does.

  Special tokens are read from the checkpoint, first found wins: ``tokenizer_config.json``
  (``bos_token`` ...), ``special_tokens_map.json`` (in either, a key set to null means "none":
  Qwen2's ``bos_token: null`` wins over the ``bos_token_id`` of its ``config.json``), then the
  ids in ``generation_config.json`` and ``config.json`` (``bos_token_id`` ...; a list of EOS ids
  gives its first), and for a SentencePiece model the model's own ids. A checkpoint without a
  pad token (Llama 2/3, Mistral) pads with EOS: ``pad_id == eos_id``; the sampler's completion
  mask still ends at the first EOS, so padding never looks like content. ``bos_id`` is None
  when there is no BOS (Qwen2). ``stop_ids`` lists every EOS id of ``generation_config.json``
  (e.g. Llama 3's ``<|end_of_text|>`` and ``<|eot_id|>``); the sampler stops at any of them
  (SamplingConfig.stop_ids). One there that no token has (>= vocab_size) is a ValueError.

  A SentencePiece model follows transformers' ``legacy=False`` default (``legacy`` in
  ``tokenizer_config.json`` overrides): the SentencePiece dummy-prefix space is added at the
  start of the text only, not after each special token. ``decode`` skips pad/BOS/EOS ids and ids
  outside the vocabulary, and never applies ``clean_up_tokenization_spaces``; with SentencePiece,
  control tokens decode as SentencePiece renders them (``<s>`` as '', ``<unk>`` as ' ⁇ ').
  """

  def __init__(self, model_dir: str):
    self.path = os.fspath(model_dir)
    self._config = _read_json(self.path, 'tokenizer_config.json')
    special_map = _read_json(self.path, 'special_tokens_map.json')
    json_path = os.path.join(self.path, 'tokenizer.json')
    spm_path = os.path.join(self.path, 'tokenizer.model')
    self._hf = self._sp = None
    if os.path.isfile(json_path):
      import tokenizers  # pylint: disable=g-import-not-at-top
      try:   # a damaged file raises a bare Exception (the Rust library's parse error)
        self._hf = tokenizers.Tokenizer.from_file(json_path)
      except Exception as e:  # pylint: disable=broad-except
        reason = ' '.join(str(e).split()) or type(e).__name__
        raise ValueError(f'{json_path}: cannot load it ({reason})') from None
      self.vocab_size = int(self._hf.get_vocab_size(with_added_tokens=True))
    elif os.path.isfile(spm_path):
      self._sp = spm.SentencePieceProcessor(model_file=spm_path)
      self.vocab_size = int(self._sp.get_piece_size())
    else:
      raise FileNotFoundError(f'no tokenizer.json or tokenizer.model in {self.path}')
    self._added = self._added_tokens()
    self.vocab_size = max([self.vocab_size] + [i + 1 for i in self._added.values()])
    ids_from = [_token_ids(self.path, name) for name in ('generation_config.json', 'config.json')]
    found = {}
    for name in ('bos', 'eos', 'pad', 'unk'):
      key = f'{name}_token'
      named_in = [c for c in (self._config, special_map) if key in c]
      if named_in:   # a tokenizer config names it (null = none): the id files are not asked
        token = _token_text(named_in[0][key])
        found[name] = self._token_id(token) if token is not None else None
        continue
      found[name] = None
      for source in ids_from:
        if found[name] is None and source.get(f'{name}_token_id'):
          found[name] = source[f'{name}_token_id'][0]
      if found[name] is None and self._sp is not None:
        sp_id = int(getattr(self._sp, f'{name}_id')())
        found[name] = sp_id if sp_id >= 0 else None
    if found['eos'] is None:
      raise ValueError(f'{self.path}: no EOS token in tokenizer_config.json, '
                       'special_tokens_map.json, generation_config.json or config.json')
    self.bos_id, self.eos_id, self.unk_id = found['bos'], found['eos'], found['unk']
    self.pad_id = found['pad'] if found['pad'] is not None else self.eos_id
    stop = ids_from[0].get('eos_token_id', [])
    if [i for i in stop if i >= self.vocab_size]:   # a stop id that can never be sampled
      raise ValueError(f'{self.path}/generation_config.json: eos_token_id={stop}: {max(stop)} '
                       f'is not a token (the vocabulary has {self.vocab_size} ids)')
    self.stop_ids = tuple(dict.fromkeys([self.eos_id] + stop))
    self._skip = frozenset(i for i in (self.bos_id, self.eos_id, self.pad_id) if i is not None)
    self._strings = {name: self._id_text(found[name]) for name in found}
    self.chat_template = self._find_chat_template()
    self._legacy = bool(self._config.get('legacy', False))

  def encode(self, text: str, add_bos: bool = False,
             add_eos: bool = False) -> list[int]:
    if self._hf is not None:
      ids = list(self._hf.encode(text, add_special_tokens=False).ids)
    else:
      ids = self._sp_encode(text)
    if add_bos and self.bos_id is not None:
      ids = [self.bos_id] + ids
    if add_eos:
      ids = ids + [self.eos_id]
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids if int(i) not in self._skip and 0 <= int(i) < self.vocab_size]
    if self._hf is not None:
      return self._hf.decode(ids, skip_special_tokens=False)
    # SentencePiece cannot decode added tokens past its own pieces: decode the runs between.
    by_id = {i: text for text, i in self._added.items()}
    parts, run = [], []
    for i in ids:
      if i >= self._sp.get_piece_size():
        parts.append(self._sp.decode(run))
        parts.append(by_id.get(i, ''))
        run = []
      else:
        run.append(i)
    return ''.join(parts + [self._sp.decode(run)])

  def apply_chat_template(self, messages: Sequence[dict],
                          add_generation_prompt: bool = True) -> str:
    """Renders ``messages`` (``[{'role': ..., 'content': ...}]``) with the checkpoint's chat
    template, in a sandboxed jinja2 environment set up as transformers sets it up."""
    if not self.chat_template:
      raise ValueError(f'{self.path}: the tokenizer has no chat_template (tokenizer_config.json '
                       'or chat_template.jinja)')
    tokens = {f'{name}_token': text for name, text in self._strings.items() if text is not None}
    return _compile_template(self.chat_template).render(
        messages=list(messages), tools=None, documents=None,
        add_generation_prompt=add_generation_prompt, **tokens)

  def _sp_encode(self, text: str) -> list[int]:
    """SentencePiece ids, with special-token text split out first (as transformers does)."""
    specials = sorted(self._added, key=len, reverse=True)
    pattern = '(' + '|'.join(re.escape(t) for t in specials) + ')' if specials else None
    parts = re.split(pattern, text) if pattern else [text]
    ids = []
    for k, part in enumerate(parts):
      if k % 2:                      # a special token's text
        ids.append(self._added[part])
      elif part:
        first = k == 0               # the dummy prefix goes at the start of the text only
        ids.extend(self._sp.encode(part) if first or self._legacy else self._sp_no_prefix(part))
    return ids

  def _sp_no_prefix(self, text: str) -> list[int]:
    """SentencePiece ids of ``text`` without the dummy-prefix space: encodes unk + text and drops
    the unk pieces (transformers' LlamaTokenizer trick)."""
    unk = self._sp.id_to_piece(self._sp.unk_id())
    return list(self._sp.encode(unk + text))[len(self._sp.encode(unk)):]

  def _added_tokens(self) -> dict[str, int]:
    """Special/added token text -> id (split out of text before SentencePiece sees it)."""
    added = {}
    for key, entry in (self._config.get('added_tokens_decoder') or {}).items():
      added[_token_text(entry)] = int(key)
    if self._sp is not None:
      for i in range(self._sp.get_piece_size()):
        if self._sp.is_control(i) or self._sp.is_unknown(i):
          added.setdefault(self._sp.id_to_piece(i), i)
    return added

  def _token_id(self, token: str) -> int:
    if self._hf is not None and self._hf.token_to_id(token) is not None:
      return int(self._hf.token_to_id(token))
    if token in self._added:
      return self._added[token]
    if self._sp is not None and self._sp.piece_to_id(token) != self._sp.unk_id():
      return int(self._sp.piece_to_id(token))
    raise ValueError(f'{self.path}: special token {token!r} is not in the vocabulary')

  def _id_text(self, i: int | None) -> str | None:
    if i is None:
      return None
    if self._hf is not None:
      return self._hf.id_to_token(i)
    by_id = {v: k for k, v in self._added.items()}
    return by_id.get(i) or self._sp.id_to_piece(i)

  def _find_chat_template(self) -> str | None:
    template = self._config.get('chat_template')
    if isinstance(template, list):   # [{'name': 'default', 'template': ...}, ...]
      named = {t.get('name'): t.get('template') for t in template}
      template = named.get('default')
    if not template:
      path = os.path.join(self.path, 'chat_template.jinja')
      if os.path.isfile(path):
        with open(path, encoding='utf-8') as f:
          template = f.read()
    if not template:
      template = _read_json(self.path, 'chat_template.json').get('chat_template')
    return template or None

  def __repr__(self) -> str:
    return f'HFTokenizer({self.path!r}, vocab_size={self.vocab_size})'


def _read_json(directory: str, name: str) -> dict:
  """The JSON object in ``directory/name``, {} if the file is absent; one-line error if bad."""
  path = os.path.join(directory, name)
  if not os.path.isfile(path):
    return {}
  return jsonfile.read_object(path)


def _token_ids(directory: str, name: str) -> dict[str, list[int]]:
  """{'bos_token_id': [ids], ...} of ``directory/name`` (generation_config.json or
  config.json): an id or a list of ids each; null, absent or negative (old Llama conversions'
  ``pad_token_id: -1``) mean none. ValueError naming the file and key for anything else (was
  an int() error or a TypeError traceback)."""
  config, ids = _read_json(directory, name), {}
  for key in ('bos_token_id', 'eos_token_id', 'pad_token_id', 'unk_token_id'):
    value = config.get(key)
    value = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(i) is int for i in value):
      raise ValueError(f'{os.path.join(directory, name)}: {key}={config[key]!r}: expected a '
                       'token id or a list of ids')
    if [i for i in value if i >= 0]:
      ids[key] = [i for i in value if i >= 0]
  return ids


def _token_text(entry) -> str | None:
  """A special token's text: a string, or an AddedToken dict ``{'content': ...}``."""
  if isinstance(entry, dict):
    return entry.get('content')
  return entry if isinstance(entry, str) else None


@functools.lru_cache(maxsize=8)
def _compile_template(template: str):
  """The chat template compiled like transformers does: an ImmutableSandboxedEnvironment with
  trim_blocks/lstrip_blocks, loop controls, and the globals templates use (raise_exception,
  strftime_now) plus a tojson filter that does not escape HTML."""
  import jinja2  # pylint: disable=g-import-not-at-top
  from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=['jinja2.ext.loopcontrols'])
  env.filters['tojson'] = tojson
  env.globals['raise_exception'] = raise_exception
  env.globals['strftime_now'] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template)


def load_tokenizer(path: str = ARITH_SPM_PATH) -> Tokenizer:
  """Loads the tokenizer at ``path``: a SentencePiece ``.model`` file, or a Hugging Face model
  directory (``tokenizer.json`` or ``tokenizer.model`` plus its JSON configs).

  Raises:
    FileNotFoundError: ``path`` does not exist, or the directory has no tokenizer file.
    ValueError: the file type is not supported, or a config file is broken.
  """
  path = os.path.expanduser(os.fspath(path))
  if os.path.isdir(path):
    return HFTokenizer(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'tokenizer file not found: {path}')
  if path.endswith('.model'):
    return SentencePieceTokenizer(path)
  raise ValueError(f'unsupported tokenizer file (expected a .model file or a Hugging Face '
                   f'model directory): {path}')


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
