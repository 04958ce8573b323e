"""RewardResult: what the reward runner (runner.py) returns for a batch of completions."""
import dataclasses
from typing import Mapping

import numpy as np


def _nan_mean(x: np.ndarray) -> float:
  return float(x.mean()) if x.size else float('nan')


def _nan_std(x: np.ndarray) -> float:
  return float(x.std()) if x.size else float('nan')


@dataclasses.dataclass
class RewardResult:
  """Rewards for a batch of N completions.

  Attributes:
    total: float32 [N], sum over verifiers of weight * value; 0.0 where not `valid`.
    per_verifier: name -> float32 [N] verifier value; NaN where that verifier raised or timed out.
    valid: bool [N], False where any verifier raised or timed out for that sample.
    errors: name -> number of samples where that verifier raised.
    timeouts: name -> number of samples where that verifier timed out (or its chunk was stuck).
    error_messages: name -> the first error message of that verifier in this batch.
    stuck_chunks: chunks abandoned by the safety net (their worker did not answer in time).
  """
  total: np.ndarray
  per_verifier: dict[str, np.ndarray]
  valid: np.ndarray
  errors: dict[str, int]
  timeouts: dict[str, int]
  error_messages: dict[str, str] = dataclasses.field(default_factory=dict)
  stuck_chunks: int = 0

  def out_of_range_frac(self, weights: Mapping[str, float]) -> float:
    """Share of valid samples whose total lies outside [lo, hi], the range weighted verifiers
    scoring in [0, 1] can produce: lo = sum_v min(w_v, 0), hi = sum_v max(w_v, 0) (with a
    float32 rounding margin). Non-zero means something between the verifiers and the trainer
    changed the reward (a scale, a sign, an undeclared shaping term) or a verifier broke its
    [0, 1] contract; the monitor's invariant/reward_out_of_range."""
    w = np.asarray([float(weights.get(n, 0.0)) for n in self.per_verifier], np.float64)
    lo, hi = np.minimum(w, 0).sum(), np.maximum(w, 0).sum()
    margin = 1e-5 * max(1.0, np.abs(w).sum())
    t = np.asarray(self.total, np.float64)[self.valid]
    return float(np.mean((t < lo - margin) | (t > hi + margin))) if t.size else 0.0

  def metrics(self) -> dict[str, float]:
    """Flat scalar metrics: per-verifier mean and std over valid samples, error/timeout counts,
    invalid fraction."""
    out = {}
    for name, values in self.per_verifier.items():
      out[f'reward/{name}/mean'] = _nan_mean(values[self.valid])
      out[f'reward/{name}/std'] = _nan_std(values[self.valid])
    out['reward/total/mean'] = _nan_mean(self.total[self.valid])
    for name, count in self.errors.items():
      out[f'reward/errors/{name}'] = float(count)
    for name, count in self.timeouts.items():
      out[f'reward/timeouts/{name}'] = float(count)
    out['reward/invalid_frac'] = float(1.0 - self.valid.mean()) if self.valid.size else 0.0
    out['reward/stuck_chunks'] = float(self.stuck_chunks)
    return out
