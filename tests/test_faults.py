"""Fault injection (rft_jax/faults.py) and FaultBench scoring (tools/faultbench_score.py) on
small hand-made inputs."""
import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from rft_jax import faults
from rft_jax.rewards.runner import RewardResult
from tools import faultbench, faultbench_score as fs


def result(total, correct, valid=None):
  total = np.asarray(total, np.float32)
  valid = np.ones(total.shape, bool) if valid is None else np.asarray(valid)
  return RewardResult(total=total, per_verifier={'correct': np.asarray(correct, np.float32),
                                                 'format': np.ones(total.shape, np.float32)},
                      valid=valid, errors={}, timeouts={})


def injector(kind, strength=None, onset=3, group_size=2):
  f = {'type': kind, 'onset_step': onset,
       'strength': faults.FAULTS[kind].strength if strength is None else strength}
  return faults.FaultInjector([f], seed=0, group_size=group_size, total_steps=10)


WEIGHTS = {'correct': 1.0, 'format': 0.1}


def test_no_faults_change_nothing():
  inj = faults.FaultInjector([], seed=0, group_size=2, total_steps=10)
  r = result([1.1, 0.1], [1, 0])
  assert inj.rewards(5, r, ['1', '2'], WEIGHTS, 6) is r
  assert inj.sampling(5, 1.0, 6) == (1.0, 6, False)
  assert inj.batch_faults(5, 4) == (None, False)
  assert inj.answers(5, [1, 2], ['3', '4']) == ['3', '4']


def test_faults_start_at_onset():
  inj = injector('reward_scale')
  r = result([1.1, 0.1], [1, 0])
  np.testing.assert_allclose(inj.rewards(2, r, ['a', 'b'], WEIGHTS, 6).total, [1.1, 0.1])
  np.testing.assert_allclose(inj.rewards(3, r, ['a', 'b'], WEIGHTS, 6).total, [110, 10],
                             rtol=1e-6)


def test_lenient_verifier_and_outage():
  texts = ['12', 'x', '-7', '13']
  r = result([1.1, 0.0, 0.1, 0.1], [1, 0, 0, 0])
  got = injector('reward_lenient').rewards(5, r, texts, {'correct': 1.0}, 6)
  np.testing.assert_array_equal(got.per_verifier['correct'], [1, 0, 1, 1])   # format, not truth
  np.testing.assert_array_equal(got.total, [1, 0, 1, 1])
  out = injector('verifier_outage').rewards(5, r, texts, WEIGHTS, 6)
  np.testing.assert_array_equal(out.total, 0.0)
  np.testing.assert_array_equal(out.per_verifier['correct'], 0.0)


def test_length_bonus_sign_flips_and_invalid_rows():
  r = result([1.1, 0.1, 0.0, 1.1], [1, 0, 0, 1], valid=[True, True, False, True])
  got = injector('reward_length', 1.0).rewards(5, r, ['123', '1', 'xx', '123456'], WEIGHTS, 6)
  np.testing.assert_allclose(got.total, [1.1 + 0.5, 0.1 + 1 / 6, 0.0, 1.1 + 1.0], rtol=1e-6)
  flipped = injector('reward_sign_flip', 1.0).rewards(5, r, ['1'] * 4, WEIGHTS, 6)
  np.testing.assert_allclose(flipped.total, [-1.1, -0.1, 0.0, -1.1], rtol=1e-6)
  np.testing.assert_array_equal(flipped.per_verifier['correct'], [1, 0, 0, 1])  # telemetry true


def test_reward_range_invariant_by_hand():
  """out_of_range_frac: valid rows outside [sum min(w, 0), sum max(w, 0)] = [0, 1.1] here."""
  r = result([1.1, 0.1, 0.0, 1.1], [1, 0, 0, 1], valid=[True, True, False, True])
  assert r.out_of_range_frac(WEIGHTS) == 0.0                # float32 1.1 is inside
  length = injector('reward_length', 1.0).rewards(5, r, ['123', '1', 'xx', '1'], WEIGHTS, 6)
  assert length.out_of_range_frac(WEIGHTS) == pytest.approx(2 / 3)   # 1.6, 0.27, 1.27
  flipped = injector('reward_sign_flip', 1.0).rewards(5, r, ['1'] * 4, WEIGHTS, 6)
  assert flipped.out_of_range_frac(WEIGHTS) == 1.0
  assert injector('reward_scale').rewards(5, r, ['1'] * 4, WEIGHTS, 6).out_of_range_frac(
      WEIGHTS) == 1.0
  assert r.out_of_range_frac({'correct': -1.0, 'format': 0.1}) == pytest.approx(2 / 3)
  negative = result([-0.9, 0.1, -1.0], [1, 0, 1])          # [-1, 0.1] with a negative weight
  assert negative.out_of_range_frac({'correct': -1.0, 'format': 0.1}) == 0.0


def test_noise_hits_about_the_requested_fraction():
  r = result(np.full(4000, 0.5), np.zeros(4000))
  got = injector('reward_noise', 0.3).rewards(5, r, ['1'] * 4000, {'correct': 0.0}, 6).total
  changed = np.mean(got != 0.0)   # {0, 1.1} replaced a 0.0 total (correct weight 0)
  assert 0.12 < changed < 0.18     # half of the 30% draw 0.0 again


def test_group_shuffle_moves_rewards_between_groups_only():
  total = np.arange(8, dtype=np.float32)
  inj = injector('group_shuffle', 1.0, group_size=2)
  r = dataclasses.replace(result(total, np.zeros(8)), per_verifier={'correct': total})
  got = inj.rewards(5, r, ['1'] * 8, {'correct': 1.0}, 6).total
  assert sorted(got.tolist()) == total.tolist() and not np.array_equal(got, total)


def test_sampling_faults():
  assert injector('sampler_temperature', 1.5).sampling(5, 1.0, 6) == (1.5, 6, False)
  assert injector('truncation', 2).sampling(5, 1.0, 6) == (1.0, 2, False)
  assert injector('eos_ignored').sampling(5, 1.0, 6) == (1.0, 6, True)
  anneal = injector('temperature_anneal', 0.7, onset=1)
  temps = [anneal.sampling(s, 1.0, 6)[0] for s in range(1, 11)]
  assert temps[0] == 1.0 and temps[-1] == 0.7 and temps == sorted(temps, reverse=True)
  assert [anneal.trainer_temperature(s, 1.0) for s in range(1, 11)] == temps   # both follow
  kl = injector('kl_removed_low_temp', 0.5)
  assert kl.kl_coef(5, 0.02) == 0.0 and kl.sampling(5, 1.0, 6)[0] == 0.5
  assert kl.trainer_temperature(5, 1.0) == 0.5 and kl.kl_coef(2, 0.02) == 0.02
  # only sampler_temperature makes the sampler's temperature differ from the trainer's
  assert injector('sampler_temperature', 1.5).trainer_temperature(5, 1.0) == 1.0


def test_answer_key_corruption_is_fixed_per_prompt():
  inj = injector('answer_key_corrupt', 0.5)
  ids = list(range(200))
  a = inj.answers(5, ids, ['10'] * 200)
  b = inj.answers(9, ids, ['10'] * 200)
  assert a == b and set(a) == {'10', '11'}
  assert 0.35 < a.count('11') / 200 < 0.65


def test_corrupt_batch_by_hand():
  batch = {'adv': jnp.array([1.0, -1.0, 0.5, -0.5]),
           'loss_mask': jnp.array([[0, 0, 1, 1], [0, 1, 1, 0]], jnp.float32)}
  out = faults.corrupt_batch(batch, jnp.array([-1.0, -1.0, 1.0, 1.0]), shift_mask=True)
  np.testing.assert_array_equal(out['adv'], [-1.0, 1.0, 0.5, -0.5])
  np.testing.assert_array_equal(out['loss_mask'], [[0, 1, 1, 0], [1, 1, 0, 0]])
  sign, shift = injector('adv_sign_flip', 1.0, group_size=2).batch_faults(5, 4)
  assert sign.tolist() == [-1, -1, -1, -1] and not shift


def test_check_faults_names_the_problem():
  with pytest.raises(ValueError, match=r"faults\[0\].type='typo': unknown fault"):
    faults.check_faults([{'type': 'typo', 'onset_step': 1, 'strength': 1}])
  # Specs that used to pass and then inject nothing, or something else than meant.
  ok = {'type': 'lr_spike', 'onset_step': 3, 'strength': 50.0}
  for bad, message in [
      ({**ok, 'durationn': 3}, r'faults\[0\].durationn: unknown key'),
      ({**ok, 'strength': float('nan')}, r'strength: must be a finite number > 0'),
      ({**ok, 'strength': float('inf')}, r'strength: must be a finite number > 0'),
      ({**ok, 'strength': True}, r'strength: must be a finite number > 0'),
      ({**ok, 'onset_step': True}, r'onset_step: must be an int >= 1'),
      ({**ok, 'onset_step': 999}, r"onset_step: 999 is after the run's last step \(train.steps=10"),
      ({**ok, 'type': 'adv_sign_flip', 'strength': 7},
       r'adv_sign_flip takes a fraction in \(0, 1\]'),
      ({**ok, 'type': 'truncation', 'strength': 0.5}, r'truncation takes a token count >= 1'),
      ({**ok, 'type': 'truncation', 'strength': 2.5}, r'truncation takes a whole token count'),
      ({**ok, 'type': 'truncation', 'strength': 6},   # sampled at min(6, 6): nothing cut
       r'truncation to 6 tokens cuts nothing: rollout.max_new_tokens is 6'),
      # FaultBench's stop-and-resume scenario: the trainer injects nothing for it
      ({**ok, 'type': 'resume', 'strength': 1}, r"faults\[0\].type='resume': not an injection"),
      ({**ok, 'strength': 1}, r'lr_spike multiplies by its strength, so 1 changes nothing'),
      ({**ok, 'type': 'reward_scale', 'strength': 1.0}, r'reward_scale multiplies'),
  ]:
    with pytest.raises(ValueError, match=message):
      faults.check_faults([bad], total_steps=10, max_new_tokens=6)
  faults.check_faults([ok, {**ok, 'type': 'truncation', 'strength': 2}], total_steps=10)
  assert len([f for f in faults.FAULTS.values() if f.family != 'benign']) >= 14
  assert {f.family for f in faults.FAULTS.values()} == {
      'reward', 'generation', 'optimisation', 'credit', 'environment', 'benign'}


def rec(fault, incidents=(), onset=20, seed=1, mode='warn', acc=0.9, steps=60):
  family = 'healthy' if fault == 'healthy' else faults.FAULTS[fault].family
  return {'fault': fault, 'family': family, 'seed': seed, 'onset': onset, 'mode': mode,
          'steps': steps, 'final_acc': acc, 'error': None,
          'incidents': [{'step': s, 'fault_class': c} for s, c in incidents]}


def test_scoring_by_hand():
  records = [
      rec('lr_spike', [(22, 'gradient_explosion')]),                  # TP, delay 2, top-1
      rec('lr_spike', [(10, 'kl_explosion')]),                          # pre-onset alarm: FN
      rec('mask_shift', [(25, 'reward_collapse'), (26, 'credit_assignment')]),  # TP, top-3
      rec('healthy'),                                                   # TN
      rec('lr_schedule_step', [(40, 'length_collapse')]),               # benign: FP
  ]
  s = fs.score(records)
  o = s['overall']
  assert (o['tp'], o['fp'], o['positives']) == (2, 1, 3)
  assert o['precision'] == pytest.approx(2 / 3) and o['recall'] == pytest.approx(2 / 3)
  assert o['flag_all_f1'] == pytest.approx(2 * 0.6 / 1.6)
  fa = s['false_alarms']
  assert (fa['alarms'], fa['healthy_steps']) == (2, 3 * 19 + 2 * 60)
  rows = {r['fault']: r for r in s['faults']}
  assert rows['lr_spike']['detected'] == 1 and rows['lr_spike']['delay_median'] == 2
  assert rows['lr_spike']['top1'] == 0.5
  assert rows['mask_shift']['top1'] == 0.0 and rows['mask_shift']['top3'] == 1.0


def test_undefined_scores_are_none_and_shown_as_a_dash(tmp_path, capsys):
  """No faulted run: recall and F1 are 0/0, and precision too when nothing is flagged. They are
  None, shown as '—' (were 0.00, read as a monitor that misses everything)."""
  o = fs.prf([rec('healthy'), rec('lr_schedule_step')])
  assert (o['precision'], o['recall'], o['f1'], o['flag_all_f1'], o['never_flag_f1']) == (
      None, None, None, None, None)
  assert fs.prf([rec('healthy', [(3, 'kl_explosion')])])['precision'] == 0.0
  missed = fs.prf([rec('lr_spike'), rec('healthy')])   # faulted, none flagged: F1 0, P undefined
  assert (missed['precision'], missed['recall'], missed['f1']) == (None, 0.0, 0.0)
  out = tmp_path / 'fb'
  out.mkdir()
  (out / 'results.jsonl').write_text(json.dumps(rec('healthy')) + '\n')
  assert faultbench.main(['--rescore', '--out', str(out)]) == 0
  report = (out / 'report.md').read_text()
  assert '| all faults | — | — | — | — | — | 1 (0) |' in report, report
  capsys.readouterr()


def test_remediation_scoring_by_hand():
  warn = [rec('healthy', acc=0.90), rec('healthy', seed=2, acc=0.92), rec('lr_spike', acc=0.50)]
  auto = [rec('lr_spike', mode='auto', acc=0.89), rec('mask_shift', mode='auto', acc=None)]
  r = fs.remediation(warn, auto)
  assert r['healthy_acc'] == pytest.approx(0.91)
  assert r['recovered_share'] == 0.5
  assert r['severity_change_median'] == pytest.approx((0.02 - 0.41) / 0.41)


def test_plan_and_onsets():
  specs = faultbench.plan('full', [1, 2])
  names = [s['name'] for s in specs]
  assert len(names) == len(set(names))
  for s in specs:
    if s['fault'] != 'healthy':
      assert 18 <= s['onset'] <= 36
  assert faultbench.onset_for(1, 'lr_spike', 60) == faultbench.onset_for(1, 'lr_spike', 60)
  ci = faultbench.plan('ci', [1, 2])
  assert {s['fault'] for s in ci} == {'healthy', 'lr_spike', 'mask_shift', 'reward_length',
                                      'lr_schedule_step'}


def test_plan_filters_faults_and_modes():
  specs = faultbench.plan('full', [2], ['healthy', 'adv_sign_flip', 'resume'], ['warn'])
  assert sorted(s['name'] for s in specs) == ['adv_sign_flip-s2-warn', 'healthy-s2-warn',
                                              'resume-s2-warn']
  with pytest.raises(ValueError, match='unknown'):
    faultbench.plan('full', [2], ['no_such_fault'])
