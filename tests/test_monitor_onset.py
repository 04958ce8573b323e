"""Onset dating of multi-condition signatures (MonitorConfig.onset_lead) and the warm-up trend of
log signals in runs from the reference (log_warmup_trend, log_trend_fast).

Were: a signature's onset was the earliest start over its conditions, so one condition whose
CUSUM had sat above onset_reset since an unrelated excursion dated the whole signature there
(FaultBench lr_spike: kl_explosion_with_clipping dated to a clip_frac spike 18 steps before KL
moved); and a KL rising from 0 during the lr warm-up was extrapolated as a trend, so a x10 KL
jump later never scored (experiments/faultbench/README.md, 2026-12-07)."""
import dataclasses
import functools

import jax
import numpy as np

from rft_jax.monitor import signatures as sigs
from rft_jax.monitor import synthetic
from rft_jax.monitor.detectors import MonitorConfig
from rft_jax.monitor.monitor import run_monitor


@functools.partial(jax.jit, static_argnames='cfg')
def _alarms(stacked, cfg):
  return run_monitor(stacked, cfg)[1]


def alarms_of(traces, **knobs):
  cfg = dataclasses.replace(MonitorConfig(), **knobs)
  return jax.device_get(_alarms(synthetic.stack_traces(traces), cfg))


def firings(al, name, i=0):
  """[(step, onset)] of signature `name` in trace i."""
  k = sigs.SIGNATURE_NAMES.index(name)
  return [(int(t), int(al.onset[i, t, k])) for t in np.flatnonzero(al.fired[i, :, k])]


def clip_then_kl_trace():
  """clip_frac jumps at 13 and is 10x noisier from then on (its warm-up scale is below that
  noise, so its up-CUSUM stays high); KL, steady before, jumps x20 at 31."""
  rng = np.random.default_rng(0)
  kl = 0.1 * np.exp(rng.normal(0, 0.2, 60))
  kl[31:] *= 20
  clip = 0.01 + rng.normal(0, 0.001, 60)
  clip[13:] = 0.03 + rng.normal(0, 0.01, 47)
  return {'kl': kl, 'clip_frac': clip}


def test_a_signature_is_dated_from_its_latest_condition_within_onset_lead():
  trace = clip_then_kl_trace()
  # the earliest start over the conditions (onset_lead=-1, the rule before): clip_frac's 13
  assert firings(alarms_of([trace], onset_lead=-1), 'kl_explosion_with_clipping') == [(33, 13)]
  # a condition may date the signature at most onset_lead steps before the latest one's start
  assert firings(alarms_of([trace], onset_lead=0), 'kl_explosion_with_clipping') == [(33, 31)]
  assert firings(alarms_of([trace], onset_lead=2), 'kl_explosion_with_clipping') == [(33, 29)]
  # a one-condition signature is dated by its condition under any lead
  for lead in (-1, 0, 2):
    assert firings(alarms_of([trace], onset_lead=lead), 'kl_explosion') == [(33, 31)]


def test_onset_lead_keeps_an_earlier_condition_that_started_just_before():
  # clip_frac rises one step before KL (a real trust-region break): with lead 2 the signature
  # keeps clip_frac's start; with lead 0 it is dated from KL's
  rng = np.random.default_rng(1)
  kl = 0.1 * np.exp(rng.normal(0, 0.02, 60))
  kl[31:] *= 20
  clip = 0.01 + rng.normal(0, 0.0005, 60)
  clip[30:] += 0.05
  trace = {'kl': kl, 'clip_frac': clip}
  (step, onset_2), = firings(alarms_of([trace], onset_lead=2), 'kl_explosion_with_clipping')
  (_, onset_0), = firings(alarms_of([trace], onset_lead=0), 'kl_explosion_with_clipping')
  assert (onset_2, onset_0) == (30, 31) and step <= 33


def from_reference_kl(seed):
  """KL of a run from the reference: exactly 0 at step 0, rising as (t/12)^2.5 to ~0.15 under
  the lr warm-up, lognormal noise; x10 from step 35."""
  rng = np.random.default_rng(seed)
  t = np.arange(60.0)
  kl = 0.15 * np.minimum(t / 12, 1) ** 2.5 * np.exp(rng.normal(0, 0.3, 60))
  kl[35:] *= 10
  return {'kl': kl}


def test_a_kl_jump_after_a_warm_up_rise_is_detected_without_the_log_warm_up_trend():
  traces = [from_reference_kl(s) for s in range(8)]
  # the warm-up rise extrapolated (log_warmup_trend=1): the baseline runs away, nothing fires
  al = alarms_of(traces, log_warmup_trend=1.0, log_trend_fast=0)
  assert all(not firings(al, 'kl_explosion', i) for i in range(8))
  al = alarms_of(traces, log_warmup_trend=0.0, log_trend_fast=1)
  steps = [firings(al, 'kl_explosion', i)[0][0] for i in range(8)]
  assert all(36 <= t <= 41 for t in steps), steps


def test_the_false_alarm_tool_scores_the_onset_of_the_first_detection(capsys):
  # pylint: disable-next=g-import-not-at-top
  from tools import monitor_false_alarms
  cfg = MonitorConfig()
  r = monitor_false_alarms.detection(cfg, 'nan_loss', 4, 81, 0)   # exact: dated on its step
  assert (r['onset_mae'], r['onset_early2']) == (0.0, 0.0)
  r = monitor_false_alarms.detection(cfg, 'length_blowup', 8, 120, 0)
  assert 0.0 < r['onset_mae'] <= 3.0 and 0.0 <= r['onset_early2'] <= 0.25, r
  monitor_false_alarms.main(['--traces', '1', '--steps', '81'])
  assert 'onset|e| early>2' in capsys.readouterr().out


def test_the_default_dates_a_signature_within_two_steps_of_its_latest_condition():
  # the default onset_lead is 2 (experiments/faultbench/README.md, 2026-12-07, 23rd session)
  assert firings(alarms_of([clip_then_kl_trace()]), 'kl_explosion_with_clipping') == [(33, 29)]
