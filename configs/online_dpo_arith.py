r"""Online DPO on the built-in arithmetic task, starting from the shipped SFT base policy.

  python -m rft_jax.main --config configs/online_dpo_arith.py --workdir runs/online_dpo_arith

Each step samples G = 8 completions for each of 32 train prompts from the current policy (the
jitted sampler), scores them with the `correct` verifier, and makes one preference pair per
prompt: a correct completion (chosen) and an incorrect one (rejected). Prompts whose completions
are all right or all wrong give no pair and are counted (`pairs/skipped_prompts`; `pairs/step`
is the number of pairs). The reference (the base policy, frozen) scores each pair once, in the
jitted batch preparation; the DPO step itself never runs it.

What to expect on 2 CPU cores (no GPU): 40-70 s of wall time; ~14 pairs per step (out of 32
prompts); held-out greedy accuracy 57% -> 96% (mean@8 62% -> 87%), printed at the end and
written to `summary.json` (GRPO, configs/grpo_arith.py, reaches ~96% in 150 steps).

`--config configs/online_dpo_arith.py:tiny` is the same recipe shrunk for tests (a few steps).
"""
import ml_collections

from configs import common


VARIANTS = ('', 'tiny')   # --config configs/<this file>.py or ...py:tiny (seconds of work)


def get_config(arg: str = ''):
  common.check_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.name = 'online_dpo_arith'
  config.variant = arg   # recorded with the run: config.json, summary.json, metrics.jsonl
  config.seed = 0

  # Input: train prompts of the arithmetic task; held-out eval on its test split.
  config.task = common.arith_task()
  config.tokenizer = common.tiny_tokenizer()

  # Policy (and frozen reference): the tiny Llama-style model, initialised from the SFT base.
  config.model = common.tiny_model()
  config.init_from = common.shipped_asset('arith_base')

  # Rollouts: G completions for each of `prompts_per_step` prompts (as in grpo_arith).
  config.rollout = ml_collections.ConfigDict()
  config.rollout.prompts_per_step = 32   # = at most 32 pairs per step
  config.rollout.group_size = 8
  config.rollout.max_new_tokens = 6
  config.rollout.temperature = 1.0
  config.rollout.top_k = 0
  config.rollout.top_p = 1.0

  # Rewards: chosen = the best-scored completion, rejected = the worst, when strictly worse.
  # With 'correct' alone that is one right and one wrong answer.
  config.rewards = ml_collections.ConfigDict()
  config.rewards.weights = ml_collections.ConfigDict({'correct': 1.0})
  config.rewards.timeout_s = 2.0
  config.rewards.num_workers = 2
  config.rewards.max_invalid_frac = 0.5
  config.rewards.memory_mb = 1024

  # DPO loss on the step's pairs.
  config.dpo = ml_collections.ConfigDict()
  config.dpo.mode = 'online'
  config.dpo.loss_type = 'sigmoid'   # sigmoid | ipo | hinge
  config.dpo.beta = 0.1
  config.dpo.label_smoothing = 0.0
  config.dpo.rpo_alpha = 0.0         # > 0: + rpo_alpha * NLL of the chosen completion (RPO)
  config.dpo.microbatches = 1

  config.optim = common.optim(1e-4)

  config.train = common.train(100, eval_every=25, ckpt_every=25)

  config.eval = common.evaluation()

  config.mesh = common.mesh()

  config.telemetry = common.telemetry()

  if arg == 'tiny':   # seconds of work: used by tests
    config.rollout.prompts_per_step = 8
    config.rollout.group_size = 4
    config.train.steps = 4
    config.train.eval_every = 4
    config.train.ckpt_every = 2
    config.eval.num_prompts = 16
    config.eval.k = 2
  return config
