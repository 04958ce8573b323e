"""The jitted train-side functions of one RL step, shared by rft_jax/trainer.py and tools/bench."""
import functools

import jax

from rft_jax.algorithms import grpo, grpo_fused, ppo


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
