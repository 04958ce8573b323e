"""A run's per-device memory estimate from its recipe, checked before the first step.

memory_sizes(config) sizes the recipe's batch as its trainer does (rft_jax/parallel/memory.py
has the formulas); check_memory(components, config, algo) raises components.SetupError (one
line) when the estimate exceeds the device's memory. Called by the RL, SFT and DPO trainers.
"""
from rft_jax import config as config_lib
from rft_jax.components import Components, SetupError
from rft_jax.parallel import memory


def memory_sizes(config) -> dict:
  """memory.estimate's keyword arguments for the recipe's batch, as its trainer sizes it: SFT one
  row per example, no sampling; DPO a chosen and a rejected row per pair, online DPO sampling its
  prompts' groups; the RL recipes their rollout rows, PPO's critic and mini-batches, and the
  copies of the reference 'auto' remediation's resets can hold (memory.run_reset_references).
  No key for the initial reference policy: every recipe keeps the initial weights (a reference
  is those arrays), and memory.estimate counts them once for all."""
  prompt_len = config.task.max_prompt_len
  if config_lib.is_sft(config):
    return dict(rows=config.sft.batch_size, seq_len=prompt_len + config.sft.answer_len,
                microbatches=1, sample_rows=0)
  if config_lib.is_dpo(config):
    if config.dpo.mode == 'online':
      pairs, seq_len = config.rollout.prompts_per_step, prompt_len + config.rollout.max_new_tokens
      sample_rows = pairs * config.rollout.group_size
    else:
      pairs, seq_len, sample_rows = config.dpo.batch_size, prompt_len + config.dpo.answer_len, 0
    return dict(rows=2 * pairs, seq_len=seq_len, microbatches=int(config.dpo.microbatches),
                sample_rows=sample_rows)
  algo = config.get('algo', {})
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  return dict(rows=rows, seq_len=prompt_len + config.rollout.max_new_tokens,
              microbatches=int(algo.get('microbatches', 1)), sample_rows=rows,
              critic=memory.run_critic(config), minibatches=config_lib.ppo_minibatches(algo),
              sampling_layout=config.rollout.get('weights_layout', 'train'),
              reset_references=memory.run_reset_references(config))


def _memory_remedy(config) -> str:
  """check_fits' advice in the keys of an SFT or DPO recipe (they have no config.algo, and
  offline DPO no config.rollout: the RL advice names keys these recipes do not have)."""
  if config_lib.is_sft(config):
    return 'or lower sft.batch_size / sft.answer_len / task.max_prompt_len'
  if config.dpo.mode == 'online':
    return ('raise config.dpo.microbatches, or lower rollout.prompts_per_step / group_size / '
            'max_new_tokens')
  return 'raise config.dpo.microbatches, or lower dpo.batch_size / dpo.answer_len'


def check_memory(c: Components, config, algo=None) -> memory.MemoryEstimate:
  """Raises SetupError (one line) when the run's estimated per-device memory exceeds the device's
  (rft_jax/parallel/memory.py; no check where the device reports no limit, e.g. CPU). algo: the
  GRPOConfig or PPOConfig of an RL recipe (its resolved micro-batches, PPO's critic and
  mini-batches); None sizes the run from the recipe (memory_sizes: SFT, DPO).
  Returns the estimate."""
  sizes = memory_sizes(config)
  if algo is not None:   # the trainer's resolved settings over the recipe's
    sizes.update(microbatches=algo.microbatches, critic=getattr(algo, 'critic', 'none'),
                 minibatches=getattr(algo, 'minibatches', 1))
  est = memory.estimate(c.model_cfg, c.mesh, **sizes)
  remedy = memory.RL_REMEDY if algo is not None else _memory_remedy(config)
  try:
    memory.check_fits(est, remedy=remedy)
  except memory.MemoryBudgetError as e:
    raise SetupError(str(e)) from None
  return est
