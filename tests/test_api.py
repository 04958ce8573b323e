"""rft_jax.api with a run: train -> Run, the trained policy, sample and evaluate; choose_mesh.
Recipes, overrides and the README's examples are tested in tests/test_api_recipes.py."""
import json
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from rft_jax import api, components, evaluation
from rft_jax.telemetry import sinks
import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def tiny(**overrides):
  base = {'train.steps': STEPS, 'train.eval_every': STEPS, 'rewards.num_workers': 0,
          'telemetry.tensorboard': False, 'optim.lr': 3e-3, 'optim.warmup_steps': 1}
  return api.load_config('grpo_arith:tiny', {**base, **overrides})


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(the config given to train, that config before training, its Run): one tiny run shared by
  this module's tests."""
  config = tiny()
  before = config.to_dict()
  run = api.train(config, str(tmp_path_factory.mktemp('api') / 'run'), progress=False)
  return config, before, run


@pytest.fixture
def run(trained):
  return trained[2]


# --- Runs ------------------------------------------------------------------------------------

def test_history_is_the_metrics_file(run, tmp_path_factory):
  path = os.path.join(run.workdir, 'metrics.jsonl')
  assert run.history == sinks.read_jsonl(path, kind='train')
  assert [r['step'] for r in run.history] == list(range(1, STEPS + 1))
  assert all(np.isfinite(r['reward/mean']) and 'kl' in r for r in run.history)
  assert [e['step'] for e in run.evals] == [0, STEPS]
  assert 'eval/base_greedy_acc' in run.evals[0] and 'eval/greedy_acc' in run.evals[-1]
  assert run.summary['steps'] == STEPS
  assert run.summary['optim_updates'] == STEPS * run.config.algo.updates_per_batch
  assert run.summary['final_greedy_acc'] == run.evals[-1]['eval/greedy_acc']
  assert run.incidents == [] and run.summary['incidents'] == 0
  steps, values = run.series('loss')
  assert steps == list(range(1, STEPS + 1)) and values == [r['loss'] for r in run.history]
  reopened = api.open_run(run.workdir)
  assert reopened.history == run.history and reopened.summary == run.summary
  # The config comes from the workdir's config.json, so the trained policy loads without it.
  mine, theirs = run.config.to_dict(), reopened.config.to_dict()
  for section, key in (('tokenizer', 'path'), (None, 'init_from'),   # recorded absolute
                       (None, 'recipe_file')):
    holder_mine, holder_theirs = (mine, theirs) if section is None else (mine[section],
                                                                         theirs[section])
    assert holder_theirs[key] == os.path.abspath(holder_mine[key])
    holder_theirs[key] = holder_mine[key]
  assert theirs == mine
  assert reopened.policy.step == STEPS
  for a, b in zip(jax.tree.leaves(reopened.policy.params), jax.tree.leaves(run.policy.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # From another directory (the recorded paths are absolute), with a mesh recorded for more
  # devices than are here (a run finished on 8, opened in a 1-device notebook).
  recorded = os.path.join(run.workdir, 'config.json')
  with open(recorded) as f:
    saved = json.load(f)
  assert os.path.isabs(saved['tokenizer']['path'])
  elsewhere = {**saved, 'mesh': {'data': 2, 'fsdp': 2, 'tensor': 2 * jax.device_count()}}
  with open(recorded, 'w') as f:
    json.dump(elsewhere, f)
  cwd = os.getcwd()
  os.chdir(tmp_path_factory.mktemp('elsewhere'))
  try:
    assert api.open_run(run.workdir).policy.step == STEPS
  finally:
    os.chdir(cwd)
    with open(recorded, 'w') as f:
      json.dump(saved, f)
  # A -1 axis that resolves on another device count to a size the model does not divide
  # (fsdp=-1 -> 6 on 6 devices, hidden_size 128) falls back to data parallelism too.
  with open(recorded, 'w') as f:
    json.dump({**saved, 'mesh': {'data': 1, 'fsdp': -1, 'tensor': 1}}, f)
  try:
    code = ('from rft_jax import api; import sys; '
            'print(api.open_run(sys.argv[1]).policy.step)')
    done = subprocess.run(
        [sys.executable, '-c', code, run.workdir], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
                 XLA_FLAGS=xla_flags.with_cpu_devices(6)), check=False)
    assert done.returncode == 0 and done.stdout.split()[-1] == str(STEPS), done.stderr[-2000:]
  finally:
    with open(recorded, 'w') as f:
      json.dump(saved, f)
  os.rename(os.path.join(run.workdir, 'config.json'), os.path.join(run.workdir, 'c.json'))
  try:   # a workdir of an older rft_jax has none
    with pytest.raises(ValueError, match='without its config'):
      api.open_run(run.workdir).policy  # pylint: disable=pointless-statement
  finally:
    os.rename(os.path.join(run.workdir, 'c.json'), os.path.join(run.workdir, 'config.json'))


def test_recorder_keeps_what_the_jsonl_sink_writes(tmp_path):
  """Where telemetry.jsonl is off, Run reads its records from the Recorder hook instead."""
  jsonl, recorder = sinks.JsonlSink(str(tmp_path / 'm.jsonl')), api.Recorder()
  for hook in (jsonl, recorder):
    hook.on_start(0, 2, {'recipe': 'x'})
    hook.on_eval(0, {'eval/base_greedy_acc': 0.5})
    hook.on_step(1, {'loss': 1.5, 'reward/mean': float('nan')})
    hook.on_message('hello')
    hook.on_incident(2, {'kind': 'incident', 'fault_class': 'kl_explosion', 'evidence': []})
    hook.on_end({'steps': 2})
  jsonl.close()
  want = sinks.read_jsonl(str(tmp_path / 'm.jsonl'))
  assert len(recorder.records) == len(want) == 6
  for have, expected in zip(recorder.records, want):
    assert have.keys() == expected.keys()
    assert all(have[k] == expected[k] or (have[k] != have[k] and expected[k] != expected[k])
               for k in have)


def test_a_rewound_run_reads_as_its_final_trajectory(tmp_path, monkeypatch):
  """metrics.jsonl after an `auto` remediation rewind: train 1..6 with evals at 4 and 6, the
  incident and the restore, then 5..8 again (other values) and an eval at 8. history/evals/
  series are each step once as re-run, the abandoned eval at 6 dropped; records, incidents and
  actions keep the whole log."""
  lines = ([{'step': 0, 'kind': 'start', 'total_steps': 8},
            {'step': 0, 'kind': 'eval', 'eval/base_greedy_acc': 0.1}]
           + [{'step': s, 'kind': 'train', 'loss': 1.0 * s} for s in range(1, 5)]
           + [{'step': 4, 'kind': 'eval', 'eval/greedy_acc': 0.4}]
           + [{'step': s, 'kind': 'train', 'loss': 1.0 * s} for s in (5, 6)]
           + [{'step': 6, 'kind': 'eval', 'eval/greedy_acc': 0.6},
              {'step': 6, 'kind': 'incident', 'fault_class': 'kl_explosion', 'onset_step': 5},
              {'step': 6, 'kind': 'action', 'action': 'lower_lr'},
              {'step': 6, 'kind': 'message', 'text': 'remediation: restored step 4'}]
           + [{'step': s, 'kind': 'train', 'loss': 10.0 * s} for s in (5, 6, 7, 8)]
           + [{'step': 8, 'kind': 'eval', 'eval/greedy_acc': 0.8},
              {'step': 8, 'kind': 'end', 'steps': 8}])
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.write(''.join(json.dumps(line) + '\n' for line in lines))
  run = api.open_run(str(tmp_path))
  want_loss = [1.0, 2.0, 3.0, 4.0, 50.0, 60.0, 70.0, 80.0]
  assert [(r['step'], r['loss']) for r in run.history] == list(zip(range(1, 9), want_loss))
  assert [r['step'] for r in run.evals] == [0, 4, 8]
  assert run.series('loss') == (list(range(1, 9)), want_loss)
  assert run.series('eval/greedy_acc', kind='eval') == ([4, 8], [0.4, 0.8])
  assert [r['step'] for r in run.records if r['kind'] == 'train'] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
  assert [r['step'] for r in run.records if r['kind'] == 'eval'] == [0, 4, 6, 8]
  assert [i['fault_class'] for i in run.incidents] == ['kl_explosion']
  assert [a['action'] for a in run.actions] == ['lower_lr']
  assert run.messages == ['remediation: restored step 4']
  assert run.series('onset_step', kind='incident') == ([6], [5])
  assert 'steps=8, evals=3, incidents=1' in repr(run)
  # A torn summary.json or config.json: a ValueError naming the file and what to do.
  for name, torn in (('summary.json', '{"steps": 8, "final_gr'), ('config.json', '[1, 2]')):
    (tmp_path / name).write_text(torn)
    with pytest.raises(ValueError,
                       match=rf'^{tmp_path}/{name}: (not valid JSON|expected a JSON obj)'):
      api.open_run(str(tmp_path))
    (tmp_path / name).unlink()

  monkeypatch.setenv('HOME', str(tmp_path.parent))   # open_run('~/run') as a notebook writes it
  assert api.open_run(f'~/{tmp_path.name}').workdir == str(tmp_path)


def test_series_of_a_metric_the_run_never_logged_is_a_one_line_error():
  """A typo was an empty series, ([], []). Known names are what the finished run's records of
  that kind logged (abandoned steps included); an eval's 'eval/X' and step 0's 'eval/base_X'
  make each other known; a run with no record of the kind yet has nothing to check against."""
  started = [{'step': 0, 'kind': 'start', 'total_steps': 4},
             {'step': 0, 'kind': 'eval', 'eval/base_greedy_acc': 0.1}]
  run = api.Run(config=None, workdir='/w', summary={}, records=started + [
      {'step': 1, 'kind': 'train', 'loss': 1.0, 'reward/mean': 0.5},
      {'step': 2, 'kind': 'train', 'loss': 2.0, 'reward/mean': 0.6, 'kl_coef': 0.1},
      {'step': 2, 'kind': 'train', 'loss': 3.0, 'reward/mean': 0.7},   # 2 redone: no kl_coef
      {'step': 2, 'kind': 'end'}])
  with pytest.raises(ValueError, match=r"^series: no 'train' record of this run logged 'lsos' "
                                       r"\(did you mean 'loss'\?\)$"):
    run.series('lsos')
  with pytest.raises(ValueError, match=r"^series: no 'train' record of this run logged 'zzz'; "
                                       r"known: kl_coef, loss, reward/mean$"):
    run.series('zzz')
  with pytest.raises(ValueError, match=r"^series: no record kind 'trian' \(did you mean "
                                       r"'train'\?\); kinds: action, end, eval, incident, "):
    run.series('loss', kind='trian')
  assert run.series('loss') == ([1, 2], [1.0, 3.0])
  assert run.series('kl_coef') == ([], [])   # logged by the abandoned step 2 only
  assert run.series('eval/greedy_acc', kind='eval') == ([], [])   # no eval after step 0 yet
  assert run.series('eval/base_greedy_acc', kind='eval') == ([0], [0.1])
  with pytest.raises(ValueError, match=r"logged 'eval/x'; known: eval/base_greedy_acc, "
                                       r"eval/greedy_acc$"):
    run.series('eval/x', kind='eval')
  assert run.series('fault_class', kind='incident') == ([], [])   # no incident at all
  fresh = api.Run(config=None, workdir='/w', summary={}, records=started)
  assert fresh.series('loss') == ([], [])   # before its first step


def test_series_of_a_metric_a_live_run_has_not_logged_yet_is_empty():
  """A run still going logs some metrics only later (scaling/* once the live fit has enough
  evals, a train metric from some step on): reading it, their series raised 'no record of this
  run logged' until then. Until the run ends (an 'end' record after its last 'start': a resumed
  run is going again) such a name gives ([], []); once it has ended, the one-line error."""
  records = [{'step': 0, 'kind': 'start', 'total_steps': 8},
             {'step': 0, 'kind': 'eval', 'eval/base_greedy_acc': 0.1},
             {'step': 1, 'kind': 'train', 'loss': 1.0},
             {'step': 2, 'kind': 'train', 'loss': 0.9, 'late/metric': 3.0},
             {'step': 2, 'kind': 'eval', 'eval/greedy_acc': 0.2}]
  live = api.Run(config=None, workdir='/w', summary={}, records=records)
  assert live.series('scaling/pred_final', kind='eval') == ([], [])
  assert live.series('late/metric') == ([2], [3.0])
  assert live.series('other/metric') == ([], [])
  ended = records + [{'step': 2, 'kind': 'end'}]
  resumed = api.Run(config=None, workdir='/w', summary={}, records=ended + [
      {'step': 2, 'kind': 'start', 'total_steps': 16}])
  assert resumed.series('scaling/pred_final', kind='eval') == ([], [])
  finished = api.Run(config=None, workdir='/w', summary={}, records=ended)
  with pytest.raises(ValueError, match=r"^series: no 'eval' record of this run logged "
                                       r"'scaling/pred_final'; known: "):
    finished.series('scaling/pred_final', kind='eval')


def test_open_run_without_metrics_jsonl_says_what_the_workdir_is(tmp_path):
  """A run trained with telemetry.jsonl=False was 'no metrics.jsonl (not a run directory?)':
  it is a run, without step records on disk; the error names what the workdir does have."""
  with pytest.raises(FileNotFoundError, match=r': no metrics\.jsonl \(not a run directory\?\)$'):
    api.open_run(str(tmp_path))
  (tmp_path / 'config.json').write_text(json.dumps({'name': 'x', 'telemetry': {'jsonl': False}}))
  (tmp_path / 'summary.json').write_text('{"steps": 3}')
  (tmp_path / 'checkpoints').mkdir()
  (tmp_path / 'tb').mkdir()
  with pytest.raises(FileNotFoundError) as e:
    api.open_run(str(tmp_path))
  assert str(e.value) == (
      f'{tmp_path}: no metrics.jsonl: the run was trained with telemetry.jsonl=False, which '
      'keeps no step records on disk; it has summary.json (its summary), checkpoints/ '
      f"(api.load_policy(config, {str(tmp_path)!r}) loads the latest), tb/ (TensorBoard "
      "events); open_run needs telemetry.jsonl=True (api.train's own Run holds its records "
      'in memory)')
  (tmp_path / 'config.json').write_text(json.dumps({'name': 'x', 'telemetry': {'jsonl': True}}))
  with pytest.raises(FileNotFoundError, match=r': no metrics\.jsonl, though the run writes it '
                                              r'\(telemetry\.jsonl=True\): deleted'):
    api.open_run(str(tmp_path))


def test_train_leaves_the_config_alone(trained):
  config, before, run = trained
  assert config.to_dict() == before
  assert config.telemetry.console and not run.config.telemetry.console   # progress=False


def test_an_interrupt_in_a_notebook_says_how_to_resume_there(monkeypatch):
  """Ctrl-C in a notebook (SIGINT at step 1) of a run in a new temporary workdir: Preempted
  names the api.train call that resumes it ('run the same command again' alone would start a
  fresh workdir); the signal handlers are the notebook's again, and that call resumes."""
  config = tiny(**{'train.steps': 2, 'train.eval_every': 2})
  handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  record = api.Recorder.on_step

  def interrupt(self, step, metrics):
    record(self, step, metrics)
    os.kill(os.getpid(), signal.SIGINT)

  monkeypatch.setattr(api.Recorder, 'on_step', interrupt)
  with pytest.raises(api.Preempted) as e:
    api.train(config, progress=False)
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
  resume = re.fullmatch(r"SIGINT after step 1; .*; in Python: api\.train\(config, '(.*)'\) "
                        r'resumes it', str(e.value))
  assert resume, str(e.value)
  monkeypatch.undo()
  run = api.train(config, resume.group(1), progress=False)
  assert [r['step'] for r in run.history] == [1, 2]
  assert 'resumed from checkpoint at step 1' in run.messages


# --- The policy ------------------------------------------------------------------------------

def test_policy_is_the_final_checkpoint(run):
  policy = run.policy
  assert policy.step == STEPS
  base = api.load_policy(run.config)
  assert base.step == 0
  moved = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(policy.params),
                                                 jax.tree.leaves(base.params))]
  assert any(moved), 'the trained policy has the starting params'
  # The trainer's own eval of its final params, computed again from the checkpoint.
  final = {k: v for k, v in run.evals[-1].items() if k.startswith('eval/')}
  assert api.evaluate(policy) == final
  base_eval = {k.replace('eval/base_', 'eval/'): v for k, v in run.evals[0].items()
               if k.startswith('eval/')}
  assert api.evaluate(base) == base_eval


def test_greedy_samples_match_the_evaluator(run):
  policy, config = run.policy, run.config
  c = policy.components
  evaluator = evaluation.Evaluator(
      c.graphdef, c.model_cfg, c.tokenizer, components.eval_batch(c, config),
      max_new_tokens=config.rollout.max_new_tokens, k=config.eval.k,
      temperature=config.eval.temperature, seed=config.seed)
  expected = evaluator.samples(policy.params, n=6)
  greedy = api.sample(policy, [p for p, _, _ in expected], temperature=0.0)
  assert [g[0] for g in greedy] == [completion for _, completion, _ in expected]


def test_sample_shapes_and_seeds(run):
  prompts = ['12+7=', '40-13=', '9*8=']
  out = api.sample(run.policy, prompts, n=5, seed=3)
  assert len(out) == 3 and all(len(group) == 5 for group in out)
  assert all(isinstance(t, str) and re.fullmatch(r'-?\d*', t) for group in out for t in group)
  assert api.sample(run.policy, prompts, n=5, seed=3) == out
  several = [api.sample(run.policy, prompts, n=5, seed=s) for s in range(4, 8)]
  assert any(other != out for other in several), 'the seed changes nothing'
  with pytest.raises(TypeError, match=r"wrap one prompt in a list"):
    api.sample(run.policy, '12+7=')
  with pytest.raises(ValueError, match=r'prompt 0 .* > max_prompt_len=8 '
                                       r'\(config.task.max_prompt_len\)'):
    api.sample(run.policy, ['12345+67890='])


def test_a_trained_policy_loads_though_a_train_prompt_is_too_long(run):
  """load_policy ran the trainers' set-up check of every train prompt against
  task.max_prompt_len: a config that some train prompt outgrows (bad_records='error'; a run of it
  is refused at set-up) refused to load the trained policy, which samples and trains nothing."""
  config = tiny(**{'task.max_prompt_len': 6, 'task.bad_records': 'error'})
  with pytest.raises(api.SetupError, match=r'^arith train split: record id=.* '
                                           r'config.task.max_prompt_len=6'):
    api.validate(config)
  policy = api.load_policy(config, run.workdir)
  assert policy.step == STEPS
  trained = run.policy
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(policy.params),
                                                  jax.tree.leaves(trained.params)))
  out = api.sample(policy, ['1+2=', '9*8='], n=2, temperature=0.0)
  assert all(len(group) == 2 and all(re.fullmatch(r'-?\d*', t) for t in group) for group in out)
  # The held-out prompts are judged on their own: the first is 7 tokens, over this limit.
  with pytest.raises(api.SetupError, match=r'^test split: .*max_prompt_len=6'):
    api.evaluate(policy)


# --- Meshes ----------------------------------------------------------------------------------

def test_choose_mesh_prefers_data_parallel_then_shards():
  from rft_jax.parallel import memory  # pylint: disable=g-import-not-at-top
  config = tiny()
  model_cfg = components.model_config(config)
  est = {shape: memory.estimate_run(config, model_cfg, shape).peak
         for shape in ((8, 1, 1), (1, 8, 1))}
  assert est[(1, 8, 1)] < est[(8, 1, 1)]
  assert api.choose_mesh(config, num_devices=8, device_bytes=None) == dict(data=8, fsdp=1,
                                                                           tensor=1)
  between = int((est[(1, 8, 1)] + est[(8, 1, 1)]) / 2 / 0.9)
  assert api.choose_mesh(config, num_devices=8, device_bytes=between) == dict(data=1, fsdp=8,
                                                                              tensor=1)
  with pytest.raises(api.SetupError, match='no mesh of 8 devices fits'):
    api.choose_mesh(config, num_devices=8, device_bytes=1024)


@pytest.mark.parametrize('recipe, overrides, n, batch_key, micro_key', [
    ('sft_arith', {'sft.batch_size': 12}, 8, 'sft.batch_size', None),
    ('dpo_arith', {'dpo.microbatches': 4}, 32, 'dpo.batch_size', 'dpo.microbatches'),
    ('online_dpo_arith', {'rollout.prompts_per_step': 4}, 8, 'rollout.prompts_per_step',
     'dpo.microbatches')])
def test_choose_mesh_for_sft_and_dpo_splits_their_batch(recipe, overrides, n, batch_key,
                                                        micro_key):
  """SFT and DPO recipes have no algo section (offline ones no rollout): choose_mesh had raised
  AttributeError 'rollout'; online DPO's mesh must split its pairs (prompts_per_step), not the
  rollout rows. Each mesh passes its trainer's check: data*fsdp*microbatches | the batch."""
  assert api.choose_mesh(api.load_config(recipe), num_devices=n) == dict(data=n, fsdp=1,
                                                                         tensor=1)
  config = api.load_config(recipe, overrides)   # data=n does not divide this batch
  section, key = batch_key.split('.')
  batch, micro = config[section][key], config.dpo.microbatches if micro_key else 1
  mesh = api.choose_mesh(config, num_devices=n)
  assert mesh['data'] * mesh['fsdp'] * mesh['tensor'] == n and mesh['data'] < n, mesh
  assert batch % (mesh['data'] * mesh['fsdp'] * micro) == 0, mesh
  with pytest.raises(api.SetupError, match=f'no mesh of {n} devices fits'):
    api.choose_mesh(config, num_devices=n, device_bytes=1024)
  with pytest.raises(api.SetupError, match=rf'no mesh of 7 devices divides the model and the '
                     rf'batch \(config.{batch_key}={batch}\); set config.mesh by hand$'):
    api.choose_mesh(config, num_devices=7)
