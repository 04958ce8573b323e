"""Offline preference pairs for the arithmetic task (DPO), as a TFDS dataset and a grain pipeline.

For every problem of the arith *train* split where a careless teacher can slip
(``arith.teacher_slip``: a forgotten carry, a dropped minus sign), one pair:

  chosen   = the correct answer              (e.g. "37+48=" -> "85")
  rejected = the teacher's slip of it        (e.g. "37+48=" -> "75")

The base policy was fine-tuned on demonstrations carrying exactly these slips
(configs/sft_arith.py), so these pairs point at its most common mistakes. Test-split problems
never appear: held-out eval stays clean. 9,804 pairs out of 20,500 train problems.

``ArithPairs`` is a TFDS ``GeneratorBasedBuilder`` (array_record, offline, deterministic: it
enumerates ``arith.split_problems()['train']`` in order). Records are
``{'id': int64 (the arith problem id), 'prompt', 'chosen', 'rejected', 'op': text}``.

``pair_batches`` turns the source into batches (B pairs, S = P + A, the ``pipeline.encode_sft``
layout for each answer):

  chosen_tokens, chosen_mask, chosen_loss_mask        int32 [B, S]   (loss mask: answer + EOS)
  rejected_tokens, rejected_mask, rejected_loss_mask  int32 [B, S]
  index  int64 [B]   the record's position in the source: the key of the reference table
  id     int64 [B]   the arith problem id
"""
import fcntl
import os
from typing import Any, Sequence

import grain
import numpy as np
import tensorflow_datasets as tfds

from rft_jax.data import arith, pipeline
from rft_jax.tokenizer import Tokenizer

PAIR_FIELDS = ('tokens', 'mask', 'loss_mask')


def slip_pairs(config: arith.ArithConfig = arith.BASE_CONFIG) -> list[dict[str, Any]]:
  """The pair records, in train-split order (pure Python, deterministic)."""
  out = []
  for pid, p in arith.split_problems(config)['train']:
    slip = arith.teacher_slip(p.a, p.op, p.b)
    if slip is not None:
      out.append({'id': pid, 'prompt': p.prompt, 'chosen': p.answer, 'rejected': str(slip),
                  'op': p.op})
  return out


class ArithPairs(tfds.core.GeneratorBasedBuilder):
  """TFDS builder of the arithmetic slip pairs (see module docstring); one split, 'train'."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  BUILDER_CONFIGS = [arith.BASE_CONFIG]
  DEFAULT_CONFIG_NAME = 'base'
  code_path = None   # downloads nothing: no checksums file to look up

  def _info(self) -> tfds.core.DatasetInfo:
    return arith.LocalDatasetInfo(
        builder=self,
        description='Arithmetic preference pairs: correct answer vs a teacher slip.',
        features=tfds.features.FeaturesDict({
            'id': np.int64, 'prompt': tfds.features.Text(), 'chosen': tfds.features.Text(),
            'rejected': tfds.features.Text(), 'op': tfds.features.Text()}),
        disable_shuffling=True)   # record i on disk = slip_pairs()[i]

  def _split_generators(self, dl_manager: Any):
    del dl_manager
    return {'train': self._generate_examples(slip_pairs(self.builder_config))}

  def _generate_examples(self, records):
    for r in records:
      yield r['id'], r


def load_pairs(data_dir: str = '', config: str = 'base'):
  """Random-access source of the pairs (generated once, under a lock, in the arith data dir)."""
  root = arith.resolve_data_dir(data_dir)
  builder = ArithPairs(config=config, data_dir=root, file_format='array_record')
  if not builder.is_prepared():
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f'.arith_pairs-{config}.lock'), 'w') as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      builder = ArithPairs(config=config, data_dir=root, file_format='array_record')
      if not builder.is_prepared():
        tfds.disable_progress_bar()
        builder.download_and_prepare(
            file_format='array_record',
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder.as_data_source(split='train')


def encode_pair(record: dict, tokenizer: Tokenizer, max_prompt_len: int,
                answer_len: int) -> dict[str, Any]:
  """One pair record -> chosen_* / rejected_* int32 [P+A] arrays (pipeline.encode_sft each)."""
  out = {'index': np.int64(record.get('index', -1)), 'id': np.int64(int(record['id']))}
  for side in ('chosen', 'rejected'):
    enc = pipeline.encode_sft({'id': int(record['id']), 'prompt': _to_str(record['prompt']),
                               'answer': _to_str(record[side])}, tokenizer, max_prompt_len,
                              answer_len)
    out.update({f'{side}_{k}': enc[k] for k in PAIR_FIELDS})
  return out


def _to_str(value) -> str:
  return value.decode('utf-8') if isinstance(value, (bytes, np.bytes_)) else str(value)


def pair_batches(source: Sequence[Any], tokenizer: Tokenizer, *, max_prompt_len: int,
                 answer_len: int, batch_size: int, seed: int, shuffle: bool = True,
                 num_epochs: int | None = None, shard_index: int = 0, shard_count: int = 1,
                 drop_remainder: bool = True) -> grain.DatasetIterator:
  """Checkpointable iterator of pair batches (layout in the module docstring).

  range(len(source)) -> (shuffle(seed)) -> repeat -> this process's share (batch_size rows of
  every global batch, pipeline.share_of_batches) -> read + encode -> batch, so each
  example keeps its source position ('index'). ``num_epochs=None`` repeats forever.
  """
  ds = grain.MapDataset.range(len(source))
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = pipeline.share_of_batches(ds.repeat(num_epochs), rows=batch_size,
                                 shard_index=shard_index, shard_count=shard_count).map(
      lambda i: encode_pair({**source[int(i)], 'index': int(i)}, tokenizer, max_prompt_len,
                            answer_len))
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  return iter(ds.to_iter_dataset(pipeline._READ_OPTIONS))  # pylint: disable=protected-access


class Subset:
  """The first n records of a random-access source (config.dpo.max_pairs)."""

  def __init__(self, source: Sequence[Any], n: int):
    self._source, self._n = source, min(n, len(source))

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i: int):
    if not 0 <= i < self._n:
      raise IndexError(i)
    return self._source[i]
