"""A model.path checkpoint with its own tokenizer, run with a recipe's other tokenizer.path (e.g.
grpo_arith's SentencePiece kept beside a Llama checkpoint): refused in one line, since the
checkpoint's embedding rows would be read as other tokens. It trained silently before."""
import json
import shutil

import pytest

from rft_jax import api, components
from rft_jax.tokenizer import load_tokenizer
import tokenizer_fixtures as fx

FIELDS = dict(vocab_size=448, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=500000.0,
              tie_word_embeddings=False)


@pytest.fixture(scope='module')
def llama_dir(tmp_path_factory):
  transformers = pytest.importorskip('transformers')
  directory = str(tmp_path_factory.mktemp('llama3'))
  config = transformers.LlamaConfig(max_position_embeddings=512,
                                    **{k: v for k, v in FIELDS.items() if k != 'head_dim'})
  transformers.LlamaForCausalLM(config).save_pretrained(directory)
  fx.write_llama3_tokenizer(directory)   # after the model: its generation_config.json wins
  return directory


def _config(llama_dir, **overrides):
  return api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in FIELDS.items()}, 'model.max_position_embeddings': 512,
      'model.path': llama_dir, 'init_from': '', **overrides})


def test_another_tokenizer_beside_a_checkpoints_own_is_refused(llama_dir):
  with pytest.raises(components.SetupError, match=r'config.tokenizer.path=.*arith_spm.model: not '
                     r'the tokenizer of model.path=.*\(vocabulary 18, .*--config.tokenizer.path='):
    components.check_setup(_config(llama_dir))
  components.check_setup(_config(llama_dir, **{'tokenizer.path': ''}))          # its own
  components.check_setup(_config(llama_dir, **{'tokenizer.path': llama_dir}))   # named


def test_a_recipes_init_from_beside_model_path_names_the_fix(llama_dir):
  """grpo_arith's init_from (the arithmetic base policy) kept beside a model.path: the shape
  error now says how to start from the checkpoint's weights."""
  config = _config(llama_dir, **{'tokenizer.path': ''})
  config.init_from = api.load_config('grpo_arith:tiny').init_from
  with pytest.raises(components.SetupError, match=r"does not match config.model: .*; "
                                                  r"--config.init_from= starts from model.path"):
    components.build(config, data=False)


def test_the_checkpoints_instruct_tokenizer_with_another_eos_is_accepted(llama_dir, tmp_path):
  """A base checkpoint (EOS <|end_of_text|>) run with its instruct tokenizer (EOS <|eot_id|>, the
  same vocabulary): the same embedding rows, so no mismatch (it was refused for the EOS)."""
  base = tmp_path / 'base'
  shutil.copytree(llama_dir, base)
  with open(base / 'tokenizer_config.json') as f:
    tokenizer_config = json.load(f)
  with open(base / 'tokenizer_config.json', 'w') as f:
    json.dump({**tokenizer_config, 'eos_token': '<|end_of_text|>'}, f)
  config = _config(str(base), **{'tokenizer.path': llama_dir})
  assert load_tokenizer(llama_dir).eos_id != load_tokenizer(str(base)).eos_id
  components.check_setup(config)
