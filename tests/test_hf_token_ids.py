"""config.json's bos/eos/pad token ids against its vocab_size (hf_checkpoint.load_hf_config),
on hand-written configs: no weights, no transformers."""
import json

import pytest

from rft_jax.models import hf_checkpoint as hc

VOCAB = 96
CONFIG = dict(architectures=['LlamaForCausalLM'], vocab_size=VOCAB, hidden_size=64,
              intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=128)


def _model_dir(tmp_path, **ids):
  (tmp_path / 'config.json').write_text(json.dumps({**CONFIG, **ids}))
  return str(tmp_path)


@pytest.mark.parametrize('ids', [
    dict(bos_token_id=0, eos_token_id=VOCAB - 1, pad_token_id=None),
    dict(eos_token_id=[VOCAB - 2, VOCAB - 1], pad_token_id=-1),   # Llama 3's list; old pad -1
    dict(),
])
def test_token_ids_in_the_vocabulary_load(tmp_path, ids):
  assert hc.load_hf_config(_model_dir(tmp_path, **ids)).vocab_size == VOCAB


@pytest.mark.parametrize('key,value,reason', [
    ('eos_token_id', VOCAB, f'{VOCAB} is not a token'),
    ('eos_token_id', [2, VOCAB + 5], f'{VOCAB + 5} is not a token'),   # one of a list
    ('bos_token_id', VOCAB, f'{VOCAB} is not a token'),
    ('pad_token_id', 10**6, f'{10**6} is not a token'),
    ('eos_token_id', '2', 'expected a token id'),
])
def test_token_id_past_the_vocabulary_is_one_line_error(tmp_path, key, value, reason):
  """An id at or past vocab_size was accepted: no embedding row has it (a device gather clamps
  it to another token). One line naming config.json, the key and the vocabulary."""
  with pytest.raises(hc.HFCheckpointError) as e:
    hc.load_hf_config(_model_dir(tmp_path, **{key: value}))
  msg = str(e.value)
  assert msg.startswith(f'{tmp_path}/config.json: {key}={value!r}: {reason}'), msg
  assert '\n' not in msg
  if 'not a token' in reason:
    assert f'vocab_size={VOCAB}' in msg, msg
