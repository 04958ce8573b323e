"""GSM8K (grade-school math word problems) as a TFDS dataset, built from local files.

Nothing is downloaded: the user puts the official files in a directory (TFDS's ``manual_dir``,
``config.task.manual_dir``)::

  MANUAL_DIR/train.jsonl   7473 lines  {"question": "...", "answer": "... #### 72"}
  MANUAL_DIR/test.jsonl    1319 lines

(e.g. ``grade_school_math/data/`` of github.com/openai/grade-school-math). Each line is one
JSON object with string fields ``question`` and ``answer``; the answer is the worked solution
ending in ``#### <final number>``.

Records are dicts ``{'id': int64, 'prompt': text, 'answer': text, 'solution': text}``: ``id`` is
the 0-based line number in its file, ``prompt`` the question (raw: the chat template and the
instruction are applied by the pipeline, see ``pipeline.PromptFormat``), ``answer`` the text
after the last ``####`` (stripped, e.g. ``'72'`` or ``'1,234'``; the ``gsm8k`` verifier
normalises it), ``solution`` the full answer field.

The files are checked at every load: a missing file, a line that is not UTF-8 or not a JSON
object, a missing or non-string field, an empty question or an answer without ``####`` raises
ValueError naming the file and line. With ``skip_bad_train``
(``config.task.bad_records='skip'``) a malformed line of train.jsonl is left out instead and its
one-line reason returned; one of test.jsonl (the held-out set) still raises. The prepared
dataset holds the well-formed records only (in the default mode that is every record). It lives in
``DATA_DIR/gsm8k/files_<hash>/``, where the hash covers both files' bytes, so editing the files
makes a new dataset instead of reusing a stale one.

Only ``file_format='array_record'`` is used (no TensorFlow here); read with
``builder.as_data_source``.
"""
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from rft_jax.data import arith

SPLIT_FILES = {'train': 'train.jsonl', 'test': 'test.jsonl'}


class _NoCustomConfigWarning(logging.Filter):
  """Drops TFDS's 'Using custom data configuration: Gsm8kConfig(...)' warning: every build is
  a custom config (named by the files' hash), so it printed a long line on every run that
  reads as a problem with the user's files."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.msg == 'Using custom data configuration: %s'
                and isinstance(record.args, tuple) and record.args
                and isinstance(record.args[0], Gsm8kConfig))


def _builder(config: 'Gsm8kConfig', root: str) -> 'Gsm8k':
  """Gsm8k(config) without TFDS's custom-configuration warning (the filter is on the absl
  logger only while the builder is made, so no other warning is touched)."""
  quiet, absl_logger = _NoCustomConfigWarning(), logging.getLogger('absl')
  absl_logger.addFilter(quiet)
  try:
    return Gsm8k(config=config, data_dir=root, file_format='array_record')
  finally:
    absl_logger.removeFilter(quiet)


def _files_error(manual_dir: str, detail: str) -> FileNotFoundError:
  names = ' and '.join(SPLIT_FILES.values())
  return FileNotFoundError(f'GSM8K manual_dir {manual_dir}: {detail}; it must hold {names} '
                           '(the official GSM8K files, one {"question", "answer"} per line)')


def split_path(manual_dir: str, split: str) -> str:
  """Path of ``split``'s file in ``manual_dir``; FileNotFoundError naming both if missing."""
  manual_dir = os.path.expanduser(manual_dir)
  if not os.path.isdir(manual_dir):
    raise _files_error(manual_dir, 'no such directory')
  paths = [os.path.join(manual_dir, name) for name in SPLIT_FILES.values()]
  folders = [os.path.basename(p) for p in paths if os.path.isdir(p)]
  if folders:   # said as such: 'missing train.jsonl' beside a train.jsonl/ folder reads wrong
    raise _files_error(manual_dir, ', '.join(folders) + ' is a directory, not a file')
  missing = [os.path.basename(p) for p in paths if not os.path.isfile(p)]
  if missing:
    raise _files_error(manual_dir, 'missing ' + ', '.join(missing))
  return os.path.join(manual_dir, SPLIT_FILES[split])


def record_where(path: str, index: int) -> str:
  """How errors name record ``index`` of ``path``: 'PATH line N (record N-1)'."""
  return f'{path} line {index + 1} (record {index})'


class FileSource:
  """A prepared split (random access, as ``builder.as_data_source``) whose records are named by
  ``path`` and line in the training stream's errors (pipeline.RecordError), as at load."""

  def __init__(self, source, path: str):
    self._source, self.path = source, path

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    return self._source[index]

  def record_where(self, rid: int) -> str:
    return record_where(self.path, rid)


def data_source(builder, split: str) -> FileSource:
  """``split`` of a prepared builder (load_builder) as a FileSource naming its file."""
  return FileSource(builder.as_data_source(split=split),
                    split_path(builder.builder_config.manual_dir, split))


def parse_record(line: str | bytes, index: int, path: str) -> dict[str, Any]:
  """One JSONL line (text, or its bytes as read from the file) -> a record; ValueError naming
  ``path`` and line ``index`` if malformed, also when the bytes are not UTF-8."""
  where = record_where(path, index)
  if isinstance(line, bytes):
    try:
      line = line.decode('utf-8')
    except UnicodeDecodeError as e:
      raise ValueError(f'{where}: not UTF-8 (byte 0x{line[e.start]:02x} at column '
                       f'{e.start + 1})') from None
  try:
    raw = json.loads(line.rstrip('\r\n'))
  except json.JSONDecodeError as e:   # its own "line 1" would read oddly after ours
    raise ValueError(f'{where}: not valid JSON ({e.msg} at column {e.colno})') from None
  except ValueError as e:
    raise ValueError(f'{where}: not valid JSON ({e})') from None
  if not isinstance(raw, dict):
    raise ValueError(f'{where}: expected a JSON object, got {type(raw).__name__}')
  for field in ('question', 'answer'):
    if field not in raw:
      raise ValueError(f'{where}: missing field {field!r}')
    if not isinstance(raw[field], str):
      raise ValueError(f'{where}: field {field!r} is {type(raw[field]).__name__}, not a string')
  if not raw['question'].strip():
    raise ValueError(f'{where}: empty question')
  if '####' not in raw['answer']:
    raise ValueError(f"{where}: answer has no '####' before the final answer")
  final = raw['answer'].rsplit('####', 1)[1].strip()
  if not final:
    raise ValueError(f"{where}: nothing after '####' in the answer")
  return {'id': index, 'prompt': raw['question'].strip(), 'answer': final,
          'solution': raw['answer']}


def read_split(manual_dir: str, split: str,
               skipped: list[str] | None = None) -> list[dict[str, Any]]:
  """Every record of ``split`` (checked, see ``parse_record``); blank lines are skipped but
  still count for ids and line numbers. A malformed line raises ValueError, or, with a
  ``skipped`` list, is left out and its one-line reason appended to the list. Read as bytes
  and decoded line by line, so a line that is not UTF-8 is one malformed line like any other
  (named, or skipped), not a UnicodeDecodeError for the whole file."""
  path = split_path(manual_dir, split)
  records = []
  with open(path, 'rb') as f:
    for index, line in enumerate(f):
      if index == 0:   # a byte-order mark, as Windows editors write, is no part of the JSON
        line = line.removeprefix(b'\xef\xbb\xbf')
      if not line.strip():
        continue
      try:
        records.append(parse_record(line, index, path))
      except ValueError as e:
        if skipped is None:
          raise
        skipped.append(str(e))
  if not records:
    raise ValueError(f'{path}: no records')
  return records


def long_prompts_in(task, tokenizer, records: list[dict], split: str):
  """long_prompts.scan of ``records`` of ``split``, their prompts rendered as config ``task``
  renders them (pipeline.PromptFormat), each named by its file and line."""
  from rft_jax.data import long_prompts, pipeline  # pylint: disable=g-import-not-at-top
  source = pipeline.formatted(records, tokenizer, pipeline.PromptFormat.of_task(task))
  return long_prompts.scan(source, tokenizer, task.max_prompt_len,
                           where=functools.partial(record_where,
                                                   split_path(task.manual_dir, split)))


def check_prompt_lengths(task, tokenizer, test: list[dict]) -> None:
  """ValueError naming the first of the ``test`` records (those the eval reads) whose prompt is
  longer than task.max_prompt_len (the run would stop at its first eval); the train split is
  rft_jax/train_prompts.py's (check)."""
  found = long_prompts_in(task, tokenizer, test, 'test')
  if found.over:
    raise ValueError(found.error())


def files_digest(manual_dir: str) -> str:
  """A short hash of both split files' bytes (names the prepared dataset)."""
  h = hashlib.sha256()
  for split in sorted(SPLIT_FILES):
    with open(split_path(manual_dir, split), 'rb') as f:
      h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()[:16]


@dataclasses.dataclass
class Gsm8kConfig(tfds.core.BuilderConfig):
  """A GSM8K build from the files of one ``manual_dir`` (named by their hash)."""
  manual_dir: str = ''


class Gsm8k(tfds.core.GeneratorBasedBuilder):
  """TFDS builder for GSM8K from local files (see module docstring)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Put the official GSM8K train.jsonl and test.jsonl in the manual directory.')
  code_path = None   # nothing to download: no checksums file to look for

  def _info(self) -> tfds.core.DatasetInfo:
    return arith.LocalDatasetInfo(
        builder=self,
        description='GSM8K grade-school math word problems, from local JSONL files.',
        features=tfds.features.FeaturesDict({
            'id': np.int64,
            'prompt': tfds.features.Text(),
            'answer': tfds.features.Text(),
            'solution': tfds.features.Text(),
        }),
        disable_shuffling=True,   # record i of a split is line i of its file (blank lines aside)
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[Any]]:
    del dl_manager   # the files come from the builder config's manual_dir
    return {split: self._generate_examples(split) for split in SPLIT_FILES}

  def _generate_examples(self, split: str):
    for record in read_split(self.builder_config.manual_dir, split, skipped=[]):
      yield record['id'], record   # the well-formed records (load_builder checked the rest)


def load_builder(manual_dir: str, data_dir: str = '',
                 skip_bad_train: bool = False) -> tuple[Gsm8k, list[str]]:
  """(the prepared builder for the files in ``manual_dir``, generated on first use; the reasons
  of the train lines left out, empty unless ``skip_bad_train``).

  Raises:
    FileNotFoundError: ``manual_dir`` or one of its files is missing (one line).
    ValueError: a malformed record (one line naming the file and line).
  """
  manual_dir = os.path.abspath(os.path.expanduser(manual_dir))
  skipped: list[str] = []
  read_split(manual_dir, 'test')   # every record checked, prepared or not (~10 ms per 1k)
  read_split(manual_dir, 'train', skipped=skipped if skip_bad_train else None)
  config = Gsm8kConfig(name=f'files_{files_digest(manual_dir)}', manual_dir=manual_dir,
                       description=f'GSM8K from {manual_dir}')
  root = arith.resolve_data_dir(data_dir)
  builder = _builder(config, root)
  if builder.is_prepared():
    return builder, skipped
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, f'.gsm8k-{config.name}.lock'), 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # one writer when several processes start together
    builder = _builder(config, root)
    if not builder.is_prepared():
      tfds.disable_progress_bar()
      builder.download_and_prepare(
          file_format='array_record',
          download_config=tfds.download.DownloadConfig(try_download_gcs=False,
                                                       manual_dir=manual_dir))
  return builder, skipped


def load_split(split: str, manual_dir: str, data_dir: str = ''):
  """Random-access data source over one split (``'train'`` or ``'test'``); records as in the
  module docstring (text as ``bytes`` or ``str``). A malformed line of either file raises."""
  if split not in SPLIT_FILES:
    raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
  return data_source(load_builder(manual_dir, data_dir)[0], split)
