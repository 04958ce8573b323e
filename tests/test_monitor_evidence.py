"""An incident's evidence as the console, incidents.md and tools.monitor_replay word it: a
'not_up' gate states the test it passed (its up score below monitor's not_up_max), not the
signal's level against its baseline, which may be above it."""
import dataclasses
import functools

import jax
import numpy as np
import pytest

from rft_jax import incidents as incidents_lib
from rft_jax.monitor import signals as sig
from rft_jax.monitor.detectors import MonitorConfig
from rft_jax.monitor.monitor import incidents_from_alarms, run_monitor
from rft_jax.telemetry import sinks
from tools import monitor_replay

CFG4 = dataclasses.replace(MonitorConfig(), warmup=4)
CORRECT = sig.SIGNALS.index('reward/correct/mean')


def hacked_trace(steps: int = 12, onset: int = 8) -> dict[str, np.ndarray]:
  """A reward x100 from `onset` (the reward_scale fault) while KL climbs, and correctness,
  0.5 +- 0.02 before, keeps rising (0.53, 0.55, ...): the grpo_arith run with warmup 4 whose
  reward_hacking incident cited correctness 'not_up' at 0.69 against a baseline of 0.50."""
  alt = (-1.0) ** np.arange(steps)
  correct = 0.5 + 0.02 * alt
  correct[onset:] = np.linspace(0.53, 0.53 + 0.02 * (steps - onset - 1), steps - onset)
  reward = correct.copy()
  reward[onset:] *= 100
  kl = 0.1 * (1 + 0.05 * alt)
  kl[onset:] = 0.1 * (1.5 + 0.8 * np.arange(steps - onset))
  return {'reward/mean': reward, 'reward/correct/mean': correct, 'kl': kl}


@functools.partial(jax.jit, static_argnames='cfg')
def _alarms(trace, cfg):
  return run_monitor(trace, cfg)[1]


def first_incident(cfg: MonitorConfig) -> dict:
  al = jax.device_get(_alarms({k: np.float32(v) for k, v in hacked_trace().items()}, cfg))
  t = int(np.flatnonzero(al.fired.any(-1))[0])
  found = incidents_from_alarms(jax.tree.map(lambda a: a[t], al), step=t + 1)
  assert found[0]['signature'] == 'reward_hacking', found
  return found[0]


@pytest.fixture(scope='module')
def hacking():
  return first_incident(CFG4)


def test_a_gate_reports_the_up_score_it_tested_not_a_level(hacking):
  gate = {e['signal']: e for e in hacking['evidence']}['reward/correct/mean']
  text = f"reward/correct/mean not up (up-score {sinks.format_value(gate['score'])} < 0.5)"
  line = sinks.describe_incident(hacking['step'], hacking)
  assert text in line and 'not_up' not in line, line
  # correctness is above its baseline, yet its CUSUM up score is below the gate's limit
  assert gate['direction'] == 'not_up' and gate['value'] > gate['baseline'] + 0.03
  assert 0 < gate['score'] < 0.5 and gate['limit'] == CFG4.not_up_max == 0.5
  assert sinks.evidence_text({'signal': 'kl', 'direction': 'up', 'score': 1.625}) == 'kl up 1.62'


def test_the_gates_limit_is_the_monitors_config():
  gate = first_incident(dataclasses.replace(CFG4, not_up_max=0.3))['evidence'][1]
  assert gate['direction'] == 'not_up' and gate['limit'] == pytest.approx(0.3)
  assert sinks.evidence_text(gate).endswith(' < 0.3)')


def test_replay_and_report_use_the_consoles_words(hacking, tmp_path):
  gate = sinks.evidence_text(hacking['evidence'][1])
  replayed = monitor_replay.format_incident(hacking)
  assert replayed.endswith(f'reward/mean up 0.625, kl up 0.625, {gate}'), replayed
  log = incidents_lib.IncidentLog(str(tmp_path), resume_step=0)
  log.add({'kind': 'incident', **hacking})
  assert f'(score 1.04; reward/mean up 0.625, {gate}, kl up 0.625)' in log.report()


def test_a_gate_logged_without_its_limit_reads_without_it():
  # incidents.jsonl written before the limit was recorded (tools.monitor_replay, old runs)
  old = {'signal': 'entropy', 'direction': 'not_up', 'score': 0.12, 'value': 0.2,
         'baseline': 0.1}
  assert sinks.evidence_text(old) == 'entropy not up (up-score 0.12)'


def out_of_range_incident(frac: float) -> dict:
  """The reward_out_of_range incident of a trace whose last step has `frac` of its rewards
  outside the verifiers' range (the reward_scale fault at step 4)."""
  trace = {'reward/mean': np.float32([0.5, 0.52, 0.5, 50.0]),
           'invariant/reward_out_of_range': np.float32([0, 0, 0, frac])}
  al = jax.device_get(_alarms(trace, CFG4))
  found = incidents_from_alarms(jax.tree.map(lambda a: a[3], al), step=4)
  assert [i['signature'] for i in found] == ['reward_out_of_range'], found
  return found[0]


def test_an_exact_check_reads_as_its_value_and_limit_not_its_fixed_score():
  # The console said 'invariant/reward_out_of_range up 100' whatever share of the rewards was
  # out of range: 100 is monitor.invariant_score, the score of every violated exact check.
  incident = out_of_range_incident(0.25)
  item = incident['evidence'][0]
  assert item['value'] == pytest.approx(0.25) and item['limit'] == 0.0
  line = sinks.describe_incident(4, incident)
  assert 'invariant/reward_out_of_range 0.25 (limit 0)' in line and 'up 100' not in line, line
  replayed = monitor_replay.format_incident(incident)
  assert replayed.endswith('evidence: invariant/reward_out_of_range 0.25 (limit 0)'), replayed


def test_a_skipped_streak_reads_as_its_length_and_limit():
  incident = incidents_lib.streak_incident(step=9, streak=5, limit=5)
  assert 'invariant/nonfinite 5 (limit 5)' in sinks.describe_incident(9, incident)
