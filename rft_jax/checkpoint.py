"""Checkpoints with orbax, verified: a checkpoint is used only if every file it wrote is intact.

Layout of a run's checkpoints: workdir/checkpoints/<step>/{state, data, meta, [reference],
[reference_before_reset], rft_manifest.json}. `state` is the TrainState pytree (params, optimizer
state, step, run-time controls, monitor state); `data` the grain iterator state; `meta` a small
JSON dict (base-policy eval, remediation state, wall time); `reference` the reference policy's
params, present only once remediation has reset it (before that the reference is the initial
policy, rebuilt at start-up); `reference_before_reset` the reference an undo of a watched reset
puts back, present only while that reset is undoable and the reference before it was itself a
reset one (rft_jax/incidents.py undo_reference; the initial policy is rebuilt, never saved).
The sampling RNG is derived as fold_in(key(seed), step), so (seed, step) restore it exactly.

Crash safety. Orbax writes a checkpoint into a temporary directory and renames it into place when
complete. After that, `save` writes `rft_manifest.json`: the size and CRC-32 of every file. When a
Checkpointer opens a directory it verifies every checkpoint against its manifest; one with a
missing, truncated or altered file is moved to `<dir>.quarantine/<step>` and reported, never loaded.
One without a manifest (older rft_jax, or the process died between orbax's rename and the manifest)
is complete per orbax and used, reported as unverified; if restoring it fails, the caller
quarantines it and falls back to the previous one (rft_jax/runs.py). A verified one that fails to
restore is intact, so it is the config that differs: the caller refuses to start. Old checkpoints
are deleted by renaming them to `<step>.deleting` first, so a deletion cut short is never mistaken
for a checkpoint. Retention (`keep`) counts verified ones: an older goes once a newer is verified.

Disk. Before saving, free space is compared with 1.2 x the size of the last checkpoint, less the
params items the next one leaves out, plus those it adds (Checkpointer._needed_bytes; the first
checkpoint: the items' bytes in memory); too little space, or a write that fails, raises
CheckpointSaveError and leaves the earlier checkpoints untouched. What to do then is the caller's
policy (rft_jax/runs.py). A failed write is said in one line ('No space left on device (<dir>)'),
orbax's tracebacks muted (rft_jax/checkpoint_errors.py).

Multi-host: every process verifies; process 0 writes manifests and deletes (the directory is
shared storage, as orbax requires), and the others wait for it before they look again.

Standalone parameter directories (the shipped base policy, `init_from`) hold just the params:
rft_jax/param_dirs.py.
"""
import dataclasses
import json
import os
import shutil
import time
from typing import Any

import jax
from etils import epath

from rft_jax import checkpoint_errors
from rft_jax.checkpoint_errors import CheckpointReadError  # noqa: F401  (checkpoint.X for callers)
from rft_jax.checkpoint_manifest import MANIFEST, file_digests, steps_on_disk, verify
from rft_jax.parallel import hostdata
from rft_jax.param_dirs import abstract, orbax_module
from rft_jax.param_dirs import (  # noqa: F401  (checkpoint.X for callers)
    check_params, check_params_out, load_params, save_params)


BEFORE_RESET = 'reference_before_reset'   # the item an undo of a reference reset puts back
# TrainState fields started afresh (re-learnt) when a checkpoint's copy no longer fits, and why.
RESET_CAUSES = {'monitor': 'monitor.warmup changed, or an rft_jax with other signals wrote it'}
RESETTABLE_FIELDS = tuple(RESET_CAUSES)
_DISK_MARGIN = 1.2          # free space needed = margin * _needed_bytes


class CheckpointSaveError(OSError):
  """A checkpoint could not be written (full disk, I/O error); earlier ones are intact."""


def tree_nbytes(tree) -> int:
  """Global bytes of the arrays in a pytree."""
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, 'dtype'))


def _shapes(tree) -> list[tuple]:
  """Sorted shapes of a tree's arrays (or their metadata)."""
  return sorted(tuple(x.shape) for x in jax.tree.leaves(tree))


def _check_fits(name: str, saved: Any, mine: Any) -> None:
  """ValueError unless the saved arrays of field `name` have the shapes of `mine`."""
  saved_n, mine_n = _shapes(saved), _shapes(mine)
  if saved_n != mine_n:
    only_saved = [s for s in saved_n if s not in mine_n]
    only_mine = [s for s in mine_n if s not in saved_n]
    raise ValueError(f'its {name} arrays have other shapes than this config builds (saved '
                     f'{only_saved[:1] or saved_n[:1]}, here {only_mine[:1] or mine_n[:1]})')


def missing_leaves(tree) -> list[str]:
  """Dotted paths of the leaves a partial_restore left as the ShapeDtypeStruct it was asked
  for (the checkpoint has no array of that name)."""
  return [jax.tree_util.keystr(k, simple=True, separator='.') for k, leaf in
          jax.tree_util.tree_leaves_with_path(tree) if isinstance(leaf, jax.ShapeDtypeStruct)]


class Checkpointer:
  """Verified checkpoints over ocp.CheckpointManager (items above); see the module doc."""

  def __init__(self, directory: str, keep: int = 2):
    ocp = orbax_module()
    self.directory = os.path.abspath(directory)
    self.keep = keep
    self.problems: list[str] = []   # checkpoints found broken at open (for the run's log)
    self._primary = jax.process_index() == 0
    self._quiet = checkpoint_errors.Quiet()
    self._sweep()
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, cleanup_tmp_directories=True))

  def _sweep(self) -> None:
    """Finishes interrupted deletions; quarantines checkpoints that fail verification."""
    if not os.path.isdir(self.directory):
      return
    for d in os.listdir(self.directory):
      if d.endswith('.deleting') and self._primary:
        shutil.rmtree(os.path.join(self.directory, d), ignore_errors=True)
    for step in steps_on_disk(self.directory):
      step_dir = os.path.join(self.directory, str(step))
      if not os.path.exists(os.path.join(step_dir, MANIFEST)):
        # Orbax renamed it into place, so it is complete; it only cannot be checked (written by
        # an rft_jax without manifests, or the process died just before the manifest).
        self.problems.append(f'checkpoint {step} has no manifest: complete per orbax but not '
                             'verified')
        continue
      problem = verify(step_dir)
      if problem is not None:
        self.quarantine(step, problem)

  def quarantine(self, step: int, problem: str) -> None:
    """Moves checkpoint `step` to <dir>.quarantine/ (kept for inspection, never loaded)."""
    quarantine = os.path.join(self.directory + '.quarantine', f'{step}-{int(time.time())}')
    self.problems.append(f'checkpoint {step} is unusable ({problem}); moved to {quarantine}')
    if self._primary:
      os.makedirs(os.path.dirname(quarantine), exist_ok=True)
      os.replace(os.path.join(self.directory, str(step)), quarantine)
    if hasattr(self, '_manager'):
      self._manager.reload()

  def verified(self, step: int) -> bool:
    """Whether checkpoint `step` has a manifest (it passed verification when opened)."""
    return os.path.exists(os.path.join(self.directory, str(step), MANIFEST))

  def latest_step(self) -> int | None:
    return (self.all_steps() or [None])[-1]

  def all_steps(self) -> list[int]:
    """Steps of the verified checkpoints on disk, ascending."""
    return sorted(self._manager.all_steps())

  def delete(self, step: int) -> None:
    if self._primary:
      path = os.path.join(self.directory, str(step))
      os.replace(path, path + '.deleting')   # atomic: never a half-deleted "checkpoint"
      shutil.rmtree(path + '.deleting')
    hostdata.barrier(f'rft_jax delete {step}')   # else another process lists what is deleted
    self._manager.reload()

  def delete_after(self, step: int) -> list[int]:
    """Deletes checkpoints newer than `step` (a rewound run's abandoned future); returns them."""
    gone = [s for s in self.all_steps() if s > step]
    for s in gone:
      self.delete(s)
    return gone

  def _needed_bytes(self, items: dict) -> int:
    """Bytes the next checkpoint will take. items: {'state': TrainState, 'reference': params or
    None, BEFORE_RESET: params or None}, as save gets them (None: an item it does not write).
    From the latest checkpoint on disk, its bytes per entry (_entry_bytes):

      need = sum(bytes of its entries, less the params items `items` leaves out)
             + tree_nbytes(the params items of `items` it lacks)

    e.g. a latest of 5,100 bytes plus a 2,700-byte reference and a 2,700-byte
    reference_before_reset, next saving only a reference: 5,100 + 2,700. No checkpoint on disk
    yet: tree_nbytes(items)."""
    steps = self.all_steps()
    if not steps:
      return tree_nbytes(items)
    on_disk = self._entry_bytes(steps[-1])
    left_out = [k for k, v in items.items() if v is None]
    added = [v for k, v in items.items() if v is not None and k not in on_disk]
    return sum(n for k, n in on_disk.items() if k not in left_out) + tree_nbytes(added)

  def _entry_bytes(self, step: int) -> dict[str, int]:
    """{top-level entry of checkpoint `step` (an item's directory, a file): bytes of the files
    under it}, from its manifest, or by walking it when it has none (unverified)."""
    step_dir = os.path.join(self.directory, str(step))
    try:
      with open(os.path.join(step_dir, MANIFEST)) as f:
        files = {rel: size for rel, (size, _) in json.load(f)['files'].items()}
    except (OSError, ValueError, KeyError):   # unverified checkpoint: no manifest to read
      paths = [os.path.join(root, name) for root, _, names in os.walk(step_dir) for name in names]
      files = {os.path.relpath(p, step_dir): os.path.getsize(p) for p in paths}
    out = {}
    for rel, size in files.items():
      entry = rel.split(os.sep)[0]
      out[entry] = out.get(entry, 0) + size
    return out

  def save(self, step: int, state: Any, data_state: dict, meta: dict,
           reference: Any = None, reference_before_reset: Any = None) -> None:
    """Saves, waits, verifies; then drops verified checkpoints beyond `keep`. reference,
    reference_before_reset: params pytrees saved as those items (module doc), or None.

    Raises CheckpointSaveError (earlier checkpoints untouched) when the disk is too full or the
    write fails.
    """
    ocp = orbax_module()
    items = {'state': state, 'reference': reference, BEFORE_RESET: reference_before_reset}
    need = int(_DISK_MARGIN * self._needed_bytes(items))
    free = shutil.disk_usage(self.directory).free
    if free < need:
      raise CheckpointSaveError(f'{free / 2**20:.0f} MiB free in {self.directory}, a '
                                f'checkpoint needs about {need / 2**20:.0f} MiB')
    args = {'state': ocp.args.PyTreeSave(state),   # restored by field: _restore_state
            'data': ocp.args.JsonSave(data_state),
            'meta': ocp.args.JsonSave({**meta, 'has_reference': reference is not None})}
    if reference is not None:
      args['reference'] = ocp.args.StandardSave(reference)
    if reference_before_reset is not None:
      args[BEFORE_RESET] = ocp.args.StandardSave(reference_before_reset)
    try:
      with self._quiet.save():   # orbax's noise muted: a failed write is said below, in one line
        self._manager.save(step, args=ocp.args.Composite(**args), force=True)
        self._manager.wait_until_finished()
      step_dir = os.path.join(self.directory, str(step))
      if self._primary:
        manifest = {'step': step, 'files': file_digests(step_dir)}
        tmp = os.path.join(step_dir, MANIFEST + '.tmp')
        with open(tmp, 'w') as f:
          json.dump(manifest, f)
          f.flush()
          os.fsync(f.fileno())
        os.replace(tmp, os.path.join(step_dir, MANIFEST))
    except (OSError, ValueError) as e:   # orbax wraps some I/O errors
      self._discard_partial(step)
      reason, number = checkpoint_errors.describe(e, self.directory)
      error = CheckpointSaveError(reason)   # 'No space left on device (<dir>)'
      error.errno = number
      raise error from e
    for old in self.all_steps()[:-self.keep] if self.keep else []:
      self.delete(old)

  def _discard_partial(self, step: int) -> None:
    """Removes what a failed save of `step` left: its directory, or orbax's temporary one
    (`<step>.orbax-checkpoint-tmp`, holding what was written: space a full disk needs back)."""
    if self._primary and os.path.isdir(self.directory):
      for name in os.listdir(self.directory):
        if name == str(step) or name.startswith(f'{step}.orbax-checkpoint-tmp'):
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    self._manager.reload()

  def restore(self, step: int, like_state: Any, shardings: Any = None,
              like_reference: Any = None, reference_shardings: Any = None):
    """Restores (state, data_state, meta, reference or None) into the structure/shardings of
    `like_state` (and `like_reference`, for a checkpoint that holds a reset reference)."""
    ocp = orbax_module()
    with self._quiet.restore():   # a failed read is raised once, without orbax's tracebacks
      meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
      has_reference = meta['meta'].get('has_reference', False) and like_reference is not None
      state = self._restore_state(step, like_state, shardings)
      args = {'data': ocp.args.JsonRestore(), 'meta': ocp.args.JsonRestore()}
      if has_reference:
        args['reference'] = ocp.args.StandardRestore(abstract(like_reference, reference_shardings))
      out = self._manager.restore(step, args=ocp.args.Composite(**args))
    meta = {k: v for k, v in out['meta'].items() if k != 'has_reference'}
    return state, out['data'], meta, out['reference'] if has_reference else None

  def restore_reference_before_reset(self, step: int, like_params: Any,
                                     shardings: Any = None) -> Any:
    """Checkpoint `step`'s reference_before_reset item into the structure (and shardings) of
    like_params; the caller knows from the checkpoint's meta that it holds one.

    Raises CheckpointReadError (one line: what is wrong, the item's directory; the checkpoint
    is left in place) when the item is missing or cannot be read: a checkpoint without a
    manifest is not verified at open (module doc)."""
    ocp = orbax_module()
    item = os.path.join(self.directory, str(step), BEFORE_RESET)
    target = ocp.args.StandardRestore(abstract(like_params, shardings))
    try:
      with self._quiet.restore():
        out = self._manager.restore(step, args=ocp.args.Composite(**{BEFORE_RESET: target}))
    except Exception as e:  # pylint: disable=broad-exception-caught  (orbax: KeyError, ValueError)
      raise checkpoint_errors.read_error(e, item, f"checkpoint {step}'s {BEFORE_RESET} item (the "
                                         'reference an undo of the watched reference reset puts '
                                         'back)') from None
    return out[BEFORE_RESET]

  def restore_params(self, step: int, like_params: Any, shardings: Any = None) -> Any:
    """Checkpoint `step`'s state.params alone, into the structure (and shardings) of
    like_params (arrays or ShapeDtypeStructs): the optimizer state, monitor and the other items
    are never read (with AdamW's two moments, a third of `restore`'s state). ValueError (first
    line: which shapes differ, before any read; or which param the checkpoint lacks) when the
    saved params are not this model's."""
    _check_fits('params', self._state_metadata(step)['params'], like_params)
    with self._quiet.restore():
      params = self._restore_fields(step, {'params': abstract(like_params, shardings)})['params']
    missing = missing_leaves(params)
    if missing:   # the same shapes under other names: partial_restore left them unread
      raise ValueError(f'no param {missing[0]} ({len(missing)} missing): a checkpoint of another '
                       'model than this config builds')
    return params

  def restore_meta(self, step: int) -> dict:
    """Checkpoint `step`'s meta item (the JSON dict `save` got)."""
    ocp = orbax_module()
    with self._quiet.restore():
      out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return {k: v for k, v in out['meta'].items() if k != 'has_reference'}

  def _state_metadata(self, step: int) -> Any:
    """Orbax's metadata of checkpoint `step`'s state item ({field: tree of array metadata})."""
    ocp = orbax_module()
    return ocp.PyTreeCheckpointHandler().metadata(
        epath.Path(self.directory) / str(step) / 'state')

  def _restore_fields(self, step: int, target: dict) -> dict:
    """{field: restored tree} of the state item for target's fields (ShapeDtypeStruct trees);
    the fields saved but not in target are skipped: orbax reads none of their arrays."""
    ocp = orbax_module()
    args = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True)
    return self._manager.restore(step, args=ocp.args.Composite(state=args))['state']

  def _restore_state(self, step: int, like_state: Any, shardings: Any) -> Any:
    """The train state, restored field by field (for a dataclass like TrainState).

    A checkpoint from an older rft_jax may lack a field this version has (e.g. PPO's critic,
    added later): it keeps its value in `like_state`. A field in RESETTABLE_FIELDS whose saved
    layout no longer fits (RESET_CAUSES) is reset the same way. Both are reported in `problems`;
    params, optimizer state and step always come back exactly, or the restore fails.
    """
    ocp = orbax_module()
    if not dataclasses.is_dataclass(like_state):
      args = ocp.args.StandardRestore(abstract(like_state, shardings))
      return self._manager.restore(step, args=ocp.args.Composite(state=args))['state']
    saved = self._state_metadata(step)
    names = [f.name for f in dataclasses.fields(like_state)
             if getattr(like_state, f.name) is not None]
    # A field absent from the checkpoint, or saved as None (no arrays), is missing there.
    holds = lambda n: n in saved and any(hasattr(x, 'shape') for x in jax.tree.leaves(saved[n]))
    wanted = [n for n in names if holds(n)]
    misfits = [n for n in wanted if n in RESETTABLE_FIELDS
               and _shapes(saved[n]) != _shapes(getattr(like_state, n))]
    for n in wanted:   # checked before orbax starts reading (its failed reads log pages of noise)
      if n not in RESETTABLE_FIELDS:
        _check_fits(n, saved[n], getattr(like_state, n))
    why = ''   # + orbax's error when the first attempt fails
    attempts = [[n for n in wanted if n not in misfits],
                [n for n in wanted if n not in RESETTABLE_FIELDS]]
    for i, fields in enumerate(attempts):
      target = {n: abstract(getattr(like_state, n),
                             None if shardings is None else getattr(shardings, n))
                for n in fields}
      try:
        restored = self._restore_fields(step, target)
        break
      except ValueError as e:
        if i == 1 or attempts[1] == attempts[0]:
          raise
        why = f': {str(e).splitlines()[0]}'
    missing = [n for n in names if not holds(n)]
    if missing:
      self.problems.append(f'checkpoint {step} has no {", ".join(missing)} state (written by an '
                           'older rft_jax): starting it afresh')
    reset = [n for n in wanted if n not in fields]
    if reset:
      self.problems.append(f'checkpoint {step}: the saved {", ".join(reset)} state does not fit '
                           f'this run ({"; ".join(map(RESET_CAUSES.get, reset))}{why}); '
                           'starting it afresh')
    return like_state.replace(**restored)

  def close(self) -> None:
    """Waits for orbax's work, then closes. Orbax (0.12) removes interrupted saves' temporary
    directories on a thread started when the manager opens, and only a save waits for it: a
    process that ends soon after opening (a refused resume, an error in set-up) had that thread
    print 'cannot schedule new futures after shutdown' after its last line."""
    try:
      getattr(self._manager, '_maybe_await_cleanup_tmp_directory', lambda: None)()
      self._manager.close()
    finally:
      self._quiet.close()

  def __enter__(self) -> 'Checkpointer':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
