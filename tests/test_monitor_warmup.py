"""The failure monitor right after a short warm-up (monitor.warmup below 10) and its onsets."""
import dataclasses
import functools

import jax
import numpy as np

from rft_jax.monitor import signatures as sigs
from rft_jax.monitor import synthetic
from rft_jax.monitor.detectors import MonitorConfig
from rft_jax.monitor.monitor import run_monitor

CFG4 = dataclasses.replace(MonitorConfig(), warmup=4)
# response/len_mean of a healthy grpo_arith run with monitor.warmup=4 (steps 1-12): the four
# warm-up lengths lie almost on a line; afterwards the length goes back to ~3.0-3.3 tokens.
ARITH_LENGTHS = [3.0, 3.1875, 3.3125, 3.5, 3.0, 3.25, 3.0, 3.25, 3.3125, 3.125, 3.25, 3.0]


@functools.partial(jax.jit, static_argnames='cfg')
def _alarms(stacked, cfg):
  return run_monitor(stacked, cfg)[1]


def alarms_of(traces, cfg):
  return jax.device_get(_alarms(synthetic.stack_traces(traces), cfg))


def fired_names(alarms, i):
  return {sigs.SIGNATURE_NAMES[k] for k in np.flatnonzero(alarms.fired[i].any(0))}


def test_short_warm_up_does_not_extrapolate_a_trend_into_a_length_collapse():
  # The 4-point line fit put the scale at its floor and extrapolated +3%/step: length_collapse
  # fired at step 8 against a baseline of 3.9 tokens that the run never reached.
  trace = {'response/len_mean': np.array(ARITH_LENGTHS)}
  al = alarms_of([trace], CFG4)
  assert 'length_collapse' not in fired_names(al, 0)
  assert al.baseline[0, -1, 4] < 3.5     # SIGNALS[4] = response/len_mean: the level, not 3.9+


def test_short_warm_up_is_quiet_on_healthy_traces_and_still_detects():
  rng = np.random.default_rng(7)
  healthy = [synthetic.healthy_trace(rng, 120) for _ in range(24)]
  faulty, onsets = [], []
  for fault in ('length_collapse', 'kl_explosion', 'reward_collapse', 'entropy_collapse'):
    for _ in range(3):
      onsets.append(int(rng.integers(30, 80)))
      faulty.append((fault, synthetic.inject(synthetic.healthy_trace(rng, 120), fault,
                                             onsets[-1])))
  al = alarms_of(healthy + [tr for _, tr in faulty], CFG4)
  # with the 4-point line fit: 5 false alarms on these 24 traces (sampler_mismatch,
  # gradient_explosion x2, reward_collapse, entropy_collapse, all at steps 12-19); level only: 1
  # (entropy_collapse at step 10: the synthetic entropy decays exponentially from step 0)
  assert al.fired[:len(healthy)].sum() <= 1, [fired_names(al, i) for i in range(len(healthy))]
  for j, ((fault, _), onset) in enumerate(zip(faulty, onsets)):
    i = len(healthy) + j
    hit = [t for t in range(onset, onset + 11)
           for k in np.flatnonzero(al.fired[i, t]) if sigs.SIGNATURES[k].fault_class == fault]
    assert hit, (fault, onset)


def test_onset_is_not_the_start_of_a_small_excursion_before_the_fault():
  # Reward steady at 0.5 (+-0.01) for 20 steps, 0.012 below it for 3 (a CUSUM_neg of a few
  # tenths: noise, not a fault), then a collapse to 0.3 at step 23. The excursion's start
  # used to be the onset (step 20); a CUSUM within one allowance (cusum_k) of 0 now restarts it.
  cfg = MonitorConfig()
  reward = np.r_[0.5 + 0.01 * (-1.0) ** np.arange(20), [0.488] * 3, [0.3] * 8]
  al = alarms_of([{'reward/mean': reward}], cfg)
  k = sigs.SIGNATURE_NAMES.index('reward_collapse')
  fired = np.flatnonzero(al.fired[0, :, k])
  assert len(fired) == 1 and 23 <= fired[0] <= 27, fired
  assert 0 < al.signal_down[0, 22, 0] < 1                # SIGNALS[0] = reward/mean
  assert al.onset[0, fired[0], k] == 23
