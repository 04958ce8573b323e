"""A model.path checkpoint with its own tokenizer, run with a recipe's other tokenizer.path (e.g.
grpo_arith's SentencePiece kept beside a Llama checkpoint): refused in one line, since the
checkpoint's embedding rows would be read as other tokens. It trained silently before."""
import pytest

from rft_jax import api, components
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
