"""DAPO dynamic sampling: keep only informative groups, refill the batch from further prompts.

(Yu et al. 2025, DAPO, arXiv:2503.14476, section 3.2.) A group of G completions whose valid
rewards are all equal has a group-normalised advantage of 0 everywhere: it only dilutes the batch.
With config.algo.dynamic_sampling, a step draws prompt batches (rounds) until it holds
num_groups = rollout.prompts_per_step informative groups, or algo.max_sampling_rounds rounds have
been drawn. The train batch is always num_groups groups (static shapes): the informative ones in
draw order, then, only if the limit was hit, uninformative ones in draw order as padding (their
advantage is 0 for the group-baseline estimators; the step reports how many).

Host-side numpy; the loop (`collect`) takes the drawing as a callable so it is testable with a
stub sampler. Rows are grouped consecutively: rows [g*G, (g+1)*G) are group g.
"""
import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from rft_jax.rewards import verifiers


def informative_groups(rewards_b, valid_b, group_size: int) -> np.ndarray:
  """bool [B / G]: the group has >= 2 valid rows and their rewards are not all equal.

  (The complement is what `reward/zero_std_frac` counts: groups with no reward spread.)
  """
  r = np.asarray(rewards_b, np.float64).reshape(-1, group_size)
  v = np.asarray(valid_b, bool).reshape(-1, group_size)
  hi = np.where(v, r, -np.inf).max(-1)
  lo = np.where(v, r, np.inf).min(-1)
  return (v.sum(-1) >= 2) & (hi > lo)


def filter_signal(total_b, per_verifier: dict, metric: str, weights) -> np.ndarray:
  """What must vary within a group for it to be kept -> [B].

  metric 'accuracy': the values of the verifier with the largest reward weight (the task's
  correctness check): DAPO keeps a group when 0 < #correct < G (eq. 11), so a group of wrong
  answers that differ only in a format bonus or the overlong penalty is dropped. 'reward': the
  total reward the estimator gets (verifiers' weighted sum plus any overlong penalty).
  """
  if metric == 'reward':
    return np.asarray(total_b)
  return np.asarray(per_verifier[verifiers.primary_verifier(weights)])


def select_groups(informative: list, num_groups: int) -> tuple[list, int]:
  """Which groups form the train batch, from the per-round informative flags.

  informative: one bool [n_g] array per round drawn. Returns (picks, padded): picks is a list of
  num_groups (round, group) pairs, the informative groups in draw order, then uninformative ones
  in draw order; padded = how many uninformative groups had to be used. Needs at least
  num_groups groups drawn in total.
  """
  order = [(r, g) for r, flags in enumerate(informative) for g in range(len(flags))]
  good = [(r, g) for r, g in order if informative[r][g]]
  rest = [(r, g) for r, g in order if not informative[r][g]]
  if len(order) < num_groups:
    raise ValueError(f'{len(order)} groups drawn, {num_groups} needed')
  picks = (good + rest)[:num_groups]
  return picks, max(num_groups - len(good), 0)


def gather_groups(payloads: list, picks: list, group_size: int):
  """Concatenates the rows of the picked groups: pytrees of [B, ...] leaves (numpy or jax) per
  round -> one pytree of [num_groups * G, ...] numpy leaves, group after group."""
  def take(*leaves):
    rows = [np.asarray(leaves[r])[g * group_size:(g + 1) * group_size] for r, g in picks]
    return np.concatenate(rows, axis=0)
  return jax.tree.map(take, *payloads)


@dataclasses.dataclass
class Collected:
  """The outcome of one step's sampling rounds (see `collect`)."""
  payloads: list        # what draw() returned for each round, in order
  informative: list     # bool [n_g] per round
  picks: list           # (round, group) pairs of the train batch
  padded: int           # uninformative groups used as padding (the limit was hit)

  def metrics(self, group_size: int) -> dict:
    drawn = sum(len(f) for f in self.informative)
    return {'sampling/rounds': float(len(self.informative)),
            'sampling/prompts_drawn': float(drawn),
            'sampling/informative_frac': float(sum(f.sum() for f in self.informative)) / drawn,
            'sampling/padded_groups': float(self.padded)}


def collect(draw: Callable[[int], tuple[Any, np.ndarray]], *, num_groups: int, max_rounds: int,
            agree_short: Callable[[bool], bool] = lambda short: short) -> Collected:
  """Draws rounds until num_groups informative groups are held or max_rounds are drawn.

  draw(round) -> (payload, informative_g): samples and scores one more prompt batch (round 0 is
  the step's usual batch) and says which of its groups are informative. agree_short(short) turns
  this process's "still short" into the decision all processes share (multi-host: any process
  short means every process draws again, so they stay in step).
  """
  payloads, informative, have = [], [], 0
  while True:
    payload, flags = draw(len(payloads))
    flags = np.asarray(flags, bool)
    payloads.append(payload)
    informative.append(flags)
    have += int(flags.sum())
    if len(payloads) >= max_rounds or not agree_short(have < num_groups):
      break
  picks, padded = select_groups(informative, num_groups)
  return Collected(payloads, informative, picks, padded)
