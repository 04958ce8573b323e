"""Export the params of an SFT run's checkpoint as a standalone base-policy directory.

  python -m tools.export_base --config configs/sft_arith.py --workdir runs/sft_arith \
      --out rft_jax/assets/arith_base [--step N]

The GRPO recipe's `init_from` points at such a directory. Without --step the latest checkpoint
is used.
"""
import argparse
import os
import shutil


from rft_jax import checkpoint, components, runs
from rft_jax.algorithms import train_state as ts


def load_config(path: str):
  import importlib.util  # pylint: disable=g-import-not-at-top
  name, _, arg = path.partition(':')
  spec = importlib.util.spec_from_file_location('recipe', name)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--config', required=True)
  ap.add_argument('--workdir', required=True)
  ap.add_argument('--out', required=True)
  ap.add_argument('--step', type=int, default=None)
  args = ap.parse_args()
  config = load_config(args.config)
  c = components.build(config)
  tx = ts.make_optimizer(config.optim)
  shardings = runs.state_shardings(c, tx)
  like = runs.init_state(c.params, tx, shardings)
  ckpt = checkpoint.Checkpointer(os.path.join(args.workdir, 'checkpoints'))
  step = args.step if args.step is not None else ckpt.latest_step()
  if step is None:
    raise SystemExit(f'error: no checkpoint in {args.workdir}/checkpoints')
  state, _, meta, _ = ckpt.restore(step, like, shardings)
  if os.path.exists(args.out):
    shutil.rmtree(args.out)
  checkpoint.save_params(args.out, state.params)
  print(f'wrote params of step {step} to {args.out} (held-out eval: {meta.get("final_eval") or meta.get("last_eval")})')


if __name__ == '__main__':
  main()
