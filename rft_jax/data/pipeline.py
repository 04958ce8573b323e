"""grain pipelines that turn a task data source into model-ready batches.

A source is any random-access sequence of records ``{'id', 'prompt',
'answer', ...}`` (e.g. ``arith.load_split(...)``, or a list of dicts); text
may be ``bytes`` or ``str``. Pipelines are

  source -> shuffle(seed) -> repeat -> this process's share -> map(tokenize) -> batch

(share_of_batches: with several processes each reads only its rows of every global batch;
rft_jax/parallel/hostdata.GlobalBatches gathers them)

built with ``grain.MapDataset``; they return grain ``DatasetIterator``s whose
``get_state()`` / ``set_state()`` resume the stream exactly (save the state in
the checkpoint).

Token layout (P = max_prompt_len, A = answer_len, B = batch size):

  prompt_tokens [B, P]   pad ... pad BOS p1 .. pk        (left-padded)
  tokens        [B, P+A] pad .. BOS p1 .. pk a1 .. am EOS pad ..

so every prompt ends at column P-1 and generation starts at column P. A prompt starts with
exactly one BOS when the tokenizer has one: none is added when the text already encodes to a
leading BOS (a chat template that writes ``bos_token``, as Llama's do), none exists for Qwen2.

Chat models see the prompt through the tokenizer's chat template: ``formatted(source, tokenizer,
PromptFormat(...))`` wraps a source so that each record's ``prompt`` is the rendered text
(system message, question + instruction as the user turn, then the assistant header). The
arithmetic task uses raw prompts.
"""

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import grain
import numpy as np

from rft_jax.tokenizer import Tokenizer

# Tokenisation is cheap: a couple of threads and a short prefetch suffice.
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)


def _to_str(value: Any) -> str:
  if isinstance(value, (bytes, np.bytes_)):
    return value.decode('utf-8')
  return str(value)


class RecordError(ValueError):
  """A bad record: `detail` about the record of id `rid`, said as 'record id=N: detail', or as
  `where` names it (a source's record_where, e.g. GSM8K's 'FILE line N+1 (record N)')."""

  def __init__(self, rid, detail: str, where: str | None = None):
    self.rid, self.detail = rid, detail
    super().__init__(f'{where or f"record id={rid}"}: {detail}')


def _naming(source, fn):
  """fn, its RecordError said naming the record as ``source.record_where(id)`` does (a source
  that knows its file: the training stream's errors then name file and line); fn itself for a
  source without record_where."""
  where = getattr(source, 'record_where', None)
  if where is None:
    return fn

  def named(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except RecordError as e:
      if not isinstance(e.rid, (int, np.integer)):   # no id to name it by ('?')
        raise
      raise RecordError(e.rid, e.detail, where(int(e.rid))) from None
  return named


def normalize_record(record: Mapping[str, Any]) -> dict[str, Any]:
  """``{'id': int, 'prompt': str, 'answer': str}`` from a raw source record.

  Raises:
    ValueError naming the record: a missing field, an id that is not an integer, an empty prompt.
  """
  rid = record.get('id', '?') if isinstance(record, Mapping) else '?'
  try:
    out = {'id': int(record['id']), 'prompt': _to_str(record['prompt']),
           'answer': _to_str(record['answer'])}
  except KeyError as e:
    raise RecordError(rid, f'missing field {e}') from None
  except (TypeError, ValueError) as e:
    raise RecordError(rid, f'bad field value ({e})') from None
  if not out['prompt'].strip():
    raise RecordError(out['id'], 'empty prompt')
  return out


class BadRecords:
  """Records skipped by a pipeline built with ``on_bad_record='skip'``.

  ``drain()`` returns the one-line reasons collected since the last call (thread-safe: grain's
  reader threads append). With ``on_bad_record='error'`` the first bad record raises instead.
  """

  def __init__(self, source_name: str = 'data'):
    self.source_name = source_name
    self.total = 0
    self._new: list[str] = []

  def add(self, reason: str) -> None:
    self.total += 1
    self._new.append(f'{self.source_name}: {reason}')

  def drain(self) -> list[str]:
    out, self._new = self._new, []
    return out


def _encode_or_skip(record, *, bad: BadRecords, encode):
  """encode(record), or None (recorded in `bad`) for a bad record."""
  try:
    return encode(record)
  except ValueError as e:
    bad.add(str(e))
    return None


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """How a task's question becomes the model's input text.

  Attributes:
    chat: render through ``tokenizer.apply_chat_template`` (with the generation prompt);
      False = the question (+ instruction) as plain text.
    system_prompt: the system message; '' = none (the template's default, e.g. Qwen2.5's
      "You are Qwen, created by Alibaba Cloud...").
    instruction: appended to the question on a new line ('' = nothing), e.g. "Please reason
      step by step, and put your final answer within \\boxed{}."
  """
  chat: bool = False
  system_prompt: str = ''
  instruction: str = ''

  @classmethod
  def of_task(cls, task) -> 'PromptFormat':
    """config.task's format: GSM8K's task.chat_template, system_prompt and instruction; the
    plain question for other tasks."""
    if task.name != 'gsm8k':
      return cls()
    return cls(chat=task.get('chat_template', True), system_prompt=task.get('system_prompt', ''),
               instruction=task.get('instruction', ''))

  def render(self, question: str, tokenizer: Tokenizer) -> str:
    user = f'{question}\n{self.instruction}' if self.instruction else question
    if not self.chat:
      return user
    messages = [{'role': 'system', 'content': self.system_prompt}] if self.system_prompt else []
    messages.append({'role': 'user', 'content': user})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


class FormattedSource:
  """A random-access source whose records' ``prompt`` is ``fmt.render(prompt)``; the raw
  question stays in ``'question'``. Rendering happens on read (cheap next to sampling)."""

  def __init__(self, source: Sequence[Any], tokenizer: Tokenizer, fmt: PromptFormat):
    self._source, self._tokenizer, self.format = source, tokenizer, fmt
    if hasattr(source, 'record_where'):   # the source's names for its records (_naming)
      self.record_where = source.record_where

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict[str, Any]:
    record = normalize_record(self._source[index])
    return {**record, 'question': record['prompt'],
            'prompt': self.format.render(record['prompt'], self._tokenizer)}


def formatted(source: Sequence[Any], tokenizer: Tokenizer,
              fmt: PromptFormat) -> Sequence[Any]:
  """``source`` with prompts rendered by ``fmt``; ``source`` itself for the plain default."""
  return source if fmt == PromptFormat() else FormattedSource(source, tokenizer, fmt)


def _short(text: str, limit: int = 80) -> str:
  text = repr(text)
  return text if len(text) <= limit else text[:limit - 3] + '...'


def prompt_ids(prompt: str, tokenizer: Tokenizer) -> list[int]:
  """The ids the model reads for ``prompt``: BOS (if the tokenizer has one, and only one) then
  its pieces, no EOS; len() is what ``max_prompt_len`` must hold."""
  ids = tokenizer.encode(prompt)
  if tokenizer.bos_id is not None and ids[:1] != [tokenizer.bos_id]:
    ids = [tokenizer.bos_id] + ids
  return ids


def encode_prompt(record: Mapping[str, Any], tokenizer: Tokenizer,
                  max_prompt_len: int) -> dict[str, Any]:
  """Tokenises one normalised record's prompt, left-padded to ``P``.

  Returns:
    ``{'prompt_tokens': int32 [P], 'prompt_mask': int32 [P], 'id': int64 [],
    'prompt': str, 'answer': str}``; the prompt is BOS (if the tokenizer has one, and only
    one) then its pieces, no EOS.

  Raises:
    ValueError: BOS + prompt is longer than ``max_prompt_len``.
  """
  ids = prompt_ids(record['prompt'], tokenizer)
  if len(ids) > max_prompt_len:
    raise RecordError(
        int(record['id']), f"prompt {_short(record['prompt'])} is "
        f'{len(ids)} tokens{" (with BOS)" if tokenizer.bos_id is not None else ""} > '
        f'max_prompt_len={max_prompt_len}')
  pad = max_prompt_len - len(ids)
  tokens = np.full((max_prompt_len,), tokenizer.pad_id, np.int32)
  tokens[pad:] = ids
  mask = np.zeros((max_prompt_len,), np.int32)
  mask[pad:] = 1
  return {'prompt_tokens': tokens, 'prompt_mask': mask,
          'id': np.int64(record['id']), 'prompt': record['prompt'],
          'answer': record['answer']}


def encode_sft(record: Mapping[str, Any], tokenizer: Tokenizer,
               max_prompt_len: int, answer_len: int) -> dict[str, Any]:
  """Prompt (left-padded to ``P``) + answer + EOS (right-padded to ``A``).

  Returns:
    ``{'tokens', 'mask', 'loss_mask'}``, each int32 ``[P+A]``, plus ``'id'``,
    ``'prompt'``, ``'answer'``. ``mask`` is 1 on every real token (BOS, prompt,
    answer, EOS); ``loss_mask`` is 1 exactly on the answer and EOS positions.

  Raises:
    ValueError: the prompt exceeds ``P`` or answer + EOS exceeds ``A``.
  """
  prompt = encode_prompt(record, tokenizer, max_prompt_len)
  answer_ids = tokenizer.encode(record['answer'], add_eos=True)
  if len(answer_ids) > answer_len:
    raise RecordError(
        int(record['id']), f"answer {record['answer']!r} is "
        f'{len(answer_ids)} tokens (with EOS) > answer_len={answer_len}')
  completion = np.full((answer_len,), tokenizer.pad_id, np.int32)
  completion[:len(answer_ids)] = answer_ids
  answer_mask = np.zeros((answer_len,), np.int32)
  answer_mask[:len(answer_ids)] = 1
  return {
      'tokens': np.concatenate([prompt['prompt_tokens'], completion]),
      'mask': np.concatenate([prompt['prompt_mask'], answer_mask]),
      'loss_mask': np.concatenate(
          [np.zeros((max_prompt_len,), np.int32), answer_mask]),
      'id': prompt['id'], 'prompt': prompt['prompt'],
      'answer': prompt['answer'],
  }


class _BatchShare:
  """Process i's rows of every global batch of a record stream (random access, lazy).

  With b rows per process and P processes (global batch B = P*b), element j is element
  (j // b) * B + i * b + j % b of `records`: process i holds rows [i*b, (i+1)*b) of each global
  batch, so the processes' batches concatenated in process order are exactly the batches one
  process reading B at a time would see. Only the records a process uses are read and encoded.
  """

  def __init__(self, records: grain.MapDataset, rows: int, index: int, count: int):
    self.records, self.rows, self.index, self.count = records, rows, index, count

  def __len__(self) -> int:
    return len(self.records) // (self.rows * self.count) * self.rows

  def __getitem__(self, j: int):
    batch, row = divmod(j, self.rows)
    return self.records[(batch * self.count + self.index) * self.rows + row]


def share_of_batches(ds: grain.MapDataset, *, rows: int, shard_index: int,
                     shard_count: int) -> grain.MapDataset:
  """ds -> process shard_index's `rows` rows of every global batch of rows*shard_count."""
  if not 0 <= shard_index < shard_count:
    raise ValueError(
        f'shard_index={shard_index} not in [0, shard_count={shard_count})')
  if shard_count == 1:
    return ds
  return grain.MapDataset.source(_BatchShare(ds, rows, shard_index, shard_count))


def _records(source: Sequence[Any], *, seed: int, shuffle: bool,
             num_epochs: int | None, rows: int, shard_index: int,
             shard_count: int, normalize: bool = True) -> grain.MapDataset:
  """source -> (shuffle) -> repeat -> this process's share -> (normalise), as a MapDataset."""
  ds = grain.MapDataset.source(source)
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = share_of_batches(ds.repeat(num_epochs), rows=rows, shard_index=shard_index,
                        shard_count=shard_count)
  return ds.map(_naming(source, normalize_record)) if normalize else ds


def prompt_batches(source: Sequence[Any], tokenizer: Tokenizer, *,
                   max_prompt_len: int, batch_size: int, seed: int,
                   shuffle: bool = True, num_epochs: int | None = None,
                   shard_index: int = 0, shard_count: int = 1,
                   bad_records: BadRecords | None = None) -> grain.DatasetIterator:
  """Checkpointable iterator of prompt batches for sampling.

  Each batch: ``'prompt_tokens'`` int32 [B, P] (left-padded, BOS first, no
  EOS), ``'prompt_mask'`` int32 [B, P], ``'id'`` int64 [B], ``'prompt'`` and
  ``'answer'`` numpy str arrays [B]. ``num_epochs=None`` repeats forever; a
  final partial batch is dropped so shapes stay static. With ``shard_count`` > 1,
  ``batch_size`` is this process's rows and process ``shard_index`` reads only its rows of
  every global batch of ``batch_size * shard_count`` records (share_of_batches).

  A bad record (missing field, empty or over-long prompt) raises ValueError naming it when the
  batch containing it is read; with ``bad_records`` given it is skipped and reported there.
  """
  encode = functools.partial(encode_prompt, tokenizer=tokenizer, max_prompt_len=max_prompt_len)
  if bad_records is None:
    ds = _records(source, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                  rows=batch_size, shard_index=shard_index, shard_count=shard_count
                  ).map(_naming(source, encode))
    ds = ds.to_iter_dataset(_READ_OPTIONS)
  else:
    ds = _records(source, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                  rows=batch_size, shard_index=shard_index, shard_count=shard_count,
                  normalize=False)
    checked = _naming(source, lambda record: encode(normalize_record(record)))
    ds = ds.map(functools.partial(_encode_or_skip, bad=bad_records, encode=checked))
    ds = ds.to_iter_dataset(_READ_OPTIONS).filter(lambda x: x is not None)
  return iter(ds.batch(batch_size, drop_remainder=True))


def sft_batches(source: Sequence[Any], tokenizer: Tokenizer, *,
                max_prompt_len: int, answer_len: int, batch_size: int,
                seed: int, num_epochs: int | None = None,
                shard_index: int = 0, shard_count: int = 1,
                teacher_error_rate: float = 0.0) -> grain.DatasetIterator:
  """Checkpointable, shuffled iterator of supervised (prompt, answer) batches.

  teacher_error_rate > 0 replaces that fraction of answers by a careless teacher's slip
  (arith.flawed_teacher): demonstrations from an imperfect teacher.

  Each batch: ``'tokens'``, ``'mask'``, ``'loss_mask'`` int32 [B, P+A] (see
  ``encode_sft``), ``'id'`` int64 [B], ``'prompt'``/``'answer'`` str [B]. With
  ``shard_count`` > 1, B is this process's rows of the global batch (share_of_batches).
  """
  ds = _records(source, seed=seed, shuffle=True, num_epochs=num_epochs,
                rows=batch_size, shard_index=shard_index, shard_count=shard_count)
  if teacher_error_rate > 0:
    from rft_jax.data import arith  # pylint: disable=g-import-not-at-top  (tfds: SFT only)
    ds = ds.map(functools.partial(arith.flawed_teacher, rate=teacher_error_rate))
  ds = ds.map(_naming(source, functools.partial(encode_sft, tokenizer=tokenizer,
                                                max_prompt_len=max_prompt_len,
                                                answer_len=answer_len)))
  ds = ds.batch(batch_size, drop_remainder=True)
  return iter(ds.to_iter_dataset(_READ_OPTIONS))


def eval_prompts(source: Sequence[Any], tokenizer: Tokenizer, *,
                 max_prompt_len: int, num_prompts: int) -> dict[str, Any]:
  """The first ``num_prompts`` records, in order, as one prompt batch.

  Same keys and layout as a ``prompt_batches`` batch, with B = num_prompts.

  Raises:
    ValueError: ``num_prompts`` is < 1 or more than the source holds; a bad record (named as
      the training stream names it: file and line for a source with ``record_where``).
  """
  if not 1 <= num_prompts <= len(source):
    raise ValueError(f'num_prompts={num_prompts} not in [1, {len(source)}] '
                     '(the number of records in the source)')
  encode = _naming(source, lambda record: encode_prompt(normalize_record(record), tokenizer,
                                                       max_prompt_len))
  items = [encode(source[i]) for i in range(num_prompts)]
  return {
      'prompt_tokens': np.stack([x['prompt_tokens'] for x in items]),
      'prompt_mask': np.stack([x['prompt_mask'] for x in items]),
      'id': np.array([x['id'] for x in items], np.int64),
      'prompt': np.array([x['prompt'] for x in items], dtype=str),
      'answer': np.array([x['answer'] for x in items], dtype=str),
  }
