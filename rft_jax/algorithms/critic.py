"""The critic of PPO: a value head on a decoder backbone, its losses and its diagnostics. Pure jnp.

Two layouts (config.algo.critic):
  'shared'    the value head reads the policy's own final hidden states: one forward pass gives
              logits and values, and the value loss also trains the shared backbone (through
              the policy optimiser, weighted by algo.vf_coef).
  'separate'  a second model of the policy's architecture, initialised from the policy's initial
              parameters (verl's usual critic init), plus a value head; trained by its own
              optimiser (lr algo.critic_lr), the policy is untouched by the value loss.

Critic params are a pure dict {'head': {'kernel': [E], 'bias': []}} (+ 'backbone': the model's
params dict for 'separate'). The head starts at zero (V = 0 everywhere), so the first advantages
are the rewards-to-go. Values use the sequence layout of rft_jax/algorithms/grpo.py: the value of
the state before completion token j sits at target position l = P - 1 + j, next to the log-prob
of that token (values_bl [B, L], L = S - 1).
"""
import jax
import jax.numpy as jnp
from flax import nnx

from rft_jax.algorithms import grpo
from rft_jax.models import functional as lm
from rft_jax.telemetry.metrics import token_entropy

CRITIC_MODES = ('none', 'shared', 'separate')


def init_head(hidden_size: int) -> dict:
  """Zero value head: V(h) = h . kernel + bias = 0 for every hidden state h [E]."""
  return {'kernel': jnp.zeros((hidden_size,), jnp.float32), 'bias': jnp.zeros((), jnp.float32)}


def init_params(mode: str, policy_params, hidden_size: int) -> dict:
  """Critic params for `mode` ('shared' | 'separate'); 'separate' copies policy_params."""
  params = {'head': init_head(hidden_size)}
  if mode == 'separate':
    params['backbone'] = jax.tree.map(jnp.copy, policy_params)
  return params


def hidden_and_logits(graphdef, params, tokens_bs, mask_bs):
  """One causal forward pass -> (final normed hidden states [B, S, E], logits [B, S, V] f32),
  as models.functional.forward (the same Transformer.hidden + .logits). Unused logits (a separate
  critic) are removed by XLA."""
  model = nnx.merge(graphdef, params)
  h_bse, _ = model.hidden(tokens_bs, lm.positions_from_mask(mask_bs), mask_bs.astype(bool))
  return h_bse, model.logits(h_bse)


def values(head: dict, h_bse) -> jax.Array:
  """V_bs = h_bse . kernel + bias, in float32 -> [B, S]."""
  return h_bse.astype(jnp.float32) @ head['kernel'] + head['bias']


def token_logprobs(logits_bsv, tokens_bs, temperature=None):
  """log pi(token_{l+1} | <= l) and the entropy at each target position -> two [B, L];
  temperature: as grpo.sequence_logprobs (pi = softmax(logits / temperature))."""
  logp_bl, logits = grpo.target_logprobs(logits_bsv[:, :-1], tokens_bs[:, 1:], temperature)
  return logp_bl, token_entropy(logits)


def critic_backbone(mode: str, policy_params, critic_params):
  """The params the value head reads: the policy's ('shared') or the critic's own."""
  return policy_params if mode == 'shared' else critic_params['backbone']


def score(graphdef, params, head, tokens_bs, mask_bs, chunks: int = 1, temperature=None,
          first: int = 0, group_size: int = 1):
  """(logp_bl, values_bl) [B, L] from one backbone pass, in `chunks` row chunks
  (grpo.map_chunks); each row is scored on its own, so the values equal a single pass.
  temperature: as token_logprobs.

  first = P - 1 and group_size K > 1 (static; grpo.sequence_logprobs' arguments): the
  completion positions only, each group of K rows sharing its prompt, which runs through the
  backbone once (models/functional.hidden_completions); log-probs and values are then 0 on
  the P - 1 prompt positions, which no loss or metric reads (grpo.loss_terms takes logp =
  old_logp off the loss mask). Where the chunks do not divide the groups, rows are scored whole.
  """
  def one(tokens, mask, group_size):
    if group_size <= 1:
      h_bse, logits = hidden_and_logits(graphdef, params, tokens, mask)
      return token_logprobs(logits, tokens, temperature)[0], values(head, h_bse)[:, :-1]
    h_bte = lm.hidden_completions(graphdef, params, tokens, mask, first + 1, group_size)
    logits = nnx.merge(graphdef, params).logits(h_bte)
    logp_bt, _ = grpo.target_logprobs(logits, tokens[:, first + 1:], temperature)
    pad = lambda x_bt: jnp.pad(x_bt, ((0, 0), (first, 0)))
    return pad(logp_bt), pad(values(head, h_bte))

  return grpo.map_chunks(one, tokens_bs, mask_bs, chunks, group_size)


def clipped_value_loss(vpred_bl, old_values_bl, returns_bl, clip: float):
  """PPO's clipped value loss per token (Schulman et al. 2017; verl compute_value_loss):

    v_clip_t = old_v_t + clip(v_t - old_v_t, -c, c)
    vf_t     = 0.5 * max((v_t - R_t)^2, (v_clip_t - R_t)^2)        (c = clip; c = 0: no clipping,
                                                                    vf_t = 0.5 (v_t - R_t)^2)
  All [B, L]. Returns (vf_bl, clipped_bl): clipped_bl = 1 where the clip is active
  (|v_t - old_v_t| > c) and the clipped term is the larger (verl's vf_clipfrac indicator; there
  the gradient of v_t is 0). Inside the range v_clip_t equals v_t only up to rounding
  (old_v + (v - old_v)), and verl's bare `clipped > unclipped` counted those 1-ulp ties: most of
  a tiny PPO run's vf_clipfrac, and another value on another mesh. Mask in the aggregation.
  """
  unclipped = (vpred_bl - returns_bl) ** 2
  if not clip:
    return 0.5 * unclipped, jnp.zeros_like(unclipped)
  delta = vpred_bl - old_values_bl
  v_clip = old_values_bl + jnp.clip(delta, -clip, clip)
  clipped = (v_clip - returns_bl) ** 2
  active = (jnp.abs(delta) > clip) & (clipped > unclipped)
  return 0.5 * jnp.maximum(unclipped, clipped), active.astype(jnp.float32)


def explained_variance(values_bl, returns_bl, mask_bl):
  """1 - Var[R - V] / Var[R] over the masked tokens (population variances; the ratio equals
  verl's unbiased one). 1: the critic predicts the returns; 0: no better than their mean;
  negative: worse. Defined as 0 when Var[R] = 0 (nothing to explain). -> scalar."""
  m = mask_bl.astype(jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)

  def var(x):
    mean = (x * m).sum() / n
    return (((x - mean) ** 2) * m).sum() / n

  var_r = var(returns_bl)
  return jnp.where(var_r > 1e-12, 1.0 - var(returns_bl - values_bl) / jnp.maximum(var_r, 1e-12),
                   0.0)


def masked_whiten(x_bl, mask_bl, eps: float = 1e-8):
  """(x - mean) / sqrt(var + eps) over the masked entries (population variance), 0 elsewhere
  (verl masked_whiten, as applied to GAE advantages). -> [B, L]."""
  m = mask_bl.astype(jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  mean = (x_bl * m).sum() / n
  var = (((x_bl - mean) ** 2) * m).sum() / n
  return (x_bl - mean) * jax.lax.rsqrt(var + eps) * m
