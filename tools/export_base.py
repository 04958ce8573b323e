"""Export the params of an SFT run's checkpoint as a standalone base-policy directory.

  python -m tools.export_base --config configs/sft_arith.py --workdir runs/sft_arith \
      --out rft_jax/assets/arith_base [--step N] [--config.a.b=v ...]

The GRPO recipe's `init_from` points at such a directory. Without --step the latest checkpoint
is used. `--config.a.b=v` overrides are the run's own (as given to `python -m rft_jax.main`).
Exit status 2 on bad input (one line naming it), 1 on a failure while working.
"""
import argparse
import os
import re
import shutil


from rft_jax import checkpoint, components
from tools import cli
from tools.checkpoint import check_out, open_run_checkpoint
from tools.cli import usage_exit


def load_config(path: str, overrides=()):
  """The recipe `path` (`file.py` or `file.py:arg`) with `--config.a.b=v` overrides applied,
  parsed as `python -m rft_jax.main` parses them (give the ones the run was started with); a bad
  file or key exits with rft_jax.main's one-line error."""
  from rft_jax import main as cli  # pylint: disable=g-import-not-at-top
  try:
    config, _, _ = cli.parse_command_line(['export', '--config', path, *overrides])
  except cli.UsageError as e:
    raise usage_exit(str(e)) from None
  return config


def parse_with_overrides(ap: argparse.ArgumentParser, argv=None):
  """(args, the `--config.a.b=v` arguments): ap's own arguments and the run's config overrides.
  Give ap (or the subcommand's parser that takes them) epilog=cli.OVERRIDES_EPILOG: --help
  then says they are taken."""
  args, rest = ap.parse_known_args(argv)
  stray = [a for a in rest if a.startswith('-') and not re.match(r'--?(no)?config\.', a)]
  if stray:
    ap.error(f'unrecognized arguments: {" ".join(stray)}')
  return args, rest


def main(argv=None):
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.OVERRIDES_EPILOG)
  ap.add_argument('--config', required=True)
  # `--out=~/x`: the shell leaves that `~`; expanded as config paths are
  ap.add_argument('--workdir', required=True, type=os.path.expanduser)
  ap.add_argument('--out', required=True, type=os.path.expanduser)
  ap.add_argument('--step', type=int, default=None)
  args, overrides = parse_with_overrides(ap, argv)
  config = load_config(args.config, overrides)
  try:
    # neither the task's data nor the initial weights (c.params: shapes; the run's are read)
    c = components.build(config, data=False, params=False)
  except components.SetupError as e:   # a file, the mesh: one line, as rft_jax.main's
    raise usage_exit(str(e)) from None
  check_out(args.out)   # before anything is read: a mistyped --out was deleted whole
  ckpt, step = open_run_checkpoint(args.workdir, args.step)
  try:
    with ckpt:   # closed however the restore ends (a failed one leaves orbax's logging muted)
      # the params alone: the optimizer moments (2x the params with AdamW) are never read
      params = ckpt.restore_params(step, c.params, c.param_shardings)
      meta = ckpt.restore_meta(step)
  except ValueError as e:   # a run of another model (as tools.checkpoint export says it)
    raise usage_exit(f'checkpoint {step} in {args.workdir} does not fit this config '
                     f'({str(e).splitlines()[0]})') from None
  if os.path.exists(args.out):
    shutil.rmtree(args.out)   # an earlier params directory (check_params_out)
  checkpoint.save_params(args.out, params)
  held_out = meta.get('final_eval') or meta.get('last_eval')
  print(f'wrote params of step {step} to {args.out} (held-out eval: {held_out})')


if __name__ == '__main__':
  main()
