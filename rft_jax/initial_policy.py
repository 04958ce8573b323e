"""Which initial policy a run started from, so that resuming cannot silently swap it.

The reference policy (the KL anchor of GRPO and PPO, DPO's reference) is the initial policy,
rebuilt at start-up from its source; checkpoints hold it only once remediation has reset it. A
resume whose source now holds other weights used to train on against another reference with
nothing said: `model.path` pointing at another snapshot of the same shape, `init_from` at
another checkpoint, or, with a random initial policy, another `seed`.

workdir/initial_policy.json records the source when a run starts:

  {"source": "init_from" | "model.path" | "random",
   "seed": int,                                             (random only)
   "path": absolute directory,                              (init_from, model.path)
   "files": {name: {"size", "crc32", "path", "mtime_ns"}}}  (init_from, model.path)

and an invocation that resumes from a checkpoint of a run with a reference policy is compared
with it (check) before the checkpoint is read (SFT, and GRPO without KL or remediation, keep no
reference and are not checked). Files are compared by size and CRC-32 of their contents (~1 s
per GB read); one whose absolute path, size and modification time equal the recorded ones is
taken as unchanged without reading it, so resuming in place reads nothing. The directory may
move. Of an init_from directory only the files orbax reads as the params count (policy_names):
one of them added or missing counts as another policy; anything else beside them (a README,
.DS_Store, notes, orbax's commit_success.txt) is ignored.
"""
import json
import os

import jax

from rft_jax import atomic_file, components
from rft_jax.checkpoint_manifest import file_crc32
from rft_jax.models import hf_checkpoint

RECORD = 'initial_policy.json'

# What orbax reads from a params directory (checkpoint.save_params): its metadata files at the
# top, named with a leading '_' (_CHECKPOINT_METADATA, _METADATA, _sharding), the OCDBT store
# (manifest.ocdbt, d/, ocdbt.process_<i>/) and array_metadatas/, or, saved without OCDBT, one
# zarr directory per array (it holds .zarray, or zarr.json for zarr3).
_ORBAX_DIRS = ('d', 'array_metadatas')
_ZARR_ARRAY = ('.zarray', 'zarr.json')
_ZARR_HIDDEN = ('.zarray', '.zattrs', '.zgroup', '.zmetadata')


def source(config) -> tuple[str, str]:
  """(kind, path) of the initial policy, in components.build's order: config.init_from, else
  config.model.path, else a random init drawn with config.seed (path '')."""
  if config.init_from:
    return 'init_from', os.path.abspath(os.path.expanduser(config.init_from))
  path = config.model.get('path', '')
  if path:
    return 'model.path', os.path.abspath(os.path.expanduser(path))
  return 'random', ''


def policy_names(names) -> set[str]:
  """Those of `names` (paths relative to an init_from directory) that orbax reads as the params
  (see _ORBAX_DIRS), less hidden files anywhere (.DS_Store, macOS ._*, editor files)."""
  split = [(n, n.split(os.sep)) for n in names]
  zarr = {parts[0] for _, parts in split if len(parts) == 2 and parts[1] in _ZARR_ARRAY}

  def read(parts):
    if any(p.startswith('.') and p not in _ZARR_HIDDEN for p in parts):
      return False
    if len(parts) == 1:
      return parts[0].startswith('_') or parts[0] == 'manifest.ocdbt'
    return parts[0] in _ORBAX_DIRS or parts[0].startswith('ocdbt.process_') or parts[0] in zarr
  return {n for n, parts in split if read(parts)}


def _files(kind: str, path: str) -> dict[str, str]:
  """{name relative to path: absolute file} of the files the initial policy is read from."""
  if kind == 'model.path':
    files = sorted(set(hf_checkpoint.weight_map(path).values()))
  else:   # an orbax params directory: its files, through symlinked directories too
    files, seen = [], set()
    for d, subdirs, names in os.walk(path, followlinks=True):
      real = os.path.realpath(d)
      if real in seen:   # a symlink loop, or a directory reached twice
        subdirs[:] = []
        continue
      seen.add(real)
      files += [os.path.join(d, f) for f in names]
    named = {os.path.relpath(f, path): f for f in files}
    return {name: named[name] for name in sorted(policy_names(named))}
  return {os.path.relpath(f, path): f for f in files}


def _stat(path: str) -> dict:
  st = os.stat(path)
  return {'size': st.st_size, 'path': path, 'mtime_ns': st.st_mtime_ns}


def describe(config) -> dict:
  """The record of this config's initial policy (reads every file of its source)."""
  kind, path = source(config)
  if kind == 'random':
    return {'source': kind, 'seed': int(config.seed)}
  return {'source': kind, 'path': path, 'files': {
      name: {**_stat(f), 'crc32': file_crc32(f)} for name, f in _files(kind, path).items()}}


def _what(record: dict) -> str:
  if record.get('source') == 'random':
    return f'a random init with config.seed={record.get("seed")}'
  return f'config.{record.get("source")}={record.get("path")!r}'


def _read(workdir: str) -> dict | None:
  path = os.path.join(workdir, RECORD)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise components.SetupError(f'{path}: unreadable ({type(e).__name__}: {e}); it records '
                                'the initial policy this run started from') from None


def check(config, workdir: str) -> dict:
  """Raises SetupError when this config's initial policy is not the one the run in `workdir`
  started from; returns this config's record (for `record`). A workdir without a record (a
  run started by an older rft_jax) is not checked."""
  theirs = _read(workdir)
  kind, path = source(config)
  if theirs is None:
    return describe(config)
  tail = ('the reference policy would change; resume with that initial policy, or use a new '
          '--workdir')
  refuse = lambda what: components.SetupError(
      f'{what}, but the run in {workdir} started from {_what(theirs)} (its {RECORD}): {tail}')
  if theirs.get('source') != kind or (kind == 'random' and theirs.get('seed') != config.seed):
    mine = {'source': kind, 'path': path, 'seed': config.seed}
    raise refuse(f'the initial policy is {_what(mine)}')
  if kind == 'random':
    return {'source': kind, 'seed': int(config.seed)}
  files, recorded = _files(kind, path), theirs.get('files', {})
  if kind == 'init_from':   # a record written before policy_names listed every file there
    recorded = {name: recorded[name] for name in policy_names(recorded)}
  if set(files) != set(recorded):
    listed = lambda names: ', '.join(sorted(names)[:3]) + (' ...' if len(names) > 3 else '')
    added, missing = set(files) - set(recorded), set(recorded) - set(files)
    raise refuse(f'config.{kind}={path!r} holds other files'
                 + (f' (added: {listed(added)})' if added else '')
                 + (f' (missing: {listed(missing)})' if missing else ''))
  mine = {}
  for name, f in sorted(files.items()):
    st, want = _stat(f), recorded[name]
    unchanged = all(st[k] == want.get(k) for k in ('path', 'size', 'mtime_ns'))
    crc = want.get('crc32') if unchanged else file_crc32(f)
    if st['size'] != want.get('size') or crc != want.get('crc32'):
      raise components.SetupError(
          f'config.{kind}={path!r}: its {name} differs (size or CRC-32) from the one the run in '
          f'{workdir} started from ({_what(theirs)}, its {RECORD}): {tail}')
    mine[name] = {**st, 'crc32': crc}
  return {'source': kind, 'path': path, 'files': mine}


def record(workdir: str, described: dict) -> None:
  """Writes workdir/initial_policy.json (process 0), atomically."""
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, RECORD)
  with atomic_file.replacing(path) as tmp, open(tmp, 'w', encoding='utf-8') as f:
    json.dump(described, f, indent=2, sort_keys=True)
