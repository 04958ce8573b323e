"""Direct preference losses (DPO family) as pure functions of summed sequence log-probs.

Inputs are [B] per preference pair: the summed log-probs of the chosen (preferred) and rejected
completions under the policy (logp_c, logp_r) and the frozen reference (ref_c, ref_r). With

  h = (logp_c - ref_c) - (logp_r - ref_r)        (the implicit reward margin / beta)

  sigmoid (DPO, Rafailov et al. 2023), with label smoothing eps (cDPO, Mitchell 2023):
      loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
  ipo (Azar et al. 2023):      loss = (h - 1 / (2 beta))^2
  hinge (RSO, Liu et al. 2023):    loss = max(0, 1 - beta h)   (SLiC's hinge, Zhao et al. 2023,
                                   on the reference-normalised margin; TRL's 'hinge')

Returns (loss_b [B], stats) with per-pair stats (TRL's names):
  rewards/chosen = beta (logp_c - ref_c), rewards/rejected = beta (logp_r - ref_r),
  rewards/margins = chosen - rejected, rewards/accuracies = 1.0 where chosen > rejected.
Mean them over pairs (or aggregate (sum, count) as the policy losses do) in the train step.

The train step works on a pair batch (B pairs, S slots, L = S - 1 target positions):

  chosen_tokens, chosen_mask, chosen_loss_mask        [B, S]  (loss mask: completion + EOS)
  rejected_tokens, rejected_mask, rejected_loss_mask  [B, S]
  ref_chosen, ref_rejected                            [B]     summed reference log-probs
  pair_mask                                           [B]     1 = a real pair, 0 = padding

  pair_logps(params, batch) -> (logp_c_b, logp_r_b), logp_b = sum_l log pi(tok_{l+1}|tok_<=l) *
      loss_mask[l+1]: the summed completion log-prob (TRL's logps/chosen, logps/rejected).
  train_step(state, batch) -> (state, metrics): loss = sum_b pair_mask_b loss_b / sum_b pair_mask_b,
      accumulated as (sum, count) over micro-batches (train_state.accumulate_grads). With
      rpo_alpha > 0 (RPO, Pang et al. 2024; TRL's rpo_alpha) each pair's loss adds
      rpo_alpha * nll_b, nll_b = -logp_c_b / |chosen tokens| (the chosen answer's token-mean
      NLL): it keeps the chosen answer likely while the margin grows.
The reference log-probs come in the batch, computed once per pair outside the step.

Online DPO builds the pairs from G sampled completions per prompt (select_pairs, online_batch):
chosen = the highest-reward completion, rejected = the lowest; a prompt gives a pair only when
that reward is strictly higher (with the 'correct' verifier alone: one correct, one incorrect).
"""
import dataclasses

import jax
import jax.numpy as jnp

from rft_jax.algorithms import train_state as ts
from rft_jax.algorithms.grpo import rollout_sequences, sequence_logprobs
from rft_jax.telemetry.metrics import rollout_metrics

DPO_LOSS_TYPES = ('sigmoid', 'ipo', 'hinge')


def dpo_loss(logp_c_b, logp_r_b, ref_c_b, ref_r_b, *, beta: float = 0.1,
             loss_type: str = 'sigmoid', label_smoothing: float = 0.0):
  """Per-pair preference loss and reward stats; see the module docstring for the formulas."""
  h = (logp_c_b - ref_c_b) - (logp_r_b - ref_r_b)
  if loss_type == 'sigmoid':
    loss = (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * h)
            - label_smoothing * jax.nn.log_sigmoid(-beta * h))
  elif loss_type == 'ipo':
    loss = (h - 1.0 / (2.0 * beta)) ** 2
  elif loss_type == 'hinge':
    loss = jax.nn.relu(1.0 - beta * h)
  else:
    raise ValueError(f'unknown DPO loss type {loss_type!r}; known: {", ".join(DPO_LOSS_TYPES)}')
  sg = jax.lax.stop_gradient
  chosen, rejected = sg(beta * (logp_c_b - ref_c_b)), sg(beta * (logp_r_b - ref_r_b))
  stats = {'rewards/chosen': chosen, 'rewards/rejected': rejected,
           'rewards/margins': chosen - rejected,
           'rewards/accuracies': (chosen > rejected).astype(jnp.float32)}
  return loss, stats


@dataclasses.dataclass(frozen=True)
class DPOConfig:
  """config.dpo's loss settings, frozen for use as a static jit argument."""
  loss_type: str = 'sigmoid'
  beta: float = 0.1
  label_smoothing: float = 0.0
  microbatches: int = 1
  rpo_alpha: float = 0.0

  @classmethod
  def from_config(cls, config) -> 'DPOConfig':
    d = config.dpo
    return cls(loss_type=d.loss_type, beta=float(d.beta),
               label_smoothing=float(d.label_smoothing), microbatches=d.microbatches,
               rpo_alpha=float(d.get('rpo_alpha', 0.0)))


def pair_logps(params, batch: dict, *, graphdef):
  """Summed completion log-probs of both sides -> (logp_c_b [B], logp_r_b [B]); one forward
  over the [2B, S] concatenation."""
  tokens = jnp.concatenate([batch['chosen_tokens'], batch['rejected_tokens']], 0)
  mask = jnp.concatenate([batch['chosen_mask'], batch['rejected_mask']], 0)
  weight = jnp.concatenate([batch['chosen_loss_mask'], batch['rejected_loss_mask']], 0)
  logp_bl, _ = sequence_logprobs(graphdef, params, tokens, mask)
  logp_b = (logp_bl * weight[:, 1:].astype(jnp.float32)).sum(-1)
  b = batch['chosen_tokens'].shape[0]
  return logp_b[:b], logp_b[b:]


def loss_fn(params, mb: dict, *, graphdef, dcfg: DPOConfig):
  """Micro-batch (loss sum, (pair count, metric sums)); see train_state.accumulate_grads."""
  logp_c, logp_r = pair_logps(params, mb, graphdef=graphdef)
  loss_b, stats = dpo_loss(logp_c, logp_r, mb['ref_chosen'], mb['ref_rejected'],
                           beta=dcfg.beta, loss_type=dcfg.loss_type,
                           label_smoothing=dcfg.label_smoothing)
  nll_b = -logp_c / jnp.maximum(mb['chosen_loss_mask'].sum(-1), 1).astype(jnp.float32)
  if dcfg.rpo_alpha:
    loss_b = loss_b + dcfg.rpo_alpha * nll_b
  w = mb['pair_mask'].astype(jnp.float32)
  sg = jax.lax.stop_gradient
  loss_sum = (loss_b * w).sum()
  sums = {k: (v * w).sum() for k, v in stats.items()}
  sums.update({'loss': sg(loss_sum), 'logps/chosen': sg((logp_c * w).sum()),
               'logps/rejected': sg((logp_r * w).sum()), 'nll_loss': sg((nll_b * w).sum())})
  return loss_sum, (w.sum(), sums)


def train_step(state: ts.TrainState, batch: dict, *, graphdef, dcfg: DPOConfig, tx, schedule):
  """One optimiser update on a pair batch -> (state, metrics: pair means + optimiser stats)."""
  grads, metrics = ts.accumulate_grads(
      lambda p, mb: loss_fn(p, mb, graphdef=graphdef, dcfg=dcfg), state.params, batch,
      dcfg.microbatches)
  metrics['pairs'] = batch['pair_mask'].astype(jnp.float32).sum()
  state, opt_stats = ts.apply_gradients(state, grads, tx, schedule)
  return state, {**metrics, **opt_stats}


def select_pairs(rewards_b, valid_b, group_size: int):
  """Per group of G consecutive rows -> (chosen_n, rejected_n row indices [N], has_pair_n [N]).

  chosen = argmax of the valid rewards, rejected = argmin (first on ties); has_pair where
  max > min, so groups with one distinct reward (all right, all wrong) or < 2 valid rows give none.
  """
  r_ng = rewards_b.reshape(-1, group_size).astype(jnp.float32)
  v_ng = valid_b.reshape(-1, group_size).astype(bool)
  hi_ng, lo_ng = jnp.where(v_ng, r_ng, -jnp.inf), jnp.where(v_ng, r_ng, jnp.inf)
  base_n = jnp.arange(r_ng.shape[0]) * group_size
  has_pair_n = hi_ng.max(-1) > lo_ng.min(-1)
  return base_n + hi_ng.argmax(-1), base_n + lo_ng.argmin(-1), has_pair_n


def online_batch(ref_params, rollout, rewards_b, valid_b, *, graphdef, group_size: int):
  """Pairs from a group rollout (rows [n*G, (n+1)*G) = prompt n) plus their reference log-probs
  -> (pair batch with N = prompts rows, {'pairs/step', 'pairs/skipped_prompts', reward/*,
  response/*}). Pure; jit it."""
  tokens_bs, mask_bs, loss_mask_bl, _ = rollout_sequences(rollout)
  loss_mask_bs = jnp.pad(loss_mask_bl, ((0, 0), (1, 0))).astype(jnp.int32)
  chosen_n, rejected_n, has_pair_n = select_pairs(rewards_b, valid_b, group_size)
  batch = {'pair_mask': has_pair_n.astype(jnp.float32)}
  for side, rows in (('chosen', chosen_n), ('rejected', rejected_n)):
    batch.update({f'{side}_tokens': tokens_bs[rows], f'{side}_mask': mask_bs[rows],
                  f'{side}_loss_mask': loss_mask_bs[rows]})
  batch['ref_chosen'], batch['ref_rejected'] = pair_logps(ref_params, batch, graphdef=graphdef)
  pairs = batch['pair_mask'].sum()
  metrics = rollout_metrics(rewards_b, valid_b, rollout.mask_bt, rollout.truncated_b, group_size)
  return batch, {**metrics, 'pairs/step': pairs,
                 'pairs/skipped_prompts': has_pair_n.shape[0] - pairs}
