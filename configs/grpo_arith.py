r"""GRPO on the built-in arithmetic task, starting from the shipped SFT base policy.

  python -m rft_jax.main --config configs/grpo_arith.py --workdir runs/grpo_arith

What to expect on 2 CPU cores (no GPU): a few minutes of wall time, the mean reward rising from
~0.7 at the first step to ~1.0 by step 150 (of a maximum 1.1: correct 1.0 + format 0.1, see
config.rewards.weights), and held-out greedy accuracy rising by well over 15 points over the
base policy (both are printed at the end and written to `summary.json`).

`--config configs/grpo_arith.py:tiny` is the same recipe shrunk for tests (a few steps).
"""
import ml_collections

from configs import common


VARIANTS = ('', 'tiny')   # --config configs/<this file>.py or ...py:tiny (seconds of work)


def get_config(arg: str = ''):
  common.check_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.name = 'grpo_arith'
  config.variant = arg   # recorded with the run: config.json, summary.json, metrics.jsonl
  config.seed = 0

  # Input: procedurally generated arithmetic (TFDS builder, array_record, offline).
  config.task = common.arith_task()
  config.tokenizer = common.tiny_tokenizer()

  # Policy: the tiny Llama-style model, initialised from the SFT base policy.
  config.model = common.tiny_model()
  config.init_from = common.shipped_asset('arith_base')   # orbax params dir; '' = random init

  # Rollouts: G completions for each of `prompts_per_step` prompts.
  config.rollout = ml_collections.ConfigDict()
  config.rollout.prompts_per_step = 32
  config.rollout.group_size = 8
  config.rollout.max_new_tokens = 6
  config.rollout.temperature = 1.0
  config.rollout.top_k = 0          # 0 = off
  config.rollout.top_p = 1.0        # 1.0 = off
  config.rollout.weights_layout = 'train'   # 'no_fsdp': sample with weights whole over fsdp

  # Rewards: weighted sum of rule-based verifiers (rft_jax/rewards/verifiers.py).
  config.rewards = ml_collections.ConfigDict()
  config.rewards.weights = ml_collections.ConfigDict({'correct': 1.0, 'format': 0.1})
  config.rewards.timeout_s = 2.0    # per completion; a hanging verifier cannot hang the run
  # Worker processes for verifiers that are not inline (correct and format are: they are
  # scored in this process, untimed, and no worker starts for them).
  config.rewards.num_workers = 2
  # A step where more than this fraction of samples could not be scored (a verifier raised or
  # timed out) stops the run, naming the verifier and an input; below it, those samples are
  # left out of the loss and counted in telemetry.
  config.rewards.max_invalid_frac = 0.5
  config.rewards.memory_mb = 1024   # per reward worker, beyond its start-up size; 0 = no limit

  # Algorithm: registry entries by name (rft_jax/algorithms/).
  config.algo = ml_collections.ConfigDict()
  config.algo.advantage = 'grpo'    # group mean, divided by group std
  config.algo.loss = 'ppo_clip'
  config.algo.loss_agg = 'token_mean'
  config.algo.clip_eps = 0.2
  config.algo.kl_coef = 0.02        # k3 KL to the frozen reference policy, in the loss
  config.algo.kl_estimator = 'k3'
  config.algo.updates_per_batch = 2 # optimiser steps on each rollout batch (>1 exercises clipping)
  config.algo.microbatches = 1

  config.optim = common.optim(2e-4)

  # Loop, eval and checkpoints.
  config.train = common.train(150, eval_every=50, ckpt_every=25)

  config.eval = common.evaluation()

  config.mesh = common.mesh()

  config.monitor = common.monitor('warn')   # see configs/common.py for the modes

  # Live scaling fit (off: --config.scaling.live_every=1 fits after every eval; it needs >= 5
  # evals, so also lower --config.train.eval_every).
  config.scaling = common.scaling()

  # Fault injection (rft_jax/faults.py), e.g. [dict(type='lr_spike', onset_step=15, strength=50)].
  config.faults = []

  config.telemetry = common.telemetry()

  if arg == 'tiny':   # a few seconds of work: used by tests
    config.rollout.prompts_per_step = 4
    config.rollout.group_size = 4
    config.train.steps = 4
    config.train.eval_every = 4
    config.train.ckpt_every = 2
    config.eval.num_prompts = 16
    config.eval.k = 2
  return config
