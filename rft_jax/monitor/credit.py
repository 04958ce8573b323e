"""Credit-assignment signals: does the advantage the loss uses point the way the rewards do?

Computed on device, on the batch the train step consumes (after any injected corruption), and
fed to the monitor with the step's other metrics (no extra host round-trip). For each group g
(rows g*G .. g*G+G-1, valid rows only) and a per-row reference x (the reward the estimator was
given, or the primary verifier's correctness):

  rho_g = sum_i da_i dx_i / sqrt(sum_i da_i^2 * sum_i dx_i^2),   da = a - mean_g(a),
                                                                 dx = x - mean_g(x)
  (0 when the advantages of g are all equal), over the *informative* groups: >= 2 valid rows and
  a spread in x (sum dx^2 > 1e-6 * sum x^2 + 1e-12; an all-equal group carries no signal).

  credit/adv_<ref>_corr          = mean_g rho_g                       (NaN: no informative group)
  invariant/adv_<ref>_disagreement = (1 - mean_g rho_g) / 2           in [0, 1]

Why this is exact for GRPO-family steps: every group estimator here (grpo, dr_grpo, rloo,
grpo_batch_norm, reinforce_pp[_baseline]) is, within a group, an increasing affine map of the
reward, so rho_g = 1 against the reward for every informative group and the disagreement is 0 up
to rounding. A group whose advantages are negated has rho_g = -1, a group whose rewards belong
to other rows has rho_g ~ 0: with a fraction f of groups reversed the disagreement is ~f, so it
reads as "the share of groups trained in the wrong direction".

Against correctness (the verifier with the largest reward weight) the healthy value is ~1 but
not exactly: other reward terms (a format bonus, a soft length penalty, KL in the reward) can
reorder rows of equal correctness, never (in a sane recipe) against it. It drops when the reward
the estimator sees no longer follows the verifier: rewards attached to the wrong rows, noise or
sign flips in the reward pipeline, a shaping term that outweighs correctness.

Token-level advantages of REINFORCE++ (adv [B, L], the KL in the reward as a return to go) are
read at each row's first completion token (`first`), whose return is the whole sequence's: the
score minus kl_coef times the sequence's KL, the row-level quantity above. PPO's (GAE) are
skipped (no metrics; the trainer does not call this for PPO): there the advantage of a token is
return - value with a learned, initially poor critic, and its correlation with the sequence's
correctness is not near 1 by construction.
"""
from __future__ import annotations

import jax.numpy as jnp

CORR_KEYS = ('credit/adv_reward_corr', 'credit/adv_correct_corr')


def group_corr(a_b, x_b, valid_b, group_size: int):
  """-> (mean over informative groups of the within-group Pearson correlation of a and x,
  number of informative groups). a_b, x_b: [B]; valid_b: [B] bool (x may be NaN where invalid).
  The mean is NaN when no group is informative, and when an informative group has a non-finite
  advantage (a NaN/Inf reward): then there is no direction to check, and the nonfinite
  invariant is what reports it (a correlation of 0 read as half the groups reversed)."""
  f32 = jnp.float32
  m = (valid_b & jnp.isfinite(x_b)).astype(f32).reshape(-1, group_size)        # [Gn, G]
  a = jnp.where(m > 0, a_b.astype(f32).reshape(-1, group_size), 0.0)
  x = jnp.where(m > 0, jnp.nan_to_num(x_b.astype(f32)).reshape(-1, group_size), 0.0)
  n = m.sum(-1)
  safe_n = jnp.maximum(n, 1.0)
  da = (a - (a * m).sum(-1, keepdims=True) / safe_n[:, None]) * m
  dx = (x - (x * m).sum(-1, keepdims=True) / safe_n[:, None]) * m
  cov, va, vx = (da * dx).sum(-1), (da * da).sum(-1), (dx * dx).sum(-1)
  informative = (n >= 2) & (vx > 1e-6 * (x * x).sum(-1) + 1e-12)
  rho = jnp.where(va > 0, cov / jnp.sqrt(jnp.where(va > 0, va * vx, 1.0)), 0.0)
  rho = jnp.where(jnp.all(jnp.isfinite(a), -1), rho, jnp.nan)
  count = informative.sum()
  mean = jnp.where(count > 0, jnp.where(informative, rho, 0.0).sum() / jnp.maximum(count, 1),
                   jnp.nan)
  return mean.astype(f32), count


def credit_metrics(adv, rewards_b, correct_b, valid_b, *, group_size: int,
                   first: int | None = None) -> dict:
  """The credit-assignment metrics of one step (see module doc); {} for a group size below 2 and
  for token-level advantages without `first`. adv: [B] or [B, L] as the loss uses it, read at
  column `first` (the first completion token) when [B, L]; rewards_b: [B] the rewards the
  estimator received; correct_b: [B] the primary verifier's values (NaN where it failed)."""
  if adv.ndim == 2 and first is not None:
    adv = adv[:, first]
  if adv.ndim != 1 or group_size < 2:
    return {}
  out = {}
  for ref, x_b in (('reward', rewards_b), ('correct', correct_b)):
    corr, count = group_corr(adv, x_b, valid_b, group_size)
    out[f'credit/adv_{ref}_corr'] = corr
    out[f'credit/adv_{ref}_groups'] = count.astype(jnp.float32)
    out[f'invariant/adv_{ref}_disagreement'] = (1.0 - corr) / 2.0
  return out

