"""A Hugging Face hub cache entry given where a model directory is wanted.

`huggingface-cli download ORG/NAME` without `--local-dir` leaves the files in the hub cache,
`~/.cache/huggingface/hub/models--ORG--NAME/snapshots/<revision>/`; the entry's own directory
has no config.json, and was reported as not a model directory with no word of where it is.
No JAX import: config checks call this before anything heavy is loaded.
"""
import os


def snapshot_hint(path: str) -> str:
  """'' unless `path` is a hub cache entry with a snapshot holding config.json; then
  '; it is a Hugging Face hub cache entry: use <its snapshot>' (refs/main's revision, else the
  first snapshot by name), to append to a 'not a model directory' message."""
  snapshots = os.path.join(os.path.expanduser(path), 'snapshots')
  if not os.path.isdir(snapshots):
    return ''
  try:
    with open(os.path.join(os.path.expanduser(path), 'refs', 'main'), encoding='utf-8') as f:
      main = [f.read().strip()]
  except OSError:
    main = []
  found = [r for r in main + sorted(os.listdir(snapshots))
           if r and os.path.isfile(os.path.join(snapshots, r, 'config.json'))]
  return f'; it is a Hugging Face hub cache entry: use {os.path.join(snapshots, found[0])}' if (
      found) else ''
