"""Builds what every recipe needs from its config: mesh, tokenizer, model, params, data, eval.

Shared by the RL trainer and the SFT trainer so both load models and data the same way.
"""
import dataclasses
from typing import Any

import jax
from flax import nnx

from rft_jax import checkpoint
from rft_jax.data import arith, pipeline
from rft_jax.models import functional as lm
from rft_jax.models.llama import ModelConfig
from rft_jax.parallel import mesh as meshlib
from rft_jax.tokenizer import load_tokenizer


class SetupError(ValueError):
  """A config that cannot run on this machine or with these files (one-line message)."""


@dataclasses.dataclass
class Components:
  mesh: Any
  tokenizer: Any
  model_cfg: ModelConfig
  graphdef: Any
  params: Any               # pure dict, placed with param_shardings
  param_shardings: Any
  train_source: Any
  test_source: Any


def build(config) -> Components:
  """Mesh, tokenizer, model and its initial params (random or config.init_from), data sources."""
  try:
    mesh = meshlib.make_mesh(config.mesh)
  except meshlib.MeshError as e:
    raise SetupError(str(e)) from None
  tokenizer = load_tokenizer(config.tokenizer.path)
  model_cfg = ModelConfig.from_dict(config.model)
  if tokenizer.vocab_size > model_cfg.vocab_size:
    raise SetupError(f'config.model.vocab_size={model_cfg.vocab_size} is smaller than the '
                     f'tokenizer vocabulary ({tokenizer.vocab_size}, {config.tokenizer.path})')
  graphdef, abstract_state = lm.abstract_params(model_cfg)
  shardings = meshlib.param_shardings(abstract_state, mesh)
  if config.init_from:
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        nnx.to_pure_dict(abstract_state))
    try:
      params = checkpoint.load_params(config.init_from, like, shardings)
    except FileNotFoundError as e:
      raise SetupError(f'config.init_from: {e}') from None
    except ValueError as e:   # orbax: shape/structure mismatch with config.model
      raise SetupError(f'config.init_from={config.init_from} does not match config.model: '
                       f'{str(e).splitlines()[0]}') from None
  else:
    _, state = lm.create(model_cfg, config.seed)
    params = jax.device_put(nnx.to_pure_dict(state), shardings)
  if config.task.name != 'arith':
    raise SetupError(f"config.task.name={config.task.name!r}: unknown task; known: 'arith'")
  return Components(
      mesh=mesh, tokenizer=tokenizer, model_cfg=model_cfg, graphdef=graphdef, params=params,
      param_shardings=shardings,
      train_source=arith.load_split('train', config.task.data_dir),
      test_source=arith.load_split('test', config.task.data_dir))


def eval_batch(c: Components, config) -> dict:
  """The fixed held-out prompts (first eval.num_prompts of the test split)."""
  try:
    return pipeline.eval_prompts(c.test_source, c.tokenizer,
                                 max_prompt_len=config.task.max_prompt_len,
                                 num_prompts=config.eval.num_prompts)
  except ValueError as e:   # names the record and what is wrong with it
    raise SetupError(f'test split: {e}') from None

