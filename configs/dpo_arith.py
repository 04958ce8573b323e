r"""Offline DPO on the built-in arithmetic task, starting from the shipped SFT base policy.

  python -m rft_jax.main --config configs/dpo_arith.py --workdir runs/dpo_arith

Preference pairs: for each train problem where a careless teacher can slip (a forgotten carry, a
dropped minus sign), chosen = the correct answer, rejected = the slip
(rft_jax/data/arith_pairs.py, ~9.8k pairs, TFDS array_record, generated offline on first use).
The base policy learnt those slips from its demonstrations (configs/sft_arith.py): it prefers
the slip in ~87% of the pairs. Reference log-probs (the base policy) are computed once per pair
before training (~10 s); the train step never runs the reference.

What to expect on 2 CPU cores (no GPU): under a minute of wall time (36 s on 2026-12-07, 12 s
of it the reference table); `rewards/accuracies` near 1 from step ~5; held-out greedy accuracy
57% -> 83% (mean@8 62% -> 67%), printed at the end and written to `summary.json`.

Why short, with a large beta and an NLL term: every pair comes from a problem *with* a slip, so
DPO also learns to carry where there is no carry. Measured on the 500 test prompts after this
recipe: '+' with a carry 13 -> 102 of 114 right, '-' with a negative result 25 -> 95 of 102, but
'+' without a carry 130 -> 76 of 135. Train longer (or with beta = 0.1, lr = 1e-4, no NLL) and
that side wins: held-out greedy accuracy falls below the base (~23% after 150 steps). Online
DPO (configs/online_dpo_arith.py) pairs the policy's own right and wrong answers and does not
have this problem.

`--config configs/dpo_arith.py:tiny` is the same recipe shrunk for tests (a few steps, 256 pairs).
"""
import ml_collections

from configs import common


VARIANTS = ('', 'tiny')   # --config configs/<this file>.py or ...py:tiny (seconds of work)


def get_config(arg: str = ''):
  common.check_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.name = 'dpo_arith'
  config.variant = arg   # recorded with the run: config.json, summary.json, metrics.jsonl
  config.seed = 0

  # Input: the arithmetic task (held-out eval on its test split) and its slip pairs.
  config.task = common.arith_task()
  config.tokenizer = common.tiny_tokenizer()

  # Policy (and frozen reference): the tiny Llama-style model, initialised from the SFT base.
  config.model = common.tiny_model()
  config.init_from = common.shipped_asset('arith_base')

  # DPO: offline pairs, sigmoid loss (Rafailov et al. 2023).
  config.dpo = ml_collections.ConfigDict()
  config.dpo.mode = 'offline'
  config.dpo.pairs = 'arith_slips'   # rft_jax/data/arith_pairs.py
  config.dpo.max_pairs = 0           # 0 = every pair; N = the first N (a random subset)
  config.dpo.batch_size = 64         # pairs per step
  config.dpo.answer_len = 6          # completion slots (answer + EOS); also the eval length
  config.dpo.loss_type = 'sigmoid'   # sigmoid | ipo | hinge
  config.dpo.beta = 0.5            # larger beta: a tighter leash to the reference
  config.dpo.label_smoothing = 0.0   # > 0: conservative DPO (sigmoid only)
  config.dpo.rpo_alpha = 1.0         # + rpo_alpha * NLL of the chosen answer (RPO); 0 = plain
  config.dpo.microbatches = 1

  config.optim = common.optim(3e-5)

  config.train = common.train(50, eval_every=25, ckpt_every=25)

  config.eval = common.evaluation()

  config.mesh = common.mesh()

  config.telemetry = common.telemetry()

  if arg == 'tiny':   # seconds of work: used by tests
    config.dpo.max_pairs = 256
    config.dpo.batch_size = 16
    config.train.steps = 4
    config.train.eval_every = 4
    config.train.ckpt_every = 2
    config.eval.num_prompts = 16
    config.eval.k = 2
  return config
