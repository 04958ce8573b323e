"""Scaling fits (rft_jax/scaling) on synthetic curves with known parameters, and tools/scaling."""

import json
import math
import os

import numpy as np
import pytest

from rft_jax import scaling
from rft_jax.scaling import ScalingFitError
from rft_jax.telemetry import flops
from tools import scaling as cli
from configs import grpo_arith

A, B, C_MID, R0 = 0.8, 2.0, 1e16, 0.3
K, E = 0.12, 2.0
SEEDS = 40


def sigmoid_run(seed, reach=4.0, n=40, sd=0.015):
  """n evals equally spaced in compute (as a run's eval steps) up to reach * C_mid."""
  rng = np.random.default_rng(seed)
  c = np.arange(1, n + 1) * C_MID * reach / n
  return c, scaling.sigmoid_curve(c, A, B, C_MID, R0) + rng.normal(0, sd, n)


def covered(interval, value):
  return interval[0] <= value <= interval[1]


def test_sigmoid_recovers_parameters_at_stated_coverage():
  target = 1e17
  truth = {'A': A, 'B': B, 'C_mid': C_MID}
  hits = {k: 0 for k in (*truth, 'prediction')}
  for seed in range(SEEDS):
    c, r = sigmoid_run(seed)
    fit = scaling.fit_sigmoid(c, r, R0=R0, n_boot=300, seed=seed, target_compute=target)
    assert fit.A_identified, fit.A_reason
    for k, v in truth.items():
      hits[k] += covered(fit.intervals[k], v)
    hits['prediction'] += covered(fit.prediction_interval,
                                  scaling.sigmoid_curve(target, A, B, C_MID, R0))
  coverage = {k: v / SEEDS for k, v in hits.items()}
  print('sigmoid 95% interval coverage over', SEEDS, 'seeds:', coverage)
  assert all(v >= 0.85 for v in coverage.values()), coverage


def test_sigmoid_estimates_r0_from_the_base_eval():
  c, r = sigmoid_run(0, sd=0.005)
  fit = scaling.fit_sigmoid(np.r_[0.0, c], np.r_[R0 + 0.003, r], n_boot=200)
  assert fit.R0 == pytest.approx(R0 + 0.003)
  assert fit.A == pytest.approx(A, abs=0.02) and fit.B == pytest.approx(B, rel=0.15)
  assert fit.C_mid == pytest.approx(C_MID, rel=0.1)
  assert np.ptp(fit.boot_r0) > 0   # R0 resampled too
  assert fit.excluded == 5         # C = 0 and the first 10% of compute


@pytest.mark.parametrize('seed', range(3))
def test_identifiability_refuses_before_c_mid_not_after(seed):
  c, r = sigmoid_run(seed, reach=0.6)
  early = scaling.fit_sigmoid(c, r, R0=R0, n_boot=300, seed=seed)
  assert not early.A_identified
  assert 'A is not identified' in early.A_reason and 'C_mid' in early.A_reason
  d = early.to_dict()
  assert d['A'] is None and d['intervals']['A'] is None and d['A_reason'] == early.A_reason
  assert 'not reported' in early.summary()
  c, r = sigmoid_run(seed, reach=4.0)
  late = scaling.fit_sigmoid(c, r, R0=R0, n_boot=300, seed=seed)
  assert late.A_identified and late.A_reason is None
  assert late.to_dict()['A'] == pytest.approx(late.A)


def power_run(seed, n=40, sd=0.03):
  rng = np.random.default_rng(seed)
  c = np.arange(1, n + 1) * 1e15
  return c, 1 - np.exp(E - K * np.log(c) + rng.normal(0, sd, n))


def test_power_law_recovers_k_at_stated_coverage():
  hits_k = hits_e = 0
  for seed in range(SEEDS):
    fit = scaling.fit_power_law(*power_run(seed), n_boot=300, seed=seed)
    hits_k += covered(fit.intervals['k'], K)
    hits_e += covered(fit.intervals['E'], E)
  print('power-law 95% coverage: k', hits_k / SEEDS, 'E', hits_e / SEEDS)
  assert hits_k / SEEDS >= 0.85 and hits_e / SEEDS >= 0.85
  fit = scaling.fit_power_law(*power_run(0, sd=0.005), target_compute=1e18)
  assert fit.k == pytest.approx(K, rel=0.05)
  assert covered(fit.prediction_interval, 1 - math.exp(E - K * math.log(1e18)))


def k_of_n_runs(k_max, n0, sizes, seed=0):
  rng = np.random.default_rng(seed)
  c = np.arange(1, 31) * 1e18
  return {n: (c, 1 - np.exp(-0.3 - k_max * n / (n + n0) * np.log(c / 1e17)
                            + rng.normal(0, 0.02, c.size))) for n in sizes}


def test_k_of_n_recovers_saturation_and_refuses_when_unsaturated():
  fit = scaling.fit_k_of_n(k_of_n_runs(0.2, 3e9, [5e8, 1.5e9, 3e9, 7e9, 1.4e10, 3.2e10]),
                           n_boot=300)
  assert fit.K_max_identified
  assert covered(fit.intervals['K_max'], 0.2) and covered(fit.intervals['N0'], 3e9)
  assert fit.predict_k(3e9) == pytest.approx(0.1, rel=0.1)
  # k still linear in N (all sizes far below N0): the ceiling is not in the data
  small = scaling.fit_k_of_n(k_of_n_runs(2.0, 1e11, [1e8, 3e8, 1e9, 3e9]), n_boot=300)
  assert not small.K_max_identified and 'K_max is not identified' in small.K_max_reason
  print(small.K_max_reason)
  assert small.to_dict()['K_max'] is None
  with pytest.raises(ScalingFitError, match='>= 3 model sizes'):
    scaling.fit_k_of_n(k_of_n_runs(0.2, 3e9, [1e9, 2e9]))


def test_compare_names_the_higher_asymptote_or_says_not_distinguishable():
  c = np.arange(1, 41) * C_MID / 10
  rng = np.random.default_rng(0)
  hi = scaling.fit_sigmoid(c, scaling.sigmoid_curve(c, 0.8, B, C_MID, R0)
                           + rng.normal(0, 0.01, 40), R0=R0, n_boot=300)
  lo = scaling.fit_sigmoid(c, scaling.sigmoid_curve(c, 0.7, B, C_MID, R0)
                           + rng.normal(0, 0.01, 40), R0=R0, n_boot=300, seed=1)
  same = scaling.fit_sigmoid(c, scaling.sigmoid_curve(c, 0.8, B, C_MID, R0)
                             + rng.normal(0, 0.01, 40), R0=R0, n_boot=300, seed=2)
  result = scaling.compare(hi, lo, names=('x', 'y'))
  assert result['params']['A']['verdict'] == 'x higher'
  assert result['params']['A']['interval'][0] > 0
  assert scaling.compare(lo, hi)['params']['A']['verdict'] == 'b higher'
  assert scaling.compare(hi, same)['params']['A']['verdict'] == 'not distinguishable'
  assert set(result['params']) == {'A', 'B', 'C_mid'} and len(result['text']) == 3
  early = scaling.fit_sigmoid(*sigmoid_run(0, reach=0.6), R0=R0, n_boot=200)
  assert scaling.compare(hi, early)['params']['A']['verdict'] == 'not compared'
  pa = scaling.fit_power_law(*power_run(0), n_boot=200)
  assert set(scaling.compare(pa, pa)['params']) == {'k', 'E'}
  with pytest.raises(ScalingFitError, match='cannot compare'):
    scaling.compare(hi, pa)


@pytest.mark.parametrize('fn, compute, values, message', [
    ('sigmoid', [1, 2, 3], [0.1, 0.2, 0.3], 'need at least 5 for 3 parameters'),
    ('power', [1, 2, 3], [0.1, 0.2, 0.3], 'need at least 4 for 2 parameters'),
    ('sigmoid', np.arange(1, 11), np.full(10, 0.5), 'constant'),
    ('power', np.arange(1, 11), np.full(10, 0.5), 'constant'),
    ('sigmoid', np.arange(1, 11), [0.1] * 5 + [math.nan] + [0.2] * 4, 'not finite'),
    ('power', [1, 2, math.inf, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5], 'not finite'),
    ('sigmoid', np.arange(1, 11), np.linspace(0, 1, 9), 'compute has 10 points'),
    ('power', np.arange(1, 11), np.linspace(0.1, 1.0, 10), 'outside \\[0, 1\\)'),
    ('sigmoid', np.ones((3, 4)), np.ones((3, 4)), '1-D'),
    ('sigmoid', [-1, 2, 3, 4, 5, 6], np.linspace(0, 1, 6), '>= 0'),
    ('sigmoid', ['a', 'b'], [1, 2], 'must be numbers'),
])
def test_malformed_input_says_why(fn, compute, values, message):
  fit = scaling.fit_sigmoid if fn == 'sigmoid' else scaling.fit_power_law
  with pytest.raises(ValueError, match=message):
    fit(compute, values, n_boot=20)


def test_bad_options_say_why():
  c, r = sigmoid_run(0)
  with pytest.raises(ScalingFitError, match='exclude_first'):
    scaling.fit_sigmoid(c, r, exclude_first=1.0)
  with pytest.raises(ScalingFitError, match='level'):
    scaling.fit_sigmoid(c, r, level=95)
  with pytest.raises(ScalingFitError, match='target_compute'):
    scaling.fit_sigmoid(c, r, target_compute=-1, n_boot=20)
  with pytest.raises(ScalingFitError, match='upper=0.3: below the largest value fitted'):
    scaling.fit_sigmoid(c, r, upper=0.3, n_boot=20)   # was a silent misfit under the bound
  for fit in (scaling.fit_sigmoid, scaling.fit_power_law):   # 0 raised IndexError, 1 gave a
    for n_boot in (0, 1, 19):                                # zero-width "identified" interval
      with pytest.raises(ScalingFitError, match=f'n_boot must be an integer >= 20.*{n_boot}'):
        fit(c, np.clip(r, 0, 0.99), n_boot=n_boot)


def test_degenerate_runs_are_refused_and_accuracy_bands_stay_in_0_1():
  rng = np.random.default_rng(0)
  same = np.full(10, 1e15)   # one compute value: nothing to fit against
  for fit in (scaling.fit_sigmoid, scaling.fit_power_law):
    with pytest.raises(ScalingFitError, match='compute is constant'):
      fit(same, np.linspace(0.1, 0.5, 10), n_boot=50)
  c = np.geomspace(1e14, 1e16, 12)
  falling = np.clip(0.6 - 0.25 * np.log10(c / 1e14) + rng.normal(0, 0.02, c.size), 0.01, 1)
  with pytest.raises(ScalingFitError, match='does not rise with compute'):
    scaling.fit_power_law(c, falling, n_boot=50)
  fit = scaling.fit_sigmoid(c, falling, n_boot=200, target_compute=1e18)
  assert fit.A >= 0 and fit.prediction_interval[0] >= 0, (fit.A, fit.prediction_interval)
  lo, _ = fit.band(np.geomspace(1e14, 1e18, 20))
  assert (lo >= 0).all()


def test_plan_group_size_rises_then_saturates():
  plans = [scaling.plan(b, 1.5e9) for b in np.logspace(17, 23, 13)]
  sizes = [p.group_size for p in plans]
  assert sizes == sorted(sizes) and sizes[0] < sizes[-1] == sizes[-2] == 64
  for p in plans:
    assert p.steps >= 50
    assert p.group_size * p.prompts_per_step * p.steps <= p.total_rollouts * 1.0001
  assert any('heuristic' in a.lower() for a in plans[0].assumptions)
  with pytest.raises(ScalingFitError, match='affords'):
    scaling.plan(1e12, 1.5e9)


def write_run(workdir, *, evals=20, every=5, with_flops=True, flops_per_step=1e14, sd=0.01):
  """A metrics.jsonl as the trainer writes it, evals on a sigmoid in compute."""
  os.makedirs(workdir, exist_ok=True)
  rng = np.random.default_rng(0)
  lines = [{'step': 0, 'kind': 'start', 'total_steps': evals * every,
            'config': {'recipe': 'grpo_arith', 'params': '789,888'}},
           {'step': 0, 'kind': 'eval', 'eval/base_greedy_acc': R0, 'eval/base_mean@8_acc': R0}]
  for step in range(1, evals * every + 1):
    rec = {'step': step, 'kind': 'train', 'reward/mean': 0.5, 'response/len_mean': 3.0}
    if with_flops:
      rec['compute/flops_cumulative'] = step * flops_per_step
    lines.append(rec)
    if step % every == 0:
      acc = scaling.sigmoid_curve(step * 1e14, A, B, every * evals * 1e14 / 4, R0)
      lines.append({'step': step, 'kind': 'eval', 'eval/greedy_acc': acc,
                    'eval/mean@8_acc': float(acc + rng.normal(0, sd))})
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(line) + '\n' for line in lines))


def test_cli_fit_writes_json_and_png(tmp_path, capsys):
  write_run(tmp_path / 'run_a')
  write_run(tmp_path / 'run_b', sd=0.02)
  out = tmp_path / 'out'
  rc = cli.main(['fit', str(tmp_path / 'run_a'), str(tmp_path / 'run_b'), '--out', str(out),
                 '--n-boot', '200', '--target-compute', '1e17', '--model', 'both'])
  assert rc == 0, capsys.readouterr().err
  doc = json.loads((out / 'scaling_fit.json').read_text())
  run = doc['runs'][0]
  assert run['metric'] == 'eval/mean@8_acc' and run['R0'] == R0
  assert run['compute_source'] == 'logged compute/flops_cumulative'
  assert run['points']['compute'][:2] == [5e14, 1e15]
  assert run['sigmoid']['A_identified'] and abs(run['sigmoid']['A'] - A) < 0.05
  assert run['sigmoid']['prediction_interval'][0] <= run['sigmoid']['prediction']
  assert 'k' in run['power_law']
  assert doc['comparisons'] and doc['comparisons'][0]['kind'] == 'sigmoid'
  png = (out / 'scaling_fit.png').read_bytes()
  assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000
  assert 'A     =' in capsys.readouterr().out


def test_cli_fit_computes_flops_from_the_config_when_not_logged(tmp_path, capsys):
  write_run(tmp_path / 'run', with_flops=False)
  rc = cli.main(['fit', str(tmp_path / 'run'), '--config', 'configs/grpo_arith.py', '--n-boot',
                 '50'])
  assert rc == 0, capsys.readouterr().err
  doc = json.loads((tmp_path / 'run' / 'scaling' / 'scaling_fit.json').read_text())
  per_step = flops.step_flops_from_config(grpo_arith.get_config(), 3.0)['total']
  assert doc['runs'][0]['points']['compute'][0] == pytest.approx(5 * per_step)
  assert 'step_flops from configs/grpo_arith.py' in doc['runs'][0]['compute_source']


def test_cli_fit_computes_flops_from_the_runs_own_config(tmp_path, capsys):
  """Without --config, the run's config.json (its variant and overrides), not the base
  recipe named in the log (16x the FLOPs of a :tiny run)."""
  write_run(tmp_path / 'run', with_flops=False)
  tiny = grpo_arith.get_config('tiny')
  (tmp_path / 'run' / 'config.json').write_text(json.dumps(tiny.to_dict()))
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '50']) == 0, (
      capsys.readouterr().err)
  doc = json.loads((tmp_path / 'run' / 'scaling' / 'scaling_fit.json').read_text())
  per_step = flops.step_flops_from_config(tiny, 3.0)['total']
  assert doc['runs'][0]['points']['compute'][0] == pytest.approx(5 * per_step)
  assert doc['runs'][0]['compute_source'].endswith('config.json')
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '1']) == 2
  assert 'at least 20 bootstrap replicates' in capsys.readouterr().err


def write_rewound_run(path, *, with_flops=True):
  """metrics.jsonl after an `auto` remediation rewind: train 1..6 with evals at 4 and 6, then
  5..8 again and an eval at 8. The logged cumulative compute counts every train record (1e14
  each), the re-run ones too, as the trainer's step_compute does."""
  lines = [{'step': 0, 'kind': 'start', 'total_steps': 8, 'config': {'recipe': 'grpo_arith'}},
           {'step': 0, 'kind': 'eval', 'eval/base_greedy_acc': 0.1}]
  done = 0
  def train(step):
    nonlocal done
    done += 1
    rec = {'step': step, 'kind': 'train', 'response/len_mean': 3.0}
    if with_flops:
      rec['compute/flops_cumulative'] = done * 1e14
    lines.append(rec)
  for step in range(1, 7):
    train(step)
    if step in (4, 6):
      lines.append({'step': step, 'kind': 'eval', 'eval/greedy_acc': step / 10})
  lines.append({'step': 6, 'kind': 'incident', 'fault_class': 'kl_explosion', 'onset_step': 5})
  for step in range(5, 9):
    train(step)
  lines.append({'step': 8, 'kind': 'eval', 'eval/greedy_acc': 0.85})
  with open(path, 'w') as f:
    f.write(''.join(json.dumps(line) + '\n' for line in lines))


def test_load_run_fits_the_final_trajectory_at_all_the_compute_spent(tmp_path):
  """After a rewind the abandoned eval (step 6) is not a point; the eval at 8 is at the compute
  of the 10 train steps that ran (1..6, then 5..8 again), logged or summed from the recipe."""
  write_rewound_run(tmp_path / 'metrics.jsonl')
  data = cli.load_run(str(tmp_path / 'metrics.jsonl'), None, None)
  assert data['metric'] == 'eval/greedy_acc' and data['R0'] == 0.1
  assert data['step'] == [4, 8] and data['value'] == [0.4, 0.85]
  assert data['compute'] == [4e14, 10e14]
  write_rewound_run(tmp_path / 'metrics.jsonl', with_flops=False)
  data = cli.load_run(str(tmp_path / 'metrics.jsonl'), None, 'configs/grpo_arith.py')
  per_step = flops.step_flops_from_config(grpo_arith.get_config(), 3.0)['total']
  assert data['step'] == [4, 8] and data['value'] == [0.4, 0.85]
  assert data['compute'] == pytest.approx([4 * per_step, 10 * per_step])


def test_cli_fit_reports_a_short_run_and_a_missing_dir(tmp_path, capsys):
  write_run(tmp_path / 'short', evals=3)
  assert cli.main(['fit', str(tmp_path / 'short')]) == 2
  err = capsys.readouterr()
  assert 'need at least 5' in err.out and 'no run could be fitted' in err.err
  assert cli.main(['fit', str(tmp_path / 'nothing')]) == 2
  assert 'no metrics.jsonl' in capsys.readouterr().err


def test_cli_fit_of_several_runs_exits_1_naming_those_that_failed(tmp_path, capsys):
  """The others' results are printed and written, then one line names the runs that could not
  be fitted, exit 1 (was exit 0 with the error lost in the output)."""
  write_run(tmp_path / 'good')
  write_run(tmp_path / 'short', evals=3)
  rc = cli.main(['fit', str(tmp_path / 'good'), str(tmp_path / 'nothing'), str(tmp_path / 'short'),
                 '--n-boot', '20'])
  out, err = capsys.readouterr()
  assert rc == 1, err
  assert 'A     =' in out and (tmp_path / 'good' / 'scaling' / 'scaling_fit.json').is_file()
  assert err.splitlines()[-1] == (f'error: 2 of 3 runs could not be fitted: {tmp_path}/nothing, '
                                  f'{tmp_path}/short')
  assert cli.main(['fit', str(tmp_path / 'good'), '--n-boot', '20']) == 0


def test_cli_plan_prints_assumptions(capsys):
  assert cli.main(['plan', '--budget', '1e20', '--model-params', '1.5e9']) == 0
  out = capsys.readouterr().out
  assert 'group size' in out and 'assumptions' in out and 'IsoCompute' in out
  assert cli.main(['plan', '--budget', '1e20']) == 2


def test_cli_fit_refuses_an_sft_config_and_a_bad_config_flag(tmp_path, capsys):
  """An SFT run (no rollouts, no logged FLOPs) was an AttributeError traceback; a --config that
  does not load was ignored when the log had its FLOPs."""
  write_run(tmp_path / 'sft', with_flops=False)
  from configs import sft_arith  # pylint: disable=g-import-not-at-top
  (tmp_path / 'sft' / 'config.json').write_text(json.dumps(sft_arith.get_config('tiny').to_dict()))
  assert cli.main(['fit', str(tmp_path / 'sft'), '--n-boot', '50']) == 2
  assert 'sft_arith has none (SFT, DPO)' in capsys.readouterr().err
  write_run(tmp_path / 'run')
  assert cli.main(['fit', str(tmp_path / 'run'), '--config', 'configs/nosuch.py']) == 2
  assert "config file not found: 'configs/nosuch.py'" in capsys.readouterr().err
  # a shipped recipe by name, as rft_jax.main takes it (was 'config file not found')
  assert cli.main(['fit', str(tmp_path / 'run'), '--config', 'grpo_arith:tiny',
                   '--n-boot', '50']) == 0


def test_cli_plan_refuses_a_recipe_without_rollouts(capsys):
  assert cli.main(['plan', '--budget', '1e15', '--config', 'configs/sft_arith.py:tiny']) == 2
  assert 'this recipe has none (SFT, DPO)' in capsys.readouterr().err


@pytest.mark.parametrize('flag,value,said', [('--gen-len', '-3', 'gen_len must be a positive'),
                                             ('--prompt-len', '-300', 'prompt_len must be a')])
def test_cli_plan_refuses_a_negative_length(capsys, flag, value, said):
  """Only prompt_len + gen_len was checked: --gen-len -3 planned rollouts of 253 tokens."""
  assert cli.main(['plan', '--budget', '1e20', '--model-params', '1e9', flag, value]) == 2
  err = capsys.readouterr().err
  assert said in err and err.count('\n') == 1, err


def test_cli_fit_refuses_to_count_an_online_dpo_run_as_rl(tmp_path, capsys):
  """Online DPO has rollouts, so its FLOPs were counted as an RL step's (every completion scored
  and trained, not its one pair per prompt) and fitted, exit 0."""
  write_run(tmp_path / 'dpo', with_flops=False)
  from configs import online_dpo_arith  # pylint: disable=g-import-not-at-top
  (tmp_path / 'dpo' / 'config.json').write_text(
      json.dumps(online_dpo_arith.get_config('tiny').to_dict()))
  assert cli.main(['fit', str(tmp_path / 'dpo'), '--n-boot', '50']) == 2
  assert 'online DPO trains one pair per prompt' in capsys.readouterr().err
