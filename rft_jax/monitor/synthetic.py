"""Synthetic GRPO telemetry traces, healthy and with injected faults (tests, false-alarm tool).

`healthy_trace` draws one run's worth of per-step metrics, shaped like real GRPO runs on a
verifiable task, with every speed and noise level randomised per trace:
  reward/correct/mean  p_t + N(0, sd_r), p_t a sigmoid from r0 ~ U(.4,.6) to r1 ~ U(.85,.97)
                       centred at U(.15,.5)*T with width U(15,45) steps (early_rise: at
                       U(-2,10) steps with width U(2,8)); sd_r ~ U(.04,.09)
  reward/mean          0.9 * correct + 0.1 * format (format verifier ~0.95, saturated)
  reward/zero_std_frac rises with p from ~0.3 to ~0.8 (+-0.04)
  kl                   kl_end * (1 - e^{-t/tau}) / (1 - e^{-T/tau}) * lognormal(sd_kl):
                       0 at t=0, kl_end ~ U(.1,.3), tau ~ U(60,400), sd_kl ~ U(.1,.35)
  entropy              e1 + (e0 - e1) e^{-t/tau_e}, e0 ~ U(.15,.25), e1 ~ U(.06,.1), x lognormal
  response/len_mean    ~3.3 +- U(.03,.1), slow drift, +0.2..0.6 spikes on 0.5-3% of steps
  response/clip_frac   ~0.03 +- 0.02 (spikes with length)
  grad_norm            lognormal around U(.3,.8), sd U(.1,.3), x2-3 spikes on 0.5-3% of steps
  mismatch             ~1e-7 lognormal; invariants exactly 0; lr constant.
  from_reference       (a family) the policy starts at the reference under an lr warm-up of
                       Tw ~ U(3,10) steps, as a real GRPO run (FaultBench's: KL 0, 2e-4, 9e-4,
                       8e-3, ... 0.2 by step 11): lr x min((t+1)/Tw, 1), update_norm x that^0.6,
                       kl = kl_p min(t/Tr, 1)^p (1 + g max(t-Tr, 0)/T) * lognormal(sd_kl):
                       exactly 0 at t=0, Tr = Tw + U(2,8), p ~ U(2,4), kl_p ~ U(.05,.3),
                       g ~ U(0,1), sd_kl ~ U(.2,.45). Its draws come from rng.spawn too.
  invariant/adv_*_disagreement  from a simulated batch per step (credit_batch_stats): 16 prompts
                       x 8 completions, per-prompt solve rate p_t + N(0, .25) clipped, reward =
                       correct + 0.1 * format (format 1 when correct, else ~Bernoulli(.9)),
                       1% invalid rows, GRPO advantages. Drawn from rng.spawn, so the other
                       signals' draws are those of traces without it.
`inject(trace, fault_class, onset, strength)` overlays the pattern of one fault class from
`onset` on (u = t - onset >= 0), keeping the trace's own noise.
"""
from __future__ import annotations

import numpy as np

FAULT_CLASSES: tuple[str, ...] = (
    'kl_explosion', 'entropy_collapse', 'entropy_explosion', 'length_blowup', 'length_collapse',
    'reward_hacking', 'reward_collapse', 'gradient_explosion', 'reward_stall', 'sampler_mismatch',
    'nan_loss', 'credit_assignment')


def healthy_trace(rng: np.random.Generator, steps: int = 300, early_rise: bool = False,
                  from_reference: bool = False) -> dict[str, np.ndarray]:
  """One healthy run: metric name -> [steps] float64 (see module doc for the model).

  early_rise: the reward's sigmoid is centred at U(-2, 10) steps with width U(2, 8) steps, so
  most of the rise falls within the monitor's warm-up and the reward then levels off (RL from an
  SFT policy on an easy task: the arithmetic recipe gains ~0.25 in its first 10 steps). The
  same random draws as without it, so the traces differ only in that curve.
  from_reference: KL, lr and update_norm of a run from the reference under an lr warm-up (module
  doc); the other signals are those of the same draws without it.
  """
  t = np.arange(steps, dtype=np.float64)
  u = rng.uniform
  credit_rng = rng.spawn(1)[0]     # before from_reference's spawn: the same child either way

  def noise(sd):
    return rng.normal(0.0, sd, steps)

  def lognormal(sd):
    return np.exp(noise(sd) - sd * sd / 2)

  def spikes(rate_lo, rate_hi):
    return rng.random(steps) < u(rate_lo, rate_hi)

  r0, r1 = u(0.4, 0.6), u(0.85, 0.97)
  centre, width = ((u(-2, 10), u(2, 8)) if early_rise else (u(0.15, 0.5) * steps, u(15, 45)))
  p = r0 + (r1 - r0) / (1 + np.exp(-(t - centre) / width))
  correct = np.clip(p + noise(u(0.04, 0.09)), 0, 1)
  fmt = np.clip(u(0.92, 0.99) + noise(0.01), 0, 1)
  reward = 0.9 * correct + 0.1 * fmt
  reward_std = np.sqrt(p * (1 - p)) * (1 + noise(0.05))
  z0, z1 = u(0.25, 0.4), u(0.7, 0.85)
  zero_std = np.clip(z0 + (z1 - z0) * (p - r0) / (r1 - r0) + noise(0.04), 0, 0.92)

  tau = u(60, 400)
  kl = u(0.1, 0.3) * (1 - np.exp(-t / tau)) / (1 - np.exp(-steps / tau)) * lognormal(u(0.1, 0.35))
  e0, e1 = u(0.15, 0.25), u(0.06, 0.1)
  entropy = (e1 + (e0 - e1) * np.exp(-t / u(60, 250))) * lognormal(u(0.02, 0.06))

  len_spike = spikes(0.005, 0.03)
  length = (u(3.0, 3.6) + u(-0.3, 0.3) * t / steps + noise(u(0.03, 0.1))
            + len_spike * rng.uniform(0.2, 0.6, steps))
  trunc = np.clip(u(0.01, 0.05) + noise(u(0.005, 0.02)) + len_spike * rng.uniform(
      0.03, 0.1, steps), 0, 1)

  g0 = u(0.3, 0.8)
  grad = (g0 * np.exp(u(-0.3, 0.3) * t / steps) * lognormal(u(0.1, 0.3))
          * np.where(spikes(0.005, 0.03), rng.uniform(2, 3, steps), 1.0))
  update = u(5e-4, 2e-3) * lognormal(u(0.03, 0.1)) * (grad / g0) ** 0.2
  loss = noise(u(0.005, 0.03)) + 0.04 * kl
  zeros = np.zeros(steps)
  out = {
      'reward/mean': reward, 'reward/std': reward_std, 'reward/zero_std_frac': zero_std,
      'reward/correct/mean': correct, 'response/len_mean': length, 'response/clip_frac': trunc,
      'kl': kl, 'entropy': entropy, 'clip_frac': u(0.002, 0.02) * lognormal(0.3),
      'ratio/mean': 1 + noise(u(2e-4, 1e-3)), 'grad_norm': grad, 'update_norm': update,
      'loss': loss, 'adv/mean': noise(1e-8),
      'mismatch/logp_abs_diff': u(5e-8, 3e-7) * lognormal(0.2),
      'lr': np.full(steps, 10 ** u(-6, -5)),
      'invariant/group_adv_mean_max': zeros.copy(), 'invariant/prompt_loss_tokens': zeros.copy(),
      **credit_batch_stats(credit_rng, np.clip(p, 0, 1)),
  }
  if from_reference:
    kl_ref, out['lr'], out['update_norm'] = _from_reference(rng.spawn(1)[0], t, out['lr'], update)
    out['loss'] += 0.04 * (kl_ref - kl)
    out['kl'] = kl_ref
  return out


def _from_reference(rng: np.random.Generator, t: np.ndarray, lr: np.ndarray,
                    update: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(kl, lr, update_norm) [T] of a run that starts at the reference under an lr warm-up
  (module doc, from_reference)."""
  u = rng.uniform
  ramp = np.minimum((t + 1) / u(3, 10), 1.0)                  # lr warm-up factor
  rise = u(2, 8) + (1 / ramp[0])                              # Tr = Tw + U(2, 8) steps
  sd = u(0.2, 0.45)
  kl = (u(0.05, 0.3) * np.minimum(t / rise, 1.0) ** u(2, 4)
        * (1 + u(0, 1) * np.maximum(t - rise, 0) / len(t))
        * np.exp(rng.normal(0.0, sd, len(t)) - sd * sd / 2))
  return kl, lr * ramp, update * ramp ** 0.6


def _group_disagreement(a, x, valid):
  """NumPy twin of rft_jax.monitor.credit.group_corr, vectorised over leading dims:
  a, x, valid [..., Gn, G] -> (1 - mean over informative groups of rho_g) / 2 [...] (NaN: none)."""
  m = valid.astype(np.float64)
  n = m.sum(-1)
  safe = np.maximum(n, 1)[..., None]
  da = (a - (a * m).sum(-1, keepdims=True) / safe) * m
  dx = (x - (x * m).sum(-1, keepdims=True) / safe) * m
  cov, va, vx = (da * dx).sum(-1), (da * da).sum(-1), (dx * dx).sum(-1)
  inf = (n >= 2) & (vx > 1e-6 * (x * x * m).sum(-1) + 1e-12)
  cnt = inf.sum(-1)
  with np.errstate(invalid='ignore', divide='ignore'):
    rho = np.where(va > 0, cov / np.sqrt(np.where(va > 0, va * vx, 1.0)), 0.0)
    mean = np.where(cnt > 0, np.where(inf, rho, 0).sum(-1) / np.maximum(cnt, 1), np.nan)
  return (1 - mean) / 2


def credit_batch_stats(rng: np.random.Generator, p_t: np.ndarray, flip_frac=0.0,
                       shuffle_frac=0.0, groups: int = 16, group_size: int = 8):
  """Per-step credit invariants of simulated GRPO batches (see module doc). flip_frac [T] or
  scalar: share of groups whose advantages are negated; shuffle_frac: share of groups whose
  rewards are permuted across those groups (as faults.FaultInjector does)."""
  steps = len(p_t)
  shape = (steps, groups, group_size)
  q = np.clip(p_t[:, None, None] + rng.normal(0, 0.25, (steps, groups, 1)), 0, 1)
  correct = (rng.random(shape) < q).astype(np.float64)
  fmt = np.where(correct > 0, 1.0, (rng.random(shape) < 0.9).astype(np.float64))
  valid = rng.random(shape) >= 0.01
  reward = np.where(valid, correct + 0.1 * fmt, 0.0)
  shuffle = rng.random((steps, groups)) < np.broadcast_to(shuffle_frac, (steps,))[:, None]
  for t in np.flatnonzero(shuffle.any(-1)):
    rows = reward[t][shuffle[t]].reshape(-1)
    reward[t][shuffle[t]] = rng.permutation(rows).reshape(-1, group_size)
  n = np.maximum(valid.sum(-1, keepdims=True), 1)
  mean = (reward * valid).sum(-1, keepdims=True) / n
  std = np.sqrt((((reward - mean) * valid) ** 2).sum(-1, keepdims=True) / n)
  adv = np.where(valid & (std > 1e-6), (reward - mean) / (std + 1e-6), 0.0)
  flip = rng.random((steps, groups)) < np.broadcast_to(flip_frac, (steps,))[:, None]
  adv = np.where(flip[..., None], -adv, adv)
  return {'invariant/adv_reward_disagreement': _group_disagreement(adv, reward, valid),
          'invariant/adv_correct_disagreement': _group_disagreement(adv, correct, valid)}


def inject(trace: dict[str, np.ndarray], fault_class: str, onset: int, strength: float = 1.0,
           rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
  """A copy of `trace` with `fault_class` starting at step `onset`.

  strength scales the fault's speed / size (1.0: the reference pattern below). For
  'credit_assignment' rng picks the variant: 'adv' (a group's advantages do not sum to 0), 'mask'
  (prompt tokens in the loss mask), 'sign' (advantages of half the groups negated x strength),
  'shuffle' (rewards of every group x strength attached to other rows); without rng it is 'adv'.
  """
  out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in trace.items()}
  steps = len(out['kl'])
  u = np.maximum(np.arange(steps) - onset, 0).astype(np.float64)
  on = np.arange(steps) >= onset
  s = strength

  def ramp(tau):        # 0 before onset, -> 1 after with time constant tau/strength
    return np.where(on, 1 - np.exp(-u * s / tau), 0.0)

  def grow(rate, cap):  # multiplicative exponential growth from onset, capped
    return np.exp(np.minimum(rate * s * u, np.log(cap)))

  if fault_class == 'kl_explosion':         # updates run away from the reference
    out['kl'] *= grow(0.35, 300.0)
    out['grad_norm'] *= grow(0.08, 5.0)
    out['clip_frac'] += 0.3 * ramp(6)
    out['reward/mean'] -= 0.3 * np.where(u > 5, ramp(10), 0.0)
  elif fault_class == 'entropy_collapse':   # the policy turns deterministic
    e_on = out['entropy'][onset]
    out['entropy'] *= np.maximum(np.exp(-u * s / 6), 0.01 / max(e_on, 1e-6))
    out['reward/std'] *= 1 - 0.5 * ramp(8)
    out['reward/zero_std_frac'] = np.minimum(out['reward/zero_std_frac'] + 0.1 * ramp(8), 0.92)
  elif fault_class == 'entropy_explosion':  # the policy degenerates into noise
    out['entropy'] *= grow(0.2, 8.0)
    out['response/len_mean'] *= grow(0.06, 3.0)
    out['response/clip_frac'] += (1 - out['response/clip_frac']) * 0.6 * ramp(15)
    out['kl'] *= grow(0.05, 4.0)
    out['reward/mean'] *= 1 - 0.5 * ramp(15)
    out['reward/correct/mean'] *= 1 - 0.5 * ramp(15)
  elif fault_class == 'length_blowup':      # responses grow to the generation limit
    length = out['response/len_mean']
    out['response/len_mean'] = length + (3 * length[onset] - length) * ramp(10)
    out['response/clip_frac'] += (1 - out['response/clip_frac']) * ramp(10)
  elif fault_class == 'length_collapse':    # responses shrink to almost nothing
    out['response/len_mean'] *= 1 - 0.7 * ramp(8)
    out['response/clip_frac'] *= 1 - ramp(8)
  elif fault_class == 'reward_hacking':     # a verifier is exploited, correctness drops
    out['reward/mean'] += 0.3 * ramp(6)
    out['reward/correct/mean'] *= 1 - 0.4 * ramp(8)
    out['kl'] *= 1 + 3 * ramp(10)
    out['reward/std'] *= 1 - 0.3 * ramp(6)
  elif fault_class == 'reward_collapse':    # the policy unlearns the task
    for k in ('reward/mean', 'reward/correct/mean'):
      out[k] *= 1 - 0.85 * ramp(6)
    out['reward/zero_std_frac'] = np.minimum(out['reward/zero_std_frac'] + 0.15 * ramp(6), 0.92)
  elif fault_class == 'gradient_explosion':  # a bad batch / lr spike, KL follows a few steps later
    out['grad_norm'] *= grow(0.4, 1e3)
    out['update_norm'] *= grow(0.1, 5.0)
    out['kl'] *= np.exp(np.minimum(0.25 * s * np.maximum(u - 4, 0), np.log(100.0)))
  elif fault_class == 'reward_stall':       # every group scores all-equal (all solved)
    r = ramp(1.5)
    out['reward/zero_std_frac'] += (0.99 - out['reward/zero_std_frac']) * r
    out['reward/zero_std_frac'] = np.minimum(out['reward/zero_std_frac'], 1.0)
    out['reward/std'] *= 1 - 0.95 * r
    for k in ('reward/mean', 'reward/correct/mean'):
      out[k] += (1.0 - out[k]) * 0.9 * r
  elif fault_class == 'sampler_mismatch':   # sampler and trainer disagree (e.g. stale weights)
    out['mismatch/logp_abs_diff'] *= 10.0 ** np.minimum(u * s, 3.0)
    out['clip_frac'] *= 1 + 2 * ramp(3)
  elif fault_class == 'nan_loss':           # one non-finite step
    out['loss'][onset] = np.nan
    out['grad_norm'][onset] = np.inf
  elif fault_class == 'credit_assignment':
    variant = 'adv' if rng is None else rng.choice(['adv', 'mask', 'sign', 'shuffle'])
    if variant in ('sign', 'shuffle'):
      sim = credit_batch_stats(
          rng, np.clip(out['reward/correct/mean'], 0, 1),
          flip_frac=np.where(on, min(0.5 * s, 1.0), 0.0) if variant == 'sign' else 0.0,
          shuffle_frac=np.where(on, min(s, 1.0), 0.0) if variant == 'shuffle' else 0.0)
      for k, v in sim.items():
        out[k] = np.where(on, v, out[k])
    elif variant == 'adv':
      out['invariant/group_adv_mean_max'][on] = 0.2 * s
      out['adv/mean'][on] += 0.05 * s
    else:
      out['invariant/prompt_loss_tokens'][on] = np.ceil(8 * s)
  else:
    raise ValueError(f'unknown fault class {fault_class!r}; known: {FAULT_CLASSES}')
  return out


def stack_traces(traces: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """[N] traces of {name: [T]} -> {name: [N, T] float32} (for a vmapped run_monitor)."""
  return {k: np.stack([tr[k] for tr in traces]).astype(np.float32) for k in traces[0]}
