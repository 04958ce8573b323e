"""Plain-Python references shared by the advantage tests (test_advantages.py) and the tiny-model
GRPO options tests (test_grpo_options.py)."""
import math

import numpy as np

EPS = 1e-6


def mean_std(xs):
  if not xs:
    return 0.0, 0.0
  m = sum(xs) / len(xs)
  return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def ref_token_returns(score, valid, mask, kl, kl_coef):
  """REINFORCE++'s token advantages by loops: G_t = s - kl_coef * sum_{i >= t} kl_i on the loss
  tokens of valid rows, whitened over all those tokens (population std)."""
  returns = {}
  for b in range(len(score)):
    if not valid[b]:
      continue
    tail = 0.0
    for t in reversed(range(len(mask[b]))):
      if mask[b][t]:
        tail += kl[b][t]
        returns[b, t] = score[b] - kl_coef * tail
  m, s = mean_std(list(returns.values()))
  out = np.zeros(np.shape(mask))
  for (b, t), g_bt in returns.items():
    out[b, t] = (g_bt - m) / (s + EPS)
  return out
