"""Builds what every recipe needs from its config: mesh, tokenizer, model, params, data, eval.

Shared by the RL trainer and the SFT trainer so both load models and data the same way.
The data modules (tensorflow_datasets, grain) and rft_jax.checkpoint are imported where a task
is loaded or init_from read: a process that only builds the model (tools.bench, tools.checkpoint
export) does not import them.
"""
import contextlib
import dataclasses
import os
from typing import Any

import jax
from flax import nnx
from safetensors import SafetensorError

from rft_jax import config as config_lib
from rft_jax import config_rules
from rft_jax import train_prompts
from rft_jax.models import functional as lm
from rft_jax.models import hf_checkpoint
from rft_jax.models.hf_checkpoint import error_reason
from rft_jax.models.llama import ModelConfig
from rft_jax.parallel import distributed
from rft_jax.parallel import mesh as meshlib
from rft_jax.tokenizer import load_tokenizer


class SetupError(ValueError):
  """A config that cannot run on this machine or with these files (one-line message)."""


def initialize_distributed() -> None:
  """jax.distributed from the environment (rft_jax/parallel/distributed.py); a variable that
  cannot start it is a SetupError naming it (was a traceback from deep in JAX)."""
  try:
    distributed.initialize_from_env()
  except distributed.DistributedEnvError as e:
    raise SetupError(str(e)) from None


@dataclasses.dataclass
class Components:
  mesh: Any
  tokenizer: Any
  model_cfg: ModelConfig
  graphdef: Any
  params: Any               # pure dict, placed with param_shardings (build(params=False): shapes)
  param_shardings: Any
  train_source: Any
  test_source: Any
  skipped_at_load: tuple[str, ...] = ()   # train records left out (task.bad_records='skip')
  setup_notes: tuple[str, ...] = ()   # lines for the run's log (train_prompts.check)


def model_config(config) -> ModelConfig:
  """config.model, or with config.model.path the ModelConfig of that HF directory's config.json.

  With a path, config.model still states the architecture (the schema needs every key, and the
  recipe then documents what it trains): each field must equal config.json's, except dtype,
  which overrides the checkpoint's compute dtype, and max_position_embeddings, which may be
  smaller. Fields only config.json has (rope_scaling, sliding_window) come from there."""
  path = config.model.get('path', '')
  run_time = dict(remat=config.model.get('remat', 'none'),   # options, not architecture:
                  scan_layers=config.model.get('scan_layers', False))   # see ModelConfig
  if not path:
    return ModelConfig.from_dict(config.model)
  try:
    hf = hf_checkpoint.load_hf_config(path)
  except hf_checkpoint.HFCheckpointError as e:
    raise SetupError(f'config.model.path: {e}') from None
  fixes = []   # every field to change, in one message
  for key in config.model.keys():
    if key in ('path', 'dtype', *run_time):
      continue
    mine, theirs = config.model[key], getattr(hf, key)
    if mine > theirs if key == 'max_position_embeddings' else mine != theirs:   # may be smaller
      fixes.append((key, mine, theirs))
  if fixes:
    key, mine, theirs = fixes[0]
    sets = ' '.join(f'--config.model.{k}={v!r}' for k, _, v in fixes)
    raise SetupError(f'config.model.{key}={mine!r} does not match {path}/config.json '
                     f'({len(fixes)} field(s) differ; set: {sets})')
  return dataclasses.replace(hf, dtype=config.model.dtype, **run_time)


def _check_vocab(tokenizer, model_cfg: ModelConfig, config) -> None:
  if tokenizer.vocab_size > model_cfg.vocab_size:   # with model.path, the checkpoint's vocab_size
    where, path = f'tokenizer vocabulary ({tokenizer.vocab_size}, {tokenizer.path})', config.model
    raise SetupError(f"config.model.path={path.path}: its config.json's vocab_size="
                     f"{model_cfg.vocab_size} is smaller than the {where}: not its tokenizer"
                     if path.get('path', '') else f'config.model.vocab_size={model_cfg.vocab_size} '
                     f'is smaller than the {where}')


def _check_chat_template(config, tokenizer) -> None:
  """SetupError when config.task.chat_template (default True) is on and the tokenizer has none
  (pipeline.PromptFormat.of_task renders the prompts with it)."""
  if config.task.get('chat_template', True) and not getattr(tokenizer, 'chat_template', None):
    raise SetupError(f'config.task.chat_template=True but the tokenizer ({tokenizer!r}) has no '
                     'chat template; set it to False for plain-text prompts')


def _like(abstract_state):
  """ShapeDtypeStructs of the params pure dict (what init_from must hold)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                      nnx.to_pure_dict(abstract_state))


@contextlib.contextmanager
def _init_from_errors(config):
  """checkpoint.check_params / load_params errors as SetupError naming config.init_from."""
  try:
    yield
  except FileNotFoundError as e:
    raise SetupError(f'config.init_from: {e}') from None
  except ValueError as e:   # not a checkpoint, or arrays config.model does not have
    hint = ("; --config.init_from= starts from model.path's weights"
            if config.model.get('path', '') else '')   # a recipe's init_from kept beside it
    raise SetupError(f'config.init_from={config.init_from}: {str(e).splitlines()[0]}'
                     + hint) from None


def check_mesh(config, model_cfg: ModelConfig) -> None:
  """config.mesh against this machine's devices (data*fsdp*tensor at most jax.device_count(),
  a -1 resolved to the rest), against the model (meshlib.check_model_fits_mesh), as build
  does first, and against the batches (check_batch_splits), as the trainers do; placing
  nothing. With the multi-process variables set, the device count is not known before
  jax.distributed starts: only the fixed axes are checked."""
  if distributed.requested():
    shape = [max(int(config.mesh[a]), 1) for a in meshlib.MESH_AXES]   # -1: not known here
    note = ''
  else:
    try:
      shape = meshlib.mesh_shape(config.mesh, jax.device_count())
    except meshlib.MeshError as e:
      devices = jax.devices()
      raise SetupError(f'{e} ({len(devices)} x {devices[0].platform} on this machine)') from None
    note = meshlib.resolved_note(config.mesh, shape)
  try:
    meshlib.check_model_fits_mesh(model_cfg, shape)
  except meshlib.MeshError as e:
    raise SetupError(str(e) + note) from None
  check_batch_splits(config, shape, note)


def batch_splits(config) -> list[tuple[str, int, tuple[tuple[str, int], ...]]]:
  """The batches config's trainer splits by rows over the mesh, as [(key, rows, factors)]:
  data*fsdp times every factor's n divides rows. factors: ((key, n), ...), the equal parts a
  batch is cut into. RL: prompts_per_step*group_size rows in algo.microbatches (times PPO's
  algo.minibatches), and in algo.score_chunks when set; SFT: sft.batch_size; DPO: the pairs per
  step (dpo.batch_size, online rollout.prompts_per_step) in dpo.microbatches."""
  if config_lib.is_sft(config) or config_lib.is_dpo(config):   # records = rows (DPO: pairs)
    key, rows = process_batch(config)
    dpo = config_lib.is_dpo(config)
    return [(key, rows, (('dpo.microbatches', int(config.dpo.microbatches)),) if dpo else ())]
  algo, key = config.algo, 'rollout.prompts_per_step*group_size'
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  factors = (('algo.microbatches', int(algo.get('microbatches', 1))),)
  if config_lib.ppo_minibatches(algo) > 1:   # PPO
    factors += (('algo.minibatches', config_lib.ppo_minibatches(algo)),)
  splits = [(key, rows, factors)]
  if algo.get('score_chunks', 0):
    splits.append((key, rows, (('algo.score_chunks', int(algo.score_chunks)),)))
  return splits


def check_batch_splits(config, mesh, note: str = '') -> None:
  """SetupError (one line naming the keys) unless mesh (a Mesh or (data, fsdp, tensor)) splits
  every batch of batch_splits(config) evenly. note: resolved_note's words for a -1 axis."""
  for key, rows, factors in batch_splits(config):
    try:
      meshlib.check_batch_fits_mesh(rows, mesh, f'config.{key}', factors)
    except meshlib.MeshError as e:
      raise SetupError(str(e) + note) from None


def check_setup(config) -> None:
  """What `--validate_only` checks beyond the config, building nothing: the model section
  against model.path's config.json, its weight files (each opens; their headers hold every
  tensor the model needs, of its shape and a float dtype; not with init_from, whose weights the
  run reads instead), the tokenizer (it loads; its vocabulary fits the model) and, for GSM8K,
  both files of task.manual_dir (every line parsed) and the chat template; the train prompts'
  lengths (train_prompts.check); config.mesh against this machine's devices and the model
  (check_mesh); the process count, where known, against the batch (check_process_count);
  init_from's names and shapes against the model (orbax metadata). SetupError naming the key."""
  model_cfg = model_config(config)   # first: its message lists every field to set
  check_mesh(config, model_cfg)
  check_process_count(config)   # with JAX_NUM_PROCESSES, before jax.distributed starts too
  if config.model.get('path', '') and not config.init_from:   # else build reads init_from's
    try:   # every weight file opens (a download cut short fails here, not at load)
      hf_checkpoint.check_readable(config.model.path)
      hf_checkpoint.check_tensors(config.model.path, model_cfg)   # none missing, none odd
    except hf_checkpoint.HFCheckpointError as e:
      raise SetupError(f'config.model.path: {e}') from None
  tokenizer = _load_tokenizer(config)
  _check_vocab(tokenizer, model_cfg, config)   # before init_from's shapes, as build: cause first
  if config.init_from:
    from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
    with _init_from_errors(config):
      checkpoint.check_params(config.init_from, _like(lm.abstract_params(model_cfg)[1]))
  if config.task.name == 'gsm8k':
    from rft_jax.data import gsm8k  # pylint: disable=g-import-not-at-top
    _check_chat_template(config, tokenizer)
    try:
      test = gsm8k.read_split(config.task.manual_dir, 'test')
      gsm8k.check_prompt_lengths(config.task, tokenizer, test[:config.eval.num_prompts])
    except (FileNotFoundError, ValueError) as e:
      raise SetupError(f'config.task.manual_dir: {e}') from None
    if config_rules.eval_size_error(config, len(test)):   # as eval_batch would at run time
      raise SetupError(str(config_rules.eval_size_error(config, len(test))))
  train_prompts.check(config, tokenizer)   # as build does; GSM8K: train.jsonl parsed too


def build(config, data: bool = True, params: bool = True,
          check_prompts: bool = True) -> Components:
  """Mesh, tokenizer, model and its initial params (random, config.init_from, or the HF
  checkpoint at config.model.path, read shard by shard onto the mesh; without `params` only
  their shapes), data sources (None without `data`: e.g. tools.checkpoint export uses neither).
  With `data` and `check_prompts`, train_prompts.check first; load_policy, which trains nothing,
  passes False: over-long train prompts neither refuse nor slow loading a policy to sample."""
  try:
    mesh = meshlib.make_mesh(config.mesh)
  except meshlib.MeshError as e:
    raise SetupError(str(e)) from None
  tokenizer, model_cfg = _load_tokenizer(config), model_config(config)
  _check_vocab(tokenizer, model_cfg, config)
  try:   # before anything is placed: a clear line instead of a device_put shape error
    meshlib.check_model_fits_mesh(model_cfg, mesh)
  except meshlib.MeshError as e:
    raise SetupError(str(e) + meshlib.resolved_note(config.mesh, mesh)) from None
  if mesh.size < jax.device_count() and jax.process_count() > 1:   # other hosts left out
    raise SetupError(f'config.mesh={dict(mesh.shape)} uses {mesh.size} of the '
                     f'{jax.device_count()} devices of {jax.process_count()} processes; with '
                     'several processes data*fsdp*tensor must be the device count (or use -1)')
  # Before the weights load: a prompt found too long costs no minutes of loading.
  notes = train_prompts.check(config, tokenizer) if data and check_prompts else ()
  graphdef, abstract_state = lm.abstract_params(model_cfg)
  shardings = meshlib.param_shardings(abstract_state, mesh)
  if not params:
    params = _like(abstract_state)
  elif config.init_from:
    from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
    with _init_from_errors(config):
      params = checkpoint.load_params(config.init_from, _like(abstract_state), shardings)
  elif config.model.get('path', ''):
    try:
      params = hf_checkpoint.load_hf_params(config.model.path, model_cfg, shardings)
    except hf_checkpoint.HFCheckpointError as e:
      raise SetupError(f'config.model.path: {e}') from None
    except (OSError, SafetensorError) as e:   # a truncated or damaged safetensors file
      raise SetupError(f'config.model.path={config.model.path}: cannot read its weights '
                       f'({error_reason(e)})') from None
  else:
    params = jax.device_put(nnx.to_pure_dict(lm.create(model_cfg, config.seed)[1]), shardings)
  skipped: list[str] = []
  train_source, test_source = load_task(config, tokenizer, skipped) if data else (None, None)
  return Components(
      mesh=mesh, tokenizer=tokenizer, model_cfg=model_cfg, graphdef=graphdef, params=params,
      param_shardings=shardings, train_source=train_source, test_source=test_source,
      skipped_at_load=tuple(skipped), setup_notes=notes)


# The verifier whose 0/1 score is the held-out accuracy of each task (evaluation.Evaluator).
TASK_VERIFIERS = {'arith': 'correct', 'gsm8k': 'gsm8k'}


def _load_tokenizer(config):
  """config.tokenizer.path, or with '' the HF model dir config.model.path (its tokenizer)."""
  path = config.tokenizer.path or config.model.get('path', '')
  key = 'tokenizer.path' if config.tokenizer.path else 'model.path'
  try:
    tokenizer = load_tokenizer(path)
  except (FileNotFoundError, ValueError) as e:
    raise SetupError(f'config.{key}: {e}') from None
  except (OSError, RuntimeError) as e:   # sentencepiece: 'could not parse ModelProto'
    raise SetupError(
        f'config.{key}={path}: cannot load a tokenizer from it ({error_reason(e)})') from None
  _check_checkpoint_tokenizer(config, tokenizer)
  return tokenizer


def _check_checkpoint_tokenizer(config, tokenizer) -> None:
  """SetupError when model.path holds its own tokenizer and config.tokenizer.path names another
  of another vocabulary size: the checkpoint's embedding rows would be read as other tokens,
  silently (e.g. grpo_arith's SentencePiece kept beside a Llama model.path). Another EOS alone
  is no mismatch: a base checkpoint run with its instruct tokenizer (Llama 3 <|eot_id|>, Qwen2.5
  <|im_end|>) shares its vocabulary."""
  model_dir = config.model.get('path', '')
  if not (config.tokenizer.path and model_dir) or not any(
      os.path.isfile(os.path.join(model_dir, f)) for f in ('tokenizer.json', 'tokenizer.model')):
    return
  try:
    own = load_tokenizer(model_dir)
  except (OSError, RuntimeError, ValueError):   # a broken own tokenizer: the given one replaces it
    return
  if own.vocab_size != tokenizer.vocab_size:
    raise SetupError(
        f'config.tokenizer.path={config.tokenizer.path}: not the tokenizer of model.path='
        f'{model_dir} (vocabulary {tokenizer.vocab_size}, EOS id {tokenizer.eos_id}; the '
        f"checkpoint's: {own.vocab_size}, {own.eos_id}); --config.tokenizer.path= uses the "
        "checkpoint's")


def load_task(config, tokenizer, skipped: list[str] | None = None):
  """(train, test) sources of config.task. GSM8K reads config.task.manual_dir and renders its
  questions through the tokenizer's chat template (pipeline.PromptFormat); with
  task.bad_records='skip' its malformed train lines are left out, their reasons appended to
  `skipped`."""
  from rft_jax.data import arith, gsm8k, pipeline  # pylint: disable=g-import-not-at-top
  task = config.task
  if task.name == 'arith':
    try:
      splits = arith.load_split('train', task.data_dir), arith.load_split('test', task.data_dir)
    except OSError as e:   # data_dir is a file, or not writable for the first preparation
      where = f': {e.filename}' if e.filename else ''
      raise SetupError(f'config.task.data_dir={task.data_dir!r}: cannot prepare the arith '
                       f'dataset there ({e.strerror or e}{where})') from None
    return _readable(splits, task)
  if task.name != 'gsm8k':
    raise SetupError(f'config.task.name={task.name!r}: unknown task; known: '
                     + ', '.join(TASK_VERIFIERS))
  try:
    builder, left_out = gsm8k.load_builder(task.manual_dir, task.data_dir,
                                           skip_bad_train=task.get('bad_records') == 'skip')
  except (FileNotFoundError, ValueError) as e:   # one line naming the file (and record)
    raise SetupError(f'config.task.manual_dir: {e}') from None
  if skipped is not None:
    skipped.extend(left_out)
  splits = _readable([gsm8k.data_source(builder, s) for s in ('train', 'test')], task)
  _check_chat_template(config, tokenizer)
  return tuple(pipeline.formatted(s, tokenizer, pipeline.PromptFormat.of_task(task))
               for s in splits)


def _readable(splits, task):
  """The splits, after reading the first and last record of each: a prepared dataset damaged on
  disk (a truncated array_record file) fails here, at load and in one line, not at step 1 with
  a traceback through the input pipeline."""
  try:
    for source in splits:
      if len(source):
        source[0], source[len(source) - 1]   # pylint: disable=pointless-statement
  except Exception as e:  # pylint: disable=broad-exception-caught  (any reader error: say so)
    from rft_jax.data import arith  # pylint: disable=g-import-not-at-top
    root = arith.resolve_data_dir(task.data_dir)
    raise SetupError(f'config.task.data_dir={task.data_dir!r}: the prepared {task.name} dataset '
                     f'in {root} cannot be read ({error_reason(e)}); delete {root}/{task.name} to '
                     'prepare it again') from None
  return splits


def eval_batch(c: Components, config) -> dict:
  """The fixed held-out prompts (first eval.num_prompts of the test split), with the verifier
  that scores them: eval.verifier, '' (default) the task's."""
  from rft_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  if config_rules.eval_size_error(config, len(c.test_source)):   # as --validate_only says
    raise SetupError(str(config_rules.eval_size_error(config, len(c.test_source))))
  try:
    batch = pipeline.eval_prompts(c.test_source, c.tokenizer,
                                  max_prompt_len=config.task.max_prompt_len,
                                  num_prompts=config.eval.num_prompts)
  except ValueError as e:   # names the record and what is wrong with it
    raise SetupError(f'test split: {e}') from None
  return {**batch, 'verifier': config.eval.get('verifier', '') or TASK_VERIFIERS[config.task.name]}


def process_batch(config) -> tuple[str, int]:
  """The batch each process reads an equal share of, as (config key, records per step): RL and
  online DPO rollout.prompts_per_step, SFT sft.batch_size, offline DPO dpo.batch_size."""
  if config_lib.is_sft(config):
    return 'sft.batch_size', config.sft.batch_size
  if config_lib.is_dpo(config) and config.dpo.mode != 'online':
    return 'dpo.batch_size', config.dpo.batch_size
  return 'rollout.prompts_per_step', config.rollout.prompts_per_step


def check_process_count(config, count: int | None = None) -> None:
  """SetupError naming process_batch's key unless `count` processes (None: as many as
  distributed.known_process_count says, if it knows) split that batch evenly."""
  try:
    count, where = (count, '') if count else distributed.known_process_count()
  except distributed.DistributedEnvError as e:   # JAX_NUM_PROCESSES='x'
    raise SetupError(str(e)) from None
  key, rows = process_batch(config)
  if count and rows % count:
    raise SetupError(f'config.{key}={rows} is not divisible by the {count} processes{where} '
                     f'(each reads an equal share of every batch); make it a multiple of {count}')


def process_share(config) -> dict:
  """pipeline.*_batches arguments for this process's rows of the global batch of
  process_batch(config) (hostdata.GlobalBatches puts them back together); SetupError naming its
  config key when the processes cannot split it evenly."""
  count = jax.process_count()
  check_process_count(config, count)
  return dict(batch_size=process_batch(config)[1] // count, shard_index=jax.process_index(),
              shard_count=count)
