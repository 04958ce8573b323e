"""The jitted train-side functions of one RL step, shared by rft_jax/trainer.py and tools/bench."""
import functools

import jax

from rft_jax import programs
from rft_jax.algorithms import grpo, grpo_fused, ppo, train_state


def make_step_fns(graphdef, algo, tx, schedule, shardings, batch_sh, rep, critic_opt=None):
  """The jitted train-side functions of one RL step (tools/bench times these same ones):

    prepare(params, ref_params, rollout, rewards_b, valid_b, **ppo.prepare_args) -> batch, metrics
    train_step(state, batch) -> state, metrics                  (state donated)
    fused(state, ref_params, rollout, rewards_b, valid_b) -> state, metrics, adv_b   (donated)
        grpo_fused.fused_step: prepare + train_step with one policy pass, or None where the
        algo needs separate passes (grpo_fused.fusable).
  """
  critic_opt = critic_opt or {}
  family = ppo if ppo.is_ppo(algo) else grpo   # PPO: critic, GAE, mini-batch epochs
  prepare = jax.jit(functools.partial(family.prepare_batch, graphdef=graphdef, algo=algo),
                    out_shardings=(batch_sh, rep))
  train_step = jax.jit(
      functools.partial(family.train_step, graphdef=graphdef, algo=algo, tx=tx,
                        schedule=schedule, **critic_opt),
      in_shardings=(shardings, batch_sh), out_shardings=(shardings, rep), donate_argnums=0)
  fused = None
  if grpo_fused.fusable(algo):
    fused = jax.jit(functools.partial(grpo_fused.fused_step, graphdef=graphdef, algo=algo,
                                      tx=tx, schedule=schedule),
                    out_shardings=(shardings, rep, batch_sh), donate_argnums=0)
  return prepare, train_step, fused


def shared_step_fns(graphdef, algo, optim_cfg, shardings, batch_sh, rep):
  """make_step_fns with config.optim's optimizer (optim_cfg; and PPO's critic's), shared with the
  earlier runs of this process that asked for the same (rft_jax/programs.py): a second run does
  not trace and lower them again."""
  def build():
    tx, schedule = train_state.make_optimizer(optim_cfg), train_state.lr_schedule(optim_cfg)
    return make_step_fns(graphdef, algo, tx, schedule, shardings, batch_sh, rep,
                         ppo.critic_optimizer(optim_cfg, algo))
  key = (graphdef, algo, programs.config_key(optim_cfg), programs.tree_key(shardings), batch_sh,
         rep)
  return programs.shared('step_fns', key, build)


def shared_update_step(step, graphdef, optim_cfg, shardings, batch_sh, rep, **static):
  """jit(step(state, batch) -> (state, metrics)) of a supervised loop (SFT, DPO: `step` is its
  train_step(state, batch, *, graphdef, tx, schedule, **static)), with config.optim's optimizer
  (optim_cfg), state donated; shared like shared_step_fns (rft_jax/programs.py)."""
  def build():
    tx, schedule = train_state.make_optimizer(optim_cfg), train_state.lr_schedule(optim_cfg)
    return jax.jit(functools.partial(step, graphdef=graphdef, tx=tx, schedule=schedule, **static),
                   in_shardings=(shardings, batch_sh), out_shardings=(shardings, rep),
                   donate_argnums=0)
  key = (step, graphdef, programs.config_key(optim_cfg), tuple(sorted(static.items())),
         programs.tree_key(shardings), batch_sh, rep)
  return programs.shared('update_step', key, build)


SKIP_KEYS = ('update_skipped', 'critic/update_skipped')


def train_epochs(train_step, state, batch, epochs: int):
  """`epochs` (algo.updates_per_batch) calls of train_step on one prepared batch -> (state, the
  last call's metrics, except that 'update_skipped' (and PPO's 'critic/update_skipped') is the
  mean over all calls: the fraction of the step's optimiser updates that a non-finite loss or
  gradient skipped, 1 when all were). A few scalar adds on the device; nothing waits on them."""
  state, metrics = train_step(state, batch)
  skipped = {k: metrics[k] for k in SKIP_KEYS if k in metrics}
  for _ in range(epochs - 1):
    state, metrics = train_step(state, batch)
    skipped = {k: v + metrics[k] for k, v in skipped.items()}
  if epochs > 1:
    metrics = {**metrics, **{k: v / epochs for k, v in skipped.items()}}
  return state, metrics
