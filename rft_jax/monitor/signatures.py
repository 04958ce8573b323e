"""Failure signatures: a table (data, not if-chains) from multi-signal patterns to fault classes.

A `Condition` names one signal (a drifting signal of signals.SIGNALS or an invariant of
signals.INVARIANT_NAMES) and a direction:
  'up'      holds when the signal's up score   >= min_score   (invariants: when violated)
  'down'    holds when the signal's down score >= min_score
  'not_up'  holds when the signal is warmed up and its up score < MonitorConfig.not_up_max
            (a gate: "flat or falling"; it never limits the signature's strength)
A `Signature` fires when all its conditions hold. Its strength is
  score = min over its 'up'/'down' conditions of (condition score / min_score)
so it fires exactly when score >= 1 and every gate holds. Several signatures may share a fault
class (two routes to the same diagnosis); several may fire on one step and all are reported.

min_score choices: single-signal drift signatures whose real faults are violent (entropy
collapse, gradient explosion, sampler mismatch, KL explosion alone) require 1.5, which removes
near-threshold false alarms at almost no delay; multi-signal ones (reward hacking, divergence of
reward and correctness) may require less of each signal because the conjunction is rare in
healthy runs. A 'not_up' gate also separates look-alikes: length_blowup requires entropy not
rising (with it, the same lengths mean entropy_explosion).

Remediation names are the actions the trainer knows: 'raise_kl_coef', 'lower_lr',
'raise_temperature', 'reset_reference', 'restore_and_lower_lr', 'skip_batch', 'halt',
'warn_only'.

SKIPPED_STREAK is the one signature outside the table: a run of steps, not one step's signals,
which the trainer counts on the host (config.monitor.max_skipped_steps) and reports as an
incident like the others (its score: the streak over that limit).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from rft_jax.monitor import signals as sig

DIRECTIONS = ('up', 'down', 'not_up')
SEVERITIES = ('critical', 'warn')


@dataclasses.dataclass(frozen=True)
class Condition:
  signal: str
  direction: str            # 'up' | 'down' | 'not_up'
  min_score: float = 1.0

  def __post_init__(self):
    if self.direction not in DIRECTIONS:
      raise ValueError(f'Condition direction must be one of {DIRECTIONS}: {self.direction!r}')
    if self.signal not in sig.SIGNALS and self.signal not in sig.INVARIANT_NAMES:
      raise ValueError(f'Condition on unknown signal {self.signal!r}')
    if self.signal in sig.INVARIANT_NAMES and self.direction != 'up':
      raise ValueError(f'invariant {self.signal!r} only supports direction "up"')


@dataclasses.dataclass(frozen=True)
class Signature:
  name: str
  fault_class: str
  severity: str             # 'critical' | 'warn'
  conditions: tuple[Condition, ...]
  remediation: str
  description: str

  def __post_init__(self):
    if self.severity not in SEVERITIES:
      raise ValueError(f'severity must be one of {SEVERITIES}: {self.severity!r}')
    if not any(c.direction != 'not_up' for c in self.conditions):
      raise ValueError(f'signature {self.name!r} needs at least one up/down condition')


C = Condition


def exact(name: str, fault_class: str, severity: str, invariant: str, remediation: str,
          description: str) -> Signature:
  """A signature on one exact invariant: it fires on the step the invariant is violated."""
  return Signature(name, fault_class, severity, (Condition(invariant, 'up'),), remediation,
                   description)


SIGNATURES: tuple[Signature, ...] = (
    # --- exact invariants --------------------------------------------------------------------
    # Before nan_loss: on a tie (both fire when a later update of the same step reads the
    # broken parameters) the incident that says the parameters are broken comes first.
    exact('nonfinite_params', 'nan_loss', 'critical',
          'invariant/param_nonfinite', 'restore_and_lower_lr',
          'param_norm is NaN/Inf after the update (an overflow of the norm counts: the '
          'parameters are that large): every later step would train on garbage; only a '
          'checkpoint from before it repairs them'),
    exact('nan_loss', 'nan_loss', 'critical',
          'invariant/nonfinite', 'skip_batch',
          'loss or grad_norm is NaN/Inf: the update would corrupt the parameters'),
    exact('group_adv_mean_nonzero', 'credit_assignment', 'critical',
          'invariant/group_adv_mean_max', 'halt',
          'a group\'s mean advantage is not 0: groups mixed up or advantage sign/normalisation '
          'wrong'),
    exact('prompt_tokens_in_loss', 'credit_assignment', 'critical',
          'invariant/prompt_loss_tokens', 'halt',
          'the loss mask covers prompt tokens: the policy is trained on its inputs'),
    exact('advantage_reward_mismatch', 'credit_assignment', 'critical',
          'invariant/adv_reward_disagreement', 'halt',
          'within groups the advantages the loss uses do not follow the rewards they were '
          'computed from (some groups trained in the wrong direction): an advantage sign or '
          'row-order bug between the estimator and the loss; no knob fixes it'),
    exact('advantage_correctness_mismatch', 'credit_assignment', 'critical',
          'invariant/adv_correct_disagreement', 'halt',
          'within groups the advantages do not follow the verifier\'s correctness for '
          'several steps: rewards attached to the wrong completions (group/row ids mixed '
          'up), advantage signs flipped, or the reward pipeline corrupting rewards (noise, '
          'sign flips, a shaping term outweighing correctness)'),
    exact('group_prompt_mismatch', 'credit_assignment', 'critical',
          'invariant/group_prompt_mismatch', 'halt',
          'rows of a group do not share their prompt, but algo.shared_prompt scores every '
          'row with its group\'s first prompt: the rollout\'s group layout is broken'),
    exact('reward_out_of_range', 'reward_pipeline', 'warn',
          'invariant/reward_out_of_range', 'warn_only',
          'rewards outside the range the weighted verifiers can produce: something between '
          'the verifiers and the trainer scales, negates or adds to them (group '
          'normalisation hides a scale, not a sign or an added term), or a verifier scores '
          'outside [0, 1]'),
    exact('reward_stall', 'reward_stall', 'warn',
          'invariant/zero_std_frac', 'raise_temperature',
          'almost every group scores all-equal for several steps: no learning signal left'),
    # --- drift patterns ------------------------------------------------------------------------
    Signature('reward_hacking', 'reward_hacking', 'critical',
              (C('reward/mean', 'up', 0.6), C('reward/correct/mean', 'not_up'),
               C('kl', 'up', 0.4)), 'reset_reference',
              'reward climbs while verified correctness does not, and the policy moves away from '
              'the reference: the reward is being exploited'),
    Signature('reward_correctness_divergence', 'reward_hacking', 'critical',
              (C('reward/mean', 'up', 0.4), C('reward/correct/mean', 'down', 0.4)),
              'reset_reference',
              'reward climbs while verified correctness falls (they normally move together): '
              'the reward is being exploited'),
    Signature('kl_explosion', 'kl_explosion', 'critical',
              (C('kl', 'up', 1.5),), 'raise_kl_coef',
              'KL to the reference grows far faster than its healthy trend'),
    Signature('kl_explosion_with_clipping', 'kl_explosion', 'critical',
              (C('kl', 'up'), C('clip_frac', 'up')), 'raise_kl_coef',
              'KL jumps while the PPO clip fraction rises: updates leave the trust region'),
    Signature('gradient_explosion', 'gradient_explosion', 'critical',
              (C('grad_norm', 'up', 1.5),), 'lower_lr',
              'gradient norm far above its healthy level'),
    Signature('entropy_collapse', 'entropy_collapse', 'warn',
              (C('entropy', 'down', 1.5),), 'raise_temperature',
              'policy entropy falls much faster than its healthy decline: exploration is dying'),
    Signature('entropy_explosion', 'entropy_explosion', 'critical',
              (C('entropy', 'up'), C('response/len_mean', 'up')), 'lower_lr',
              'entropy and response length rise together: the policy is degenerating into noise'),
    Signature('length_blowup', 'length_blowup', 'critical',
              (C('response/len_mean', 'up'), C('response/clip_frac', 'up'),
               C('entropy', 'not_up')), 'lower_lr',
              'responses grow until they hit the generation limit while entropy stays normal '
              '(with rising entropy it is entropy_explosion)'),
    Signature('length_collapse', 'length_collapse', 'warn',
              (C('response/len_mean', 'down'),), 'lower_lr',
              'responses shrink far below their healthy length'),
    Signature('reward_collapse', 'reward_collapse', 'critical',
              (C('reward/mean', 'down'),), 'restore_and_lower_lr',
              'reward falls far below its healthy trajectory'),
    Signature('sampler_mismatch', 'sampler_mismatch', 'warn',
              (C('mismatch/logp_abs_diff', 'up', 1.5),), 'warn_only',
              'sampler and trainer log-probs disagree: the update is off-policy'),
)

# --- host-side: a pattern over steps that the trainer evaluates (rft_jax/incidents.py
# streak_incident), not part of the on-device table above ------------------------------------
SKIPPED_STREAK = exact(
    'skipped_streak', 'nan_loss', 'critical', 'invariant/nonfinite', 'restore_and_lower_lr',
    'the loss or gradient was non-finite, and update(s) skipped, on monitor.max_skipped_steps '
    'steps in a row: nothing is being learned (e.g. parameters finite but huge, or a loss NaN '
    'for every batch); only a checkpoint from before the streak repairs it')
del C, exact

SIGNATURE_NAMES: tuple[str, ...] = tuple(s.name for s in SIGNATURES)
FAULT_CLASSES: tuple[str, ...] = tuple(dict.fromkeys(s.fault_class for s in SIGNATURES))
assert len(set(SIGNATURE_NAMES)) == len(SIGNATURE_NAMES), 'signature names must be unique'


def uses_matrix(signatures: tuple[Signature, ...] = SIGNATURES) -> np.ndarray:
  """[K, S] bool: signature k has an 'up'/'down' condition on drifting signal s (its evidence;
  the monitor freezes those signals' baselines while k is active)."""
  out = np.zeros((len(signatures), len(sig.SIGNALS)), bool)
  for k, s in enumerate(signatures):
    for c in s.conditions:
      if c.direction != 'not_up' and c.signal in sig.SIGNALS:
        out[k, sig.SIGNALS.index(c.signal)] = True
  return out


def rank_key(signature: Signature, score: float) -> tuple:
  """Sort key that puts the most serious, most specific diagnosis first: critical before warn,
  more up/down conditions before fewer, then higher score."""
  n = sum(c.direction != 'not_up' for c in signature.conditions)
  return (SEVERITIES.index(signature.severity), -n, -score)
