"""Jitted autoregressive sampling: one prefill, then a `lax.while_loop` decode over a KV cache.

Prompts arrive left-padded ([B,P] tokens and mask). Each prompt's KV cache is computed once and
attended as a prefix shared by its group's rows; every row's i-th new token goes into slot i of
the row's own cache (after the prompt's P slots), with its own position id prompt_len_b + i.
The loop stops early once every row has emitted EOS. Shapes: B rows, P prompt slots,
T = max_new_tokens, V vocab.
"""
import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from rft_jax import programs
from rft_jax.models import functional as lm
from rft_jax.models.llama import ModelConfig


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int
  eos_id: int
  pad_id: int
  temperature: float = 1.0   # 0 = greedy
  top_k: int = 0             # 0 = off
  top_p: float = 1.0         # 1.0 = off
  # Further ids that end a completion as eos_id does (a HF checkpoint's generation_config.json
  # eos_token_id list, e.g. Llama 3's <|eot_id|> beside <|end_of_text|>; tokenizer.stop_ids).
  stop_ids: tuple[int, ...] = ()


def extra_stop_ids(tokenizer) -> tuple[int, ...]:
  """The tokenizer's stop ids besides eos_id (for SamplingConfig.stop_ids)."""
  return tuple(int(i) for i in getattr(tokenizer, 'stop_ids', ()) if i != tokenizer.eos_id)


def is_stop(tokens, cfg: SamplingConfig):
  """tokens == eos_id or any of stop_ids (bool, tokens' shape)."""
  out = tokens == cfg.eos_id
  for stop in cfg.stop_ids:
    out = out | (tokens == stop)
  return out


@struct.dataclass
class Rollout:
  """Completions for B rows.

  tokens_bt: sampled ids, pad after EOS (eos_id or one of stop_ids). logp_bt: log-prob of each
  sampled token under the distribution actually sampled from (after temperature, top-k, top-p;
  for greedy, the untempered model distribution); 0 where mask is 0. mask_bt: 1 on generated
  tokens up to and including EOS. truncated_b: True where no EOS came within T tokens.
  """
  prompt_tokens_bp: jax.Array
  prompt_mask_bp: jax.Array
  tokens_bt: jax.Array
  logp_bt: jax.Array
  mask_bt: jax.Array
  truncated_b: jax.Array

  @property
  def lengths_b(self) -> jax.Array:
    return self.mask_bt.sum(-1)


def filter_logits(logits_bv: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf (static k, p).

  Nucleus: keep the smallest set of highest-probability tokens whose mass reaches top_p (the
  token that crosses the threshold is kept).
  """
  neg = jnp.finfo(logits_bv.dtype).min
  if top_k > 0:
    kth = jax.lax.top_k(logits_bv, top_k)[0][:, -1:]
    logits_bv = jnp.where(logits_bv < kth, neg, logits_bv)
  if top_p < 1.0:
    sorted_desc = jnp.sort(logits_bv, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < top_p
    threshold = jnp.min(jnp.where(keep_sorted, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    logits_bv = jnp.where(logits_bv < threshold, neg, logits_bv)
  return logits_bv


def inverse_cdf_draw(logp_bv: jax.Array, u_b: jax.Array) -> jax.Array:
  """token_b = #{v : cdf_bv <= u_b * cdf_bV} with cdf_bv = sum_{w <= v} exp(logp_bw): the first
  token whose cumulative mass passes u_b in [0, 1) of the row's total -> int32 [B].

  Only tokens with mass come out: fp32 rounding (u * total rounding up to total, a cumulative
  sum not exactly monotone) can land on a zero-mass token (e.g. one top-k / top-p removed); such
  rows take the row's most likely token instead (an argmax computed only when that happens).
  """
  cdf_bv = jnp.cumsum(jnp.exp(logp_bv), axis=-1)
  token_b = jnp.minimum(jnp.sum(cdf_bv <= u_b[:, None] * cdf_bv[:, -1:], axis=-1),
                        logp_bv.shape[-1] - 1)
  on_mass_b = jnp.exp(jnp.take_along_axis(logp_bv, token_b[:, None], axis=-1)[:, 0]) > 0
  token_b = jax.lax.cond(jnp.all(on_mass_b), lambda: token_b,
                         lambda: jnp.where(on_mass_b, token_b, jnp.argmax(logp_bv, axis=-1)))
  return token_b.astype(jnp.int32)


def choose(logits_bv: jax.Array, rng: jax.Array, cfg: SamplingConfig):
  """Draws one token per row -> (token_b, logp_b of it under the sampled distribution).

  Sampling is inverse_cdf_draw with one uniform per row: the distribution of
  jax.random.categorical (the Gumbel-max trick) up to fp32 rounding of the cumulative sum, with
  B instead of B*V random numbers and logs (at 128 x 1024 the Gumbel noise was ~12% of the
  sampler's time on 2 CPU cores).
  """
  if cfg.temperature == 0.0:
    token = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
    logp_v = jax.nn.log_softmax(logits_bv, axis=-1)
  else:
    logp_v = jax.nn.log_softmax(
        filter_logits(logits_bv / cfg.temperature, cfg.top_k, cfg.top_p), axis=-1)
    token = inverse_cdf_draw(logp_v, jax.random.uniform(rng, logits_bv.shape[:1], jnp.float32))
  return token, jnp.take_along_axis(logp_v, token[:, None], axis=-1)[:, 0]


def prefill(graphdef, params, prompt_tokens_bp, prompt_mask_bp, *, model_cfg: ModelConfig,
            max_new_tokens: int, group_size: int = 1):
  """The prompt pass -> (last-position logits [B*G, V], prefix, own cache).

  Each prompt runs through the model once: prefix = (its KV cache [B,K,P,D] per layer, prompt
  mask [B,P] as bool), shared by the G rows of its group (rows [g*G, (g+1)*G) belong to prompt
  g; llama.Attention's prefix, never repeated); only the logits are repeated. The own cache
  holds each of the B*G rows' T = max_new_tokens slots, zeroed.
  """
  b, _ = prompt_tokens_bp.shape
  prompt_valid_bp = prompt_mask_bp.astype(bool)
  cache = lm.init_cache(model_cfg, b, prompt_tokens_bp.shape[1])
  logits, cache = lm.forward_cached(graphdef, params, prompt_tokens_bp,
                                    lm.positions_from_mask(prompt_mask_bp), prompt_valid_bp,
                                    cache, 0)
  last_bv = jnp.repeat(logits[:, -1], group_size, axis=0) if group_size > 1 else logits[:, -1]
  return last_bv, (cache, prompt_valid_bp), lm.init_cache(model_cfg, b * group_size,
                                                          max_new_tokens)


def sample(graphdef, params, prompt_tokens_bp, prompt_mask_bp, rng, *, model_cfg: ModelConfig,
           cfg: SamplingConfig, group_size: int = 1) -> Rollout:
  """Samples T = cfg.max_new_tokens tokens after each left-padded prompt, group_size times per
  prompt (B*G rows out, see prefill): prefill, then decode. Pure; jit it."""
  last_logits_bv, prefix, cache = prefill(graphdef, params, prompt_tokens_bp, prompt_mask_bp,
                                          model_cfg=model_cfg, max_new_tokens=cfg.max_new_tokens,
                                          group_size=group_size)
  return decode(graphdef, params, prompt_tokens_bp, prompt_mask_bp, rng, last_logits_bv, prefix,
                cache, model_cfg=model_cfg, cfg=cfg, group_size=group_size)


def decode(graphdef, params, prompt_tokens_bp, prompt_mask_bp, rng, last_logits_bv, prefix,
           cache, *, model_cfg: ModelConfig, cfg: SamplingConfig,
           group_size: int = 1) -> Rollout:
  """The decode loop after prefill (its three outputs in): one token per row per iteration,
  on device (lax.while_loop), stopping early once every row has emitted EOS. Pure; jit it."""
  if group_size > 1:
    prompt_tokens_bp = jnp.repeat(prompt_tokens_bp, group_size, axis=0)
    prompt_mask_bp = jnp.repeat(prompt_mask_bp, group_size, axis=0)
  b, _ = prompt_tokens_bp.shape
  t_max = cfg.max_new_tokens
  prompt_len_b = prompt_mask_bp.sum(-1).astype(jnp.int32)
  own_valid_bt = jnp.ones((b, t_max), bool)   # causality hides the slots not yet written
  # Rotary tables of every decode step's positions prompt_len_b + i, computed once: [B,T,1,D].
  cos_bt1d, sin_bt1d = lm.rope_tables(model_cfg, prompt_len_b[:, None] + jnp.arange(t_max))

  def cond(carry):
    i, _, _, done_b, *_ = carry
    return (i < t_max) & ~jnp.all(done_b)

  def body(carry):
    i, logits_bv, cache, done_b, tokens_bt, logp_bt, rng = carry
    rng, step_rng = jax.random.split(rng)
    token_b, logp_b = choose(logits_bv, step_rng, cfg)
    token_b = jnp.where(done_b, cfg.pad_id, token_b)
    logp_b = jnp.where(done_b, 0.0, logp_b)
    tokens_bt = tokens_bt.at[:, i].set(token_b)
    logp_bt = logp_bt.at[:, i].set(logp_b)
    done_b = done_b | is_stop(token_b, cfg)
    rope_b1 = tuple(jax.lax.dynamic_slice_in_dim(x, i, 1, axis=1) for x in (cos_bt1d, sin_bt1d))
    logits_b1v, cache = lm.forward_cached(graphdef, params, token_b[:, None],
                                          (prompt_len_b + i)[:, None], own_valid_bt, cache, i,
                                          rope_b1, prefix)
    return i + 1, logits_b1v[:, 0], cache, done_b, tokens_bt, logp_bt, rng

  init = (jnp.int32(0), last_logits_bv, cache, jnp.zeros((b,), bool),
          jnp.full((b, t_max), cfg.pad_id, jnp.int32), jnp.zeros((b, t_max), jnp.float32), rng)
  _, _, _, done_b, tokens_bt, logp_bt, _ = jax.lax.while_loop(cond, body, init)
  # Mask: tokens up to and including the first EOS. Slots never written (early exit) only exist
  # when every row is done, so they all lie after an EOS.
  is_eos = is_stop(tokens_bt, cfg)
  mask_bt = ((jnp.cumsum(is_eos, axis=-1) - is_eos) == 0).astype(jnp.int32)
  return Rollout(prompt_tokens_bp=prompt_tokens_bp, prompt_mask_bp=prompt_mask_bp,
                 tokens_bt=tokens_bt, logp_bt=logp_bt * mask_bt, mask_bt=mask_bt,
                 truncated_b=~done_b)


def make_sampler(graphdef, model_cfg: ModelConfig, cfg: SamplingConfig, group_size: int = 1):
  """jit(fn(params, prompt_tokens_bp, prompt_mask_bp, rng) -> Rollout over B*group_size rows).

  With group_size G, each prompt is repeated G times consecutively: rows [g*G, (g+1)*G) are the
  group of prompt g.
  """
  def fn(params, prompt_tokens_bp, prompt_mask_bp, rng):
    return sample(graphdef, params, prompt_tokens_bp, prompt_mask_bp, rng,
                  model_cfg=model_cfg, cfg=cfg, group_size=group_size)
  return jax.jit(fn)


def shared_sampler(graphdef, model_cfg: ModelConfig, cfg: SamplingConfig, group_size: int = 1):
  """make_sampler's program, shared with earlier runs of this process that sampled the same way
  (rft_jax/programs.py): a second run does not trace and lower it again."""
  return programs.shared('sampler', (graphdef, model_cfg, cfg, group_size),
                         lambda: make_sampler(graphdef, model_cfg, cfg, group_size))
