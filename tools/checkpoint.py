"""Inspect, export and convert checkpoints between Hugging Face directories and rft_jax.

  python -m tools.checkpoint inspect DIR
      DIR: a HF model dir (config.json + safetensors) or an orbax pytree dir (a params dir such
      as rft_jax/assets/arith_base, or a run's RUN/checkpoints/<step> or its state). Prints
      family, config, each tensor's shape and dtype, and the parameter count; for a HF dir
      whether rft_jax loads it (its config and every tensor's name and shape). Exits 1 with
      the reason as its last line (stderr) when rft_jax cannot load it, or a file cannot be
      read (e.g. a truncated safetensors file). A run directory (or its checkpoints/) is no
      checkpoint: exit 2 naming its step directories.
  python -m tools.checkpoint export --config configs/X.py --workdir RUN --out DIR \
      [--step N] [--dtype bfloat16|float32] [--max-shard-gb 2] [--config.a.b=v ...]
      The params of RUN's latest (or --step) checkpoint as a HF dir that transformers and vLLM
      load. With config.model.path set, the family, token ids and the tokenizer / generation
      files of that source dir are carried over, never its weights in any format (the files of
      a tokenizer.path dir win). Only the checkpoint's params are read (no optimizer state). Give
      the `--config.a.b=v` overrides the run was started with (e.g. --config.model.path=...):
      the model is built from the config. --out must be new, empty or a HF model dir (an
      earlier export), and not one the run reads (config.model.path, tokenizer.path).
  python -m tools.checkpoint convert HF_DIR --out DIR
      A HF dir's params as an orbax params dir (for `init_from`, with model.path = HF_DIR).
  python -m tools.checkpoint rewind RUN --step N
      Sets RUN's checkpoints after step N aside (into RUN/checkpoints.rewound/, with its
      summary.json and incidents.md, and copies of its logs: rft_jax/rewind.py), so the same
      training command resumes exactly from step N, e.g. with a lower --config.optim.lr after a
      halt. Refused (exit 2) when N is not a checkpoint of RUN, RUN is not a run directory, or
      a run is using it.
  python -m tools.checkpoint rewind RUN --undo [NAME]
      Puts the latest rewind of RUN (or RUN/checkpoints.rewound/NAME) back as it was: its
      checkpoints, summary.json and incidents.md, and the logs from their copies
      (rft_jax/rewind_undo.py). Refused (exit 2), nothing moved, when RUN has checkpoints after
      the step since (the run went on), nothing is set aside, a run is using RUN, or the
      set-aside is damaged or incomplete.

Exit status, as rft_jax.main's: 2 bad input (a bad argument, config or --out, a run directory
without that checkpoint or in use, a HF dir rft_jax does not load), one line naming it; 1 a
failure while working (and inspect's verdict: not loadable, or unreadable).
"""
import json
import math
import os
import shutil

from tools import cli
from tools.cli import usage_exit

# config.json fields carried from the source dir on export (the model fields are rewritten).
_CARRIED_FIELDS = ('bos_token_id', 'eos_token_id', 'pad_token_id')
# file name endings of weights in other formats (torch, flax, TF/Keras, GGUF, ONNX, numpy ...)
_WEIGHT_SUFFIXES = ('.safetensors', '.bin', '.pt', '.pth', '.ckpt', '.gguf', '.ggml', '.msgpack',
                    '.h5', '.hdf5', '.keras', '.onnx', '.tflite', '.npz', '.npy', '.pkl',
                    '.pickle', '.nemo', '.ot', '.mlmodel')


def is_weight_file(name: str) -> bool:
  """Whether a file of a HF directory holds weights, or indexes them, in some format (export
  copies the other files: weights beside the trained ones were stale, and loaders may pick
  them, e.g. `pytorch_model.bin`, `flax_model.msgpack`, `model-q4.gguf`, `tf_model.h5`)."""
  name = name.lower()
  return (name.endswith(_WEIGHT_SUFFIXES) or name.endswith('.index.json')
          or '.ckpt.' in name or '.data-0' in name)   # TF checkpoints' index and data files


def check_out(out: str) -> None:
  """Exits 2 unless --out may be replaced whole by a params directory (new, empty or an earlier
  one: rft_jax.checkpoint.check_params_out); call before reading any weights."""
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  try:
    checkpoint.check_params_out(out)
  except FileExistsError as e:
    raise usage_exit(f'--out {e}') from None


def check_hf_out(out: str, config) -> None:
  """Exits 2 unless export may write a HF directory into --out: new, empty, or a HF model
  directory (config.json naming `architectures`, as an earlier export), and not one the run
  reads (config.model.path, a tokenizer.path checkpoint: its weights and config.json would be
  replaced by the trained ones)."""
  from rft_jax.models import hf_checkpoint as hc  # pylint: disable=g-import-not-at-top
  if not os.path.lexists(out):
    return
  if not os.path.isdir(out):
    raise usage_exit(f'--out {out} exists and is not a directory')
  for key in ('model.path', 'tokenizer.path'):
    section, name = key.split('.')
    read = os.path.expanduser(config[section].get(name, ''))
    if read and os.path.isdir(read) and os.path.samefile(out, read):
      raise usage_exit(f'--out {out} is config.{key}, a directory the run reads: exporting '
                       'there would replace its files; give a new directory')
  names = os.listdir(out)
  if all(n.startswith('.shard') and n.endswith('.tmp') for n in names):
    return   # empty, or the temporary shards of an export that died before its config.json
  try:
    hf = hc.read_config_json(out)
  except hc.HFCheckpointError:
    hf = {}
  if not hf.get('architectures'):
    raise usage_exit(f'--out {out} exists and is not a HF model directory (no {hc.CONFIG} '
                     'naming its architectures); give a new or empty directory')


def check_model_path_given(source: str, workdir: str) -> None:
  """Exits 2 when config.model.path is '' but the run in `workdir` recorded one (its
  config.json): the model and tokenizer are built from it (else 'tokenizer file not found: ')."""
  from rft_jax import jsonfile, runs  # pylint: disable=g-import-not-at-top
  if source:
    return
  try:
    recorded = jsonfile.read_object(os.path.join(workdir, runs.RUN_CONFIG))
  except (OSError, ValueError):   # no record (or unreadable): checked later, as before
    return
  model = recorded.get('model')
  started = model.get('path') if isinstance(model, dict) else None
  if started and isinstance(started, str):
    raise usage_exit(f"config.model.path='': the run in {workdir} was started with "
                     f'--config.model.path={started} (its {runs.RUN_CONFIG}); give export the '
                     '--config.a.b=v overrides the run was started with')


def open_run_checkpoint(workdir: str, step: int | None):
  """-> (Checkpointer of workdir/checkpoints, step: the given one or the latest); exits 2 when
  workdir has no checkpoints directory (Checkpointer would create one) or not that step."""
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise usage_exit(f'no checkpoint in {directory} (not a run directory?)')
  ckpt = checkpoint.Checkpointer(directory)
  try:   # closed unless returned (a failed read or no such step)
    steps = ckpt.all_steps()
    step = step if step is not None else ckpt.latest_step()
    if step is None or step not in steps:
      where = f'at step {step} ' if step is not None else ''
      raise usage_exit(f'no checkpoint {where}in {directory} (there: '
                       f'{", ".join(map(str, steps)) or "none"})')
  except BaseException:
    ckpt.close()
    raise
  return ckpt, step


def inspect(path: str) -> None:
  from rft_jax.config_schema import relative_to_cwd  # pylint: disable=g-import-not-at-top
  from rft_jax.models import hf_checkpoint as hc  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise usage_exit(f'{path} does not exist{relative_to_cwd(path)}')
  hint = _run_dir_hint(path)
  if hint:   # its config.json is the run's: it was read as a HF config ('model_type=None')
    raise usage_exit(hint)
  if not os.path.isfile(os.path.join(path, hc.CONFIG)):
    return _inspect_orbax(path)
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  try:   # a damaged file: one line naming it, not a traceback
    hf = hc.read_config_json(path)
    hc.check_readable(path)
  except hc.HFCheckpointError as e:
    raise SystemExit(f'error: {e}') from None
  problem = None
  try:
    cfg = hc.load_hf_config(path)
    hc.check_tensors(path, cfg)   # names and shapes on disk against what the config builds
    print(f'family: {hc.family(hf)}  loadable by rft_jax: yes')
    print('config: ' + ', '.join(f'{k}={v}' for k, v in cfg.__dict__.items()))
  except hc.HFCheckpointError as e:
    problem = e
    print(f'loadable by rft_jax: no ({e})')
  total, dtypes = 0, set()
  files = hc.weight_map(path)
  for name in sorted(files):
    with safe_open(files[name], framework='np') as f:
      sl = f.get_slice(name)
      shape, dtype = sl.get_shape(), sl.get_dtype()
    total += math.prod(shape)
    dtypes.add(dtype)
    print(f'  {name:60s} {str(shape):16s} {dtype}  ({os.path.basename(files[name])})')
  print(f'{len(files)} tensors, {total:,} parameters, dtype on disk: {", ".join(sorted(dtypes))}')
  if problem is not None:   # the report above, then a non-zero exit with the reason
    raise SystemExit(f'error: not loadable by rft_jax: {problem}')


def _is_run_dir(path: str) -> bool:
  """A run's directory: its config.json is the run's (is_run_workdir alone: an empty dir too)."""
  from rft_jax import workdir_config  # pylint: disable=g-import-not-at-top
  return (os.path.isfile(os.path.join(path, workdir_config.RUN_CONFIG))
          and workdir_config.is_run_workdir(path))


def _run_dir_hint(path: str) -> str | None:
  """For a run directory or its `checkpoints` directory (neither is a checkpoint): which
  directories to inspect instead, else None."""
  from rft_jax.checkpoint_manifest import steps_on_disk  # pylint: disable=g-import-not-at-top
  if os.path.isfile(os.path.join(path, '_METADATA')):
    return None
  if os.path.basename(os.path.normpath(path)) == 'checkpoints':
    directory, what = path, 'the checkpoints directory of a run'
  elif _is_run_dir(path):
    directory, what = os.path.join(path, 'checkpoints'), 'a run directory'
  else:
    return None
  steps = steps_on_disk(directory)
  if not steps and directory == path:
    return None
  return (f'{path} is {what}; inspect one of its checkpoints, {os.path.join(directory, "STEP")}'
          f' (steps there: {", ".join(map(str, steps)) or "none"})')


def _inspect_orbax(path: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  if os.path.isfile(os.path.join(path, 'state', '_METADATA')):
    path = os.path.join(path, 'state')   # a run's checkpoint step: its train state
  if not os.path.isfile(os.path.join(path, '_METADATA')):
    from rft_jax.hf_hub import snapshot_hint  # pylint: disable=g-import-not-at-top
    raise usage_exit(f'{path} is neither a HF model dir (config.json) nor an orbax pytree '
                     'dir (_METADATA), nor a run checkpoint step (state/_METADATA)'
                     + snapshot_hint(path))
  # orbax warns (absl) that an item dir has no step metadata: its logger's own level, put back
  # after (set_verbosity set it, NOTSET by default, to WARNING: a notebook's INFO lines lost)
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  absl_logger.setLevel('ERROR')
  try:
    with ocp.PyTreeCheckpointer() as ckptr:
      tree = ckptr.metadata(os.path.abspath(path)).item_metadata
  finally:
    absl_logger.setLevel(level)
  if not jax.tree_util.tree_leaves(tree):
    raise usage_exit(f'{path}: orbax metadata lists no arrays')
  total = 0
  for keys, leaf in jax.tree_util.tree_leaves_with_path(tree):
    total += math.prod(leaf.shape)
    print(f'  {jax.tree_util.keystr(keys, simple=True, separator="."):60s} '
          f'{str(tuple(leaf.shape)):16s} {leaf.dtype}')
  print(f'orbax pytree: {total:,} numbers')


def export(args) -> None:
  from rft_jax import components, runs  # pylint: disable=g-import-not-at-top
  from rft_jax.models import hf_checkpoint as hc  # pylint: disable=g-import-not-at-top
  from tools.export_base import load_config  # pylint: disable=g-import-not-at-top
  config = load_config(args.config, args.overrides)
  source = config.model.get('path', '')
  check_hf_out(args.out, config)   # before anything is written: --out=model.path was overwritten
  check_model_path_given(source, args.workdir)
  try:   # the run's config.json: another recipe or model is named in one line
    runs.check_workdir_config(config, args.workdir, advice='give export the recipe and the '
                              '--config.a.b=v overrides the run was started with',
                              training=False)
    # neither the task's data nor the initial weights (c.params: shapes) are needed to export
    c = components.build(config, data=False, params=False)
  except components.SetupError as e:
    raise usage_exit(str(e)) from None
  ckpt, step = open_run_checkpoint(args.workdir, args.step)
  try:
    with ckpt:   # closed however the restore ends (a failed one leaves orbax's logging muted)
      # the params alone: the optimizer moments (2x the params with AdamW) are never read
      params = ckpt.restore_params(step, c.params, c.param_shardings)
  except ValueError as e:   # shapes of a run this config does not build (no config.json)
    raise usage_exit(f'checkpoint {step} in {args.workdir} does not fit this config '
                     f'({str(e).splitlines()[0]})') from None
  architecture, extra = None, {}
  if source:
    hf = hc.read_config_json(source)
    architecture, extra = hc.family(hf), {k: hf[k] for k in _CARRIED_FIELDS if k in hf}
  files = hc.save_hf(args.out, params, c.model_cfg, dtype=args.dtype,
                     max_shard_bytes=int(args.max_shard_gb * 2**30), architecture=architecture,
                     extra_config=extra)
  tokenizer_dir = os.path.expanduser(config.tokenizer.path)
  # tokenizer and generation files, so the directory is complete for serving: model.path's,
  # then those of the tokenizer the run used (tokenizer.path, e.g. a base checkpoint's instruct
  # tokenizer: its chat template and EOS ids are the ones the policy was trained to emit)
  for directory in (source, tokenizer_dir if os.path.isdir(tokenizer_dir) else ''):
    for name in sorted(os.listdir(directory) if directory else []):
      src = os.path.join(directory, name)
      if os.path.isfile(src) and name != hc.CONFIG and not is_weight_file(name):
        shutil.copy(src, os.path.join(args.out, name))
        if name not in files:
          files.append(name)
  print(f'wrote step {step} of {args.workdir} to {args.out}: {", ".join(files)}')


def convert(args) -> None:
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from rft_jax.models import functional, hf_checkpoint as hc  # pylint: disable=g-import-not-at-top
  from rft_jax.parallel import mesh as meshlib  # pylint: disable=g-import-not-at-top
  if _is_run_dir(args.hf_dir):   # its config.json is the run's, not a HF model's
    raise usage_exit(f'{args.hf_dir} is a run directory, not a Hugging Face model: convert reads '
                     "one; to write a run's weights in that format: python -m tools.checkpoint "
                     f'export --config RECIPE --workdir {args.hf_dir} --out DIR')
  check_out(args.out)   # before reading the weights: orbax's save replaces the whole --out
  cfg = hc.load_hf_config(args.hf_dir)
  hc.check_readable(args.hf_dir)   # a shard missing or cut short: one line naming it
  mesh = meshlib.make_mesh({'data': 1, 'fsdp': -1, 'tensor': 1})
  _, abstract = functional.abstract_params(cfg)
  params = hc.load_hf_params(args.hf_dir, cfg, meshlib.param_shardings(abstract, mesh))
  checkpoint.save_params(args.out, params)
  print(f'wrote {cfg.num_params():,} params of {args.hf_dir} to {args.out}; '
        f'use init_from={json.dumps(args.out)} with model.path={json.dumps(args.hf_dir)}')


def rewind(run: str, step: int | None, undo: str | None) -> None:
  """--step N: rewind.rewind; --undo [NAME]: rewind_undo.undo (NAME '': the latest)."""
  from rft_jax import rewind as rewind_lib, rewind_undo  # pylint: disable=g-import-not-at-top
  try:
    print(rewind_lib.rewind(run, step) if undo is None else rewind_undo.undo(run, undo))
  except rewind_lib.RewindError as e:
    raise usage_exit(str(e)) from None


def main(argv=None):
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0],
                          epilog='export: ' + cli.OVERRIDES_EPILOG)
  sub = ap.add_subparsers(dest='command', required=True)
  path = os.path.expanduser   # `--out=~/x`: the shell leaves that `~` (as config paths, expanded)
  p = sub.add_parser('inspect')
  p.add_argument('dir', type=path)
  p = sub.add_parser('export', epilog=cli.OVERRIDES_EPILOG)
  p.add_argument('--config', required=True)
  p.add_argument('--workdir', required=True, type=path)
  p.add_argument('--out', required=True, type=path)
  p.add_argument('--step', type=int, default=None)
  p.add_argument('--dtype', choices=('bfloat16', 'float32'), default=None,
                 help='dtype on disk (default: the model compute dtype)')
  p.add_argument('--max-shard-gb', type=float, default=2.0)
  p = sub.add_parser('convert')
  p.add_argument('hf_dir', type=path)
  p.add_argument('--out', required=True, type=path)
  p = sub.add_parser('rewind')
  p.add_argument('run', type=path)
  which = p.add_mutually_exclusive_group(required=True)
  which.add_argument('--step', type=int)
  which.add_argument('--undo', nargs='?', const='', metavar='NAME',
                     help='put back the latest rewind (or checkpoints.rewound/NAME)')
  from tools import export_base  # pylint: disable=g-import-not-at-top
  args, overrides = export_base.parse_with_overrides(ap, argv)
  if overrides and args.command != 'export':
    ap.error(f'unrecognized arguments: {" ".join(overrides)} (config overrides are for export)')
  args.overrides = overrides
  from rft_jax.models.hf_checkpoint import HFCheckpointError  # pylint: disable=g-import-not-at-top
  try:
    if args.command == 'inspect':
      inspect(args.dir)
    elif args.command == 'rewind':
      rewind(args.run, args.step, args.undo)
    else:
      (export if args.command == 'export' else convert)(args)
  except HFCheckpointError as e:   # export's model.path, convert's HF_DIR: not one rft_jax loads
    raise usage_exit(str(e)) from None


if __name__ == '__main__':
  main()
