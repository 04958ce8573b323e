"""Hugging Face `config.json` <-> ModelConfig for LlamaForCausalLM, Qwen2ForCausalLM and
MistralForCausalLM.

Every unsupported architecture or config value that would change the maths raises
HFCheckpointError with one line naming the file and the field; fields that do not (dropout,
pretraining_tp, use_cache) are ignored. The bos/eos/pad token ids must be ids of the vocabulary
(or null / negative: none); they are not otherwise used here (rft_jax.tokenizer). The weights
are read and written by rft_jax/models/hf_checkpoint.py.
"""
import os
from typing import Any

from rft_jax import jsonfile
from rft_jax.hf_hub import snapshot_hint
from rft_jax.models.llama import ModelConfig

FAMILIES = {'LlamaForCausalLM': 'llama', 'Qwen2ForCausalLM': 'qwen2',
            'MistralForCausalLM': 'mistral'}
ARCHITECTURE = {family: arch for arch, family in FAMILIES.items()}
# HF torch dtype -> compute dtype. float16 checkpoints (e.g. Llama-2) compute in bfloat16: fp16
# activations overflow easily in JAX on TPU/CPU, and bf16 has fp32's range (results differ from
# an fp16 reference at the bf16 rounding level).
DTYPES = {'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'bfloat16'}
LLAMA3_KEYS = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')
CONFIG = 'config.json'


class HFCheckpointError(ValueError):
  """A HF directory rft_jax cannot load exactly (one-line message naming the file and field)."""


def _fail(path: str, field: str, value: Any, reason: str):
  raise HFCheckpointError(f'{path}: {field}={value!r}: {reason}')


def read_config_json(model_dir: str) -> dict:
  path = os.path.join(model_dir, CONFIG)
  if not os.path.isfile(path):
    raise HFCheckpointError(f'{path}: not found (a HF model directory needs config.json)'
                            + snapshot_hint(model_dir))
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
