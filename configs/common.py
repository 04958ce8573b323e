"""Pieces shared by the arithmetic recipes: the task, tokenizer and tiny model.

Both `sft_arith.py` (which builds the base policy) and `grpo_arith.py` (which post-trains it) use
exactly these, so the GRPO recipe can load the SFT checkpoint without shape surprises.
"""
import ml_collections


def arith_task():
  task = ml_collections.ConfigDict()
  task.name = 'arith'            # TFDS builder in rft_jax/data/arith.py
  task.data_dir = ''             # '' = ~/.cache/rft_jax/tfds (generated offline on first use)
  task.max_prompt_len = 8        # prompts are left-padded to this many tokens (BOS + "99+99=" is 7)
  return task


def tiny_tokenizer():
  tok = ml_collections.ConfigDict()
  tok.path = 'rft_jax/assets/arith_spm.model'  # SentencePiece, trained on the task corpus
  return tok


def tiny_model():
  """A ~0.8M-parameter Llama-style decoder. Field names follow HF `config.json`."""
  model = ml_collections.ConfigDict()
  model.vocab_size = 18          # = the shipped SentencePiece vocabulary
  model.hidden_size = 128
  model.intermediate_size = 384
  model.num_hidden_layers = 4
  model.num_attention_heads = 4
  model.num_key_value_heads = 2
  model.head_dim = 32
  model.rope_theta = 10000.0
  model.rms_norm_eps = 1e-6
  model.tie_word_embeddings = True
  model.attention_bias = False
  model.max_position_embeddings = 64
  model.dtype = 'float32'        # activation/compute dtype; params are always float32
  return model


def mesh():
  m = ml_collections.ConfigDict()
  m.data = -1   # -1 = all devices not used by the other axes
  m.fsdp = 1
  m.tensor = 1
  return m
