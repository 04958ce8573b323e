"""Each checkpoint step's manifest, `rft_manifest.json`: {"step": N, "files": {relative path:
[size, crc32]}} of every file orbax wrote, written last (a step without one was cut short).
verify(step_dir) compares a step with it; rft_jax/checkpoint.py writes and checks it, and
rft_jax/initial_policy.py uses the same CRC for the initial weights' files.
"""
import json
import os
import zlib

MANIFEST = 'rft_manifest.json'


def file_crc32(path: str) -> int:
  """CRC-32 of a file's contents, read in 4 MiB chunks."""
  crc = 0
  with open(path, 'rb') as f:
    while chunk := f.read(1 << 22):
      crc = zlib.crc32(chunk, crc)
  return crc


def file_digests(step_dir: str) -> dict[str, list[int]]:
  """{relative path: [size, crc32]} of every file under step_dir except the manifest."""
  out = {}
  for root, _, files in os.walk(step_dir):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, step_dir)
      if rel not in (MANIFEST, MANIFEST + '.tmp'):
        out[rel] = [os.path.getsize(path), file_crc32(path)]
  return out


def verify(step_dir: str) -> str | None:
  """None if step_dir matches its manifest, else what is wrong (one line)."""
  try:
    with open(os.path.join(step_dir, MANIFEST)) as f:
      expected = json.load(f)['files']
  except FileNotFoundError:
    return 'no manifest'
  except (ValueError, KeyError) as e:
    return f'unreadable manifest ({e})'
  for rel, (size, crc) in sorted(expected.items()):
    path = os.path.join(step_dir, rel)
    if not os.path.exists(path):
      return f'missing file {rel}'
    if os.path.getsize(path) != size:
      return f'{rel} has {os.path.getsize(path)} bytes, expected {size}'
    if file_crc32(path) != crc:
      return f'{rel} fails its checksum'
  return None


def steps_on_disk(directory: str) -> list[int]:
  """The step directories (digit names) in a checkpoints directory, ascending; [] without it."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory)
                if d.isdigit() and os.path.isdir(os.path.join(directory, d)))
