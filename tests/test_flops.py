"""FLOPs formulas (rft_jax/telemetry/flops.py) against values worked by hand for a tiny config."""

import dataclasses

import pytest

from configs import grpo_arith
from rft_jax.models.llama import ModelConfig
from rft_jax.telemetry import flops

# L=2, E=8, F=16, H=2, K=1, D=4, V=10.
#   per layer: E*H*D=64 + 2*E*K*D=64 + H*D*E=64 + 3*E*F=384 = 576; N_mm = 2*576 + V*E(80) = 1232
#   attention per key: 4*L*H*D = 64
TINY = ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=4)


def test_matmul_params_and_per_key_cost():
  assert flops.matmul_params(TINY) == 1232
  assert flops.attention_flops_per_key(TINY) == 64
  # num_params adds the norms (2E per layer + E) and, untied, the input embedding (V*E).
  assert TINY.num_params() - flops.matmul_params(TINY) == 2 * 2 * 8 + 8 + 10 * 8
  tied = dataclasses.replace(TINY, tie_word_embeddings=True)
  assert tied.num_params() - flops.matmul_params(tied) == 2 * 2 * 8 + 8


def test_forward_train_prefill_decode_by_hand():
  # forward(3) = 2*1232*3 + 64*(1+2+3) = 7392 + 384
  assert flops.forward_flops(TINY, 3) == 7776
  assert flops.train_flops(TINY, 3) == 3 * 7776
  assert flops.prefill_flops(TINY, 2) == 2 * 1232 * 2 + 64 * 3
  # one decode step after a 2-token prompt: 2*N_mm + 64 * 3 keys
  assert flops.decode_flops(TINY, 2, 1) == 2 * 1232 + 64 * 3
  assert flops.forward_flops_per_token(TINY, 3) == 2 * 1232 + 64 * 3
  assert flops.sampling_flops(TINY, 2, 1) == flops.forward_flops(TINY, 3)
  # fractional (mean) lengths use the closed form T(T+1)/2
  assert flops.forward_flops(TINY, 2.5) == pytest.approx(2 * 1232 * 2.5 + 64 * 2.5 * 3.5 / 2)


def test_sliding_window_caps_attended_keys():
  windowed = dataclasses.replace(TINY, sliding_window=2)
  assert flops.attended_keys(windowed, 4) == 1 + 2 + 2 + 2
  assert flops.forward_flops(windowed, 4) == 2 * 1232 * 4 + 64 * 7
  assert flops.forward_flops_per_token(windowed, 10) == 2 * 1232 + 64 * 2


def test_step_flops_by_hand():
  # 2 prompts x 3 completions, prompt 2 + completion 1 tokens, 2 updates, with a reference.
  out = flops.step_flops(TINY, prompts=2, group_size=3, prompt_len=2, gen_len_mean=1,
                         updates_per_batch=2, use_reference=True)
  assert out['sampling'] == 6 * 7776
  assert out['scoring'] == 6 * 7776
  assert out['reference'] == 6 * 7776
  assert out['train'] == 2 * 6 * 3 * 7776
  assert out['critic'] == 0
  assert out['total'] == 3 * 6 * 7776 + 2 * 6 * 3 * 7776 == 419904
  no_ref = flops.step_flops(TINY, 2, 3, 2, 1, updates_per_batch=2, use_reference=False)
  assert no_ref['reference'] == 0 and no_ref['total'] == out['total'] - 6 * 7776
  critic = flops.step_flops(TINY, 2, 3, 2, 1, updates_per_batch=2, critic_cfg=TINY)
  assert critic['critic'] == 6 * (7776 + 2 * 3 * 7776)


def test_step_flops_from_a_recipe_config():
  config = grpo_arith.get_config()
  out = flops.step_flops_from_config(config, gen_len_mean=3.2)
  model = ModelConfig.from_dict(dict(config.model))
  expected = flops.step_flops(model, 32, 8, 8, 3.2, updates_per_batch=2, use_reference=True)
  assert out == pytest.approx(expected)
  # 6N per trained token dominates: ~0.79M params, 256 rows of 11.2 tokens, 2 updates
  assert 0.8 < out['train'] / (2 * 256 * 11.2 * 6 * flops.matmul_params(model)) < 1.2


def test_a_separate_ppo_critic_is_counted():
  """algo.critic='separate' trains a second copy of the model: its passes are in the total."""
  from configs import ppo_arith  # pylint: disable=g-import-not-at-top
  config = ppo_arith.get_config('tiny')
  shared = flops.step_flops_from_config(config, gen_len_mean=4.0)
  config.algo.critic = 'separate'
  separate = flops.step_flops_from_config(config, gen_len_mean=4.0)
  assert shared['critic'] == 0 and separate['critic'] > 0
  assert separate['total'] == pytest.approx(shared['total'] + separate['critic'])
