"""Hugging Face checkpoints in and out: safetensors <-> params (config.json <-> ModelConfig is
rft_jax/models/hf_config.py; its names are imported here, so one module loads a checkpoint).

A HF model directory holds `config.json` and either `model.safetensors` or shards listed in
`model.safetensors.index.json` ({"weight_map": {tensor name: file}}). Families:
LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM. Names (HF weights are [out, in], NNX
kernels [in, out]):

  model.embed_tokens.weight [V,E]                 -> embed_tokens.embedding [V,E]
  model.layers.{i}.self_attn.q_proj.weight [H*D,E] -> layers.{i}.self_attn.q_proj.kernel [E,H*D]
  model.layers.{i}.self_attn.q_proj.bias [H*D]     -> layers.{i}.self_attn.q_proj.bias (Qwen2)
  model.layers.{i}.mlp.gate_proj.weight [F,E]      -> layers.{i}.mlp.gate_proj.kernel [E,F]
  model.layers.{i}.input_layernorm.weight [E]      -> layers.{i}.input_layernorm.weight [E]
  model.norm.weight [E]                            -> norm.weight [E]
  lm_head.weight [V,E]                             -> lm_head.kernel [E,V] (absent when tied)

Params are float32 whatever the dtype on disk (bf16 and fp16 widen exactly); the config's dtype
becomes the compute dtype. A tensor that is missing, unexpected, of another shape or not a float
raises HFCheckpointError with one line naming the file and the tensor.
"""
import contextlib
import json
import os
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from rft_jax import jsonfile
from rft_jax.models import functional
from rft_jax.models.hf_config import (  # noqa: F401 (the config half, for callers)
    ARCHITECTURE, CONFIG, FAMILIES, HFCheckpointError, family, hf_config_dict,
    load_hf_config, read_config_json)
from rft_jax.models.llama import ModelConfig

# Non-parameter tensors some checkpoints carry (old Llama exports store the rope buffer).
IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)
SINGLE, INDEX = 'model.safetensors', 'model.safetensors.index.json'
# safetensors dtypes read as float32 without changing a value (an int8 or fp8 tensor is a
# quantized weight that needs its scales: read as it stands, it would be silently wrong).
FLOAT_DTYPES = ('F64', 'F32', 'F16', 'BF16')


def _tensor_names(model_cfg: ModelConfig) -> dict[str, tuple[tuple, bool, tuple]]:
  """{HF tensor name: (path in the params pure dict, transposed?, NNX shape)}, pure-dict order."""
  _, abstract = functional.abstract_params(model_cfg)
  names = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(abstract)):
    keys = tuple(p.key for p in path)
    module = '.'.join(map(str, keys[:-1]))
    prefix = module if module == 'lm_head' else 'model.' + module
    kind = 'bias' if keys[-1] == 'bias' else 'weight'
    names[f'{prefix}.{kind}'] = (keys, keys[-1] == 'kernel', tuple(leaf.shape))
  return names


def weight_map(model_dir: str) -> dict[str, str]:
  """{tensor name: safetensors file path} from the index or the single file."""
  index = os.path.join(model_dir, INDEX)
  if os.path.isfile(index):
    try:
      files = jsonfile.read_object(index).get('weight_map')
    except ValueError as e:   # not JSON, not UTF-8, not an object
      raise HFCheckpointError(str(e)) from None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
      raise HFCheckpointError(f'{index}: no "weight_map" of tensor name -> file name')
    return {k: os.path.join(model_dir, v) for k, v in files.items()}
  single = os.path.join(model_dir, SINGLE)
  if not os.path.isfile(single):
    raise HFCheckpointError(f'{model_dir}: no {SINGLE} or {INDEX} (only safetensors is read)')
  with safe_open(single, framework='np') as f:
    return {k: single for k in f.keys()}


def error_reason(e: BaseException) -> str:
  """'Type: last line of its message' (where a multi-line message names the cause); also
  components' words for a tokenizer or prepared dataset that cannot be read."""
  lines = str(e).strip().splitlines()
  return f'{type(e).__name__}: {lines[-1]}' if lines else type(e).__name__


def check_readable(model_dir: str) -> None:
  """Opens every safetensors file of `model_dir` (the index's shards, else the single file; the
  headers only): HFCheckpointError naming the first that is missing, truncated or damaged, or
  a shard without a tensor the index places in it (shards of two downloads mixed)."""
  single = os.path.join(model_dir, SINGLE)
  placed = weight_map(model_dir) if os.path.isfile(os.path.join(model_dir, INDEX)) else {}
  files = sorted(set(placed.values())) if placed else (
      [single] if os.path.isfile(single) else [])   # neither: weight_map says so
  for file in files:
    try:
      with safe_open(file, framework='np') as f:
        held = set(f.keys())
    except Exception as e:  # pylint: disable=broad-except  (OSError or SafetensorError)
      raise HFCheckpointError(f'{file}: cannot read its tensors ({error_reason(e)})') from None
    absent = sorted(name for name, where in placed.items() if where == file and name not in held)
    if absent:
      raise HFCheckpointError(f'{file}: holds no tensor {absent[0]} ({len(absent)} absent), '
                              f'which {INDEX} places there (shards of another download?)')


def check_tensors(model_dir: str, model_cfg: ModelConfig) -> dict[str, str]:
  """weight_map(model_dir) after checking it against model_cfg: HFCheckpointError for a tensor
  the model does not have, one it needs that is missing, one of another shape, or one that is
  not a float tensor, e.g. int8 (the files' headers are read, not the data)."""
  wanted = _tensor_names(model_cfg)
  files = weight_map(model_dir)
  for name in files:
    tied_head = name == 'lm_head.weight' and model_cfg.tie_word_embeddings
    if name not in wanted and not tied_head and not name.endswith(IGNORED_SUFFIXES):
      raise HFCheckpointError(f'{files[name]}: unexpected tensor {name} for this config')
  for name in wanted:
    if name not in files:
      raise HFCheckpointError(f'{model_dir}: missing tensor {name}')
  with contextlib.ExitStack() as stack:
    handles = {p: stack.enter_context(safe_open(p, framework='np')) for p in set(files.values())}
    for name, (_, transposed, shape) in wanted.items():
      sl = handles[files[name]].get_slice(name)
      disk = tuple(sl.get_shape())
      if disk != (shape[::-1] if transposed else shape):
        raise HFCheckpointError(f'{files[name]}: tensor {name} has shape {list(disk)}, the '
                                f'config needs {list(shape[::-1] if transposed else shape)}')
      if sl.get_dtype() not in FLOAT_DTYPES:
        raise HFCheckpointError(f'{files[name]}: tensor {name} is {sl.get_dtype()} on disk; '
                                f'only {", ".join(FLOAT_DTYPES)} tensors are read (quantized '
                                'weights are not supported)')
  return files


def load_hf_params(model_dir: str, model_cfg: ModelConfig, shardings: Any) -> dict:
  """Params pure dict (float32, structure of nnx.to_pure_dict(abstract_params(model_cfg))).

  `shardings` is the matching pure dict of jax.sharding.Sharding. Each array is built with
  jax.make_array_from_callback: every addressable device reads only its slice of the tensor
  from disk (`get_slice` on a memory map), transposed when the HF layout is [out, in]
  (NNX block [i0:i1, o0:o1] = HF weight[o0:o1, i0:i1].T). With tied embeddings a stored
  `lm_head.weight` is ignored, as transformers does.
  """
  wanted = _tensor_names(model_cfg)
  files = check_tensors(model_dir, model_cfg)
  out: dict = {}
  with contextlib.ExitStack() as stack:
    handles = {p: stack.enter_context(safe_open(p, framework='np')) for p in set(files.values())}
    for name, (keys, transposed, shape) in wanted.items():
      sl = handles[files[name]].get_slice(name)

      def read(index, sl=sl, transposed=transposed):
        block = sl[index[::-1]].T if transposed else sl[index]
        return np.asarray(block, np.float32)

      node, sharding = out, shardings
      for k in keys[:-1]:
        node, sharding = node.setdefault(k, {}), sharding[k]
      node[keys[-1]] = jax.make_array_from_callback(shape, sharding[keys[-1]], read)
  return out


def _host_array(x: jax.Array) -> np.ndarray:
  """The full array on this host: a device_get when every shard is local, else an all-gather
  over processes (every process must call it, in the same order)."""
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _save_file(tensors: dict[str, np.ndarray], path: str) -> None:
  """safetensors' save_file, the file's mode that of any file open() makes (0666 less the
  umask, as config.json): safetensors 0.8 writes 0600, which other users cannot read."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(path)   # a stale temporary file of an export that died keeps its own mode
  with open(path, 'xb'):
    pass
  mode = os.stat(path).st_mode & 0o777
  save_file(tensors, path, metadata={'format': 'pt'})
  os.chmod(path, mode)


def save_hf(out_dir: str, params: dict, model_cfg: ModelConfig, *, dtype: str | None = None,
            max_shard_bytes: int = 2 << 30, architecture: str | None = None,
            extra_config: dict | None = None) -> list[str]:
  """Writes a HF directory transformers/vLLM load: config.json + model.safetensors, or
  model-0000k-of-0000n.safetensors + model.safetensors.index.json past max_shard_bytes.

  params: pure dict as from load_hf_params (any sharding). dtype: 'float32' | 'bfloat16' on
  disk (default model_cfg.dtype). architecture: 'llama' | 'qwen2' | 'mistral' (or the HF class
  name); default qwen2 with attention_bias, mistral with a sliding window, else llama.
  extra_config: more config.json fields (e.g. bos/eos token ids); model fields win.
  Tensors are gathered one at a time; at most one file's tensors are held on the host. In a
  multi-host run every process must call this; only process 0 writes. Returns the files written.
  """
  dtype = dtype or model_cfg.dtype
  np_dtype = {'float32': np.float32, 'bfloat16': ml_dtypes.bfloat16}[dtype]
  fam = FAMILIES.get(architecture, architecture) or (
      'qwen2' if model_cfg.attention_bias else
      'mistral' if model_cfg.sliding_window is not None else 'llama')
  if fam not in ARCHITECTURE:
    raise HFCheckpointError(f'architecture={architecture!r}: supported: {", ".join(ARCHITECTURE)}')
  hf = {**(extra_config or {}), **hf_config_dict(model_cfg, fam, dtype)}
  writer = jax.process_index() == 0
  shards: list[dict[str, np.ndarray]] = [{}]
  sizes = [0]
  tmp_files: list[str] = []
  if writer:
    os.makedirs(out_dir, exist_ok=True)

  def flush():
    if writer:
      tmp_files.append(os.path.join(out_dir, f'.shard{len(tmp_files)}.tmp'))
      _save_file(shards[-1], tmp_files[-1])
    shards[-1] = {}

  names, shard_of = _tensor_names(model_cfg), {}
  for name, (keys, transposed, _) in names.items():
    leaf = params
    for k in keys:
      leaf = leaf[k]
    host = _host_array(leaf)
    host = np.ascontiguousarray((host.T if transposed else host).astype(np_dtype))
    if shards[-1] and sizes[-1] + host.nbytes > max_shard_bytes:
      flush()
      sizes.append(0)
    shards[-1][name] = host
    sizes[-1] += host.nbytes
    shard_of[name] = len(sizes) - 1
  flush()
  if not writer:
    return []
  n = len(tmp_files)
  final = [SINGLE] if n == 1 else [f'model-{i + 1:05d}-of-{n:05d}.safetensors' for i in range(n)]
  for tmp, name in zip(tmp_files, final):
    os.replace(tmp, os.path.join(out_dir, name))
  for name in os.listdir(out_dir):   # files of an earlier export into the same directory
    if name == INDEX or (name.startswith('model') and name.endswith('.safetensors')
                         and name not in final):
      os.remove(os.path.join(out_dir, name))
  if n > 1:
    with open(os.path.join(out_dir, INDEX), 'w') as f:
      json.dump({'metadata': {'total_size': sum(sizes)},
                 'weight_map': {k: final[i] for k, i in shard_of.items()}}, f, indent=2)
  with open(os.path.join(out_dir, CONFIG), 'w') as f:
    json.dump(hf, f, indent=2)
  return [CONFIG] + final + ([INDEX] if n > 1 else [])
