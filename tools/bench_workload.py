"""The fixed GRPO workload of issue 11, shared by the rft_jax and TRL sides of tools/bench.

A Llama-shaped model (vocab 1024, hidden 256, 4 layers, 4 heads, FFN 1024, fp32, random init:
4,720,896 parameters), 16 prompts x 8 completions, prompts of 18-26 tokens (mean ~22), 32 new
tokens at temperature 1, beta = 0.04 (k3 KL to the frozen reference), one AdamW update per batch.

Both sides read the same files (`write_assets`): a word-level tokenizer (`tokenizer.json`: ids
0-3 are <pad> <s> </s> <unk>, id i >= 4 is the word 't<i>'), the model exported to HF format
by rft_jax.models.hf_checkpoint, and the prompts (`prompts.json`: text and token ids, one list
per step). The verifier `first_even` (reward 1 when the completion's first word has an even id)
is cheap and gives about half the rows reward 1, so every group has a real advantage.
"""
import dataclasses
import json
import os

import numpy as np

from rft_jax.rewards.verifiers import register_verifier

SPECIALS = ('<pad>', '<s>', '</s>', '<unk>')
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Workload:
  vocab_size: int = 1024
  hidden_size: int = 256
  intermediate_size: int = 1024
  num_hidden_layers: int = 4
  num_attention_heads: int = 4
  prompts_per_step: int = 16
  group_size: int = 8
  prompt_len_min: int = 18
  prompt_len_max: int = 26
  max_new_tokens: int = 32
  kl_coef: float = 0.04
  lr: float = 1e-5
  seed: int = 0
  shared_prompt: bool = True   # rft_jax scores each group's prompt once (False: once per row)
  num_key_value_heads: int = 0   # 0: as many as num_attention_heads (no GQA)
  tie_word_embeddings: bool = False
  attention_bias: bool = False   # q/k/v biases (Qwen2)
  dtype: str = 'float32'         # compute dtype; parameters and optimizer state stay float32
  reward_workers: int = 2        # rft_jax's verifier processes (the recipes' rewards.num_workers);
  #                                first_even is inline, so they start only for other verifiers

  @property
  def rows(self) -> int:
    return self.prompts_per_step * self.group_size

  def model_dict(self) -> dict:
    """config.model fields (rft_jax.models.llama.ModelConfig; HF config.json names)."""
    return dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                intermediate_size=self.intermediate_size,
                num_hidden_layers=self.num_hidden_layers,
                num_attention_heads=self.num_attention_heads,
                num_key_value_heads=self.num_key_value_heads or self.num_attention_heads,
                head_dim=self.hidden_size // self.num_attention_heads, rope_theta=10000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=self.tie_word_embeddings,
                attention_bias=self.attention_bias,
                max_position_embeddings=max(128, self.prompt_len_max + self.max_new_tokens),
                dtype=self.dtype)


ISSUE = Workload()
# A few-second version for tests (same code paths, tiny shapes).
TINY = Workload(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, prompts_per_step=2, group_size=4, prompt_len_min=4,
                prompt_len_max=7, max_new_tokens=6)
# The issue's accelerator measurement (MFU of the update, decode tokens/s): a Qwen2.5-0.5B-shaped
# model (494,032,768 parameters: 24 layers, hidden 896, 14 query / 2 key-value heads, q/k/v
# biases, tied embeddings, vocab 151,936), bf16 compute, random init; 16 prompts x 8 completions,
# 128 new tokens. On 2 CPU cores one step would take tens of minutes: meant for a GPU or TPU.
GPU_0P5B = Workload(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    tie_word_embeddings=True, attention_bias=True, dtype='bfloat16',
                    max_new_tokens=128)
PRESETS = {'issue11': ISSUE, 'tiny': TINY, 'gpu_0p5b': GPU_0P5B}


def with_fields(w: Workload, fields) -> Workload:
  """`w` with `fields` (--workload-json's object) replaced. ValueError, one line, naming the
  first field that is unknown, of another type or out of range."""
  if not isinstance(fields, dict):
    raise ValueError(f'expected a JSON object of workload fields, got {type(fields).__name__}')
  names = [f.name for f in dataclasses.fields(Workload)]
  for name, value in fields.items():
    if name not in names:   # not hasattr: 'rows' (a property) was a TypeError traceback
      raise ValueError(f'unknown field {name!r}; fields: ' + ', '.join(names))
    want = type(getattr(w, name))
    if not (type(value) is want or want is float and type(value) is int):
      raise ValueError(f'{name}={value!r}: expected {want.__name__}')
  w = dataclasses.replace(w, **{k: float(v) if type(getattr(w, k)) is float else v
                                for k, v in fields.items()})
  kv = w.num_key_value_heads or w.num_attention_heads
  for name, ok, need in (
      ('vocab_size', w.vocab_size >= 8, '>= 8'),
      ('hidden_size', w.hidden_size >= 1, '>= 1'),
      ('intermediate_size', w.intermediate_size >= 1, '>= 1'),
      ('num_hidden_layers', w.num_hidden_layers >= 1, '>= 1'),
      ('num_attention_heads', w.num_attention_heads >= 1 and w.hidden_size
       % w.num_attention_heads == 0, 'a divisor of hidden_size'),
      ('num_key_value_heads', w.num_key_value_heads >= 0 and w.num_attention_heads % kv == 0,
       '0 or a divisor of num_attention_heads'),
      ('prompts_per_step', w.prompts_per_step >= 1, '>= 1'),
      ('group_size', w.group_size >= 2, '>= 2 (a group baseline)'),
      ('prompt_len_min', 1 <= w.prompt_len_min <= w.prompt_len_max, '>= 1 and <= prompt_len_max'),
      ('max_new_tokens', w.max_new_tokens >= 1, '>= 1'),
      ('kl_coef', w.kl_coef >= 0, '>= 0'), ('lr', w.lr > 0, '> 0'),
      ('seed', w.seed >= 0, '>= 0'), ('reward_workers', w.reward_workers >= 0, '>= 0'),
      ('dtype', w.dtype in ('float32', 'bfloat16'), "'float32' or 'bfloat16'")):
    if not ok:
      raise ValueError(f'{name}={getattr(w, name)!r}: must be {need}')
  return w


@register_verifier('first_even', inline=True)
def first_even(completion: str, answer: str) -> float:
  """1.0 when the completion's first word is 't<even id>', else 0.0 (answer unused).

  Inline (scored in the trainer's process, untimed, as TRL calls its reward function): a split
  and an int() of at most 4300 digits, bounded by the completion's length."""
  del answer
  words = completion.split()
  return float(bool(words) and words[0][1:].isdigit() and int(words[0][1:]) % 2 == 0)


def reward_texts(completions) -> list[float]:
  return [first_even(c, '') for c in completions]


def make_prompts(w: Workload, steps: int) -> list[dict]:
  """`steps` prompt batches: {'ids': [[int]], 'text': [str]} with word ids >= 4."""
  rng = np.random.default_rng(w.seed)
  batches = []
  for _ in range(steps):
    lens = rng.integers(w.prompt_len_min, w.prompt_len_max + 1, w.prompts_per_step)
    ids = [[int(i) for i in rng.integers(len(SPECIALS), w.vocab_size, n)] for n in lens]
    batches.append({'ids': ids, 'text': [' '.join(f't{i}' for i in row) for row in ids]})
  return batches


def left_pad(ids: list[list[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded int32 tokens and mask [B, length] (the layout of rft_jax.data.pipeline)."""
  tokens = np.full((len(ids), length), PAD_ID, np.int32)
  mask = np.zeros((len(ids), length), np.int32)
  for b, row in enumerate(ids):
    tokens[b, length - len(row):] = row
    mask[b, length - len(row):] = 1
  return tokens, mask


def write_tokenizer(w: Workload, out_dir: str) -> None:
  """A word-level tokenizer.json (+ tokenizer_config.json) both rft_jax and transformers load;
  model_max_length is the model's max_position_embeddings (model_dict)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers
  vocab = {t: i for i, t in enumerate(SPECIALS)}
  vocab.update({f't{i}': i for i in range(len(SPECIALS), w.vocab_size)})
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(list(SPECIALS))
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, 'tokenizer.json'))
  with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w') as f:
    json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'pad_token': '<pad>',
               'bos_token': '<s>', 'eos_token': '</s>', 'unk_token': '<unk>',
               'padding_side': 'left',
               'model_max_length': w.model_dict()['max_position_embeddings']}, f, indent=1)


def write_assets(w: Workload, params, model_cfg, out_dir: str, steps: int) -> str:
  """The HF model dir (weights, config, tokenizer) and prompts.json in out_dir; returns out_dir."""
  from rft_jax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  hf_checkpoint.save_hf(out_dir, params, model_cfg, extra_config=dict(
      bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID))
  write_tokenizer(w, out_dir)
  with open(os.path.join(out_dir, 'generation_config.json'), 'w') as f:
    json.dump({'bos_token_id': BOS_ID, 'eos_token_id': EOS_ID, 'pad_token_id': PAD_ID}, f)
  with open(os.path.join(out_dir, 'prompts.json'), 'w') as f:
    json.dump({'workload': dataclasses.asdict(w), 'batches': make_prompts(w, steps)}, f)
  return out_dir
