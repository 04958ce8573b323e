"""DAPO extras and mismatch correction: chunked scoring, dynamic sampling (group filter, refill
loop on a stub sampler, gather), overlong shaping, TIS weights, and a tiny DAPO run end to end."""
import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compile_log import programs_compiled
from configs import dapo_arith, grpo_arith
from rft_jax import components, trainer
from rft_jax import config as config_lib
from rft_jax.algorithms import corrections, grpo, losses
from rft_jax.algorithms import dynamic_sampling as ds
from rft_jax.data import pipeline
from rft_jax.rollouts import round_rng
from rft_jax.sampling.sampler import SamplingConfig, make_sampler
from rft_jax.telemetry.sinks import read_jsonl


# ----------------------------------------------------------------------------
# Chunked scoring on the tiny recipe (its model, base params and a real rollout).


@pytest.fixture(scope='module')
def tiny_rollout():
  config = grpo_arith.get_config('tiny')
  c = components.build(config)
  prompts = next(pipeline.prompt_batches(c.train_source, c.tokenizer, max_prompt_len=8,
                                         batch_size=4, seed=0))
  sampler = make_sampler(c.graphdef, c.model_cfg, SamplingConfig(
      max_new_tokens=6, eos_id=c.tokenizer.eos_id, pad_id=c.tokenizer.pad_id), group_size=4)
  rollout = sampler(c.params, prompts['prompt_tokens'], prompts['prompt_mask'],
                    jax.random.key(0))
  return config, c, rollout


def test_chunked_scoring_equals_the_single_pass(tiny_rollout):
  config, c, rollout = tiny_rollout
  ref = jax.tree.map(lambda x: x * 1.01, c.params)
  rewards, valid = jnp.arange(16.0) % 3, jnp.ones(16, bool)
  algo = grpo.GRPOConfig.from_config(config)   # kl_coef 0.02: the reference pass runs too
  assert algo.score_chunks == 0 and algo.microbatches == 1

  @jax.jit
  def single_pass(params, ref_params, rollout):   # the scoring before chunking, verbatim
    tokens_bs, mask_bs, _, _ = grpo.rollout_sequences(rollout)
    return (grpo.sequence_logprobs(c.graphdef, params, tokens_bs, mask_bs)[0],
            grpo.sequence_logprobs(c.graphdef, ref_params, tokens_bs, mask_bs)[0])

  want_old, want_ref = single_pass(c.params, ref, rollout)
  first = rollout.prompt_tokens_bp.shape[1] - 1   # completion positions start here
  for shared in (False, True):
    for chunks in (0, 2, 4):
      a = dataclasses.replace(algo, score_chunks=chunks, shared_prompt=shared)
      batch, _ = jax.jit(functools.partial(grpo.prepare_batch, graphdef=c.graphdef, algo=a))(
          c.params, ref, rollout, rewards, valid)
      assert 'tis_weight' not in batch   # tis_cap 0: the batch is as before
      got_old, got_ref = np.asarray(batch['old_logp']), np.asarray(batch['ref_logp'])
      if shared:   # each group's prompt run once: completion positions only, float rounding
        assert not got_old[:, :first].any() and not got_ref[:, :first].any()
        np.testing.assert_allclose(got_old[:, first:], want_old[:, first:], rtol=1e-6,
                                   atol=5e-6)
        np.testing.assert_allclose(got_ref[:, first:], want_ref[:, first:], rtol=1e-6,
                                   atol=5e-6)
      elif chunks <= 2:   # the default (one pass) and 2 chunks of 8 rows: bit-identical
        np.testing.assert_array_equal(got_old, want_old, err_msg=str(chunks))
        np.testing.assert_array_equal(got_ref, want_ref, err_msg=str(chunks))
      else:   # XLA:CPU's GEMM blocking depends on the row count: a few ulps, so relative
        np.testing.assert_allclose(got_old, want_old, rtol=1e-6, atol=5e-6)
        np.testing.assert_allclose(got_ref, want_ref, rtol=1e-6, atol=5e-6)


def test_score_logprobs_chunk_layout_is_interleaved():
  """Chunk c holds rows c, c+n, ... (groups c, c+n, ... with group_size > 1): the stitched
  result puts every row back in its place, and each chunk gets whole groups."""
  calls = []

  def fake(graphdef, params, tokens_bs, mask_bs, first=0, group_size=1, temperature=None):
    calls.append((tokens_bs.shape, group_size))
    if group_size > 1:   # each row reads its group's first row, as a shared prompt would
      tokens_bs = jnp.repeat(tokens_bs[::group_size], group_size, axis=0)
    return tokens_bs[:, 1:].astype(jnp.float32) * params, None

  tokens = jnp.arange(8 * 3).reshape(8, 3)
  orig = grpo.sequence_logprobs
  grpo.sequence_logprobs = fake
  try:
    out = grpo.score_logprobs(None, 2.0, tokens, tokens, chunks=4)
    out_grouped = grpo.score_logprobs(None, 2.0, tokens, tokens, chunks=2, group_size=2)
    # chunks that do not divide the 4 groups: row by row
    out_rows = grpo.score_logprobs(None, 2.0, tokens, tokens, chunks=8, group_size=2)
  finally:
    grpo.sequence_logprobs = orig
  want = 2.0 * np.asarray(tokens[:, 1:], np.float32)
  np.testing.assert_array_equal(out, want)
  assert calls[0] == ((2, 3), 1)   # traced once by lax.map, on 8 / 4 rows
  # groups of 2 consecutive rows reach one call together: row r reads row r - r % 2
  np.testing.assert_array_equal(out_grouped, want[np.arange(8) // 2 * 2])
  assert calls[1] == ((4, 3), 2)
  np.testing.assert_array_equal(out_rows, want)
  assert calls[2] == ((1, 3), 1)


# ----------------------------------------------------------------------------
# Dynamic sampling.


def ref_informative(r, v, g):
  out = []
  for start in range(0, len(r), g):
    vals = [float(r[i]) for i in range(start, start + g) if v[i]]
    out.append(len(vals) >= 2 and max(vals) != min(vals))
  return out


def test_group_filter_matches_python_reference():
  rng = np.random.RandomState(0)
  for _ in range(20):
    g = rng.randint(2, 5)
    r = rng.choice([0.0, 0.1, 1.0, 1.1], size=6 * g).astype(np.float32)
    v = rng.rand(6 * g) > 0.2
    np.testing.assert_array_equal(ds.informative_groups(r, v, g), ref_informative(r, v, g))
  # Hand cases: spread; all equal; spread only through an invalid row; one valid row.
  r = np.array([1, 0, 1, 1, 0, 1, 1, 1], np.float32)
  v = np.array([1, 1, 1, 1, 0, 1, 1, 0], bool)
  np.testing.assert_array_equal(ds.informative_groups(r, v, 2), [True, False, False, False])


def test_groups_are_kept_on_accuracy_by_default():
  # DAPO recipe shape: correct 1.0 + format 0.1, soft overlong penalty (Lmax 6, cache 2). An
  # all-wrong group of lengths 4, 4, 5, 6 totals [0.1, 0.1, -0.4, -0.9]: it varies, but its
  # accuracy does not, so DAPO's filter (eq. 11) drops it; 'reward' keeps it.
  pen = corrections.overlong_penalty(np.array([4, 4, 5, 6]), 6, 2)
  np.testing.assert_allclose(pen, [0.0, 0.0, -0.5, -1.0])
  correct = np.zeros(4, np.float32)
  total = (1.0 * correct + 0.1 * np.ones(4) + pen).astype(np.float32)
  per_verifier = {'correct': correct, 'format': np.ones(4, np.float32)}
  weights = {'correct': 1.0, 'format': 0.1}
  valid = np.ones(4, bool)
  keep = lambda metric: ds.informative_groups(
      ds.filter_signal(total, per_verifier, metric, weights), valid, 4)
  assert keep('accuracy').tolist() == [False] and keep('reward').tolist() == [True]
  correct[1] = 1.0   # one right answer: informative either way
  total[1] += 1.0
  assert keep('accuracy').tolist() == [True] and keep('reward').tolist() == [True]
  assert grpo.GRPOConfig.from_config(dapo_arith.get_config()).dynamic_sampling_metric == 'accuracy'


def test_select_groups_fills_with_informative_first_then_pads():
  flags = [np.array([True, False, False]), np.array([False, True, True])]
  picks, padded = ds.select_groups(flags, 3)
  assert picks == [(0, 0), (1, 1), (1, 2)] and padded == 0
  picks, padded = ds.select_groups([np.array([False, True, False])], 3)
  assert picks == [(0, 1), (0, 0), (0, 2)] and padded == 2


class StubSampler:
  """Round r gives groups whose informativeness follows a fixed script; records the rounds."""

  def __init__(self, script, g=2):
    self.script, self.g, self.rounds = script, g, []

  def __call__(self, round_):
    self.rounds.append(round_)
    flags = np.asarray(self.script[round_], bool)
    rewards = np.stack([np.where(flags, 1.0, 0.0), np.zeros(len(flags))], 1).reshape(-1)
    rows = {'reward': rewards.astype(np.float32),
            'id': (100 * round_ + np.arange(len(flags) * self.g)).astype(np.int64)}
    return rows, ds.informative_groups(rewards, np.ones_like(rewards, bool), self.g)


def test_refill_loop_stops_when_full():
  stub = StubSampler([[1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
  got = ds.collect(stub, num_groups=4, max_rounds=10)
  assert stub.rounds == [0, 1, 2]                  # 1 + 2 informative, then 3 more: full
  assert got.picks == [(0, 0), (1, 1), (1, 2), (2, 0)] and got.padded == 0
  m = got.metrics(2)
  assert m == {'sampling/rounds': 3.0, 'sampling/prompts_drawn': 12.0,
               'sampling/informative_frac': 7 / 12, 'sampling/padded_groups': 0.0}
  rows = ds.gather_groups(got.payloads, got.picks, 2)
  np.testing.assert_array_equal(rows['id'], [0, 1, 102, 103, 104, 105, 200, 201])
  assert rows['reward'].shape == (8,) and np.all(rows['reward'][::2] == 1.0)


def test_refill_loop_pads_at_the_round_limit():
  stub = StubSampler([[0, 0, 1], [0, 0, 0], [1, 1, 1]])
  got = ds.collect(stub, num_groups=3, max_rounds=2)
  assert stub.rounds == [0, 1]                     # the limit: no third round
  assert got.picks == [(0, 2), (0, 0), (0, 1)] and got.padded == 2
  assert got.metrics(2)['sampling/padded_groups'] == 2.0
  # All processes draw again while any of them is short.
  stub = StubSampler([[1, 1, 1], [1, 1, 1], [1, 1, 1]])
  got = ds.collect(stub, num_groups=3, max_rounds=3, agree_short=lambda short: True)
  assert stub.rounds == [0, 1, 2] and got.padded == 0


def test_round_keys():
  k0 = round_rng(7, 5, 0)
  assert jnp.array_equal(jax.random.key_data(k0), jax.random.key_data(trainer.step_rng(7, 5)))
  k = [jax.random.key_data(round_rng(7, 5, r)) for r in range(3)]
  assert not jnp.array_equal(k[0], k[1]) and not jnp.array_equal(k[1], k[2])
  assert jnp.array_equal(k[2], jax.random.key_data(round_rng(7, 5, 2)))


@pytest.mark.parametrize('seed', [0, 7, 2**31 - 1, 2**31, 2**32 + 3, -1, -2**31 - 1])
def test_step_key_is_eager_fold_in_in_one_program(seed):
  """The step key is fold_in(key(seed), step) bit for bit (a seed beyond int32 by its low 32
  bits, as jax.random.key takes it), built by one XLA program where the eager key and fold_in
  compiled four at a run's first step."""
  eager = lambda s, r: jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), s), r)
  for step in (1, 5, 2**31):
    assert jnp.array_equal(jax.random.key_data(round_rng(seed, step, 0)),
                           jax.random.key_data(jax.random.fold_in(jax.random.key(seed), step)))
    assert jnp.array_equal(jax.random.key_data(round_rng(seed, step, 2)),
                           jax.random.key_data(eager(step, 2)))
  assert len(programs_compiled(round_rng, seed, 3, 0)) == 1


# ----------------------------------------------------------------------------
# Overlong shaping and TIS.


def test_overlong_penalty_hand_values():
  # Lmax = 10, Lcache = 4: free up to 6; 7 -> -1/4, 8 -> -2/4, 10 -> -1; beyond Lmax -1.
  got = corrections.overlong_penalty(np.array([1, 6, 7, 8, 9, 10, 12]), 10, 4)
  np.testing.assert_allclose(got, [0, 0, -0.25, -0.5, -0.75, -1.0, -1.0], rtol=1e-6)
  # The DAPO recipe's numbers: Lmax 6, Lcache 2.
  np.testing.assert_allclose(corrections.overlong_penalty(np.array([4, 5, 6]), 6, 2),
                             [0, -0.5, -1.0])
  with pytest.raises(ValueError, match='overlong cache'):
    corrections.overlong_penalty(np.array([1]), 6, 7)


def test_overlong_mask_drops_truncated_rows():
  m = jnp.ones((3, 4))
  got = corrections.overlong_loss_mask(m, jnp.array([False, True, False]))
  np.testing.assert_array_equal(got, [[1] * 4, [0] * 4, [1] * 4])


def test_tis_weights_and_mismatch_hand_values():
  old = jnp.log(jnp.array([[0.5, 0.2, 0.9, 0.3]]))
  samp = jnp.log(jnp.array([[0.5, 0.4, 0.3, 0.3]]))
  mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
  w = corrections.tis_weights(old, samp, mask, 2.0)
  # ratios pi_trainer / pi_sampler: 1, 0.5, 3 -> capped at 2; masked position: 1.
  np.testing.assert_allclose(w, [[1.0, 0.5, 2.0, 1.0]], rtol=1e-6)
  m = corrections.mismatch_metrics(old, samp, mask, 2.0)
  d = [0.0, math.log(0.5), math.log(3.0)]
  np.testing.assert_allclose(m['mismatch/logp_abs_diff'], sum(map(abs, d)) / 3, rtol=1e-5)
  np.testing.assert_allclose(m['mismatch/logp_abs_diff_max'], math.log(3.0), rtol=1e-5)
  np.testing.assert_allclose(m['mismatch/k3'], sum(math.exp(x) - x - 1 for x in d) / 3,
                             rtol=1e-5)
  np.testing.assert_allclose(m['mismatch/tis_weight_mean'], 3.5 / 3, rtol=1e-6)
  np.testing.assert_allclose(m['mismatch/tis_clip_frac'], 1 / 3, rtol=1e-6)
  assert 'mismatch/tis_weight_mean' not in corrections.mismatch_metrics(old, samp, mask)


def test_tis_weight_multiplies_the_policy_gradient_loss(tiny_rollout):
  config, c, rollout = tiny_rollout
  # A sampler that disagrees with the trainer: perturbed sampler log-probs.
  noise = 0.3 * jax.random.normal(jax.random.key(1), rollout.logp_bt.shape)
  rollout = rollout.replace(logp_bt=(rollout.logp_bt + noise) * rollout.mask_bt)
  rewards, valid = jnp.arange(16.0) % 3, jnp.ones(16, bool)
  algo = dataclasses.replace(grpo.GRPOConfig.from_config(config), kl_coef=0.0,
                             use_reference=False, tis_cap=1.5)
  params = jax.tree.map(lambda x: x * 1.01, c.params)

  @jax.jit
  def run(params, rollout):
    batch, metrics = grpo.prepare_batch(c.params, c.params, rollout, rewards, valid,
                                        graphdef=c.graphdef, algo=algo)
    logp, _ = grpo.sequence_logprobs(c.graphdef, params, batch['tokens'], batch['mask'])
    return batch, metrics, grpo.loss_fn(params, batch, graphdef=c.graphdef, algo=algo), logp

  batch, metrics, (loss_sum, _), logp = run(params, rollout)
  lm = np.asarray(batch['loss_mask'])
  w = np.asarray(batch['tis_weight'])
  assert w.max() <= 1.5 and (w[lm > 0] < 1).any() and (w[lm > 0] == 1.5).any()
  assert float(metrics['mismatch/tis_clip_frac']) > 0 and float(metrics['mismatch/k3']) > 0
  # loss = sum_t w_t pg_t (token_mean sum; no KL, no entropy): recompute pg_t directly.
  pg, _ = losses.ppo_clip(logp, batch['old_logp'], batch['adv'], batch['loss_mask'])
  pg = np.asarray(pg)
  np.testing.assert_allclose(float(loss_sum), float((pg * w * lm).sum()), rtol=1e-4)
  assert abs(float((pg * w * lm).sum()) - float((pg * lm).sum())) > 1e-3   # not vacuous


# ----------------------------------------------------------------------------
# Config and the DAPO recipe end to end.


@pytest.mark.parametrize('key,value,message', [
    ('overlong', 'clip', "config.algo.overlong='clip': must be one of 'none', 'mask', 'soft'"),
    ('tis_cap', 0.5, 'config.algo.tis_cap=0.5: truncated importance sampling cap must be >= 1'),
    ('max_sampling_rounds', 0, 'config.algo.max_sampling_rounds=0: must be >= 1'),
    ('overlong_cache', 7, 'config.algo.overlong_cache=7: must be <= rollout.max_new_tokens=6'),
    ('score_chunks', 3, 'config.algo.score_chunks=3: must divide the rollout batch'),
    ('dynamic_sampling', 1, 'config.algo.dynamic_sampling=1: expected bool, got int'),
    ('dynamic_sampling_metric', 'acc',
     "config.algo.dynamic_sampling_metric='acc': must be one of 'accuracy', 'reward'"),
])
def test_dapo_option_errors(key, value, message):
  config = dapo_arith.get_config()
  if key in config.algo:
    del config.algo[key]   # a ConfigDict keeps the type of a field once set
  config.algo[key] = value
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert str(info.value).startswith(message) and '\n' not in str(info.value)


def test_shared_prompt_default_and_its_exclusions():
  """On by default; off by itself with remat or scan_layers and with a mask_shift fault (which
  puts a prompt position in the loss); asking for it with remat is a one-line error."""
  config = grpo_arith.get_config()
  assert grpo.GRPOConfig.from_config(config).prompt_group() == config.rollout.group_size
  config.model.remat = 'full'
  assert not grpo.GRPOConfig.from_config(config).shared_prompt
  config.algo.shared_prompt = True
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert str(info.value).startswith('config.algo.shared_prompt=True: cannot be combined with '
                                    'model.remat') and '\n' not in str(info.value)
  config = grpo_arith.get_config()
  config.faults = [{'type': 'mask_shift', 'onset_step': 2, 'strength': 1.0}]
  assert grpo.GRPOConfig.from_config(config).prompt_group() == 1


def test_grpo_recipe_has_none_of_the_options():
  algo = grpo.GRPOConfig.from_config(grpo_arith.get_config())
  assert (algo.dynamic_sampling, algo.overlong, algo.tis_cap, algo.score_chunks) == (
      False, 'none', 0.0, 0)
  config_lib.validate(dapo_arith.get_config())


def test_tiny_dapo_run_reports_sampling_metrics(tmp_path):
  config = dapo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.telemetry.plot = False
  config.rewards.num_workers = 0
  config.train.steps, config.train.eval_every, config.train.ckpt_every = 2, 2, 2
  config.algo.tis_cap = 2.0
  summary = trainer.run(config, str(tmp_path))
  assert summary['steps'] == 2
  rows = read_jsonl(os.path.join(str(tmp_path), 'metrics.jsonl'), kind='train')
  assert len(rows) == 2
  for r in rows:
    assert 1 <= r['sampling/rounds'] <= 3
    assert r['sampling/prompts_drawn'] == 4 * r['sampling/rounds']
    assert 0 <= r['sampling/informative_frac'] <= 1
    # Full batch of informative groups unless padded: no zero-spread groups left otherwise.
    if r['sampling/padded_groups'] == 0:
      assert r['reward/zero_std_frac'] == 0
    assert r['overlong/penalty_mean'] <= 0 and 'mismatch/tis_weight_mean' in r
    assert np.isfinite(r['loss'])
