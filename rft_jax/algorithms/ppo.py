"""PPO with a critic (Schulman et al. 2017; Ouyang et al. 2022): GAE advantages on token-level
rewards, the clipped policy loss of the GRPO family and a clipped value loss, several epochs of
mini-batches per rollout batch. Selected by config.algo.advantage = 'gae' (configs/ppo_arith.py).

Sequence layout as rft_jax/algorithms/grpo.py: [B, L] target positions, completion token j at
l = P - 1 + j. Per rollout batch:

  prepare_batch(params, ref_params, rollout, rewards_b, valid_b, critic_params=, kl_coef=)
      old_logp_bl, ref_logp_bl, old_values_bl (V at the sampling params; with algo.shared_prompt
      each group's prompt runs once in these passes, and they are 0 on prompt positions), and
      on the T completion positions:
        r_t = R * [t = last completion token] - beta * kl_t * kl_in_reward   (token rewards)
        A_t, G_t = GAE(r, V_old; gamma, lam)    (advantages.gae; returns G_t = A_t + V_old_t)
        A_t <- (A_t - mean) / std over the batch's completion tokens   (algo.adv_whiten)
  train_step(state, batch) -> state, metrics    one epoch (the trainer runs algo.updates_per_batch)
      algo.minibatches updates, each on a 1/minibatches slice of the rows (shuffled with key
      fold_in(key(0), state.step) when > 1), each the sum over algo.microbatches of
        loss = L_pg / C_pg + vf_coef * sum_t vf_t / N_tok
      where L_pg is the GRPO family's policy loss sum (grpo.loss_terms: PPO-clip, KL, entropy;
      C_pg its aggregation's count) and vf_t the clipped value loss (critic.clipped_value_loss),
      normalised by the mini-batch's global counts, so micro-batching changes nothing.
      Gradients go to the policy (its optimiser) and to the critic params (their own optimiser,
      lr algo.critic_lr); with critic = 'shared' the value loss also trains the policy backbone.

The critic (params + optimiser state) lives in TrainState.critic and is checkpointed with it.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp

from rft_jax.algorithms import corrections, critic, grpo, kl_control, registry
from rft_jax.algorithms import train_state as ts
from rft_jax.algorithms.advantages import gae
from rft_jax.algorithms.losses import kl_penalty, masked
from rft_jax.parallel import mesh as meshlib
from rft_jax.sampling.sampler import Rollout
from rft_jax.telemetry.metrics import masked_mean, rollout_metrics

CRITIC_ADVANTAGES = ('gae',)   # = rft_jax.config_schema.CRITIC_ADVANTAGES


@dataclasses.dataclass(frozen=True)
class PPOConfig(grpo.GRPOConfig):
  """config.algo of a PPO recipe: the GRPO family's fields plus the critic's."""
  advantage: str = 'gae'
  critic: str = 'shared'     # 'shared' (value head on the policy) | 'separate' (critic.py)
  gamma: float = 1.0         # GAE discount
  lam: float = 0.95          # GAE lambda
  vf_coef: float = 0.5       # weight of the value loss in the summed objective
  vf_clip: float = 0.2       # value clipping range around V_old (0 = off)
  critic_lr: float = 0.0     # the critic optimiser's lr; 0 = optim.lr
  minibatches: int = 1       # optimiser updates per epoch over the rollout batch
  adv_whiten: bool = True    # whiten GAE advantages over the batch's completion tokens


def is_ppo(algo) -> bool:
  return isinstance(algo, PPOConfig)


def algo_config(config, use_reference: bool = False) -> grpo.GRPOConfig:
  """PPOConfig for a critic-based advantage ('gae'), else the GRPO family's GRPOConfig."""
  cls = PPOConfig if config.algo.advantage in CRITIC_ADVANTAGES else grpo.GRPOConfig
  return cls.from_config(config, use_reference=use_reference)


def critic_optimizer(optim_cfg, algo) -> dict:
  """{'critic_tx', 'critic_schedule'}: config.optim's AdamW and schedule at lr algo.critic_lr
  (0 = optim.lr); {} without a critic. Keyword arguments of train_step and extra_state."""
  if not is_ppo(algo):
    return {}
  optim = optim_cfg.copy_and_resolve_references()
  if algo.critic_lr:
    optim.lr = algo.critic_lr
  return {'critic_tx': ts.make_optimizer(optim), 'critic_schedule': ts.lr_schedule(optim)}


def extra_state(c, algo, critic_tx=None, critic_schedule=None):
  """Further TrainState fields of this algorithm, placed -> (fields, shardings) or None:
  'kl_ctrl' (adaptive KL, replicated) and 'critic' {'params', 'opt_state'} (head replicated, a
  separate backbone sharded like the policy). c: components.Components."""
  del critic_schedule
  fields, shardings = {}, {}
  rep = meshlib.replicated(c.mesh)
  kl = kl_control.init_state(algo)
  if kl is not None:
    shardings['kl_ctrl'] = jax.tree.map(lambda _: rep, kl)
    fields['kl_ctrl'] = jax.device_put(kl, shardings['kl_ctrl'])
  if is_ppo(algo):
    params = critic.init_params(algo.critic, c.params, c.model_cfg.hidden_size)
    p_sh = {'head': jax.tree.map(lambda _: rep, params['head'])}
    if 'backbone' in params:
      p_sh['backbone'] = c.param_shardings
    params = jax.device_put(params, p_sh)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    o_sh = meshlib.opt_state_shardings(critic_tx, like, p_sh, c.mesh)
    fields['critic'] = {'params': params,
                        'opt_state': jax.jit(critic_tx.init, out_shardings=o_sh)(params)}
    shardings['critic'] = {'params': p_sh, 'opt_state': o_sh}
  return (fields, shardings) if fields else None


def prepare_args(state, algo) -> dict:
  """Keyword arguments of this step's prepare_batch call that come from the train state."""
  args = {}
  if algo.kl_in_reward and algo.use_reference and algo.kl_coef:
    args['kl_coef'] = kl_control.coef(state, algo)
  if is_ppo(algo):
    args['critic_params'] = state.critic['params']
  args['temperature'] = grpo.scoring_temperature(state)   # the sampler's (controls)
  return args


def token_rewards(rewards_b, mask_bt):
  """The sequence reward on the last completion token: r_bt = R_b [t = n_b - 1], n_b = sum_t m.
  mask_bt [B, T] is a prefix per row (a row without tokens gets no reward). -> [B, T]."""
  n_b = mask_bt.sum(-1)
  last_bt = (jnp.arange(mask_bt.shape[1])[None, :] == (n_b - 1)[:, None]) & (n_b > 0)[:, None]
  return jnp.where(last_bt, rewards_b[:, None], 0.0).astype(jnp.float32)


def prepare_batch(params, ref_params, rollout: Rollout, rewards_b, valid_b, *, graphdef,
                  algo: PPOConfig, critic_params, kl_coef=None, temperature=None):
  """Scores a rollout: old/reference log-probs, old values, GAE advantages and returns.

  As grpo.prepare_batch for masks (invalid rows, overlong 'mask'), chunked scoring, TIS and
  the monitor's invariants; the batch also holds 'old_values' and 'returns' [B, L] and 'adv' is
  per token [B, L]. Metrics add verl's critic/* data metrics (values, returns, advantages,
  vf_explained_var of V_old against the returns).
  """
  tokens_bs, mask_bs, loss_mask_bl, sampler_logp_bl = grpo.rollout_sequences(rollout)
  loss_mask_bl = loss_mask_bl * valid_b[:, None]
  if algo.overlong == 'mask':
    loss_mask_bl = corrections.overlong_loss_mask(loss_mask_bl, rollout.truncated_b)
  p = rollout.prompt_tokens_bp.shape[1]
  kw = dict(chunks=algo.score_chunks or algo.microbatches)
  if algo.shared_prompt:   # completion positions only, each group's prompt once (else all)
    kw.update(first=p - 1, group_size=algo.group_size)
  head = critic_params['head']
  if algo.critic == 'shared':   # one pass: log-probs and values from the policy's backbone
    old_logp_bl, old_values_bl = critic.score(graphdef, params, head, tokens_bs, mask_bs,
                                              temperature=temperature, **kw)
  else:
    old_logp_bl = grpo.score_logprobs(graphdef, params, tokens_bs, mask_bs,
                                      temperature=temperature, **kw)
    _, old_values_bl = critic.score(graphdef, critic_params['backbone'], head, tokens_bs,
                                    mask_bs, **kw)
  old_logp_bl, old_values_bl = jax.lax.stop_gradient((old_logp_bl, old_values_bl))
  if algo.use_reference:
    ref_logp_bl = grpo.score_logprobs(graphdef, ref_params, tokens_bs, mask_bs,
                                      temperature=temperature, **kw)
  else:
    ref_logp_bl = old_logp_bl
  m_bt = loss_mask_bl[:, p - 1:]   # the T completion positions: a prefix per row
  reward_bt = token_rewards(jnp.where(valid_b, rewards_b, 0.0), m_bt)
  metrics = {}
  if algo.kl_in_reward and algo.use_reference and algo.kl_coef:
    kl_coef = algo.kl_coef if kl_coef is None else kl_coef
    kl_bt = masked(kl_penalty(old_logp_bl, ref_logp_bl, algo.kl_estimator)[:, p - 1:], m_bt)
    reward_bt = reward_bt - kl_coef * kl_bt
    metrics['kl_reward/seq_kl'] = masked_mean(kl_bt.sum(-1), valid_b)
    metrics['kl_reward/penalty'] = kl_coef * metrics['kl_reward/seq_kl']
  adv_bt, returns_bt = gae(reward_bt, old_values_bl[:, p - 1:], m_bt, algo.gamma, algo.lam)
  pad = lambda x_bt: jnp.concatenate([jnp.zeros_like(loss_mask_bl[:, :p - 1]), x_bt], axis=1)
  raw_adv_bl, returns_bl = pad(adv_bt), pad(returns_bt)
  adv_bl = critic.masked_whiten(raw_adv_bl, loss_mask_bl) if algo.adv_whiten else raw_adv_bl
  batch = {'tokens': tokens_bs, 'mask': mask_bs, 'loss_mask': loss_mask_bl,
           'old_logp': old_logp_bl, 'ref_logp': ref_logp_bl, 'adv': adv_bl,
           'old_values': old_values_bl, 'returns': returns_bl}
  metrics.update(rollout_metrics(rewards_b, valid_b, rollout.mask_bt, rollout.truncated_b,
                                 algo.group_size))
  tok = lambda x_bl: masked_mean(x_bl, loss_mask_bl)
  metrics['adv/mean'] = tok(adv_bl)
  metrics['adv/abs_mean'] = tok(jnp.abs(adv_bl))
  metrics['adv/std'] = jnp.sqrt(tok((adv_bl - metrics['adv/mean']) ** 2))
  metrics['adv/pos_frac'] = tok((adv_bl > 0).astype(jnp.float32))
  metrics['adv/neg_frac'] = tok((adv_bl < 0).astype(jnp.float32))
  metrics['critic/advantages/mean'] = metrics['adv/mean']
  metrics['critic/advantages/raw_mean'] = tok(raw_adv_bl)
  metrics['critic/values/mean'] = tok(old_values_bl)
  metrics['critic/returns/mean'] = tok(returns_bl)
  metrics['critic/rewards/mean'] = masked_mean(reward_bt.sum(-1), valid_b)
  metrics['critic/vf_explained_var'] = critic.explained_variance(old_values_bl, returns_bl,
                                                                 loss_mask_bl)
  metrics['invariant/prompt_loss_tokens'] = loss_mask_bl[:, :p - 1].sum()
  if algo.shared_prompt and algo.group_size > 1:   # scored with each group's first prompt
    metrics['invariant/group_prompt_mismatch'] = grpo.group_prompt_mismatch(rollout,
                                                                             algo.group_size)
  corrections.add_mismatch(batch, metrics, old_logp_bl, sampler_logp_bl, loss_mask_bl,
                           algo.tis_cap)
  return batch, metrics


def loss_fn(params, mb, *, graphdef, algo: PPOConfig, kl_coef, n_pg, n_tok, temperature=None):
  """Micro-batch objective, already divided by the global counts -> (loss, metrics).

  params = (policy params, critic params). n_pg: the policy aggregation's count over the whole
  (mini-)batch; n_tok: its loss tokens. Metric values sum over micro-batches to global values.
  """
  policy, critic_params = params
  if algo.critic == 'shared':
    h_bse, logits = critic.hidden_and_logits(graphdef, policy, mb['tokens'], mb['mask'])
    logp_bl, entropy_bl = critic.token_logprobs(logits, mb['tokens'], temperature)
  else:
    logp_bl, entropy_bl = grpo.sequence_logprobs(graphdef, policy, mb['tokens'], mb['mask'],
                                                 temperature=temperature)
    h_bse, _ = critic.hidden_and_logits(graphdef, critic_params['backbone'], mb['tokens'],
                                        mb['mask'])
  pg_sum, (_, sums) = grpo.loss_terms(logp_bl, entropy_bl, mb, algo=algo, kl_coef=kl_coef)
  vpred_bl = critic.values(critic_params['head'], h_bse)[:, :-1]
  vf_bl, clipped_bl = critic.clipped_value_loss(vpred_bl, mb['old_values'], mb['returns'],
                                                algo.vf_clip)
  m = mb['loss_mask']
  vf = (vf_bl * m).sum() / n_tok
  total = pg_sum / n_pg + algo.vf_coef * vf
  sg = jax.lax.stop_gradient
  metrics = {k: v / n_pg for k, v in sums.items()}   # accumulate_grads' convention
  metrics['actor/loss'] = metrics.pop('loss')          # the policy's part (pg, KL, entropy)
  metrics.update({'loss': sg(total), 'critic/vf_loss': sg(vf),
                  'critic/vf_clipfrac': (clipped_bl * m).sum() / n_tok,
                  'critic/vpred_mean': sg((vpred_bl * m).sum()) / n_tok})
  return total, metrics


def sum_grads(loss_fn_, params, batch: dict, microbatches: int):
  """(grads, metrics) of a globally normalised loss, summed over micro-batches (lax.scan)."""
  grad_fn = jax.grad(loss_fn_, has_aux=True)
  mbs = ts.split_microbatches(batch, microbatches)
  first = jax.tree.map(lambda x: x[0], mbs)
  init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(grad_fn, params, first))
  body = lambda acc, mb: (jax.tree.map(jnp.add, acc, grad_fn(params, mb)), None)
  return jax.lax.scan(body, init, mbs)[0]


def update(state: ts.TrainState, mb: dict, *, graphdef, algo: PPOConfig, tx, schedule,
           critic_tx, critic_schedule):
  """One optimiser update of policy and critic on a (mini-)batch -> (state, metrics)."""
  kl_coef = kl_control.coef(state, algo)
  agg = registry.get_loss_agg(algo.loss_agg)
  n_pg = jnp.maximum(agg(jnp.zeros_like(mb['loss_mask']), mb['loss_mask'],
                         norm_len=algo.max_len)[1], 1.0)
  n_tok = jnp.maximum(mb['loss_mask'].sum(), 1.0)
  fn = functools.partial(loss_fn, graphdef=graphdef, algo=algo, kl_coef=kl_coef, n_pg=n_pg,
                         n_tok=n_tok, temperature=grpo.scoring_temperature(state))
  (g_policy, g_critic), metrics = sum_grads(fn, (state.params, state.critic['params']), mb,
                                            algo.microbatches)
  metrics = grpo.token_means(metrics)
  metrics['kl_coef'] = kl_coef
  metrics['clip_frac'] = metrics['clip_frac/low'] + metrics['clip_frac/high']
  cs = ts.TrainState(step=state.step, params=state.critic['params'],
                     opt_state=state.critic['opt_state'], controls=state.controls)
  cs, c_stats = ts.apply_gradients(cs, g_critic, critic_tx, critic_schedule)
  state, opt_stats = ts.apply_gradients(state, g_policy, tx, schedule)
  state = state.replace(critic={'params': cs.params, 'opt_state': cs.opt_state})
  metrics.update(opt_stats)
  metrics.update({f'critic/{k}': c_stats[k] for k in ('grad_norm', 'lr', 'update_skipped')})
  return state, metrics


def train_step(state: ts.TrainState, batch: dict, *, graphdef, algo: PPOConfig, tx, schedule,
               critic_tx, critic_schedule):
  """One epoch over the prepared batch: algo.minibatches updates -> (state, metrics averaged
  over them). Pure; jit with donation."""
  step = functools.partial(update, graphdef=graphdef, algo=algo, tx=tx, schedule=schedule,
                           critic_tx=critic_tx, critic_schedule=critic_schedule)
  n = algo.minibatches
  if n == 1:
    return step(state, batch)
  rows = batch['tokens'].shape[0]
  perm = jax.random.permutation(jax.random.fold_in(jax.random.key(0), state.step), rows)
  mbs = ts.split_microbatches(jax.tree.map(lambda x: x[perm], batch), n)
  state, metrics_n = jax.lax.scan(step, state, mbs)
  return state, jax.tree.map(lambda x: x.mean(0), metrics_n)
