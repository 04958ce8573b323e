"""Per-signal change detectors, vectorised over the S watched signals. Pure jnp, jittable.

Every signal is first mapped to detector units y = transform(x) (signals.py). Then, per signal:

Warm-up (the first `warmup` = W valid observations, kept in `window` [S, W]). When the W-th
arrives, a robust line is fitted:
  slope_ts = median over i < j of (y_j - y_i) / (j - i)                (Theil-Sen)
  baseline = median(y_i - slope_ts * i) + slope_ts * (W - 1)          (level at the last step)
  scale    = max(1.4826 * MAD(y - fitted line), floor),  floor = eps_rel * |baseline|
             (identity signals only) + SCALE_FLOOR_s
  trend    = sign(slope_ts) * max(|slope_ts| - trend_shrink * se, 0),  se = scale sqrt(12/(W^3-W))
The detrended MAD keeps a healthy warm-up trend (KL rising from 0) out of the scale; the floor
keeps constant signals (lr) from giving infinite z; the soft threshold starts a trend that W
noisy points cannot resolve at 0 instead of extrapolating noise. A warm-up shorter than
min_trend_warmup (10) fits a level only: baseline = median, scale = 1.4826 MAD (floored),
trend = 0 (see MonitorConfig.min_trend_warmup).

After warm-up, every valid observation y_t (NaN = missing: that signal's state does not change),
with n = valid observations before y_t:
  pred      = baseline + phi * trend                             (one-step prediction)
              phi = 1 for log-transformed signals, additive_trend_damping (0.5) for the
              identity-transformed ones (rewards, fractions, ratio, loss: bounded or level
              signals, whose rises saturate)
  z         = (y_t - pred) / (scale * sqrt(1 + small_sample * W / n))
              (the inflation is the small-sample uncertainty of the fit: x1.7 right after
               warm-up with the defaults, x1.1 after 100 observations)
  zc        = clip(z, -z_clip, z_clip)                           (one outlier adds <= z_clip)
  cusum_pos = clip(cusum_pos + zc - k, 0, cap),  cusum_neg = clip(cusum_neg - zc - k, 0, cap)
              cap = cusum_cap * h bounds how long an alarm outlives the shift that caused it
  *_start   = the step after the CUSUM was last <= onset_reset (0.5, cusum_k's default: within
              one step's allowance of 0; a knob of its own), the onset estimate
  persist_up / persist_down = consecutive steps with z > z_thresh / z < -z_thresh
  ewma      = (1-a) ewma + a y_t;   slope = (1-a) slope + a (y_t - y_last) / scale  (reporting)
Scores (dimensionless, >= 0; 1.0 is the decision threshold):
  up   = max(cusum_pos / h, [persist_up   >= P] *  z / z_thresh)
  down = max(cusum_neg / h, [persist_down >= P] * -z / z_thresh)
The CUSUM catches sustained shifts of a few scale units (delay ~ h / (min(shift, z_clip) - k)
steps); the persistence term catches large jumps that hold for P steps.

Healthy RL runs trend (reward rises, KL grows, entropy falls), so the baseline keeps adapting
after warm-up, as a robust Holt (level + damped trend) filter on the clipped innovation
e = scale * zc:
  baseline <- pred + baseline_rate * g * e,    trend <- phi * trend + trend_rate * g * e
  (log signals with log_trend_fast: gain max(trend_rate, 1/n); their warm-up trend is scaled by
  log_warmup_trend: see MonitorConfig)
  ewvar    <- (1 - v) ewvar + v * scale^2 min(z^2, z_clip^2),  v = max(var_rate, 1/n)
  scale    <- max(sqrt(ewvar), floor)
With phi = 1 a linear trend is followed without lag (its z stays centred), a slowly bending one
with a small lag; a fault that moves several scale units within a few steps outruns the small
rates. With phi < 1 the prediction extrapolates a trend by at most phi / (1 - phi) steps' worth:
a reward that rose fast during warm-up (RL from an SFT policy often gains most in its first ten
steps) and then levels off is not predicted to keep rising, which read as reward_collapse on
healthy runs (synthetic.healthy_trace(early_rise=True); tools/monitor_false_alarms). g = 1,
except while a signature that uses the signal is active (`freeze`): then the scale is held, the
trend only decays (by phi) and the level adapts with g = frozen_rate, i.e. the baseline
continues along its pre-alarm trend and absorbs at most frozen_rate * baseline_rate * z_clip
scale units per step. A fault is not learned as the new normal, yet a false alarm on a healthy
trend clears, and a permanent new regime is accepted after ~shift / (frozen_rate *
baseline_rate * z_clip) steps.
"""
from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rft_jax.monitor import signals as sig


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
  """Detector and signature knobs (static under jit: hashable). Defaults are tuned with
  `python -m tools.monitor_false_alarms` on the synthetic traces of synthetic.py (200 healthy
  traces of 300 steps: ~0.1 false alarms per 1,000 steps; every fault class detected within 10
  steps in >= 98% of traces, median delay 3-7 steps).

  warmup: valid observations before a signal is scored (the robust fit needs ~10; short, so a
    fault early in a run, e.g. at step 15, is still caught).
  cusum_k: CUSUM allowance in scale units: drifts below k per step are ignored.
  cusum_h: CUSUM decision threshold in scale units (8: ARL0 of order 1e4 steps per side on iid
    noise, ~4 steps for a 3-sigma shift). cusum_cap: CUSUM ceiling in units of h.
  z_clip: bound on one observation's standardised innovation (CUSUM and adaptation): a single
    spike (grad_norm x3) adds at most z_clip - k.
  ewma_alpha: rate of the smoothed level `ewma` and of `slope` (reported, not scored).
  z_thresh, persistence: the level test: z beyond z_thresh for `persistence` steps.
  baseline_rate, trend_rate: Holt gains after warm-up (0.1 / 0.02: a sigmoid reward rise or
    an exponential entropy decline is followed; a 1-scale-unit-per-step ramp is not).
  frozen_rate: level-gain multiplier while a signature using the signal is active.
  trend_shrink: soft threshold (in standard errors) on the warm-up trend.
  var_rate: floor of the scale's adaptation gain (time constant 1/var_rate steps).
  small_sample: z inflation sqrt(1 + small_sample * W / n) right after warm-up.
  eps_rel: relative scale floor (fraction of |baseline|) for identity-transformed signals.
  not_up_max: a 'not_up' condition holds while the signal's up score is below this.
  release: an active signature stays active while its strength is >= release (hysteresis: a
    fault that hovers at threshold yields one incident, not many).
  stall_persistence: steps zero_std_frac must stay above its threshold (signals.INVARIANTS).
  credit_persistence: steps the advantage/correctness disagreement must stay above its
    threshold (signals.INVARIANTS; rft_jax/monitor/credit.py).
  invariant_score: the score of a violated invariant (exact checks outrank drift evidence).
  additive_trend_damping: phi of the identity-transformed signals' trend (log signals: 1).
    Chosen on synthetic traces (tools/monitor_false_alarms, 200 traces of 300 steps): of the
    healthy traces whose reward rises within the warm-up, 18.5% had an alarm (reward_collapse)
    at phi = 1, 3.0% at 0.9, 1.5% at 0.7 and 0.5 (none a reward_collapse; the other healthy
    traces: 2.5%); at 0.5 every fault class is still detected within 10 steps in >= 98.5% of
    traces, reward_collapse's median delay 4 -> 5 steps.
  min_trend_warmup: a warm-up shorter than this fits a level only (median, MAD; trend 0, which
    the Holt filter then learns). A line through 4 points has 2 residual degrees of freedom:
    4 lengths that happen to lie on a line give a scale at its floor and a trend that is
    extrapolated for tens of steps, and the next ordinary value reads as length_collapse
    (healthy arithmetic runs with monitor.warmup=4: a false alarm at step 8, baseline 3.9
    tokens, never observed, against 3.0-3.25). Synthetic traces (tools/monitor_false_alarms,
    200 traces) at warmup 4: false alarms per 1,000 healthy steps 0.63 with the line fit,
    0.017 level only; at warmup 6 and 8 (100 traces) 0.20 -> 0 and 0.033 -> 0; detection of
    every class as good or better. 10: the default warm-up keeps its line fit. Level only
    at warmup 10 (min_trend_warmup=11), FaultBench seeds 3, 4 replayed: the same detections and
    0 false alarms either way, 3 of 30 detections 1-2 steps later (a reward rising within the
    warm-up inflates the MAD about the median: scale 0.133 vs the line's 0.060); synthetic
    false alarms 0.083 -> 0 per 1,000 steps (experiments/faultbench/README.md, 2026-12-07).
  onset_reset: the onset estimate (*_start) restarts while the CUSUM is at or below this (scale
    units). At 0 (the textbook change point: the excursion's last zero) noise that left the
    CUSUM a few tenths above 0 before a fault dated the fault to that noise. Onset error
    (estimate - injected onset; ramps first show one step after it) of the first right
    diagnosis, 10 drift classes x 100 synthetic traces: early 31.3% -> 19.6% of detections,
    more than 2 steps early 15.6% -> 9.5%, more than 2 steps late 9.8% -> 9.9% (reward_stall's
    streaks: 98% either way), mean |error| 2.55 -> 2.13. Higher trades early for late
    (1.0: early > 2 6.3%, late > 2 11.0%; 2.0: 2.4%, 16.0%), so it stays at one allowance.
  onset_lead: how a signature with several up/down conditions is dated (monitor.py): the
    earliest of its conditions' starts, but at most onset_lead steps before the latest, so a
    condition whose CUSUM sat above onset_reset since an unrelated excursion (clip_frac after
    an early spike, a reward rise the trend underpredicts) no longer dates the signature there;
    -1: the earliest, unbounded (the rule before 2026-12-07). One-condition signatures are
    dated by their condition either way. Onset error of the first detection (mean |error|,
    200 synthetic traces per class, tools/monitor_false_alarms), -1 -> 2: reward_hacking
    5.61 -> 1.18 steps, entropy_explosion 1.66 -> 0.85, length_blowup 1.43 -> 0.88,
    kl_explosion 1.10 -> 0.89 (from the reference 1.53 -> 1.39), reward_collapse 1.69 -> 1.31,
    no class worse (the only lead tried with none worse: 0, the latest start, 1.47 on
    kl_explosion, whose KL CUSUM starts a step or two after clip_frac's; 1, 1.62 on
    kl_explosion from the reference). Detection and false alarms do not depend on it;
    FaultBench seeds 3, 4 replayed: the same incidents in all 44 runs
    (experiments/faultbench/README.md, 2026-12-07, 23rd session).
  log_warmup_trend: the share of the warm-up fit's trend that log signals keep (1: all). KL of
    a run from the reference rises from 0 during the lr warm-up; extrapolated, that rise runs
    its baseline away and hides a later KL explosion. 0 with log_trend_fast 1 detects it
    (synthetic, from the reference: kl_explosion within 10 steps 0.780 -> 0.995) but dated
    FaultBench's first detections worse (mean |error| 0.20 -> 0.67 with onset_lead 2), so both
    stay off (experiments/faultbench/README.md, 2026-12-07).
  log_trend_fast: 1: log signals' trend gain is max(trend_rate, 1/n) after warm-up, as the
    variance's, so a trend the warm-up did not give them (log_warmup_trend 0) is learned within
    a few steps; 0: trend_rate.
  """
  warmup: int = 10
  cusum_k: float = 0.5
  cusum_h: float = 8.0
  cusum_cap: float = 2.0
  z_clip: float = 3.0
  ewma_alpha: float = 0.2
  z_thresh: float = 4.0
  persistence: int = 3
  baseline_rate: float = 0.1
  trend_rate: float = 0.02
  frozen_rate: float = 0.2
  trend_shrink: float = 2.0
  var_rate: float = 0.02
  small_sample: float = 2.0
  eps_rel: float = 0.01
  not_up_max: float = 0.5
  release: float = 0.5
  stall_persistence: int = 5
  credit_persistence: int = 3
  invariant_score: float = 100.0
  additive_trend_damping: float = 0.5
  min_trend_warmup: int = 10
  onset_reset: float = 0.5
  log_warmup_trend: float = 1.0
  log_trend_fast: int = 0
  onset_lead: int = 2


@flax.struct.dataclass
class DetectorState:
  """Per-signal detector state. Shapes are [..., S] (S = len(SIGNALS)); the optional leading
  batch dims run many independent monitors at once (synthetic trace batches)."""
  count: jnp.ndarray            # [S] int32   valid observations so far
  window: jnp.ndarray           # [S, W] f32  ring buffer of the latest W valid y (warm-up fit)
  baseline: jnp.ndarray         # [S] f32     robust level (detector units)
  trend: jnp.ndarray            # [S] f32     robust level change per step (detector units)
  scale: jnp.ndarray            # [S] f32     robust noise scale (detector units)
  ewma: jnp.ndarray             # [S] f32     smoothed level of y
  ewvar: jnp.ndarray            # [S] f32     smoothed clipped squared innovation
  cusum_pos: jnp.ndarray        # [S] f32
  cusum_neg: jnp.ndarray        # [S] f32
  cusum_pos_start: jnp.ndarray  # [S] int32   step the current upward excursion began
  cusum_neg_start: jnp.ndarray  # [S] int32
  slope: jnp.ndarray            # [S] f32     EWMA of first differences / scale
  persist_up: jnp.ndarray       # [S] int32
  persist_down: jnp.ndarray     # [S] int32
  z: jnp.ndarray                # [S] f32     standardised innovation of the last observation
  last: jnp.ndarray             # [S] f32     last valid raw value x (signal units)


def init_detectors(cfg: MonitorConfig, batch_shape: tuple[int, ...] = ()) -> DetectorState:
  """Fresh detectors, built in NumPy and placed with one device_put (no XLA program: eager jnp
  zeros compiled ~6 small programs at a run's set-up)."""
  shape = tuple(batch_shape) + (len(sig.SIGNALS),)
  zf, zi = np.zeros(shape, np.float32), np.zeros(shape, np.int32)
  return jax.device_put(DetectorState(
      count=zi, window=np.zeros(shape + (cfg.warmup,), np.float32), baseline=zf, trend=zf,
      scale=np.ones(shape, np.float32), ewma=zf, ewvar=np.ones(shape, np.float32),
      cusum_pos=zf, cusum_neg=zf, cusum_pos_start=zi, cusum_neg_start=zi, slope=zf,
      persist_up=zi, persist_down=zi, z=zf, last=np.full(shape, np.nan, np.float32)))


def _scale_floor(baseline: jnp.ndarray, cfg: MonitorConfig) -> jnp.ndarray:
  rel = jnp.where(sig.IS_LOG, 0.0, cfg.eps_rel * jnp.abs(baseline))
  return rel + sig.SCALE_FLOOR


def _warmup_fit(window: jnp.ndarray, cfg: MonitorConfig):
  """Robust line through the warm-up window [..., S, W] -> (baseline, trend, scale) [..., S].

  trend: Theil-Sen slope (median of pairwise slopes), soft-thresholded by trend_shrink standard
  errors (se = scale * sqrt(12 / (W^3 - W))) so a trend that 10 noisy points cannot resolve
  starts at 0 instead of being extrapolated; the Holt filter learns the rest.
  """
  w = cfg.warmup
  i = jnp.arange(w, dtype=jnp.float32)
  lo, hi = np.triu_indices(w, k=1)                                        # the W(W-1)/2 pairs
  slope = jnp.median((window[..., hi] - window[..., lo]) / (hi - lo).astype(np.float32), axis=-1)
  centre = jnp.median(window - slope[..., None] * i, axis=-1)             # level at i = 0
  resid = window - (centre[..., None] + slope[..., None] * i)
  mad = jnp.median(jnp.abs(resid - jnp.median(resid, axis=-1, keepdims=True)), axis=-1)
  baseline = centre + slope * (w - 1)
  scale = jnp.maximum(1.4826 * mad, _scale_floor(baseline, cfg))
  se = scale * np.sqrt(12.0 / max(w ** 3 - w, 1))
  trend = jnp.sign(slope) * jnp.maximum(jnp.abs(slope) - cfg.trend_shrink * se, 0.0)
  trend = jnp.where(sig.IS_LOG, cfg.log_warmup_trend * trend, trend)
  if w < cfg.min_trend_warmup:   # too few points to tell a trend from noise: level only
    level = jnp.median(window, axis=-1)
    mad = jnp.median(jnp.abs(window - level[..., None]), axis=-1)
    return level, jnp.zeros_like(level), jnp.maximum(1.4826 * mad, _scale_floor(level, cfg))
  return baseline, trend, scale


def detector_scores(state: DetectorState, cfg: MonitorConfig):
  """(up [..., S], down [..., S]) scores of the current state; 0 while warming up."""
  warm = state.count >= cfg.warmup
  lvl_up = jnp.where(state.persist_up >= cfg.persistence, state.z / cfg.z_thresh, 0.0)
  lvl_dn = jnp.where(state.persist_down >= cfg.persistence, -state.z / cfg.z_thresh, 0.0)
  up = jnp.maximum(state.cusum_pos / cfg.cusum_h, lvl_up)
  down = jnp.maximum(state.cusum_neg / cfg.cusum_h, lvl_dn)
  return jnp.where(warm, up, 0.0), jnp.where(warm, down, 0.0)


def detector_update(state: DetectorState, x: jnp.ndarray, step: jnp.ndarray,
                    cfg: MonitorConfig, freeze: jnp.ndarray | None = None):
  """One observation x [..., S] (raw, NaN = missing) at `step` (int, shape [...] or scalar)
  -> (state, up [..., S], down [..., S]), the scores of the updated state (detector_scores).

  freeze [..., S] bool: signals with an active alarm: level adapts at frozen_rate; trend and
  scale are held. The warm-up fit (medians: a sort) runs under lax.cond only on steps where
  some signal completes its warm-up.
  """
  x = jnp.asarray(x, jnp.float32)
  y = sig.transform(x)
  valid = jnp.isfinite(y)
  y0 = jnp.where(valid, y, 0.0)
  step = jnp.asarray(step, jnp.int32)[..., None]
  freeze = jnp.zeros_like(valid) if freeze is None else freeze
  w = cfg.warmup

  # Ring buffer of the latest W valid observations; warm-up fit when the W-th arrives.
  slot = jnp.arange(w) == (state.count % w)[..., None]
  window = jnp.where(valid[..., None] & slot, y0[..., None], state.window)
  count = state.count + valid.astype(jnp.int32)
  just_warm = valid & (count == w)
  fit_base, fit_trend, fit_scale = jax.lax.cond(
      jnp.any(just_warm), lambda win: _warmup_fit(win, cfg),
      lambda win: (jnp.zeros_like(y0), jnp.zeros_like(y0), jnp.ones_like(y0)), window)
  scoring = valid & (state.count >= w)            # warm before this observation

  phi = jnp.where(sig.IS_LOG, 1.0, cfg.additive_trend_damping)       # [S] trend damping
  pred = state.baseline + phi * state.trend
  n = jnp.maximum(state.count, 1).astype(jnp.float32)
  z = (y0 - pred) / (state.scale * jnp.sqrt(1.0 + cfg.small_sample * w / n))
  zc = jnp.clip(z, -cfg.z_clip, cfg.z_clip)
  cap = cfg.cusum_cap * cfg.cusum_h
  cpos = jnp.clip(state.cusum_pos + zc - cfg.cusum_k, 0.0, cap)
  cneg = jnp.clip(state.cusum_neg - zc - cfg.cusum_k, 0.0, cap)
  pos_start = jnp.where(state.cusum_pos <= cfg.onset_reset, step, state.cusum_pos_start)
  neg_start = jnp.where(state.cusum_neg <= cfg.onset_reset, step, state.cusum_neg_start)
  pup = jnp.where(z > cfg.z_thresh, state.persist_up + 1, 0)
  pdn = jnp.where(z < -cfg.z_thresh, state.persist_down + 1, 0)
  a = cfg.ewma_alpha
  y_last = sig.transform(state.last)
  slope = (1 - a) * state.slope + a * (y0 - y_last) / state.scale

  adapt = scoring & ~freeze
  gain = jnp.where(freeze, cfg.frozen_rate, 1.0) * state.scale * zc     # frozen: slow re-learning
  base = jnp.where(scoring, pred + cfg.baseline_rate * gain, state.baseline)
  trend_gain = cfg.trend_rate
  if cfg.log_trend_fast:
    trend_gain = jnp.where(sig.IS_LOG, jnp.maximum(cfg.trend_rate, 1.0 / n), cfg.trend_rate)
  trend = jnp.where(adapt, phi * state.trend + trend_gain * gain,
                    jnp.where(scoring, phi * state.trend, state.trend))
  var_gain = jnp.maximum(cfg.var_rate, 1.0 / n)
  resid2 = jnp.minimum(((y0 - pred) / state.scale) ** 2, cfg.z_clip ** 2) * state.scale ** 2
  ewvar = jnp.where(adapt, (1 - var_gain) * state.ewvar + var_gain * resid2, state.ewvar)
  scale = jnp.where(adapt, jnp.maximum(jnp.sqrt(ewvar), _scale_floor(base, cfg)), state.scale)

  def pick(new, old):
    return jnp.where(scoring, new, old)

  new = DetectorState(
      count=count, window=window,
      baseline=jnp.where(just_warm, fit_base, base),
      trend=jnp.where(just_warm, fit_trend, trend),
      scale=jnp.where(just_warm, fit_scale, scale),
      ewma=jnp.where(just_warm, fit_base, pick((1 - a) * state.ewma + a * y0, state.ewma)),
      ewvar=jnp.where(just_warm, fit_scale ** 2, ewvar),
      cusum_pos=pick(cpos, state.cusum_pos), cusum_neg=pick(cneg, state.cusum_neg),
      cusum_pos_start=pick(pos_start, state.cusum_pos_start),
      cusum_neg_start=pick(neg_start, state.cusum_neg_start),
      slope=pick(slope, state.slope),
      persist_up=pick(pup, state.persist_up), persist_down=pick(pdn, state.persist_down),
      z=pick(z, state.z), last=jnp.where(valid, x, state.last))
  up, down = detector_scores(new, cfg)
  return new, up, down
