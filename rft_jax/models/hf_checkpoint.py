"""Hugging Face checkpoints in and out: `config.json` <-> ModelConfig, safetensors <-> params.

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
becomes the compute dtype. Every unsupported architecture or config value that would change the
maths raises HFCheckpointError with one line naming the file and the field; fields that do not
(dropout, pretraining_tp, use_cache) are ignored. The bos/eos/pad token ids must be ids of the
vocabulary (or null / negative: none); they are not otherwise used here (rft_jax.tokenizer).
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
from rft_jax.models.llama import ModelConfig

FAMILIES = {'LlamaForCausalLM': 'llama', 'Qwen2ForCausalLM': 'qwen2',
            'MistralForCausalLM': 'mistral'}
ARCHITECTURE = {family: arch for arch, family in FAMILIES.items()}
# HF torch dtype -> compute dtype. float16 checkpoints (e.g. Llama-2) compute in bfloat16: fp16
# activations overflow easily in JAX on TPU/CPU, and bf16 has fp32's range (results differ from
# an fp16 reference at the bf16 rounding level).
DTYPES = {'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'bfloat16'}
LLAMA3_KEYS = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')
# Non-parameter tensors some checkpoints carry (old Llama exports store the rope buffer).
IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)
CONFIG, SINGLE, INDEX = 'config.json', 'model.safetensors', 'model.safetensors.index.json'
# safetensors dtypes read as float32 without changing a value (an int8 or fp8 tensor is a
# quantized weight that needs its scales: read as it stands, it would be silently wrong).
FLOAT_DTYPES = ('F64', 'F32', 'F16', 'BF16')


class HFCheckpointError(ValueError):
  """A HF directory rft_jax cannot load exactly (one-line message naming the file and field)."""


def _fail(path: str, field: str, value: Any, reason: str):
  raise HFCheckpointError(f'{path}: {field}={value!r}: {reason}')


def read_config_json(model_dir: str) -> dict:
  path = os.path.join(model_dir, CONFIG)
  if not os.path.isfile(path):
    raise HFCheckpointError(f'{path}: not found (a HF model directory needs config.json)')
  try:
    return jsonfile.read_object(path)
  except ValueError as e:   # not JSON, not UTF-8, not an object
    raise HFCheckpointError(str(e)) from None
  except OSError as e:
    raise HFCheckpointError(f'{path}: cannot read it ({e.strerror or e})') from None


def family(hf: dict, path: str = CONFIG) -> str:
  """'llama' | 'qwen2' | 'mistral' from `architectures` (or `model_type` when absent)."""
  archs = hf.get('architectures') or []
  if archs:
    if len(archs) != 1 or archs[0] not in FAMILIES:
      _fail(path, 'architectures', archs, f'supported: {", ".join(FAMILIES)}')
    return FAMILIES[archs[0]]
  if hf.get('model_type') not in ARCHITECTURE:
    _fail(path, 'model_type', hf.get('model_type'), f'supported: {", ".join(ARCHITECTURE)}')
  return hf['model_type']


def _rope(hf: dict, path: str) -> tuple[float, tuple | None]:
  """(rope_theta, rope_scaling pairs or None) from transformers v4 (`rope_theta`, `rope_scaling`)
  or v5 (`rope_parameters`) fields; rope type key `rope_type` or legacy `type`."""
  params = dict(hf.get('rope_parameters') or {})
  scaling = dict(hf.get('rope_scaling') or params)
  theta = next((t for t in (hf.get('rope_theta'), params.get('rope_theta')) if t is not None),
               10000.0)   # not `or`: a theta of 0 became 10000 instead of an error
  kind = scaling.get('rope_type', scaling.get('type', 'default'))
  field = 'rope_scaling' if hf.get('rope_scaling') else 'rope_parameters'
  partial = scaling.get('partial_rotary_factor', hf.get('partial_rotary_factor', 1.0))
  if partial != 1.0:
    _fail(path, 'partial_rotary_factor', partial, 'must be 1.0 (rotary on the whole head)')
  if type(theta) not in (int, float) or theta <= 0:
    _fail(path, f'{field}.rope_theta', theta, 'must be a positive number')
  if kind == 'default':
    return float(theta), None
  if kind != 'llama3':   # yarn/dynamic/linear/longrope change the rotary maths
    _fail(path, f'{field}.rope_type', kind, "supported: 'default', 'llama3'")
  pairs = {k: scaling.get(k) for k in LLAMA3_KEYS}
  pairs['original_max_position_embeddings'] = (pairs['original_max_position_embeddings']
                                               or hf.get('max_position_embeddings'))
  for k, v in pairs.items():
    if v is None:
      _fail(path, f'{field}.{k}', v, 'required for llama3 rope scaling')
  if pairs['low_freq_factor'] == pairs['high_freq_factor']:
    _fail(path, f'{field}.high_freq_factor', pairs['high_freq_factor'],
          'must differ from low_freq_factor')
  return float(theta), tuple(sorted({**pairs, 'rope_type': 'llama3'}.items()))


TOKEN_ID_KEYS = ('bos_token_id', 'eos_token_id', 'pad_token_id')


def _check_token_ids(hf: dict, path: str) -> None:
  """config.json's bos/eos/pad ids: each an id or a list of ids (Llama 3's list of EOS ids);
  null or negative means none (rft_jax.tokenizer reads them so). One at or past vocab_size is
  no row of the embedding (a gather there is clamped on device: silently another token), so it
  is refused with the others that are not ids."""
  vocab = hf['vocab_size']
  for key in TOKEN_ID_KEYS:
    value = hf.get(key)
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(i) is int for i in ids):
      _fail(path, key, value, 'expected a token id, a list of ids, or null')
    if any(i >= vocab for i in ids):
      _fail(path, key, value, f'{max(ids)} is not a token (vocab_size={vocab}: ids 0 to '
            f'{vocab - 1}; null or a negative id means none)')


def load_hf_config(model_dir: str) -> ModelConfig:
  """ModelConfig from `model_dir/config.json`.

  Decisions (each a documented exactness boundary):
  - hidden_act must be silu; Llama `mlp_bias` and `attention_bias` must be false (Llama's
    attention_bias also biases o_proj, which this model lacks); Qwen2 always has q/k/v bias.
  - Qwen2 `use_sliding_window` must be false (its per-layer windows are not implemented);
    `layer_types` must all be full_attention.
  - Mistral `sliding_window` W is implemented exactly (slot-based, as transformers), so W=4096
    (v0.1) and null (v0.2+) both load; W only matters once prompt + completion exceed W.
  - rope: default or llama3 scaling; anything else (yarn, dynamic, linear, longrope) fails.
  - dtype: `torch_dtype` / `dtype` float32 or bfloat16 computes in that dtype; float16 computes
    in bfloat16 (see DTYPES); params are float32 regardless.
  - quantized checkpoints (`quantization_config`) fail.
  - bos/eos/pad_token_id at or past vocab_size fail (_check_token_ids).
  """
  hf = read_config_json(model_dir)
  path = os.path.join(model_dir, CONFIG)
  fam = family(hf, path)
  for key in ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
              'num_attention_heads'):
    if type(hf.get(key)) is not int or hf[key] < 1:
      _fail(path, key, hf.get(key), 'required (an integer >= 1)')
  _check_token_ids(hf, path)
  for key, kind, nullable in (('rms_norm_eps', float, False),   # null: was a traceback
                              ('max_position_embeddings', int, False), ('rope_theta', float, True),
                              ('head_dim', int, True), ('num_key_value_heads', int, True)):
    value = hf.get(key)
    number = type(value) is int or kind is float and type(value) is float
    if key in hf and not (nullable and value is None) and not (number and value > 0):
      _fail(path, key, value, f'must be a positive {"integer" if kind is int else "number"}'
            + (' or null' if nullable else ''))
  for key, kind in (('rope_parameters', dict), ('rope_scaling', dict),
                    ('tie_word_embeddings', bool)):
    if hf.get(key) is not None and type(hf[key]) is not kind:
      _fail(path, key, hf[key], f'must be {"an object" if kind is dict else "true/false"} or null')
  if hf.get('hidden_act', 'silu') != 'silu':
    _fail(path, 'hidden_act', hf['hidden_act'], "only 'silu' (SwiGLU) is supported")
  if hf.get('quantization_config'):
    _fail(path, 'quantization_config', hf['quantization_config'].get('quant_method'),
          'quantized checkpoints are not supported')
  if fam == 'llama':
    for key in ('mlp_bias', 'attention_bias'):
      if hf.get(key, False):
        _fail(path, key, True, 'Llama biases are not supported (o_proj / MLP have no bias here)')
  if fam == 'qwen2':
    if hf.get('use_sliding_window', False):
      _fail(path, 'use_sliding_window', True, 'Qwen2 sliding-window layers are not supported')
    if any(t != 'full_attention' for t in hf.get('layer_types') or []):
      _fail(path, 'layer_types', sorted(set(hf['layer_types'])), 'only full_attention')
  window = hf.get('sliding_window') if fam == 'mistral' else None
  if window is not None and (not isinstance(window, int) or window < 1):
    _fail(path, 'sliding_window', window, 'must be a positive integer or null')
  heads = hf['num_attention_heads']
  head_dim = hf.get('head_dim') or hf['hidden_size'] // heads
  if not hf.get('head_dim') and hf['hidden_size'] % heads:
    _fail(path, 'num_attention_heads', heads, f'must divide hidden_size={hf["hidden_size"]}')
  kv_heads = hf.get('num_key_value_heads') or heads
  if heads % kv_heads:
    _fail(path, 'num_key_value_heads', kv_heads, f'must divide num_attention_heads={heads}')
  dtype = hf.get('dtype') or hf.get('torch_dtype') or 'float32'
  if dtype not in DTYPES:
    _fail(path, 'dtype' if hf.get('dtype') else 'torch_dtype', dtype,
          f'supported: {", ".join(DTYPES)}')
  theta, scaling = _rope(hf, path)
  return ModelConfig(
      vocab_size=hf['vocab_size'], hidden_size=hf['hidden_size'],
      intermediate_size=hf['intermediate_size'], num_hidden_layers=hf['num_hidden_layers'],
      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
      rope_theta=theta, rms_norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
      tie_word_embeddings=bool(hf.get('tie_word_embeddings', False)),
      attention_bias=fam == 'qwen2',
      max_position_embeddings=hf.get('max_position_embeddings', 2048),
      dtype=DTYPES[dtype], rope_scaling=scaling, sliding_window=window)


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


def check_readable(model_dir: str) -> None:
  """Opens every safetensors file of `model_dir` (the index's shards, else the single file; the
  headers only): HFCheckpointError naming the first that is missing, truncated or damaged."""
  single = os.path.join(model_dir, SINGLE)
  if os.path.isfile(os.path.join(model_dir, INDEX)):
    files = sorted(set(weight_map(model_dir).values()))
  else:
    files = [single] if os.path.isfile(single) else []   # neither: weight_map says so
  for file in files:
    try:
      with safe_open(file, framework='np'):
        pass
    except Exception as e:  # pylint: disable=broad-except  (OSError or SafetensorError)
      lines = str(e).strip().splitlines()
      reason = f'{type(e).__name__}: {lines[-1]}' if lines else type(e).__name__
      raise HFCheckpointError(f'{file}: cannot read its tensors ({reason})') from None


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


def hf_config_dict(model_cfg: ModelConfig, fam: str, dtype: str) -> dict:
  """config.json contents in the transformers v4 layout (`rope_theta`, `rope_scaling`,
  `torch_dtype`), which transformers v5 and vLLM read as well."""
  if (fam == 'qwen2') != model_cfg.attention_bias:
    raise HFCheckpointError(f'attention_bias={model_cfg.attention_bias}: {fam} checkpoints '
                            f'{"need" if fam == "qwen2" else "cannot have"} q/k/v biases')
  if model_cfg.sliding_window is not None and fam != 'mistral':
    raise HFCheckpointError(f'sliding_window={model_cfg.sliding_window}: only mistral has one')
  if fam == 'qwen2' and model_cfg.head_dim * model_cfg.num_attention_heads != model_cfg.hidden_size:
    raise HFCheckpointError(f'head_dim={model_cfg.head_dim}: qwen2 needs hidden_size / heads')
  hf = {
      'architectures': [ARCHITECTURE[fam]], 'model_type': fam,
      'vocab_size': model_cfg.vocab_size, 'hidden_size': model_cfg.hidden_size,
      'intermediate_size': model_cfg.intermediate_size,
      'num_hidden_layers': model_cfg.num_hidden_layers,
      'num_attention_heads': model_cfg.num_attention_heads,
      'num_key_value_heads': model_cfg.num_key_value_heads, 'head_dim': model_cfg.head_dim,
      'hidden_act': 'silu', 'rms_norm_eps': model_cfg.rms_norm_eps,
      'rope_theta': model_cfg.rope_theta,
      'rope_scaling': dict(model_cfg.rope_scaling) if model_cfg.rope_scaling else None,
      'max_position_embeddings': model_cfg.max_position_embeddings,
      'tie_word_embeddings': model_cfg.tie_word_embeddings, 'torch_dtype': dtype,
  }
  if fam == 'llama':
    hf.update(attention_bias=False, mlp_bias=False)
  elif fam == 'qwen2':
    hf.update(use_sliding_window=False, sliding_window=None)
  else:
    hf.update(sliding_window=model_cfg.sliding_window)
  return hf


def _host_array(x: jax.Array) -> np.ndarray:
  """The full array on this host: a device_get when every shard is local, else an all-gather
  over processes (every process must call it, in the same order)."""
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


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
      save_file(shards[-1], tmp_files[-1], metadata={'format': 'pt'})
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
