r"""Recipes of the scaling sweep: two model sizes x two algorithms on the arithmetic task.

  python -m experiments.scaling.run_sweep run      # all of it, ~25-35 min on 2 shared CPU cores
  python -m rft_jax.main --config experiments/scaling/sweep_config.py:grpo_tiny \
      --workdir runs/scaling_sweep/grpo_tiny        # one run by hand

Arguments (`get_config(arg)`):
  sft_small            SFT of the small model from scratch (configs/sft_arith.py, same teacher);
                       its params become the small model's base policy (run_sweep exports them).
  <algo>_<size>        RL: algo in {grpo, dr_grpo} (configs/grpo_arith.py, dr_grpo_arith.py),
                       size in {tiny, small}. tiny = configs/common.tiny_model (790K params)
                       from the shipped base rft_jax/assets/arith_base; small = small_model()
                       (186K params) from the sft_small export.
Each RL run is the recipe with a shorter length (STEPS) and a dense held-out eval (every
EVAL_EVERY steps, 256 prompts, mean@8) so that a curve has ~20 points to fit.
"""
from configs import common, dr_grpo_arith, grpo_arith, sft_arith

STEPS = 100
EVAL_EVERY = 5
SWEEP_DIR = 'runs/scaling_sweep'
ALGOS = {'grpo': grpo_arith, 'dr_grpo': dr_grpo_arith}
SIZES = ('tiny', 'small')


def small_model():
  """A ~0.19M-parameter variant of the tiny model: half the width, 3 layers, 2 heads."""
  model = common.tiny_model()
  model.hidden_size = 64
  model.intermediate_size = 256
  model.num_hidden_layers = 3
  model.num_attention_heads = 2
  model.num_key_value_heads = 1
  model.head_dim = 32
  return model


def base_dir(size: str) -> str:
  return 'rft_jax/assets/arith_base' if size == 'tiny' else f'{SWEEP_DIR}/base_{size}'


def get_config(arg: str = 'grpo_tiny'):
  if arg == 'sft_small':
    config = sft_arith.get_config()
    config.name = 'sft_small'
    config.model = small_model()
    config.telemetry.tensorboard = False
    return config
  algo, _, size = arg.rpartition('_')
  if algo not in ALGOS or size not in SIZES:
    raise ValueError(f'unknown sweep recipe {arg!r}: expected sft_small or <algo>_<size> with '
                     f'algo in {sorted(ALGOS)} and size in {SIZES}')
  config = ALGOS[algo].get_config()
  config.name = arg
  if size == 'small':
    config.model = small_model()
  config.init_from = base_dir(size)
  config.train.steps = STEPS
  config.train.eval_every = EVAL_EVERY
  config.train.ckpt_every = 50
  config.telemetry.tensorboard = False
  return config
