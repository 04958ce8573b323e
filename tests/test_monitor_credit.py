"""Credit-assignment signals (rft_jax/monitor/credit.py): math against a NumPy reference, the
signatures on synthetic traces, and the injected adv_sign_flip fault in a short live run."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rft_jax.algorithms import advantages
from rft_jax.monitor import credit
from rft_jax.monitor import signatures as sigs
from rft_jax.monitor import synthetic
from rft_jax.monitor.detectors import MonitorConfig
from rft_jax.rewards import verifiers
from rft_jax.monitor.monitor import run_monitor

CFG = MonitorConfig()
G = 4


def reference_corr(a, x, valid, group_size):
  """Plain loops: mean over groups (>= 2 valid rows, x not constant) of np.corrcoef(a, x)
  (0 where a is constant), NaN when no group qualifies."""
  rhos = []
  for g in range(len(a) // group_size):
    sl = slice(g * group_size, (g + 1) * group_size)
    keep = valid[sl] & np.isfinite(x[sl])
    ag, xg = a[sl][keep].astype(np.float64), x[sl][keep].astype(np.float64)
    if len(xg) < 2 or np.ptp(xg) == 0:
      continue
    rhos.append(0.0 if np.ptp(ag) == 0 else np.corrcoef(ag, xg)[0, 1])
  return (np.mean(rhos) if rhos else np.nan), len(rhos)


def test_group_corr_matches_numpy_with_masks_and_invalid_rows():
  rng = np.random.default_rng(0)
  a = rng.normal(size=6 * G).astype(np.float32)
  x = rng.integers(0, 3, 6 * G).astype(np.float32)
  valid = rng.random(6 * G) > 0.2
  x[0:G] = 1.0                      # group 0: constant x -> not informative
  a[G:2 * G] = 0.5                  # group 1: constant advantages -> rho 0
  x[G:2 * G] = [0, 1, 0, 1]
  valid[2 * G:3 * G] = [True, False, False, False]   # group 2: one valid row -> skipped
  x[3 * G + 1] = np.nan             # a failed verifier: that row is left out
  valid[3 * G:4 * G] = True
  fn = jax.jit(credit.group_corr, static_argnums=3)
  got, count = fn(jnp.asarray(a), jnp.asarray(x), jnp.asarray(valid), G)
  want, want_count = reference_corr(a, x, valid, G)
  assert int(count) == want_count
  np.testing.assert_allclose(float(got), want, atol=1e-5)
  # a non-finite advantage (rewards overflowed to Inf): NaN, not 0 (= 'half the groups reversed')
  a_nan = a.copy()
  a_nan[3 * G] = np.nan
  got, _ = fn(jnp.asarray(a_nan), jnp.asarray(x), jnp.asarray(valid), G)
  assert np.isnan(float(got))
  # no informative group at all: NaN (the monitor leaves NaN invariants untouched)
  got, count = credit.group_corr(jnp.asarray(a), jnp.ones(6 * G), jnp.asarray(valid), G)
  assert np.isnan(float(got)) and int(count) == 0


@pytest.mark.parametrize('estimator', ['grpo', 'dr_grpo', 'rloo', 'grpo_batch_norm',
                                       'reinforce_pp_baseline'])
def test_every_group_estimator_agrees_with_its_reward_exactly(estimator):
  rng = np.random.default_rng(1)
  correct = (rng.random(8 * G) < 0.5).astype(np.float32)
  fmt = np.where(correct > 0, 1.0, rng.random(8 * G) < 0.7).astype(np.float32)
  reward = correct + 0.1 * fmt
  valid = rng.random(8 * G) > 0.1
  adv = advantages.__dict__[estimator](jnp.asarray(reward), jnp.asarray(valid), G)
  m = credit.credit_metrics(adv, jnp.asarray(reward), jnp.asarray(correct), jnp.asarray(valid),
                            group_size=G)
  assert float(m['invariant/adv_reward_disagreement']) < 1e-5
  assert float(m['invariant/adv_correct_disagreement']) < 0.05   # format bonus only
  # half the groups negated: the disagreement is the share of informative groups flipped
  flip = np.repeat(np.arange(8) % 2 == 0, G)
  m = credit.credit_metrics(jnp.where(flip, -adv, adv), jnp.asarray(reward),
                            jnp.asarray(correct), jnp.asarray(valid), group_size=G)
  _, n_inf = reference_corr(np.asarray(adv), reward, valid, G)
  flipped = sum(flip[g * G] and reference_corr(np.asarray(adv)[g * G:(g + 1) * G],
                                               reward[g * G:(g + 1) * G],
                                               valid[g * G:(g + 1) * G], G)[1]
                for g in range(8))
  assert float(m['invariant/adv_reward_disagreement']) == pytest.approx(flipped / n_inf, abs=1e-5)


def test_token_level_advantages_are_skipped():
  assert credit.credit_metrics(jnp.zeros((8, 5)), jnp.zeros(8), jnp.zeros(8),
                               jnp.ones(8, bool), group_size=G) == {}


def test_token_returns_are_read_at_the_first_completion_token():
  # REINFORCE++ with the KL in the reward per token: adv [B, L]. Its first completion token
  # (column 2 here) carries the sequence's whole return, which follows the reward within a group.
  rng = np.random.default_rng(2)
  reward = (rng.random(8 * G) < 0.5).astype(np.float32)
  valid = rng.random(8 * G) > 0.1
  mask = np.zeros((8 * G, 6), np.float32)
  mask[:, 2:2 + 3] = 1.0
  kl = jnp.asarray(rng.random((8 * G, 6)) * 0.01, jnp.float32)
  adv = advantages.reinforce_pp_baseline(jnp.asarray(reward), jnp.asarray(valid), G,
                                         mask_bl=jnp.asarray(mask), kl_bl=kl, kl_coef=1.0)
  args = (jnp.asarray(reward), jnp.asarray(reward), jnp.asarray(valid))
  m = credit.credit_metrics(adv, *args, group_size=G, first=2)
  assert int(m['credit/adv_reward_groups']) > 0
  assert float(m['invariant/adv_reward_disagreement']) < 1e-3   # KL reorders nothing here
  flip = np.repeat(np.arange(8) % 2 == 0, G)[:, None]
  m = credit.credit_metrics(jnp.where(flip, -adv, adv), *args, group_size=G, first=2)
  assert float(m['invariant/adv_reward_disagreement']) > 0.3
  assert verifiers.primary_verifier({'correct': 1.0, 'format': 0.1}) == 'correct'
  assert verifiers.primary_verifier({}) is None


def _fired(trace):
  _, al = jax.jit(run_monitor, static_argnames='cfg')(
      {k: np.asarray(v, np.float32) for k, v in trace.items()}, CFG)
  return np.asarray(al.fired)


def test_sign_flip_and_shuffle_fire_healthy_does_not():
  rng = np.random.default_rng(5)
  onset, steps = 40, 80
  k_rew = sigs.SIGNATURE_NAMES.index('advantage_reward_mismatch')
  k_cor = sigs.SIGNATURE_NAMES.index('advantage_correctness_mismatch')
  healthy = synthetic.healthy_trace(rng, steps)
  assert not _fired(healthy)[:, [k_rew, k_cor]].any()
  on = np.arange(steps) >= onset
  for variant, kw in (('sign', {'flip_frac': np.where(on, 0.5, 0.0)}),
                      ('shuffle', {'shuffle_frac': np.where(on, 1.0, 0.0)})):
    trace = dict(healthy)
    sim = synthetic.credit_batch_stats(rng, np.clip(healthy['reward/correct/mean'], 0, 1), **kw)
    trace.update(sim)
    fired = _fired(trace)
    assert not fired[:onset].any(), variant
    hits = np.flatnonzero(fired[:, [k_rew, k_cor]].any(1))
    assert len(hits) and hits[0] - onset < 10, (variant, hits)
    first = [sigs.SIGNATURES[k].fault_class for k in np.flatnonzero(fired[hits[0]])]
    assert first == ['credit_assignment'] * len(first)
    if variant == 'shuffle':   # the advantages still follow the (misattached) rewards
      assert not fired[:, k_rew].any()
      assert hits[0] >= onset + CFG.credit_persistence - 1


@pytest.mark.slow
def test_injected_adv_sign_flip_is_detected_live(tmp_path):
  from rft_jax import trainer   # pylint: disable=import-outside-toplevel
  from test_trainer import tiny_config   # pylint: disable=import-outside-toplevel
  onset = 3
  config = tiny_config(**{'train.steps': 6, 'train.eval_every': 6, 'train.ckpt_every': 6,
                          'rollout.prompts_per_step': 8, 'monitor.mode': 'warn'})
  config.faults = [{'type': 'adv_sign_flip', 'onset_step': onset, 'strength': 1.0}]
  trainer.run(config, str(tmp_path))
  with open(os.path.join(str(tmp_path), 'incidents.jsonl')) as f:
    found = [e for e in map(json.loads, f) if e['kind'] == 'incident']
  first = min(found, key=lambda e: e['step'])
  assert first['step'] == onset and first['fault_class'] == 'credit_assignment', first
  assert first['signature'] == 'advantage_reward_mismatch'
  with open(os.path.join(str(tmp_path), 'metrics.jsonl')) as f:
    rows = [r for r in map(json.loads, f) if r['kind'] == 'train']
  before = [r['credit/adv_reward_corr'] for r in rows if r['step'] < onset]
  assert before and all(c > 0.999 for c in before if c == c), before
