"""FLOPs of an RL step for a decoder LM (Llama / Qwen2 / Mistral family), as pure functions.

Counts are *model* FLOPs (useful multiply-adds x 2), the convention of Kaplan et al. (2020) and of
the RL scaling papers (ScaleRL; "Scaling Behaviors of LLM RL Post-Training"): padding, masked
attention slots, recomputation and the decode steps run by rows that already finished are not
counted, so hardware FLOPs are higher. Only the model config's attributes are read (any object
with ModelConfig's fields works; nothing here imports JAX).

Symbols: L layers, E hidden size, F MLP size, H query heads, K key/value heads, D head dim,
V vocab, W sliding window (None = full attention).

  N_mm      = L * (E*H*D + 2*E*K*D + H*D*E + 3*E*F) + V*E
              weights used in matmuls per token: attention projections, SwiGLU MLP and the LM head
              (the input embedding is a lookup; norms and biases are elementwise and ignored).
  attn(c)   = 4 * L * H * D * c
              scores q.k (2*H*D per key) and the weighted sum of values (2*H*D per key) for one
              query attending to c keys, c = min(position, W).
  fwd(c)    = 2 * N_mm + attn(c)                      one token's forward pass at context c
  S(T)      = sum_{t=1..T} min(t, W) = T(T+1)/2 (no window or T <= W),
              else W(W+1)/2 + (T - W) * W             keys attended by a causal sequence of T
  forward_flops(T)  = 2 * N_mm * T + 4*L*H*D * S(T)   one causal sequence of T tokens
  train_flops(T)    = 3 * forward_flops(T)            forward + backward (backward = 2x forward)

Sampling with a KV cache: prefill of the P prompt tokens costs forward_flops(P); decoding g tokens
costs sum_{i=1..g} fwd(P + i) = forward_flops(P + g) - forward_flops(P) (one decode forward per
generated token; each attends to the prompt and the tokens before it, itself included). The
sampler repeats each prompt G times, so the prefill is counted once per completion.
Real-valued lengths are allowed (a mean generation length), the sums taken in closed form.
"""

from __future__ import annotations

from typing import Any

from rft_jax.config_schema import critic_layout

ModelConfigLike = Any   # rft_jax.models.llama.ModelConfig or anything with its fields


def matmul_params(cfg: ModelConfigLike) -> int:
  """N_mm = L*(E*H*D + 2*E*K*D + H*D*E + 3*E*F) + V*E: the weights multiplied per token."""
  e, f, l = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
  q = cfg.num_attention_heads * cfg.head_dim
  kv = cfg.num_key_value_heads * cfg.head_dim
  return l * (e * q + 2 * e * kv + q * e + 3 * e * f) + cfg.vocab_size * e


def attention_flops_per_key(cfg: ModelConfigLike) -> int:
  """4 * L * H * D: attention FLOPs of one query token per key it attends to."""
  return 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim


def _window(cfg: ModelConfigLike) -> float | None:
  return getattr(cfg, 'sliding_window', None)


def attended_keys(cfg: ModelConfigLike, seq_len: float) -> float:
  """S(T) = sum_{t=1..T} min(t, W): keys attended by all queries of a causal sequence of T."""
  t, w = float(seq_len), _window(cfg)
  if t <= 0:
    return 0.0
  if w is None or t <= w:
    return t * (t + 1) / 2
  return w * (w + 1) / 2 + (t - w) * w


def forward_flops_per_token(cfg: ModelConfigLike, context: float) -> float:
  """fwd(c) = 2 * N_mm + 4*L*H*D * min(c, W): one token attending to `context` keys."""
  w = _window(cfg)
  c = float(context) if w is None else min(float(context), float(w))
  return 2.0 * matmul_params(cfg) + attention_flops_per_key(cfg) * c


def forward_flops(cfg: ModelConfigLike, seq_len: float) -> float:
  """forward_flops(T) = 2 * N_mm * T + 4*L*H*D * S(T): a causal forward pass over T tokens."""
  return (2.0 * matmul_params(cfg) * float(seq_len)
          + attention_flops_per_key(cfg) * attended_keys(cfg, seq_len))


def train_flops(cfg: ModelConfigLike, seq_len: float) -> float:
  """3 * forward_flops(T): forward + backward (the backward pass is ~2x the forward).

  Per token this is 6 * N_mm + 12*L*H*D * (mean attended keys).
  """
  return 3.0 * forward_flops(cfg, seq_len)


def prefill_flops(cfg: ModelConfigLike, prompt_len: float) -> float:
  """forward_flops(P): the prompt's pass that fills the KV cache."""
  return forward_flops(cfg, prompt_len)


def decode_flops(cfg: ModelConfigLike, prompt_len: float, gen_len: float) -> float:
  """sum_{i=1..g} fwd(P + i) = forward_flops(P + g) - forward_flops(P): g cached decode steps.

  Per generated token: 2 * N_mm + 4*L*H*D * (context so far).
  """
  return forward_flops(cfg, prompt_len + gen_len) - forward_flops(cfg, prompt_len)


def sampling_flops(cfg: ModelConfigLike, prompt_len: float, gen_len: float) -> float:
  """prefill + decode of one completion = forward_flops(P + g)."""
  return prefill_flops(cfg, prompt_len) + decode_flops(cfg, prompt_len, gen_len)


def step_flops(model_cfg: ModelConfigLike, prompts: int, group_size: int, prompt_len: float,
               gen_len_mean: float, updates_per_batch: int = 1, use_reference: bool = False,
               *, critic_cfg: ModelConfigLike | None = None) -> dict[str, float]:
  """FLOPs of one RL step on `prompts` prompts x `group_size` completions (R = prompts*group_size).

  With T = prompt_len + gen_len_mean (the trainer's `config.task.max_prompt_len` and the
  logged `response/len_mean`):
    sampling  = R * forward_flops(T)                  prefill + KV-cache decode
    scoring   = R * forward_flops(T)                  policy log-probs before the updates
    reference = R * forward_flops(T) if use_reference else 0
    train     = updates_per_batch * R * train_flops(T)
    critic    = R * (forward_flops_c(T) + updates_per_batch * train_flops_c(T)) with critic_cfg
                (a value model: one scoring pass, then trained each update), else 0
    total     = the sum.
  Evaluation passes are not training compute and are not counted.
  """
  rows = float(prompts) * float(group_size)
  seq = float(prompt_len) + float(gen_len_mean)
  fwd = forward_flops(model_cfg, seq)
  out = {
      'sampling': rows * sampling_flops(model_cfg, prompt_len, gen_len_mean),
      'scoring': rows * fwd,
      'reference': rows * fwd if use_reference else 0.0,
      'train': float(updates_per_batch) * rows * train_flops(model_cfg, seq),
      'critic': 0.0,
  }
  if critic_cfg is not None:
    out['critic'] = rows * (forward_flops(critic_cfg, seq)
                            + float(updates_per_batch) * train_flops(critic_cfg, seq))
  out['total'] = sum(out.values())
  return out


def step_flops_from_config(config: Any, gen_len_mean: float,
                           model_cfg: ModelConfigLike | None = None) -> dict[str, float]:
  """step_flops with the numbers read from an rft_jax RL config (ml_collections ConfigDict).

  use_reference follows the trainer: on when algo.kl_coef > 0 or the monitor runs in 'auto'.
  `model_cfg` defaults to config.model's fields (ModelConfig's names). PPO's separate critic
  (algo.critic='separate': a second copy of the base model) is counted as `critic`.
  """
  if model_cfg is None:
    model_cfg = ModelFields(dict(config.model))
  algo = config.get('algo', {})
  separate_critic = critic_layout(algo) == 'separate'
  return step_flops(model_cfg, config.rollout.prompts_per_step, config.rollout.group_size,
                    config.task.max_prompt_len, gen_len_mean,
                    updates_per_batch=int(algo.get('updates_per_batch', 1)),
                    use_reference=uses_reference(config),
                    critic_cfg=model_cfg if separate_critic else None)


def uses_reference(config: Any) -> bool:
  """As the trainer: a reference pass when algo.kl_coef > 0 or the monitor runs in 'auto'."""
  kl_coef = float(config.get('algo', {}).get('kl_coef', 0.0) or 0.0)
  return kl_coef > 0 or config.get('monitor', {}).get('mode', 'off') == 'auto'


class ModelFields:
  """Attribute view of a dict of ModelConfig fields (no JAX import needed)."""

  def __init__(self, d: dict):
    self.sliding_window = None
    self.__dict__.update(d)
