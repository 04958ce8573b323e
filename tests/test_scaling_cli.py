"""tools.scaling fit's account of its input: every eval point counted once with each exclusion
said, --exclude-first checked as a usage error, and FLOPs counted from a guessed recipe said."""
import json
import os

import numpy as np
import pytest

from rft_jax import scaling
from tools import scaling as cli


def write_log(workdir, *, evals=16, every=5, total_steps=None, with_flops=True, variant=None):
  """A metrics.jsonl: the base eval at step 0, then `evals` evals on a noisy sigmoid; the start
  record names the recipe grpo_arith (and `variant`, unless None: a log of before runs recorded
  it)."""
  os.makedirs(workdir, exist_ok=True)
  rng = np.random.default_rng(0)
  steps = evals * every
  lines = [{'step': 0, 'kind': 'start', 'total_steps': total_steps or steps,
            'config': {'recipe': 'grpo_arith',
                       **({} if variant is None else {'variant': variant})}},
           {'step': 0, 'kind': 'eval', 'eval/base_greedy_acc': 0.3}]
  for step in range(1, steps + 1):
    rec = {'step': step, 'kind': 'train', 'response/len_mean': 3.0}
    if with_flops:
      rec['compute/flops_cumulative'] = step * 1e14
    lines.append(rec)
    if step % every == 0:
      acc = scaling.sigmoid_curve(step * 1e14, 0.8, 2.0, steps * 1e14 / 4, 0.3)
      lines.append({'step': step, 'kind': 'eval',
                    'eval/greedy_acc': float(acc + rng.normal(0, 0.01))})
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(line) + '\n' for line in lines))


def test_the_point_counts_agree_and_say_what_is_excluded(tmp_path, capsys):
  """Was '16 eval points', then 'fit on 15 points (2 excluded as the start)': the base eval was
  left out of the first count and called part of the run's start in the second."""
  write_log(tmp_path / 'run')
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20', '--model', 'both']) == 0
  out = capsys.readouterr().out
  assert (f'{tmp_path}/run: 17 eval points of eval/greedy_acc (the base eval at step 0 and 16 '
          'after training), compute from logged') in out, out
  assert ('sigmoid fit on 15 of 17 points (excluded: the base eval at C = 0 (it sets R0); 1 '
          'with C <= 0.1 * max C, the start of the run)') in out, out
  assert ('power-law fit on 15 of 17 points (excluded: the base eval at C = 0 (log C is '
          'undefined there); 1 with C <= 0.1 * max C') in out, out
  doc = json.loads((tmp_path / 'run' / 'scaling' / 'scaling_fit.json').read_text())
  fit = doc['runs'][0]['sigmoid']
  assert (fit['n_points'], fit['n_excluded'], fit['n_excluded_at_zero']) == (15, 2, 1)


@pytest.mark.parametrize('value', ['1.5', '1', '-0.1', 'x', 'nan'])
def test_exclude_first_outside_0_1_is_a_usage_error(tmp_path, capsys, value):
  """It is a fraction of the run's compute; 1.5 was read, then refused run by run ('error:
  exclude_first must be in [0, 1)' under each run, 'no run could be fitted')."""
  write_log(tmp_path / 'run')
  with pytest.raises(SystemExit) as e:
    cli.main(['fit', str(tmp_path / 'run'), '--exclude-first', value])
  err = capsys.readouterr().err
  assert e.value.code == 2 and f"argument --exclude-first: {value!r} is not a fraction in [0, 1)" \
      in err, err
  assert not (tmp_path / 'run' / 'scaling').exists()


def test_flops_from_the_recipe_named_in_the_log_are_said_to_be_a_guess(tmp_path, capsys):
  """Without config.json the FLOPs come from the full recipe (150 steps of 32 prompts x 8),
  though the run may have been its :tiny variant: was said only as 'overrides unknown'."""
  write_log(tmp_path / 'run', with_flops=False, total_steps=4)
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20']) == 0
  err = capsys.readouterr().err
  assert err.startswith(f'warning: {tmp_path}/run: no config.json beside the log, so FLOPs are '
                        'counted from configs/grpo_arith.py, the full recipe named in the log, '
                        'not any variant (e.g. :tiny)'), err
  assert "the log's run had 4 steps, the recipe has 150" in err and '--config' in err
  doc = json.loads((tmp_path / 'run' / 'scaling' / 'scaling_fit.json').read_text())
  assert 'its variant and overrides are unknown' in doc['runs'][0]['compute_source']
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20', '--config',
                   'configs/grpo_arith.py:tiny']) == 0
  assert 'warning' not in capsys.readouterr().err


def test_flops_from_a_log_use_the_variant_it_records(tmp_path, capsys):
  """Runs record their recipe's variant (config.variant, in the start record); the FLOPs of a
  log without its config.json were counted from the full recipe (16x a :tiny run's), with a
  warning that the variant was unknown."""
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry import flops  # pylint: disable=g-import-not-at-top
  write_log(tmp_path / 'run', with_flops=False, total_steps=4, variant='tiny')
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20']) == 0
  assert capsys.readouterr().err == ''
  doc = json.loads((tmp_path / 'run' / 'scaling' / 'scaling_fit.json').read_text())
  per_step = flops.step_flops_from_config(grpo_arith.get_config('tiny'), 3.0)['total']
  assert doc['runs'][0]['points']['compute'][0] == pytest.approx(5 * per_step)
  assert doc['runs'][0]['compute_source'] == (
      'step_flops from configs/grpo_arith.py:tiny (the recipe and variant named in the log; its '
      'overrides are unknown)')
  write_log(tmp_path / 'full', with_flops=False, total_steps=80, variant='')   # the full recipe
  assert cli.main(['fit', str(tmp_path / 'full'), '--n-boot', '20']) == 0
  err = capsys.readouterr().err
  assert err.startswith(f'warning: {tmp_path}/full: no config.json beside the log, so FLOPs are '
                        'counted from configs/grpo_arith.py, the recipe and variant named in the '
                        "log, without any overrides the run used; the log's run had 80 steps, "
                        'the recipe has 150'), err


@pytest.mark.parametrize('variant', ['', 'tiny'])
def test_flops_from_a_log_use_the_recipe_file_it_records(tmp_path, capsys, variant):
  """A run of one's own recipe (a file outside configs/) records its recipe_file; a log without
  its config.json was refused ('no config to compute it from (recipe 'mine')'), as only
  configs/<recipe>.py was looked for. A recipe built on grpo_arith:tiny records variant 'tiny'
  while its own get_config() takes no argument: it is loaded without one."""
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry import flops  # pylint: disable=g-import-not-at-top
  recipe = tmp_path / 'own_data' / 'recipe.py'
  recipe.parent.mkdir()
  recipe.write_text('from configs import grpo_arith\n\n\ndef get_config():\n'
                    "  config = grpo_arith.get_config('tiny')\n  config.name = 'mine'\n"
                    '  return config\n')
  write_log(tmp_path / 'run', with_flops=False, total_steps=4, variant=variant)
  log = tmp_path / 'run' / 'metrics.jsonl'
  lines = log.read_text().splitlines()
  start = json.loads(lines[0])
  start['config'].update(recipe='mine', recipe_file=str(recipe))
  log.write_text('\n'.join([json.dumps(start)] + lines[1:]) + '\n')
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20']) == 0
  assert capsys.readouterr().err == ''
  doc = json.loads((tmp_path / 'run' / 'scaling' / 'scaling_fit.json').read_text())
  per_step = flops.step_flops_from_config(grpo_arith.get_config('tiny'), 3.0)['total']
  assert doc['runs'][0]['points']['compute'][0] == pytest.approx(5 * per_step)
  assert doc['runs'][0]['compute_source'].startswith(f'step_flops from {recipe}')
  recipe.unlink()   # moved since the run: named, with what to do
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20']) == 2
  err = capsys.readouterr().err
  assert f"the recipe file '{recipe}' the log records is not found" in err, err
  assert '--config' in err and 'Traceback' not in err


def test_one_run_named_twice_is_fitted_twice(tmp_path, capsys):
  """Runs were matched to the fitted ones by ==, which compares their fits' arrays: the same
  run given twice ended in 'error: The truth value of an array ... is ambiguous', exit 2,
  after its results were written."""
  write_log(tmp_path / 'run')
  run = str(tmp_path / 'run')
  assert cli.main(['fit', run, run, '--n-boot', '20']) == 0
  captured = capsys.readouterr()
  assert captured.err == '' and f'compare (sigmoid) {run} vs {run}' in captured.out


def test_an_out_that_cannot_be_made_is_one_line(tmp_path, capsys):
  """--out naming a file (or under /proc) was a FileExistsError traceback after the fits."""
  write_log(tmp_path / 'run')
  (tmp_path / 'file').write_text('')
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20', '--out',
                   str(tmp_path / 'file')]) == 2
  err = capsys.readouterr().err
  assert err == f'error: --out={tmp_path}/file: cannot make the directory: File exists\n', err


@pytest.mark.parametrize('text,said', [('garbage\n', "no records at all: not a run's"),
                                       ('', "no records at all: not a run's"),
                                       ('{"step": 1, "kind": "train"}\n', 'no eval records')])
def test_a_log_without_evals_is_said_so(tmp_path, capsys, text, said):
  """A file that is no run's log, or a log with no eval yet, was told to 'pass --metric'."""
  (tmp_path / 'metrics.jsonl').write_text(text)
  assert cli.main(['fit', str(tmp_path / 'metrics.jsonl'), '--n-boot', '20']) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: {tmp_path}/metrics.jsonl: no eval records') and said in err
  assert '--metric' not in err, err


@pytest.mark.parametrize('flag,value,said', [
    ('--target-compute', '0', "'0' is not a positive number of FLOPs"),   # refused run by run
    ('--target-compute', '-1', "'-1' is not a positive number of FLOPs"),
    ('--target-compute', 'inf', "'inf' is not a positive number of FLOPs"),   # JSON error
    ('--upper', 'abc', "'abc' is not a number or 'none'"),   # 'invalid _optional_float value'
    ('--upper', 'nan', "'nan' is not a number or 'none'")])
def test_a_bad_target_or_upper_is_a_usage_error(tmp_path, capsys, flag, value, said):
  write_log(tmp_path / 'run')
  with pytest.raises(SystemExit) as e:
    cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20', flag, value])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(f'error: argument {flag}: {said}'), err
  assert err.count('\n') == 1 and not (tmp_path / 'run' / 'scaling').exists()


def test_a_log_without_a_start_record_says_so(tmp_path, capsys):
  """A log with no start record (cut from a longer one) was refused as 'recipe None'."""
  write_log(tmp_path / 'run', with_flops=False)
  log = tmp_path / 'run' / 'metrics.jsonl'
  log.write_text(''.join(log.read_text().splitlines(keepends=True)[1:]))
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20']) == 2
  err = capsys.readouterr().err
  assert 'the log has no start record naming its recipe); pass --config' in err, err


def test_a_negative_seed_is_a_usage_error(tmp_path, capsys):
  """--seed -1 reached numpy: 'sigmoid: error: expected non-negative integer' under each run,
  then 'no run could be fitted', the flag unnamed."""
  write_log(tmp_path / 'run')
  assert cli.main(['fit', str(tmp_path / 'run'), '--n-boot', '20', '--seed', '-1']) == 2
  assert capsys.readouterr().err == 'error: --seed=-1: must be >= 0\n'
