"""DPO recipes: the arith pair dataset, reference log-probs computed once, online pair building,
tiny end-to-end runs that learn, exact resume, and the config errors."""
import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dpo_arith, grpo_arith, online_dpo_arith
from rft_jax import components, dpo_trainer, runs
from rft_jax import config as config_lib
from rft_jax import main as main_lib
from rft_jax.algorithms import dpo
from rft_jax.data import arith, arith_pairs
from rft_jax.sampling.sampler import Rollout
from rft_jax.telemetry.sinks import read_jsonl

import reward_fixtures  # noqa: E402  (tests/ on sys.path) registers test-only verifiers

ConfigError = config_lib.ConfigError


def tiny(module=dpo_arith, **overrides):
  config = module.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.telemetry.plot = False
  if 'rewards' in config:
    config.rewards.num_workers = 0   # inline scoring: no worker start-up in short tests
  config.update_from_flattened_dict(overrides)   # {'train.steps': 4, ...}
  return config


def train_rows(workdir):
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


@pytest.fixture(scope='module')
def built():
  return components.build(tiny())


# --- the pair dataset ------------------------------------------------------------------------

def test_slip_pairs_are_correct_vs_slip_on_the_same_train_prompt(built):
  source = arith_pairs.load_pairs()
  assert len(source) == len(arith_pairs.slip_pairs()) > 9000
  for i in range(0, len(source), 97):
    r = {k: v.decode() if isinstance(v, bytes) else v for k, v in source[i].items()}
    a, op, b = arith.parse_prompt(r['prompt'])
    assert r['id'] >= arith.NUM_TEST                     # train split only: eval stays clean
    assert r['chosen'] == str(arith.compute(a, op, b))   # chosen is right ...
    assert r['rejected'] == str(arith.teacher_slip(a, op, b)) != r['chosen']   # ... rejected not
  enc = arith_pairs.encode_pair({**source[0], 'index': 0}, built.tokenizer, 8, 6)
  p = 8
  np.testing.assert_array_equal(enc['chosen_tokens'][:p], enc['rejected_tokens'][:p])
  assert not enc['chosen_loss_mask'][:p].any() and enc['chosen_loss_mask'][p:].any()
  assert not np.array_equal(enc['chosen_tokens'][p:], enc['rejected_tokens'][p:])


def test_reference_table_is_one_pass_and_matches_a_fresh_forward(built):
  source = arith_pairs.Subset(arith_pairs.load_pairs(), 70)
  jitted = jax.jit(functools.partial(dpo.pair_logps, graphdef=built.graphdef))
  calls = []
  counting = lambda params, batch: calls.append(1) or jitted(params, batch)
  table = dpo_trainer.reference_table(counting, built.params, source, built.tokenizer,
                                      max_prompt_len=8, answer_len=6, chunk=32)
  assert len(calls) == 3                                # ceil(70 / 32) forwards, then never
  rows = [arith_pairs.encode_pair({**source[i], 'index': i}, built.tokenizer, 8, 6)
          for i in (0, 41, 69)]
  batch = {k: np.stack([r[k] for r in rows]) for k in dpo_trainer.PAIR_KEYS}
  logp_c, logp_r = jitted(built.params, batch)   # a fresh forward of the 3 pairs alone
  np.testing.assert_allclose(table[[0, 41, 69]], np.stack([logp_c, logp_r], 1), atol=1e-5)
  assert (table < 0).all()


# --- online pairs ----------------------------------------------------------------------------

def test_select_pairs_on_hand_made_rewards():
  rewards = jnp.array([1, 0, 0, 1,  0, 0, 0, 0,  1, 1, 1, 1,  0, 1, 0, 0,  0, 0, 1, 0.5])
  valid = jnp.ones(20, bool).at[13].set(False)          # group 3's only right answer unscored
  chosen, rejected, has = dpo.select_pairs(rewards, valid, 4)
  np.testing.assert_array_equal(has, [True, False, False, False, True])
  assert int(chosen[0]) == 0 and int(rejected[0]) == 1   # same prompt: rows 0..3
  assert int(chosen[4]) == 18 and int(rejected[4]) == 16


def test_online_batch_pairs_rows_of_one_prompt_with_reference(built):
  """4 prompts x G=3 hand-made completions: chosen/rejected rows, pair mask, reference."""
  tok = built.tokenizer
  left = lambda ids, n: [tok.pad_id] * (n - len(ids)) + ids
  right = lambda ids, n: ids + [tok.pad_id] * (n - len(ids))
  prompts = np.array([left([tok.bos_id] + tok.encode(f'1{i}+1='), 8) for i in range(4)],
                     np.int32)
  completions = np.array([right(tok.encode(t, add_eos=True), 6)
                          for t in ('12', '22', '3')] * 4, np.int32)
  mask = (np.cumsum(completions == tok.eos_id, 1) - (completions == tok.eos_id) == 0)
  rollout = Rollout(prompt_tokens_bp=np.repeat(prompts, 3, 0),
                    prompt_mask_bp=np.repeat((prompts != tok.pad_id).astype(np.int32), 3, 0),
                    tokens_bt=completions, logp_bt=np.zeros((12, 6), np.float32),
                    mask_bt=mask.astype(np.int32), truncated_b=np.zeros(12, bool))
  rewards = jnp.array([1, 0, 0,  0, 0, 0,  0, 1, 0,  1, 1, 1], jnp.float32)
  online_batch = jax.jit(functools.partial(dpo.online_batch, graphdef=built.graphdef,
                                           group_size=3))
  batch, metrics = online_batch(built.params, rollout, rewards, jnp.ones(12, bool))
  np.testing.assert_array_equal(batch['pair_mask'], [1, 0, 1, 0])
  assert float(metrics['pairs/step']) == 2 and float(metrics['pairs/skipped_prompts']) == 2
  for n, (c, r) in ((0, (0, 1)), (2, (7, 6))):
    np.testing.assert_array_equal(batch['chosen_tokens'][n, 8:], completions[c])
    np.testing.assert_array_equal(batch['rejected_tokens'][n, 8:], completions[r])
    np.testing.assert_array_equal(batch['chosen_tokens'][n, :8], prompts[n])
    np.testing.assert_array_equal(batch['rejected_tokens'][n, :8], prompts[n])
  logp_c, logp_r = jax.jit(functools.partial(dpo.pair_logps, graphdef=built.graphdef))(
      built.params, batch)
  np.testing.assert_allclose(batch['ref_chosen'], logp_c, atol=1e-5)
  np.testing.assert_allclose(batch['ref_rejected'], logp_r, atol=1e-5)


# --- end to end ------------------------------------------------------------------------------

LEARN = {'train.steps': 6, 'optim.lr': 1e-3, 'optim.warmup_steps': 1, 'train.ckpt_every': 3,
         'train.eval_every': 6}


@pytest.fixture(scope='module')
def offline_run(tmp_path_factory):
  """One tiny offline run at a high learning rate, counting reference forwards."""
  workdir = str(tmp_path_factory.mktemp('dpo_full'))
  original, calls = dpo_trainer.reference_table, []

  def counted(logps_fn, *args, **kwargs):
    return original(lambda *a: calls.append(1) or logps_fn(*a), *args, **kwargs)

  dpo_trainer.reference_table = counted
  try:
    summary = dpo_trainer.run(tiny(**LEARN), workdir)
  finally:
    dpo_trainer.reference_table = original
  return workdir, summary, len(calls)


def test_offline_dpo_learns_the_preferences_with_one_reference_pass(offline_run):
  workdir, summary, reference_calls = offline_run
  assert reference_calls == 1        # 256 pairs, one chunk, before step 1; none per step
  rows = train_rows(workdir)
  assert sorted(rows) == list(range(1, 7))
  for key in ('loss', 'rewards/chosen', 'rewards/rejected', 'rewards/margins',
              'rewards/accuracies', 'logps/chosen', 'logps/rejected'):
    assert key in rows[1], key
  dpo_loss_1 = rows[1]['loss'] - tiny().dpo.rpo_alpha * rows[1]['nll_loss']
  np.testing.assert_allclose(dpo_loss_1, np.log(2), atol=1e-3)   # step 1: policy = reference
  assert rows[6]['rewards/margins'] > rows[1]['rewards/margins'] + 0.5
  assert rows[6]['rewards/accuracies'] > 0.9 > rows[1]['rewards/accuracies']
  assert rows[6]['loss'] < 0.5
  assert summary['pairs_per_step'] == 16 and summary['steps'] == 6


def test_offline_resume_continues_exactly(offline_run, tmp_path):
  """Stopping after step 3 and resuming gives the same metrics at steps 4..6 as one run."""
  full_dir, full_summary, _ = offline_run
  split_dir = str(tmp_path / 'split')
  dpo_trainer.run(tiny(**{**LEARN, 'train.steps': 3}), split_dir)
  summary = dpo_trainer.run(tiny(**LEARN), split_dir)
  full, split = train_rows(full_dir), train_rows(split_dir)
  assert sorted(split) == list(range(1, 7))
  for step in (4, 5, 6):
    for k in ('loss', 'rewards/margins', 'rewards/accuracies', 'logps/chosen', 'grad_norm'):
      np.testing.assert_allclose(split[step][k], full[step][k], rtol=1e-5, atol=1e-7,
                                 err_msg=f'{k} at step {step}')
  assert summary['final_greedy_acc'] == full_summary['final_greedy_acc']


def test_online_dpo_runs_and_counts_pairs(tmp_path):
  summary = dpo_trainer.run(tiny(online_dpo_arith, **{'train.steps': 2}), str(tmp_path))
  rows = train_rows(str(tmp_path))
  for row in rows.values():
    assert row['pairs/step'] + row['pairs/skipped_prompts'] == 8   # prompts_per_step
    assert row['pairs'] == row['pairs/step'] and 'rewards/accuracies' in row
  assert summary['dpo_mode'] == 'online' and summary['pairs_per_step'] > 0


def test_online_dpo_says_a_verifier_failing_on_some_samples_once(tmp_path):
  """As in GRPO (rollouts.RolloutStage): the first failure of each verifier below
  rewards.max_invalid_frac is one message at its step; it showed only in reward/errors/<name>."""
  reward_fixtures.EVERY_8TH_CALLS[0] = 0
  config = tiny(online_dpo_arith, **{'train.steps': 2})
  config.rewards.weights = {'correct': 1.0, 'test_raises_every_8th': 0.0}
  dpo_trainer.run(config, str(tmp_path))
  rows = train_rows(str(tmp_path))
  n = config.rollout.prompts_per_step * config.rollout.group_size
  assert [rows[s]['reward/errors/test_raises_every_8th'] for s in (1, 2)] == [n // 8] * 2
  said = [(r['step'], r['text']) for r in read_jsonl(os.path.join(tmp_path, 'metrics.jsonl'),
                                                     kind='message')
          if 'test_raises_every_8th' in r['text']]
  assert len(said) == 1 and said[0][0] == 1, said
  assert said[0][1].startswith(
      f"step 1: verifier 'test_raises_every_8th' left {n // 8} of {n} samples unscored "
      f'({n // 8} raised or gave no finite number, the first: RuntimeError: call 8'), said


def test_offline_dpo_stops_on_non_finite_parameters_and_logs_that_step(tmp_path):
  """An absurd learning rate, warmed up over 4 steps: the run stops at the first step whose
  parameters (or loss or gradient) are not finite (step 2 here: the parameters' norm
  overflows), with that step in metrics.jsonl (its values show the cause) and nothing of it
  saved: the last checkpoint is the step before."""
  config = tiny(**{'train.steps': 6, 'train.ckpt_every': 1, 'optim.lr': 1e18,
                   'optim.warmup_steps': 4})
  with pytest.raises(runs.TrainingError, match='no longer finite|non-finite') as stopped:
    dpo_trainer.run(config, str(tmp_path))
  bad_step = int(re.search(r'(?:after|at) step (\d+)', str(stopped.value)).group(1))
  rows = train_rows(str(tmp_path))
  assert bad_step > 1 and max(rows) == bad_step
  assert not all(np.isfinite(rows[bad_step][k]) for k in ('loss', 'grad_norm', 'param_norm'))
  saved = sorted(int(d) for d in os.listdir(tmp_path / 'checkpoints') if d.isdigit())
  assert saved and max(saved) == bad_step - 1


# --- config ----------------------------------------------------------------------------------

def _error(config) -> ConfigError:
  with pytest.raises(ConfigError) as info:
    config_lib.validate(config)
  assert '\n' not in str(info.value) and str(info.value).startswith('config.')
  return info.value


def test_recipes_validate():
  for module in (dpo_arith, online_dpo_arith):
    for arg in ('', 'tiny'):
      config_lib.validate(module.get_config(arg))
  assert config_lib.DPO_LOSS_TYPES == dpo.DPO_LOSS_TYPES


def test_offline_dpo_without_a_pair_source_fails_at_load(capsys):
  config = dpo_arith.get_config('tiny')
  config.dpo.pairs = ''
  assert _error(config).key == 'dpo.pairs'
  status = main_lib.main(['main', '--config', 'configs/dpo_arith.py:tiny', '--config.dpo.pairs=',
                          '--validate_only'])
  err = capsys.readouterr().err.strip()
  assert status == 2 and err.startswith('error: config.dpo.pairs') and '\n' not in err
  assert 'preference-pair source' in err


def test_pairs_that_do_not_fit_the_answer_length_are_one_line_at_load(capsys, tmp_path):
  status = main_lib.main(['main', '--config', 'configs/dpo_arith.py:tiny',
                          '--config.dpo.answer_len=1', '--workdir', str(tmp_path)])
  err = capsys.readouterr().err.strip()
  assert status == 2 and '\n' not in err, err
  assert re.fullmatch(r"error: offline DPO pairs: record id=\d+: answer '-?\d+' is \d+ tokens "
                      r'\(with EOS\) > answer_len=1', err), err


@pytest.mark.parametrize('module,key,value,bad_key,words', [
    (dpo_arith, 'dpo.pairs', 'arith_slip', 'dpo.pairs', "did you mean 'arith_slips'"),
    (dpo_arith, 'dpo.loss_type', 'kto', 'dpo.loss_type', "'sigmoid', 'ipo', 'hinge'"),
    (dpo_arith, 'dpo.label_smoothing', 0.6, 'dpo.label_smoothing', '[0, 0.5)'),
    (dpo_arith, 'dpo.mode', 'offline_', 'dpo.mode', "'offline', 'online'"),
    (dpo_arith, 'dpo.microbatches', 3, 'dpo.microbatches', 'dpo.batch_size=16'),
    (online_dpo_arith, 'rollout.group_size', 1, 'rollout.group_size', 'form a pair'),
    (online_dpo_arith, 'dpo.batch_size', 8, 'dpo.batch_size', 'offline DPO only'),
])
def test_dpo_config_errors(module, key, value, bad_key, words):
  config = module.get_config('tiny')
  *parents, leaf = key.split('.')
  node = config
  for p in parents:
    node = node[p]
  if leaf in node:
    del node[leaf]
  node[leaf] = value
  error = _error(config)
  assert error.key == bad_key and words in str(error), str(error)


def test_dpo_section_conflicts():
  config = dpo_arith.get_config('tiny')
  config.dpo.loss_type, config.dpo.label_smoothing = 'ipo', 0.1
  assert 'sigmoid' in str(_error(config))
  config = online_dpo_arith.get_config('tiny')
  del config['rollout']
  assert _error(config).key == 'rollout'
  config = online_dpo_arith.get_config('tiny')
  config.algo = grpo_arith.get_config().algo
  assert _error(config).key == 'algo'


@pytest.mark.parametrize('section', ['faults', 'monitor', 'scaling'])
def test_rl_only_sections_are_refused_where_nothing_runs_them(section):
  """The failure monitor, fault injection and the live scaling fit run in the RL loop only: in
  a DPO (or SFT) recipe they used to validate and then do nothing."""
  config = online_dpo_arith.get_config('tiny')
  with config.unlocked():
    config[section] = [] if section == 'faults' else {'mode': 'warn'}
  error = _error(config)
  assert error.key == section and 'SFT and DPO recipes do not use it' in str(error)
