"""Fault injection into live runs, driven by `config.faults` (inactive and free when empty).

Each fault is a dict {type, onset_step, strength[, duration]}: active for steps
onset_step <= step < onset_step + duration (duration 0 or absent = until the end). The trainer
asks a FaultInjector at fixed points of each step; with no faults configured every call is a
no-op on host values and nothing is added to any jitted function.

Types (FAULTS below: family, the monitor fault classes that count as a right diagnosis, meaning
of `strength`). Reward faults change what the policy is trained on; where the fault sits in a
verifier (lenient, outage) the telemetry of that verifier shows it too, where it sits in the
reward pipeline (noise, sign flips, scale, a length bonus) the verifiers' own telemetry is
untouched — as in real runs.

  reward        reward_lenient      'correct' accepts any well-formed integer
                reward_length       reward += strength * completion length / max_new_tokens
                reward_noise        a `strength` fraction of rewards replaced by random 0 / 1.1
                reward_sign_flip    a `strength` fraction of rewards negated
                reward_scale        rewards multiplied by `strength`
                verifier_outage     every verifier returns 0
  generation    sampler_temperature the sampler runs at temperature `strength`; the trainer
                                    still scores at the recipe's temperature
                truncation          max_new_tokens cut to `strength`
                eos_ignored         the sampler does not stop at EOS (stop-token misconfigured)
  optimisation  lr_spike            learning rate x strength
                kl_removed_low_temp KL coefficient 0 and the recipe's temperature `strength`
                                    (sampler and trainer alike)
                grad_clip_off_high_lr  learning rate x strength (see GRAD_CLIP_NOTE)
                bf16_logits         the trainer (not the sampler) computes in bfloat16
  credit        group_shuffle       rewards of a `strength` fraction of groups permuted across
                                    groups (completions scored for another prompt)
                adv_sign_flip       advantage signs flipped on a `strength` fraction of groups
                mask_shift          the loss mask shifted one token left (covers a prompt token)
  environment   answer_key_corrupt  the answer of a `strength` fraction of prompts is wrong (+1)
  benign        lr_schedule_step    learning rate x strength from onset on (a schedule step)
                curriculum_switch   prompts drawn only from harder problems (carries, negative
                                    results) from onset on
                temperature_anneal  the temperature (sampler and trainer alike) falls linearly to
                                    `strength` by the end
                resume              (no injection: the benchmark stops the run at onset and
                                    resumes it from its checkpoint)
"""
import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

GRAD_CLIP_NOTE = ('gradient clipping sits before AdamW, whose update is nearly invariant to the '
                  'gradient scale, so removing the clip is modelled by its effect that matters: '
                  'a higher learning rate')


@dataclasses.dataclass(frozen=True)
class FaultType:
  family: str
  expected: tuple[str, ...]     # monitor fault classes that diagnose it correctly
  strength: float               # default strength for the benchmark


FAULTS: dict[str, FaultType] = {
    'reward_lenient': FaultType('reward', ('reward_hacking',), 1.0),
    'reward_length': FaultType('reward', ('reward_hacking', 'length_blowup'), 1.0),
    'reward_noise': FaultType('reward', ('reward_collapse', 'reward_stall'), 0.3),
    'reward_sign_flip': FaultType('reward', ('reward_collapse',), 0.5),
    'reward_scale': FaultType('reward', ('reward_hacking',), 100.0),
    'verifier_outage': FaultType('reward', ('reward_collapse', 'reward_stall'), 1.0),
    'sampler_temperature': FaultType('generation', ('sampler_mismatch',), 1.5),
    'truncation': FaultType('generation', ('length_collapse', 'reward_collapse'), 2.0),
    'eos_ignored': FaultType('generation', ('length_blowup', 'reward_collapse'), 1.0),
    'lr_spike': FaultType('optimisation', ('gradient_explosion', 'kl_explosion'), 20.0),
    'kl_removed_low_temp': FaultType('optimisation', ('entropy_collapse', 'kl_explosion'), 0.5),
    'grad_clip_off_high_lr': FaultType('optimisation', ('gradient_explosion', 'kl_explosion'),
                                       10.0),
    'bf16_logits': FaultType('optimisation', ('sampler_mismatch',), 1.0),
    'group_shuffle': FaultType('credit', ('credit_assignment', 'reward_collapse'), 1.0),
    'adv_sign_flip': FaultType('credit', ('credit_assignment', 'reward_collapse'), 0.5),
    'mask_shift': FaultType('credit', ('credit_assignment',), 1.0),
    'answer_key_corrupt': FaultType('environment', ('reward_collapse',), 0.5),
    'lr_schedule_step': FaultType('benign', (), 0.5),
    'curriculum_switch': FaultType('benign', (), 1.0),
    'temperature_anneal': FaultType('benign', (), 0.7),
    'resume': FaultType('benign', (), 1.0),
}
FAULT_TYPES = tuple(FAULTS)
# Strengths that are a fraction of groups/prompts/rewards, and those that are a token count.
FRACTION_STRENGTHS = ('reward_noise', 'reward_sign_flip', 'group_shuffle', 'adv_sign_flip',
                      'answer_key_corrupt')
TOKEN_STRENGTHS = ('truncation',)
# Strengths that multiply something (a learning rate, the rewards): 1 changes nothing.
FACTOR_STRENGTHS = ('lr_spike', 'grad_clip_off_high_lr', 'lr_schedule_step', 'reward_scale')
# FaultBench scenarios that are not injections: tools.faultbench carries them out itself.
BENCH_ONLY = {'resume': 'tools.faultbench stops the run at onset_step and resumes it from its '
                        'checkpoint; a live run injects nothing for it'}
_FAULT_KEYS = ('type', 'onset_step', 'strength', 'duration')


def check_faults(faults: Sequence[Mapping[str, Any]], total_steps: int | None = None,
                 max_new_tokens: int | None = None) -> None:
  """Raises ValueError('faults[i].key: reason') for the first malformed fault, or one that would
  do nothing (an onset after the run's last step, a token count below 1 or not below the
  recipe's rollout.max_new_tokens, a factor of 1, FaultBench's 'resume', ...)."""
  is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)
  for i, f in enumerate(faults):
    if not isinstance(f, Mapping):
      raise ValueError(f'faults[{i}]: expected a dict {{type, onset_step, strength}}')
    unknown = sorted(set(f) - set(_FAULT_KEYS))
    if unknown:
      raise ValueError(f'faults[{i}].{unknown[0]}: unknown key; a fault has '
                       + ', '.join(_FAULT_KEYS))
    kind = f.get('type')
    if kind not in FAULTS:
      raise ValueError(f'faults[{i}].type={kind!r}: unknown fault; known: '
                       + ', '.join(FAULT_TYPES))
    if kind in BENCH_ONLY:
      raise ValueError(f'faults[{i}].type={kind!r}: not an injection: {BENCH_ONLY[kind]}')
    if not is_int(f.get('onset_step')) or f['onset_step'] < 1:
      raise ValueError(f'faults[{i}].onset_step: must be an int >= 1')
    if total_steps is not None and f['onset_step'] > total_steps:
      raise ValueError(f'faults[{i}].onset_step: {f["onset_step"]} is after the run\'s last '
                       f'step (train.steps={total_steps}), so it would never be injected')
    strength = f.get('strength')
    if (not isinstance(strength, (int, float)) or isinstance(strength, bool)
        or not np.isfinite(strength) or strength <= 0):
      raise ValueError(f'faults[{i}].strength: must be a finite number > 0')
    if kind in FRACTION_STRENGTHS and strength > 1:
      raise ValueError(f'faults[{i}].strength: {kind} takes a fraction in (0, 1], got {strength}')
    if kind in FACTOR_STRENGTHS and strength == 1:
      raise ValueError(f'faults[{i}].strength: {kind} multiplies by its strength, so 1 '
                       'changes nothing')
    if kind in TOKEN_STRENGTHS and strength < 1:
      raise ValueError(f'faults[{i}].strength: {kind} takes a token count >= 1, got {strength}')
    if kind in TOKEN_STRENGTHS and strength != int(strength):
      raise ValueError(f'faults[{i}].strength: {kind} takes a whole token count, got {strength}')
    if kind in TOKEN_STRENGTHS and max_new_tokens is not None and strength >= max_new_tokens:
      raise ValueError(f'faults[{i}].strength: {kind} to {strength:g} tokens cuts nothing: '
                       f'rollout.max_new_tokens is {max_new_tokens}')
    if not is_int(f.get('duration', 0)) or f.get('duration', 0) < 0:
      raise ValueError(f'faults[{i}].duration: must be an int >= 0 (0 = until the end)')


def active(fault: Mapping[str, Any], step: int) -> bool:
  start, duration = fault['onset_step'], fault.get('duration', 0)
  return step >= start and (duration == 0 or step < start + duration)


def lr_multiplier(faults: Sequence[Mapping[str, Any]], step: int) -> float:
  """Product of the learning-rate factors of the faults active at `step` (1.0 when none)."""
  m = 1.0
  for f in faults:
    if f['type'] in ('lr_spike', 'grad_clip_off_high_lr', 'lr_schedule_step') and active(f, step):
      m *= float(f['strength'])
  return m


def kl_coef(faults: Sequence[Mapping[str, Any]], step: int, kl: float) -> float:
  """The KL coefficient at `step`: 0 while kl_removed_low_temp is active, else `kl`."""
  return 0.0 if any(f['type'] == 'kl_removed_low_temp' and active(f, step) for f in faults) else kl


def trainer_temperature(faults: Sequence[Mapping[str, Any]], step: int, temperature: float,
                        total_steps: int) -> float:
  """The temperature of the run's recipe at `step` after the faults that change it for sampler
  and trainer alike (kl_removed_low_temp: `strength`; temperature_anneal: linear to `strength`
  by the end, in steps of 0.05 so a handful of samplers compile). sampler_temperature is not
  here: it changes the sampler's alone (FaultInjector.sampling)."""
  for f in faults:
    if f['type'] == 'kl_removed_low_temp' and active(f, step):
      temperature = float(f['strength'])
  for f in faults:
    if f['type'] == 'temperature_anneal' and active(f, step):
      frac = (step - f['onset_step']) / max(total_steps - f['onset_step'], 1)
      target = temperature + frac * (float(f['strength']) - temperature)
      temperature = round(target * 20) / 20
  return temperature


def hard_arith_records(source) -> list[dict]:
  """The arithmetic records where a careless teacher can slip (a carry, a negative result):
  the harder problems the curriculum_switch change moves to."""
  from rft_jax.data import arith, pipeline  # pylint: disable=g-import-not-at-top
  out = []
  for i in range(len(source)):
    r = pipeline.normalize_record(source[i])
    if arith.teacher_slip(*arith.parse_prompt(r['prompt'])) is not None:
      out.append(r)
  return out


def corrupt_batch(batch: dict, adv_sign_b, shift_mask: bool) -> dict:
  """Credit-assignment faults on a prepared batch (jit with shift_mask static).

  adv_sign_b [B] in {+1, -1} multiplies the advantages; shift_mask moves loss_mask [B, L] one
  position left, so the last prompt position enters the loss and the last completion token
  leaves it.
  """
  out = dict(batch)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top  (config checks import this module)
  adv = batch['adv']   # [B] or [B, L]
  out['adv'] = adv * adv_sign_b.astype(adv.dtype).reshape((-1,) + (1,) * (adv.ndim - 1))
  if shift_mask:
    out['loss_mask'] = jnp.concatenate(
        [batch['loss_mask'][:, 1:], jnp.zeros_like(batch['loss_mask'][:, :1])], axis=1)
  return out


class FaultInjector:
  """Host-side view of config.faults for one run; every method is a no-op without faults."""

  def __init__(self, faults: Sequence[Mapping[str, Any]], seed: int, group_size: int,
               total_steps: int):
    self.faults = [f if isinstance(f, dict) else f.to_dict() for f in faults]
    self.seed, self.group_size, self.total_steps = seed, group_size, total_steps
    self.enabled = bool(self.faults)

  def _active(self, step: int, *types: str) -> list[dict]:
    return [f for f in self.faults if f['type'] in types and active(f, step)]

  def _rng(self, step: int, salt: int) -> np.random.Generator:
    return np.random.default_rng([self.seed, step, salt, 7919])

  def lr_multiplier(self, step: int) -> float:
    return lr_multiplier(self.faults, step)

  def kl_coef(self, step: int, kl: float) -> float:
    return kl_coef(self.faults, step, kl)

  def trainer_temperature(self, step: int, temperature: float) -> float:
    """The temperature the run means to sample at (and the trainer scores at) at `step`."""
    return trainer_temperature(self.faults, step, temperature, self.total_steps)

  def sampling(self, step: int, temperature: float, max_new_tokens: int):
    """(temperature, max_new_tokens, ignore_eos) the sampler runs with at `step`: the
    trainer's temperature unless sampler_temperature sets the sampler's own."""
    ignore_eos = bool(self._active(step, 'eos_ignored'))
    temperature = self.trainer_temperature(step, temperature)
    for f in self._active(step, 'sampler_temperature'):
      temperature = float(f['strength'])
    for f in self._active(step, 'truncation'):
      max_new_tokens = min(max_new_tokens, int(f['strength']))
    return temperature, max_new_tokens, ignore_eos

  def trainer_bf16(self, step: int) -> bool:
    return bool(self._active(step, 'bf16_logits'))

  def hard_prompts(self, step: int) -> bool:
    return bool(self._active(step, 'curriculum_switch'))

  def answers(self, step: int, ids, answers) -> list[str]:
    """The answer key as the verifiers see it: for answer_key_corrupt, a fixed `strength`
    fraction of prompt ids (chosen by id) get answer + 1."""
    answers = [str(a) for a in answers]
    for f in self._active(step, 'answer_key_corrupt'):
      for i, pid in enumerate(ids):
        if np.random.default_rng([self.seed, int(pid), 104729]).random() < f['strength']:
          answers[i] = str(int(answers[i]) + 1)
    return answers

  def verifier_values(self, step: int, name: str, values, texts):
    """A verifier's values as faulty verifiers would return them (lenient, outage)."""
    values = np.array(values, np.float32)
    if self._active(step, 'verifier_outage'):
      return np.where(np.isnan(values), values, 0.0).astype(np.float32)
    if name == 'correct' and self._active(step, 'reward_lenient'):
      from rft_jax.rewards.verifiers import format_ok  # pylint: disable=g-import-not-at-top
      lenient = np.array([format_ok(t, '') for t in texts], np.float32)
      return np.where(np.isnan(values), values, lenient).astype(np.float32)
    return values

  def rewards(self, step: int, result, texts, weights: Mapping[str, float],
              max_new_tokens: int):
    """RewardResult after the active reward, environment and credit faults (a copy)."""
    if not self._active(step, 'reward_lenient', 'verifier_outage', 'reward_length',
                        'reward_noise', 'reward_sign_flip', 'reward_scale', 'group_shuffle'):
      return result
    per = {n: self.verifier_values(step, n, v, texts) for n, v in result.per_verifier.items()}
    total = sum(float(weights.get(n, 0.0)) * np.nan_to_num(v) for n, v in per.items())
    total = np.where(result.valid, total, 0.0).astype(np.float32)
    for k, f in enumerate(self._active(step, 'reward_length', 'reward_noise', 'reward_sign_flip',
                                       'reward_scale', 'group_shuffle')):
      rng, s = self._rng(step, k), float(f['strength'])
      if f['type'] == 'reward_length':
        total = total + s * np.array([len(t) for t in texts], np.float32) / max_new_tokens
      elif f['type'] == 'reward_noise':
        hit = rng.random(total.shape) < s
        total = np.where(hit, rng.choice([0.0, 1.1], total.shape), total)
      elif f['type'] == 'reward_sign_flip':
        total = np.where(rng.random(total.shape) < s, -total, total)
      elif f['type'] == 'reward_scale':
        total = total * s
      else:   # group_shuffle: rows of the chosen groups exchange rewards with each other
        groups = np.flatnonzero(rng.random(total.size // self.group_size) < s)
        rows = np.concatenate([np.arange(g * self.group_size, (g + 1) * self.group_size)
                               for g in groups]) if groups.size else np.zeros(0, int)
        total = total.copy()
        total[rows] = total[rng.permutation(rows)]
    total = np.where(result.valid, total, 0.0).astype(np.float32)
    return dataclasses.replace(result, total=total, per_verifier=per)

  def batch_faults(self, step: int, batch_size: int):
    """(adv_sign_b [B] of +-1 or None, shift_mask) for corrupt_batch, or (None, False)."""
    flips = self._active(step, 'adv_sign_flip')
    shift = bool(self._active(step, 'mask_shift'))
    if not flips and not shift:
      return None, False
    sign = np.ones(batch_size, np.float32)
    for k, f in enumerate(flips):
      groups = self._rng(step, 100 + k).random(batch_size // self.group_size) < f['strength']
      sign *= np.where(np.repeat(groups, self.group_size), -1.0, 1.0)
    return sign, shift
