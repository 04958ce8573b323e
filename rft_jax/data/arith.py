"""Procedurally generated integer arithmetic as a TFDS dataset.

A problem is ``a op b =`` with ``op`` in ``{+, -, *}``. The prompt string is
exactly ``f"{a}{op}{b}="`` (e.g. ``"37+48="``, ``"12-45="``, ``"37*8="``) and
the answer string is ``str(result)`` (possibly negative, e.g. ``"-33"``).

Operand ranges live in an ``ArithConfig`` (a TFDS ``BuilderConfig``); the
default ``'base'`` config uses ``a, b in [0, 99]`` for ``+``/``-`` and
``a in [0, 99], b in [0, 9]`` for ``*``. The builder enumerates every distinct
problem of the config, shuffles them with a fixed numpy seed, and takes the
first ``NUM_TEST`` as the ``test`` split and the rest as ``train``, so the two
splits are disjoint and the whole thing is deterministic and offline.

Records are dicts ``{'id': int64, 'prompt': text, 'answer': text, 'op': text}``
where ``id`` is the problem's index in the shuffled enumeration (test ids are
``0 .. NUM_TEST-1``). Text fields come back from the data source as ``bytes``
or ``str`` depending on the TFDS decoder; ``pipeline.py`` normalises them.

Only ``file_format='array_record'`` is used: TensorFlow is not installed, so
``tfds.load`` does not work; read with ``builder.as_data_source``.
"""

import dataclasses
import fcntl
import os
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

OPS = ('+', '-', '*')
NUM_TEST = 500
SHUFFLE_SEED = 20240601
DATA_DIR_ENV = 'RFT_JAX_DATA_DIR'
DEFAULT_DATA_DIR = os.path.join('~', '.cache', 'rft_jax', 'tfds')


@dataclasses.dataclass(frozen=True)
class Problem:
  """One arithmetic problem; ``prompt``/``answer`` are the task strings."""
  a: int
  op: str
  b: int

  @property
  def prompt(self) -> str:
    return f'{self.a}{self.op}{self.b}='

  @property
  def answer(self) -> str:
    return str(compute(self.a, self.op, self.b))


def compute(a: int, op: str, b: int) -> int:
  """Reference result of ``a op b`` for ``op`` in ``OPS``."""
  if op == '+':
    return a + b
  if op == '-':
    return a - b
  if op == '*':
    return a * b
  raise ValueError(f'unknown op {op!r}; expected one of {OPS}')


@dataclasses.dataclass
class ArithConfig(tfds.core.BuilderConfig):
  """Operand ranges (inclusive, from 0) of an arithmetic curriculum level.

  Attributes:
    max_a: largest left operand for every op.
    max_b: largest right operand for ``+`` and ``-``.
    max_b_mul: largest right operand for ``*``.
  """
  max_a: int = 99
  max_b: int = 99
  max_b_mul: int = 9


BASE_CONFIG = ArithConfig(
    name='base', description='a in [0,99]; b in [0,99] (+,-), [0,9] (*).')


def enumerate_problems(config: ArithConfig = BASE_CONFIG) -> list[Problem]:
  """All distinct problems of ``config``, in a fixed (unshuffled) order."""
  problems = []
  for op in OPS:
    max_b = config.max_b_mul if op == '*' else config.max_b
    for a in range(config.max_a + 1):
      for b in range(max_b + 1):
        problems.append(Problem(a, op, b))
  return problems


def split_problems(
    config: ArithConfig = BASE_CONFIG) -> dict[str, list[tuple[int, Problem]]]:
  """Deterministic disjoint splits as lists of ``(id, problem)``.

  The enumeration is permuted with ``np.random.default_rng(SHUFFLE_SEED)``;
  ``id`` is the position in that permutation. ``test`` holds ids
  ``0 .. NUM_TEST-1`` and ``train`` the rest.
  """
  problems = enumerate_problems(config)
  order = np.random.default_rng(SHUFFLE_SEED).permutation(len(problems))
  shuffled = [(i, problems[j]) for i, j in enumerate(order)]
  return {'test': shuffled[:NUM_TEST], 'train': shuffled[NUM_TEST:]}


def split_records(split: str, config: ArithConfig = BASE_CONFIG) -> list[dict[str, Any]]:
  """The records of ``split`` as the prepared dataset holds them, in memory (~40 ms for the
  base train split's 20.5k)."""
  return [{'id': pid, 'prompt': p.prompt, 'answer': p.answer, 'op': p.op}
          for pid, p in split_problems(config)[split]]


def make_corpus(config: ArithConfig = BASE_CONFIG) -> list[str]:
  """Sorted distinct prompt and answer strings, for tokenizer training."""
  texts = set()
  for p in enumerate_problems(config):
    texts.add(p.prompt)
    texts.add(p.answer)
  return sorted(texts)


class Arith(tfds.core.GeneratorBasedBuilder):
  """TFDS builder for the arithmetic task (see module docstring)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  BUILDER_CONFIGS = [BASE_CONFIG]
  DEFAULT_CONFIG_NAME = 'base'
  # No checksums file to find: this builder downloads nothing. (TFDS's own
  # code_path lookup also imports `importlib_resources`, absent here.)
  code_path = None

  def _info(self) -> tfds.core.DatasetInfo:
    # Explicit DatasetInfo: this builder lives outside a TFDS package dir, so
    # there is no README/CITATIONS metadata for TFDS to discover.
    return LocalDatasetInfo(
        builder=self,
        description='Procedural integer arithmetic: prompt "a op b=".',
        features=tfds.features.FeaturesDict({
            'id': np.int64,
            'prompt': tfds.features.Text(),
            'answer': tfds.features.Text(),
            'op': tfds.features.Text(),
        }),
        # Keep generation order on disk so record i of 'test' has id i.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[Any]]:
    del dl_manager  # Nothing to download.
    return {name: self._generate_examples(split_records(name, self.builder_config))
            for name in ('train', 'test')}

  def _generate_examples(self, records: list[dict[str, Any]]):
    for record in records:
      yield record['id'], record


class LocalDatasetInfo(tfds.core.DatasetInfo):
  """DatasetInfo of a dataset built here, never on TFDS's GCS bucket.

  TFDS's builder asks the bucket for precomputed metadata whenever the data dir holds none
  yet, and its `initialize_from_bucket` makes a temporary directory before it finds out that
  GCS is off: one empty /tmp/tmp*tfds directory left behind per dataset prepared in a new data
  dir. Nothing of these datasets is on the bucket, so the lookup is skipped.
  """

  def initialize_from_bucket(self) -> None:
    return None


def resolve_data_dir(data_dir: str = '') -> str:
  """``data_dir``, else ``$RFT_JAX_DATA_DIR``, else ``~/.cache/rft_jax/tfds``.
  """
  if not data_dir:
    data_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  return os.path.expanduser(data_dir)


def load_builder(data_dir: str = '', config: str = 'base') -> Arith:
  """Returns the prepared ``Arith`` builder, generating it on first use."""
  root = resolve_data_dir(data_dir)
  builder = Arith(config=config, data_dir=root, file_format='array_record')
  if builder.is_prepared():
    return builder
  # Generate once (~1 s). A lock file serialises processes that start together (parallel
  # test workers, several hosts sharing a directory) so only one of them writes the files.
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, f'.arith-{config}.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    builder = Arith(config=config, data_dir=root, file_format='array_record')
    if not builder.is_prepared():
      tfds.disable_progress_bar()
      builder.download_and_prepare(
          file_format='array_record',
          download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder


def load_split(split: str, data_dir: str = '', config: str = 'base'):
  """Random-access data source over one split (``'train'`` or ``'test'``).

  Supports ``len()`` and ``source[i]``; records are dicts with keys
  ``id, prompt, answer, op`` (text as ``bytes`` or ``str``).
  """
  if split not in ('train', 'test'):
    raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
  return load_builder(data_dir, config).as_data_source(split=split)


def teacher_slip(a: int, op: str, b: int) -> int | None:
  """The answer a careless teacher writes for `a op b`, or None where it cannot slip.

  Three classic slips: '+' forgets the carry out of the units digit (37+48 -> 75); '-' drops the
  minus sign of a negative result (12-45 -> 33); '*' forgets the units-digit carry
  (37*8: 7*8 = 56, so 296 -> 246).
  """
  if op == '+' and a % 10 + b % 10 >= 10:
    return a + b - 10
  if op == '-' and a < b:
    return b - a
  if op == '*' and (a % 10) * b >= 10:
    return a * b - 10 * ((a % 10) * b // 10)
  return None


def flawed_teacher(record: dict, rate: float) -> dict:
  """SFT demonstrations from an imperfect teacher: with probability `rate` (fixed per record id)
  the answer carries the teacher's slip (see teacher_slip). Used to build a base policy whose
  most likely answer is often wrong while the right one keeps real probability mass — the
  situation RL with an exact verifier is meant to repair. rate = 0 returns the record unchanged.
  """
  if rate <= 0:
    return record
  u = ((int(record['id']) * 2654435761 + 12345) % 2**32) / 2**32   # fixed per record
  if u >= rate:
    return record
  a, op, b = parse_prompt(record['prompt'])
  slip = teacher_slip(a, op, b)
  return record if slip is None else {**record, 'answer': str(slip)}


def parse_prompt(prompt: str) -> tuple[int, str, int]:
  """'37+48=' -> (37, '+', 48); '12-45=' -> (12, '-', 45)."""
  body = prompt.rstrip('=')
  for i, ch in enumerate(body[1:], start=1):   # operands are non-negative: skip index 0
    if ch in '+-*':
      return int(body[:i]), ch, int(body[i + 1:])
  raise ValueError(f'not an arithmetic prompt: {prompt!r}')
