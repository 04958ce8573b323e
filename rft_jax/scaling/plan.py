"""Splitting an RL compute budget into group size, prompts per step and steps (IsoCompute rules).

Heuristics from the IsoCompute Playbook (Cheng et al. 2026, "Optimally Scaling Sampling Compute
for LLM RL", arXiv 2603.12151), which writes rollout compute as C = n * B_p * M (n rollouts per
prompt = our group size G, B_p prompts per batch, M steps) and reports that

  1. the compute-optimal n grows with the budget and then saturates;
  2. at a fixed batch B = B_p * n, small budgets favour more prompts (small n) and large
     budgets more rollouts per prompt (large n);
  3. B_p matters little within a moderate range.

The numbers below (where n starts and saturates, the batch, the minimum number of steps) are
our placeholders, not values fitted by the paper or measured on this stack; `plan` returns
them as plain-language assumptions so the caller can print them.

Rollout cost (dense decoder of N parameters, T = prompt + completion tokens, attention ignored):
  f = (2 [sampling] + 2 [policy scoring] + 2 * ref [reference] + 6 * u [train, u updates]) N T
  total rollouts R = budget / f
Group size: log2 n = log2 n_min + (log10 R - 4) / 3 * (log2 n_max - log2 n_min), rounded to a
power of two and clipped to [n_min, n_max] (n_min at 1e4 rollouts, n_max from 1e7 on).
Prompts per step: B_p = batch / n clipped to the moderate range [16, 256]; steps M = R / (B_p n).
More than max_steps steps: B_p grows (up to 256). Fewer than min_steps: B_p shrinks (to 8),
then n halves.
"""

from __future__ import annotations

import dataclasses
import math

from rft_jax.scaling.common import ScalingFitError

_R_LOW, _R_HIGH = 1e4, 1e7   # total rollouts where n leaves n_min / reaches n_max
_MIN_PROMPTS = 8
_MODERATE_PROMPTS = (16, 256)


@dataclasses.dataclass
class Plan:
  budget: float
  model_params: float
  flops_per_rollout: float
  total_rollouts: float
  group_size: int
  prompts_per_step: int
  steps: int
  assumptions: list[str]

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def rollout_flops(model_params: float, prompt_len: float, gen_len: float,
                  updates_per_batch: int = 1, use_reference: bool = False) -> float:
  """f = (2 + 2 + 2*ref + 6*u) * N * (prompt_len + gen_len)."""
  per_token = 2 + 2 + (2 if use_reference else 0) + 6 * updates_per_batch
  return per_token * model_params * (prompt_len + gen_len)


def optimal_group_size(total_rollouts: float, n_min: int = 4, n_max: int = 64) -> int:
  """n rising log-linearly in log10 R from n_min (R <= 1e4) to n_max (R >= 1e7), a power of 2."""
  t = (math.log10(max(total_rollouts, 1.0)) - math.log10(_R_LOW)) / math.log10(_R_HIGH / _R_LOW)
  t = min(max(t, 0.0), 1.0)
  log2n = math.log2(n_min) + t * (math.log2(n_max) - math.log2(n_min))
  return int(min(max(2 ** round(log2n), n_min), n_max))


def plan(budget: float, model_params: float, *, prompt_len: float = 256, gen_len: float = 1024,
         batch_rollouts: int = 512, n_min: int = 4, n_max: int = 64, min_steps: int = 50,
         max_steps: int = 5000, updates_per_batch: int = 1, use_reference: bool = False) -> Plan:
  """Suggests (group size, prompts per step, steps) for a FLOPs budget; see the module rules."""
  for name, v in (('budget', budget), ('model_params', model_params),
                  ('gen_len', gen_len), ('batch_rollouts', batch_rollouts)):
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
      raise ScalingFitError(f'{name} must be a positive number, got {v!r}')
  if not (isinstance(prompt_len, (int, float)) and math.isfinite(prompt_len) and prompt_len >= 0):
    raise ScalingFitError(f'prompt_len must be a number >= 0, got {prompt_len!r}')
  if not 2 <= n_min <= n_max:
    raise ScalingFitError(f'need 2 <= n_min <= n_max, got {n_min}, {n_max}')
  f = rollout_flops(model_params, prompt_len, gen_len, updates_per_batch, use_reference)
  total = budget / f
  smallest = min_steps * _MIN_PROMPTS * 2
  if total < smallest:
    raise ScalingFitError(f'the budget affords {total:.3g} rollouts ({f:.3g} FLOPs each); '
                          f'at least {smallest} are needed for {min_steps} steps of '
                          f'{_MIN_PROMPTS} prompts x 2 completions')
  n = optimal_group_size(total, n_min, n_max)
  lo_p, hi_p = _MODERATE_PROMPTS
  prompts = min(max(batch_rollouts // n, lo_p), hi_p)
  steps = total / (prompts * n)
  if steps > max_steps:
    prompts = min(max(prompts, math.ceil(total / (max_steps * n))), hi_p)
    steps = total / (prompts * n)
  if steps < min_steps:
    prompts = max(_MIN_PROMPTS, int(total / (min_steps * n)))
    steps = total / (prompts * n)
  while steps < min_steps and n > 2:
    n //= 2
    steps = total / (prompts * n)
  assumptions = [
      'Heuristics from the IsoCompute Playbook (arXiv 2603.12151): the compute-optimal group '
      'size grows with the budget, then saturates; at a fixed batch, small budgets favour '
      'more prompts per step and large budgets more completions per prompt; prompts per '
      'step matter little in a moderate range. They are trends from that paper, not a fit '
      'to your task or this stack.',
      f'Our placeholders: group size {n_min} up to {_R_LOW:.0e} total rollouts, rising to '
      f'{n_max} at {_R_HIGH:.0e} and beyond (powers of 2); a batch of {batch_rollouts} '
      f'rollouts per step, as prompts per step in [{lo_p}, {hi_p}] (grown to keep steps <= '
      f'{max_steps}); at least {min_steps} steps and {_MIN_PROMPTS} prompts per step.',
      f'Cost per rollout {f:.3g} FLOPs = (2 sampling + 2 scoring'
      f'{" + 2 reference" if use_reference else ""} + 6 x {updates_per_batch} train) x '
      f'N={model_params:.3g} x {prompt_len + gen_len:g} tokens; attention FLOPs, evals and '
      'padding are ignored (rft_jax.telemetry.flops.step_flops counts attention for a real '
      'config).',
      'Completions are assumed to use the full gen_len; shorter ones leave budget over.',
      'Harder tasks (low pass rate) gain from larger groups (coverage); easy ones saturate '
      'earlier (IsoCompute); verify with a short run and `python -m tools.scaling fit`.',
  ]
  return Plan(budget=float(budget), model_params=float(model_params), flops_per_rollout=f,
              total_rollouts=total, group_size=int(n), prompts_per_step=int(prompts),
              steps=int(steps), assumptions=assumptions)
