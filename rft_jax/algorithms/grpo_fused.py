"""The on-policy GRPO step as one program: reference pass, policy forward + backward, update.

With one optimiser update per rollout batch (algo.updates_per_batch == 1) the "old" policy that
scored the batch IS the policy being updated, so its log-probs are the update's own forward pass
(stop-gradient): ratio = exp(logp - sg(logp)) = 1 exactly, and the gradient is that of
grpo.train_step. prepare_batch + train_step run two policy forward passes for this (one to
score, one to differentiate); fused_step runs one, as TRL's GRPOTrainer does with
num_iterations = 1:

  fused_step(state, ref_params, rollout, rewards_b, valid_b) -> (state, metrics, adv_b)
      ref_logp_bl = reference pass (skipped without algo.use_reference; ref_params may be None)
      (logp_bl, entropy_bl), pullback = vjp(policy forward, state.params)
      batch, metrics = grpo.assemble_batch(rollout, sg(logp_bl), ref_logp_bl, ...)
      d loss_sum / d (logp_bl, entropy_bl) -> pullback -> grads / count -> grpo.finish_update

Everything prepare_batch computes from old log-probs (advantages with the in-reward KL, TIS
weights, the sampler/trainer mismatch metrics) is computed from the same values, so the step's
metrics have the same names. Gradients equal the two-pass path's up to float rounding (its
separately computed old log-probs differ from the update's by ~1e-7). Both passes run the LM
head on the completion positions only (grpo.sequence_logprobs with first = P - 1; the loss
never reads prompt positions), and with algo.shared_prompt (the default) run each group's prompt
once (models/functional.forward_completions).
"""
import jax
import jax.numpy as jnp

from rft_jax.algorithms import grpo, kl_control


def fusable(algo) -> bool:
  """True when fused_step applies: one update per batch over one micro-batch (a GRPO-family
  algo; PPO's critic has its own step)."""
  is_grpo = type(algo) is grpo.GRPOConfig  # pylint: disable=unidiomatic-typecheck
  return is_grpo and algo.updates_per_batch == 1 and algo.microbatches == 1


def fused_step(state, ref_params, rollout, rewards_b, valid_b, *, graphdef,
               algo: grpo.GRPOConfig, tx, schedule):
  """prepare_batch + train_step for fusable(algo), with one policy forward pass; also returns
  the advantages [B] the loss used (for the monitor's credit signals). Pure; jit it with the
  state donated."""
  tokens_bs, mask_bs, _, _ = grpo.rollout_sequences(rollout)
  first = rollout.prompt_tokens_bp.shape[1] - 1   # LM head on the completion positions only
  kl_coef = kl_control.coef(state, algo)
  temperature = grpo.scoring_temperature(state)
  ref_logp_bl = None
  if algo.use_reference:
    ref_logp_bl = grpo.score_logprobs(graphdef, ref_params, tokens_bs, mask_bs,
                                      algo.score_chunks or 1, first, algo.prompt_group(),
                                      temperature)

  def policy(params):
    logp_bl, entropy_bl = grpo.sequence_logprobs(graphdef, params, tokens_bs, mask_bs, first,
                                                 algo.prompt_group(), temperature)
    if algo.entropy_coef:   # the entropy is in the loss: differentiate it too
      return (logp_bl, entropy_bl), None
    return logp_bl, entropy_bl   # entropy only reported: no backward pass through it

  if algo.entropy_coef:
    (logp_bl, entropy_bl), pullback = jax.vjp(lambda p: policy(p)[0], state.params)
  else:
    logp_bl, pullback, entropy_bl = jax.vjp(policy, state.params, has_aux=True)
  old_logp_bl = jax.lax.stop_gradient(logp_bl)
  batch, metrics = grpo.assemble_batch(
      rollout, old_logp_bl, old_logp_bl if ref_logp_bl is None else ref_logp_bl, rewards_b,
      valid_b, algo=algo, kl_coef=kl_coef)

  def loss(lp, ent):
    return grpo.loss_terms(lp, ent, batch, algo=algo, kl_coef=kl_coef)

  (g_logp, g_ent), (count, sums) = jax.grad(loss, argnums=(0, 1), has_aux=True)(
      logp_bl, entropy_bl)
  (grads,) = pullback((g_logp, g_ent) if algo.entropy_coef else g_logp)
  denom = jnp.maximum(count, 1.0)   # as train_state.accumulate_grads: the global mean
  grads = jax.tree.map(lambda g: g / denom, grads)
  sums = jax.tree.map(lambda x: x / denom, sums)
  state, step_metrics = grpo.finish_update(state, grads, sums, kl_coef, tx, schedule)
  return state, {**metrics, **step_metrics}, batch['adv']
