"""End-to-end runs of the RL loop: learning on an easy reward, exact resume, run-complete."""
import json
import os
import re
import sys

import jax
import numpy as np
import pytest

from compile_log import assert_compiled_once, programs_compiled
from configs import grpo_arith
from rft_jax import runs, trainer
from rft_jax.telemetry.sinks import read_jsonl
from test_ppo_recipe import check_documented

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:   # reward_fixtures registers test-only verifiers
  sys.path.insert(0, _TESTS_DIR)
import reward_fixtures  # noqa: E402,F401  pylint: disable=g-import-not-at-top,unused-import


def tiny_config(**overrides):
  config = grpo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0     # inline scoring: no worker start-up in short tests
  config.update_from_flattened_dict(overrides)   # {'train.steps': 4, ...}
  return config


def train_rows(workdir):
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


def test_reward_rises_on_an_easy_task(tmp_path):
  """Reward = completion length in characters: GRPO must learn to answer longer within 16 steps."""
  config = tiny_config(**{'train.steps': 16, 'train.eval_every': 16, 'train.ckpt_every': 16,
                          'rollout.prompts_per_step': 8, 'optim.lr': 1e-3,
                          'optim.warmup_steps': 1, 'algo.kl_coef': 0.0})
  config.rewards.weights = {'test_length': 1.0}
  trainer.run(config, str(tmp_path))
  rows = train_rows(str(tmp_path))
  rewards = np.array([rows[s]['reward/mean'] for s in range(1, 17)])
  first, last = rewards[:4].mean(), rewards[-4:].mean()
  assert last > first + 0.5, (first, last, rewards)
  lengths = np.array([rows[s]['response/len_mean'] for s in range(1, 17)])
  assert lengths[-4:].mean() > lengths[:4].mean()


def test_resume_continues_exactly(tmp_path):
  """Stopping after step 2 and resuming gives the same metrics at steps 3..5 as one run."""
  keys = ('reward/mean', 'loss', 'kl', 'entropy', 'grad_norm', 'response/len_mean',
          'compute/flops_cumulative')
  full_dir, split_dir = str(tmp_path / 'full'), str(tmp_path / 'split')
  trainer.run(tiny_config(**{'train.steps': 5, 'train.ckpt_every': 2}), full_dir)
  trainer.run(tiny_config(**{'train.steps': 2, 'train.ckpt_every': 2}), split_dir)
  trainer.run(tiny_config(**{'train.steps': 5, 'train.ckpt_every': 2}), split_dir)
  full, split = train_rows(full_dir), train_rows(split_dir)
  assert sorted(split) == [1, 2, 3, 4, 5]
  for step in (3, 4, 5):
    for k in keys:
      np.testing.assert_allclose(split[step][k], full[step][k], rtol=1e-5, atol=1e-7,
                                 err_msg=f'{k} at step {step}')
  summaries = []
  for d in (full_dir, split_dir):
    with open(os.path.join(d, 'summary.json')) as f:
      summaries.append(json.load(f))
  assert summaries[1]['steps'] == 5
  # Compute accounting: the cumulative FLOPs are the running sum of the per-step estimates,
  # each from the step's own mean completion length.
  from rft_jax.telemetry import flops  # pylint: disable=g-import-not-at-top
  per_step = [flops.step_flops_from_config(tiny_config(), full[s]['response/len_mean'])['total']
              for s in range(1, 6)]
  np.testing.assert_allclose([full[s]['compute/flops_step'] for s in range(1, 6)], per_step,
                             rtol=1e-9)
  np.testing.assert_allclose([full[s]['compute/flops_cumulative'] for s in range(1, 6)],
                             np.cumsum(per_step), rtol=1e-9)
  for k in ('base_greedy_acc', 'final_greedy_acc', 'final_mean@2_acc'):
    assert summaries[1][k] == summaries[0][k], k


def test_second_invocation_reports_complete(tmp_path, capsys):
  config = tiny_config(**{'train.steps': 2, 'train.ckpt_every': 2})
  first = trainer.run(config, str(tmp_path))
  capsys.readouterr()
  config.telemetry.console = True
  second = trainer.run(config, str(tmp_path))
  out = capsys.readouterr().out   # the console's plain lines (not a terminal)
  assert 'already complete' in out and 'run summary' in out
  assert not [l for l in out.splitlines() if l.startswith('step ')], out   # no step 2/2 again
  assert second == first                          # the same summary, incidents included
  assert list(second) == list(first)              # in the same order (the console's table)
  assert second['steps'] == 2
  messages = read_jsonl(os.path.join(str(tmp_path), 'metrics.jsonl'), kind='message')
  assert any('already complete' in m['text'] for m in messages)
  # The tiny recipe's monitor.warmup (10) outlasts its 2 steps: said once, at the start of
  # the run that trained, not again by the invocation that found it complete.
  assert [m['step'] for m in messages
          if m['text'].startswith('warning: config.monitor.warmup=10 >= config.train.steps=2: ')
          ] == [0]
  assert len(train_rows(str(tmp_path))) == 2     # nothing was trained again
  for name in ('summary.json', 'metrics.jsonl', 'run.png'):
    assert os.path.exists(os.path.join(str(tmp_path), name)), name
  # A torn summary.json (a write cut by power loss, an edit): said, rebuilt from the
  # checkpoint's record (was a JSONDecodeError traceback on every later invocation).
  with open(os.path.join(str(tmp_path), 'summary.json'), 'w') as f:
    f.write('{"recipe": ')
  third = trainer.run(config, str(tmp_path))
  assert 'summary.json: not valid JSON (' in capsys.readouterr().out
  rebuilt = lambda s: {k: v for k, v in s.items() if k != 'wall_s'}
  assert rebuilt(third) == rebuilt(first) and list(third) == list(first)   # incidents too (0)
  with open(os.path.join(str(tmp_path), 'summary.json')) as f:
    assert json.load(f) == third
  # Rebuilt, 'incidents' counts incidents.jsonl's (it lacked the key); with the monitor off
  # and no file, null as a live run writes it.
  torn = lambda: (tmp_path / 'summary.json').write_text('{"recipe": ')
  torn()
  (tmp_path / 'incidents.jsonl').write_text(
      json.dumps({'step': 2, 'kind': 'incident'}) + '\n' + json.dumps({'step': 2, 'kind': 'action'})
      + '\n')
  assert trainer.run(config, str(tmp_path))['incidents'] == 1
  torn()
  (tmp_path / 'incidents.jsonl').unlink()
  config.monitor.mode = 'off'
  assert trainer.run(config, str(tmp_path))['incidents'] is None
  # A summary.json of an earlier step (an extension of the finished run cut short after its
  # checkpoint) is not printed as the finished run's: said, rebuilt (was printed as is).
  (tmp_path / 'summary.json').write_text(json.dumps({**first, 'steps': 1}))
  capsys.readouterr()
  assert trainer.run(config, str(tmp_path))['steps'] == 2
  assert "summary.json is of step 1, the checkpoint's 2" in capsys.readouterr().out


def test_a_run_without_the_monitor_does_not_report_0_incidents(tmp_path, capsys):
  """monitor.mode='off': summary.json's incidents is null (the monitor did not run; 0 read as
  a healthy run), and the console's summary table says 'monitor off'."""
  config = tiny_config(**{'train.steps': 1, 'train.eval_every': 1, 'monitor.mode': 'off'})
  config.telemetry.console = True
  summary = trainer.run(config, str(tmp_path))
  assert 'incidents' in summary and summary['incidents'] is None
  with open(os.path.join(str(tmp_path), 'summary.json')) as f:
    assert json.load(f)['incidents'] is None
  [row] = [l for l in capsys.readouterr().out.splitlines() if 'incidents' in l]
  assert 'monitor off' in row, row


def test_a_run_records_its_recipes_variant(tmp_path):
  """config.name is 'grpo_arith' for the full recipe and its :tiny variant alike, and the
  variant was recorded nowhere (tools.scaling warned that it was unknown when it counted a
  log's FLOPs from the recipe). Now config.json, summary.json and the log's start record say it."""
  config = tiny_config(**{'train.steps': 1, 'train.eval_every': 1, 'monitor.mode': 'off'})
  assert trainer.run(config, str(tmp_path))['variant'] == 'tiny'
  for name in ('config.json', 'summary.json'):
    assert json.loads((tmp_path / name).read_text())['variant'] == 'tiny', name
  [start] = read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='start')
  assert start['config']['recipe'] == 'grpo_arith' and start['config']['variant'] == 'tiny'


def test_a_truncated_sampler_is_announced_and_shows_in_the_mismatch_metric(tmp_path):
  """top_k / top_p: the run says at start-up that the update scores under the full softmax, and
  the gap it names (mismatch/k3: exp(d) - d - 1, d = trainer - sampler log-prob) is far above
  the numerical noise of an untruncated run (measured: 6.4e-3 here, 0.0 without the filter)."""
  config = tiny_config(**{'train.steps': 1, 'train.ckpt_every': 1, 'rollout.top_k': 8,
                          'rollout.top_p': 0.5})
  trainer.run(config, str(tmp_path))
  messages = [m['text'] for m in read_jsonl(os.path.join(str(tmp_path), 'metrics.jsonl'),
                                            kind='message')]
  assert any(m.startswith('rollout.top_k=8, rollout.top_p=0.5: completions are sampled from '
                          'the truncated distribution') for m in messages), messages
  [row] = train_rows(str(tmp_path)).values()
  assert row['mismatch/k3'] > 1e-3, row['mismatch/k3']
  check_documented(row)   # every GRPO metric (credit/* were not) is in the README's table


def test_no_recompilation_after_the_first_step(tmp_path, caplog):
  """Every jitted piece of the loop compiles once: later steps reuse the executables."""
  config = tiny_config(**{'train.steps': 4, 'train.eval_every': 100, 'train.ckpt_every': 100})
  assert_compiled_once(lambda: trainer.run(config, str(tmp_path)), caplog)


def test_a_broken_verifier_stops_the_run_naming_it(tmp_path):
  config = tiny_config(**{'train.steps': 3})
  config.rewards.weights = {'correct': 1.0, 'test_broken_key': 0.5}
  with pytest.raises(trainer.TrainingError) as info:
    trainer.run(config, str(tmp_path))
  msg = str(info.value)
  assert 'reward failure at step 1: 100% of samples unscored' in msg
  assert "verifier 'test_broken_key'" in msg and 'KeyError' in msg
  assert not os.path.exists(tmp_path / 'checkpoints' / '1')   # nothing learned from it is saved


def test_a_prompt_too_long_for_the_config_is_a_setup_error_naming_the_record(tmp_path):
  from rft_jax import components  # pylint: disable=g-import-not-at-top
  with pytest.raises(components.SetupError, match=r'^arith train split: record id=\d+: its '
                     r'prompt is \d+ tokens, more than config.task.max_prompt_len=4 '):
    trainer.run(tiny_config(**{'task.max_prompt_len': 4}), str(tmp_path))


def test_a_verifier_hanging_on_5_percent_of_samples_costs_only_those_samples(tmp_path):
  """Same recipe twice: once healthy, once with a verifier (weight 0) that hangs on a random 5%
  of samples. The hung samples time out, are counted and left out; the run finishes and learns
  as much as the healthy one."""
  overrides = {'train.steps': 16, 'train.eval_every': 16, 'train.ckpt_every': 16,
               'rollout.prompts_per_step': 8, 'optim.lr': 1e-3, 'optim.warmup_steps': 1,
               'algo.kl_coef': 0.0, 'rewards.timeout_s': 0.3, 'rewards.num_workers': 2}
  runs = {}
  for name, weights in (('healthy', {'test_length': 1.0}),
                        ('hanging', {'test_length': 1.0, 'test_hangs_on_5_percent': 0.0})):
    config = tiny_config(**overrides)
    config.rewards.weights = weights
    trainer.run(config, str(tmp_path / name))
    runs[name] = train_rows(str(tmp_path / name))
  hanging, healthy = runs['hanging'], runs['healthy']
  assert sorted(hanging) == list(range(1, 17))
  samples = 16 * 8 * 4
  timeouts = sum(r['reward/timeouts/test_hangs_on_5_percent'] for r in hanging.values())
  assert 0.01 * samples <= timeouts <= 0.12 * samples, timeouts
  invalid = np.mean([r['reward/invalid_frac'] for r in hanging.values()])
  np.testing.assert_allclose(invalid, timeouts / samples, rtol=1e-6)
  assert sum(r['reward/errors/test_hangs_on_5_percent'] for r in hanging.values()) == 0
  gain = lambda rows: (np.mean([rows[s]['reward/mean'] for s in range(13, 17)]) -
                       np.mean([rows[s]['reward/mean'] for s in range(1, 5)]))
  assert gain(healthy) > 0.5 and gain(hanging) > 0.5, (gain(healthy), gain(hanging))
  assert abs(gain(hanging) - gain(healthy)) < 0.5 * gain(healthy), (gain(healthy),
                                                                     gain(hanging))


@pytest.mark.filterwarnings('error::pytest.PytestUnraisableExceptionWarning')
def test_resume_skips_a_checkpoint_that_fails_to_restore(tmp_path):
  """The newest checkpoint has lost its manifest *and* a file is truncated: restoring it fails,
  so it is quarantined, the run resumes from the one before and says so in one line (orbax's
  failed reads had printed a traceback each, ~8,000 lines on stderr)."""
  workdir = str(tmp_path)
  trainer.run(tiny_config(**{'train.steps': 4, 'train.ckpt_every': 2}), workdir)
  step_dir = os.path.join(workdir, 'checkpoints', '4')
  os.remove(os.path.join(step_dir, 'rft_manifest.json'))
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, 'state'))
           for f in fs]
  victim = max(files, key=os.path.getsize)
  with open(victim, 'r+b') as f:
    f.truncate(os.path.getsize(victim) // 3)
  trainer.run(tiny_config(**{'train.steps': 6, 'train.ckpt_every': 2}), workdir)
  messages = [r['text'] for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'),
                                            kind='message')]
  unusable = [m for m in messages if m.startswith('checkpoint 4 is unusable (restore failed:')]
  assert len(unusable) == 1 and 'TensorStore details' not in unusable[0], messages
  assert 'resumed from checkpoint at step 2' in messages
  assert sorted(train_rows(workdir)) == [1, 2, 3, 4, 5, 6]
  assert len(os.listdir(os.path.join(workdir, 'checkpoints.quarantine'))) == 1


def test_a_workdir_refuses_another_recipe_or_model_and_keeps_its_checkpoints(tmp_path):
  """config.json records the run's config: another recipe or model is a one-line SetupError
  before any checkpoint is touched; train.steps and compute options may change. Without
  config.json (an older workdir) a checkpoint that restores with the wrong shapes is reported
  as not fitting this config, never set aside as unusable."""
  from configs import ppo_arith   # pylint: disable=g-import-not-at-top
  from rft_jax import components   # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path)
  trainer.run(tiny_config(**{'train.steps': 2, 'train.ckpt_every': 2}), workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['name'] == 'grpo_arith'
  ppo = ppo_arith.get_config('tiny')
  with pytest.raises(components.SetupError, match=r"^config.name='ppo_arith' does not match the "
                     r"run in .* \('grpo_arith' in its config.json\)"):
    trainer.run(ppo, workdir)
  wider = tiny_config(**{'train.steps': 3, 'model.intermediate_size': 96, 'init_from': ''})
  with pytest.raises(components.SetupError, match=r'^config.model.intermediate_size=96 does not'):
    trainer.run(wider, workdir)
  for name in ('config.json', 'initial_policy.json'):   # as an older rft_jax left it
    os.remove(os.path.join(workdir, name))
  with pytest.raises(components.SetupError, match=r'^checkpoint 2 in .* does not fit this config'):
    trainer.run(wider, workdir)
  assert os.listdir(os.path.join(workdir, 'checkpoints')) == ['2']
  assert not os.path.exists(os.path.join(workdir, 'checkpoints.quarantine'))
  trainer.run(tiny_config(**{'train.steps': 3, 'train.ckpt_every': 3, 'model.remat': 'full'}),
              workdir)   # longer, with a compute option changed: resumes
  assert sorted(train_rows(workdir)) == [1, 2, 3]


def test_a_malformed_record_in_the_stream_stops_with_one_line():
  """runs.next_batch, used by the RL, SFT and DPO loops: the pipeline's ValueError naming the
  record becomes a TrainingError (exit 1) of one line instead of a traceback through grain."""
  from rft_jax import runs   # pylint: disable=g-import-not-at-top

  def records():
    yield {'ok': 1}
    raise ValueError("record id=7: answer '133' is 4 tokens (with EOS) > answer_len=1")
  data_it = records()
  assert runs.next_batch(data_it, 1) == {'ok': 1}
  with pytest.raises(runs.TrainingError, match=r"^bad input data at step 2: record id=7: answer "
                     r"'133' is 4 tokens \(with EOS\) > answer_len=1 \(config.task.bad_records"):
    runs.next_batch(data_it, 2)


def test_device_controls_are_host_float32_and_place_without_compiling():
  """A step's TrainState.controls are NumPy float32 scalars, an injected fault applied: placing
  them compiles nothing (eager jnp.float32 compiled a program at a run's set-up)."""
  config = tiny_config()
  config.faults = [{'type': 'lr_spike', 'onset_step': 1, 'duration': 1, 'strength': 4.0}]
  controls = trainer.Controls(0.5, 0.04, 0.7)
  got = trainer.device_controls(controls, config, 1)
  assert got == {'lr_scale': 2.0, 'kl_coef': np.float32(0.04), 'temperature': np.float32(0.7)}
  assert all(type(v) is np.float32 for v in got.values())
  assert programs_compiled(
      lambda: jax.device_put(trainer.device_controls(controls, config, 1))) == []


def test_updates_per_step_counts_epochs_and_minibatches():
  """summary.json's optim_updates = steps x updates per step (PPO: epochs x mini-batches)."""
  from configs import dpo_arith, ppo_arith, sft_arith  # pylint: disable=g-import-not-at-top
  assert runs.updates_per_step(tiny_config()) == tiny_config().algo.updates_per_batch
  ppo = ppo_arith.get_config('tiny')
  ppo.algo.updates_per_batch, ppo.algo.minibatches = 3, 2
  assert runs.updates_per_step(ppo) == 6
  assert runs.updates_per_step(sft_arith.get_config('tiny')) == 1
  assert runs.updates_per_step(dpo_arith.get_config('tiny')) == 1


def test_resuming_an_unfinished_run_at_its_checkpoint_step_finishes_it(tmp_path):
  """A run stopped after its step-2 checkpoint (here: later checkpoints removed), resumed with
  train.steps=2, evaluates and finishes (was: KeyError 'final_eval'); below the checkpoint's
  step it is a one-line setup error."""
  import shutil  # pylint: disable=g-import-not-at-top
  from rft_jax import components  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  trainer.run(tiny_config(**{'train.steps': 4, 'train.ckpt_every': 2}), workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '4'))
  os.remove(os.path.join(workdir, 'summary.json'))
  shutil.copytree(workdir, str(tmp_path / 'copy'))
  summary = trainer.run(tiny_config(**{'train.steps': 2, 'train.ckpt_every': 2}), workdir)
  assert summary['steps'] == 2 and 0.0 <= summary['final_greedy_acc'] <= 1.0
  with pytest.raises(components.SetupError, match=r'config.train.steps=1 is below the step of '
                                                  r'the unfinished run .* \(checkpoint 2\)'):
    trainer.run(tiny_config(**{'train.steps': 1}), str(tmp_path / 'copy'))


def test_sft_stops_on_non_finite_parameters(tmp_path):
  """SFT with an absurd learning rate: the run stops with the last good checkpoint (it used to
  train on with every update skipped and finish at 0% accuracy)."""
  from configs import sft_arith  # pylint: disable=g-import-not-at-top
  from rft_jax import sft  # pylint: disable=g-import-not-at-top
  config = sft_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.update_from_flattened_dict({'train.steps': 6, 'train.ckpt_every': 1,
                                     'optim.lr': 1e25, 'optim.warmup_steps': 0})
  with pytest.raises(runs.TrainingError, match='no longer finite|non-finite') as stopped:
    sft.run(config, str(tmp_path))
  assert os.path.exists(tmp_path / 'run.png')   # the steps it ran, drawn on the way out
  # The failing step is logged before the run stops (as GRPO does): its values show the cause.
  bad_step = int(re.search(r'(?:after|at) step (\d+)', str(stopped.value)).group(1))
  last = read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='train')[-1]
  assert last['step'] == bad_step
  assert not all(np.isfinite(last[k]) for k in ('loss', 'grad_norm', 'param_norm')), last


def test_a_plot_that_cannot_be_written_does_not_fail_a_finished_run(tmp_path, monkeypatch):
  def full_disk(*args, **kwargs):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(runs, 'plot_run', full_disk)
  summary = trainer.run(tiny_config(**{'train.steps': 1}), str(tmp_path))
  assert summary['steps'] == 1 and os.path.exists(tmp_path / 'summary.json')
  messages = [m['text'] for m in read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='message')]
  assert any(m.startswith(f'run.png not drawn ({tmp_path / "run.png"}): OSError') for m in messages)


def test_sft_logs_its_base_eval_at_step_0(tmp_path):
  """The SFT loop evaluated the starting policy (summary.json's base_*_acc) but neither printed
  nor logged it, unlike the RL and DPO loops: no 'eval @ step 0' line, no step-0 eval record in
  metrics.jsonl (so none in run.png or api.Run.evals)."""
  from configs import sft_arith  # pylint: disable=g-import-not-at-top
  from rft_jax import sft  # pylint: disable=g-import-not-at-top
  config = sft_arith.get_config('tiny')
  config.telemetry.tensorboard = False
  config.train.steps = 1
  summary = sft.run(config, str(tmp_path))
  first = read_jsonl(str(tmp_path / 'metrics.jsonl'), kind='eval')[0]
  assert first['step'] == 0 and first['eval/base_greedy_acc'] == summary['base_greedy_acc']


def test_rerunning_a_finished_run_keeps_the_config_it_trained_with(tmp_path):
  """A finished run invoked again trains nothing (it prints its summary) but used to rewrite
  config.json with that invocation's config: train.steps=1 or another learning rate were then
  recorded (and read by api.open_run and tools.scaling) for a run trained with others."""
  workdir = str(tmp_path)
  trainer.run(tiny_config(**{'train.steps': 2}), workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    trained = json.load(f)
  summary = trainer.run(tiny_config(**{'train.steps': 1, 'optim.lr': 1e-6}), workdir)
  assert summary['steps'] == 2
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f) == trained
