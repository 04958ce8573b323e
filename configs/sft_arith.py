r"""Supervised fine-tuning of the tiny model from scratch: builds the GRPO base policy.

  python -m rft_jax.main --config configs/sft_arith.py --workdir runs/sft_arith

Trains on (prompt, answer) pairs from the arithmetic train split with a token-mean cross-entropy
on the answer tokens only. It stops deliberately early, at partial competence, so that RL has
room to improve. The base policy shipped in `rft_jax/assets/arith_base` was made with this
command on 2026-12-02 (57.4% held-out greedy accuracy), then exported with

  python -m tools.export_base --config configs/sft_arith.py --workdir runs/sft_arith \
      --out rft_jax/assets/arith_base

(`make base` runs both). Rerun on 2026-12-07: 49.6% greedy, 49.8% mean@8, 313 s of wall time
on 2 CPU cores shared with other jobs.
"""
import ml_collections

from configs import common


VARIANTS = ('', 'tiny')   # --config configs/<this file>.py or ...py:tiny (seconds of work)


def get_config(arg: str = ''):
  common.check_variant(arg, VARIANTS)
  config = ml_collections.ConfigDict()
  config.name = 'sft_arith'
  config.variant = arg   # recorded with the run: config.json, summary.json, metrics.jsonl
  config.seed = 0

  config.task = common.arith_task()
  config.tokenizer = common.tiny_tokenizer()
  config.model = common.tiny_model()
  config.init_from = ''

  config.sft = ml_collections.ConfigDict()
  config.sft.batch_size = 64
  config.sft.answer_len = 4         # answer + EOS, right-padded ("-99" + EOS is 4)
  # Demonstrations come from a careless teacher: 65% of the answers where a slip is possible
  # (a forgotten carry, a dropped minus sign; see arith.teacher_slip) carry it. The base policy
  # then often prefers the slip while still giving the right answer real probability — what RL
  # with an exact verifier should repair. 0.0 = a perfect teacher.
  config.sft.teacher_error_rate = 0.65

  config.optim = common.optim(1e-3, warmup_steps=50, weight_decay=0.01)

  config.train = common.train(2500, eval_every=250, ckpt_every=250, keep_checkpoints=10)

  config.eval = common.evaluation()

  config.mesh = common.mesh()

  config.telemetry = common.telemetry()

  if arg == 'tiny':
    config.train.steps = 6
    config.train.eval_every = 6
    config.train.ckpt_every = 3
    config.eval.num_prompts = 16
    config.eval.k = 2
  return config
