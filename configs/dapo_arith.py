r"""DAPO on the arithmetic task (Yu et al. 2025, arXiv:2503.14476): decoupled clip bounds
(clip-higher), token-mean loss, no KL, dynamic sampling and soft overlong punishment.

  python -m rft_jax.main --config configs/dapo_arith.py --workdir runs/dapo_arith

Everything but the algorithm section is configs/grpo_arith.py (same data, model, budget, and the
`:tiny` variant). Dynamic sampling drops groups whose rewards are all equal and refills the batch
from up to 2 more prompt batches per step (sampling/rounds, sampling/prompts_drawn and
sampling/informative_frac in metrics.jsonl), so a step may cost up to 3x the sampling of GRPO's.
Soft overlong punishment: completions get up to 6 tokens (EOS included) and the longest correct
answer ("198" + EOS) is 4, so the last 2 tokens are the punishment interval: -0.5 for 5 tokens,
-1 for 6 (truncated). `--config.algo.overlong=mask` switches to overlong filtering instead
(truncated completions leave the loss).
"""
from configs import grpo_arith


VARIANTS = grpo_arith.VARIANTS


def get_config(arg: str = ''):
  config = grpo_arith.get_config(arg)
  config.name = 'dapo_arith'
  config.algo.advantage = 'grpo'
  config.algo.loss = 'ppo_clip'
  config.algo.clip_eps = 0.2         # ratio >= 1 - 0.2 for A < 0 (clip_eps_low follows it)
  config.algo.clip_eps_high = 0.28   # clip-higher: ratio <= 1 + 0.28 for A > 0
  config.algo.loss_agg = 'token_mean'
  config.algo.kl_coef = 0.0
  # Dynamic sampling: keep groups with reward spread; refill from further prompt batches.
  config.algo.dynamic_sampling = True
  config.algo.max_sampling_rounds = 3   # round 0 + up to 2 refills; then pad (reported)
  # Overlong reward shaping: 'soft' punishment over the last overlong_cache tokens.
  config.algo.overlong = 'soft'
  config.algo.overlong_cache = 2        # Lmax - Lcache = 6 - 2 = 4 = the longest correct answer
  return config
