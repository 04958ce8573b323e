"""Prompts longer than ``task.max_prompt_len`` in a finite source, found before training.

The input pipeline (pipeline.encode_prompt) refuses such a prompt only when a batch draws it,
maybe hours into a run. ``scan`` reads every record of a random-access source once instead:
the train split through rft_jax/train_prompts.py, which ``--validate_only``
(components.check_setup) and a run's set-up (components.build, before the weights load) both
call; GSM8K's eval records through gsm8k.check_prompt_lengths.

Cost: the token count of a prompt is at most its UTF-8 byte count + 2 (every piece of a
byte-level BPE or SentencePiece-with-byte-fallback vocabulary covers at least one byte; + the
SentencePiece leading-space piece and BOS), so only prompts longer than
``max_prompt_len - 2`` bytes are tokenized (a normalizer that expands text, as NFKC does a
ligature, could beat the bound: the pipeline still refuses such a prompt when it is drawn).
Measured on 2 shared CPU cores: 20.5k arith prompts ~0.2 s; 7.5k GSM8K-length prompts with the
tests' Qwen2-style tokenizer ~0.2 s when the limit clears their bytes, else ~2-3 s.
"""
import dataclasses
from typing import Any, Callable, Sequence

from rft_jax.data import pipeline
from rft_jax.tokenizer import Tokenizer

# Tokens a prompt can have beyond its UTF-8 byte count (BOS, SentencePiece's leading '▁').
_EXTRA_TOKENS = 2


@dataclasses.dataclass(frozen=True)
class Scan:
  """What ``scan`` found in one source.

  Attributes:
    limit: the max_prompt_len it was checked against.
    over: (record id, tokens) of each prompt longer than ``limit``, in source order.
    longest: tokens of the longest prompt over ``limit`` (0 when none is).
    where: names a record by its id, as the training stream's errors do (pipeline._naming).
  """
  limit: int
  over: tuple[tuple[int, int], ...]
  longest: int
  where: Callable[[int], str]

  def error(self) -> str:
    """One line naming the first over-long record, its length, the limit and the key to set."""
    rid, n = self.over[0]
    others = (f'{len(self.over)} prompts are longer, the longest {self.longest} tokens'
              if len(self.over) > 1 else 'the only one longer')
    return (f'{self.where(rid)}: its prompt is {n} tokens, more than config.task.max_prompt_len='
            f'{self.limit} ({others}; set --config.task.max_prompt_len={self.longest})')


def _name_by_id(source) -> Callable[[int], str]:
  """The source's record_where (GSM8K: file and line), else 'record id=N'."""
  return getattr(source, 'record_where', None) or (lambda rid: f'record id={rid}')


def scan(source: Sequence[Any], tokenizer: Tokenizer, max_prompt_len: int, *,
         where: Callable[[int], str] | None = None) -> Scan:
  """Every record of ``source`` (prompts as the pipeline reads them: pipeline.formatted) whose
  prompt_ids are longer than ``max_prompt_len``. A record the pipeline cannot normalise is
  passed over here (the pipeline names it, or skips it, as before). ``where``: how to name a
  record id (default: the source's record_where)."""
  over, longest = [], 0
  for index in range(len(source)):
    try:
      record = pipeline.normalize_record(source[index])
    except ValueError:
      continue
    prompt = record['prompt']
    if len(prompt) + _EXTRA_TOKENS <= max_prompt_len and (   # chars <= bytes: cheap first
        len(prompt.encode('utf-8')) + _EXTRA_TOKENS <= max_prompt_len):
      continue   # cannot be over: tokens <= bytes + _EXTRA_TOKENS
    n = len(pipeline.prompt_ids(prompt, tokenizer))
    if n > max_prompt_len:
      over.append((record['id'], n))
      longest = max(longest, n)
  return Scan(max_prompt_len, tuple(over), longest, where or _name_by_id(source))
