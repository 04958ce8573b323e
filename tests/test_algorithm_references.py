"""Each shipped GRPO-family recipe (configs/*_arith.py) against its paper's objective written as
plain-Python loops over tokens: the advantages (with any KL in the reward), the loss value and
its gradient with respect to every token's log-prob, through the trainer's own batch assembly
(grpo.assemble_batch) and loss (grpo.loss_terms); no model, so the case is small and exact.

The clip ranges the papers prescribe (GRPO 0.2, DAPO 0.2 / 0.28, GSPO 3e-4 / 4e-4) are written
here, not read from the recipe, so a recipe that drifts from its paper fails. Hyperparameters
the papers leave open (beta, CISPO's upper bound) come from the recipe.

The batch holds the edge cases: a group of equal rewards, an empty (all-masked) completion, an
unscored row, length-1 completions, junk log-probs off the loss mask (prompt and padding
positions), and rows whose ratio is and is not clipped.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from advantage_refs import ref_token_returns
from configs import (cispo_arith, dapo_arith, dr_grpo_arith, grpo_arith, gspo_arith,
                     reinforce_pp_arith, rloo_arith)
from rft_jax.algorithms import grpo
from rft_jax.sampling.sampler import Rollout

P, T, G = 3, 5, 4   # L = 7 target positions: not the recipes' max_new_tokens (6)
L = P + T - 1
LENGTHS = [5, 3, 1, 4, 2, 0, 5, 1, 4, 1, 3, 5]     # row 5: empty completion
VALID = [True] * 6 + [False] + [True] * 5           # row 6: unscored
REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.9, 0.9, 0.0]   # group 1: all equal
NEAR_ON_POLICY = (0, 4, 9, 11)   # rows with |logp - old| ~ 1e-5: inside even GSPO's bounds
B = len(LENGTHS)


def make_case(seed=0, sampler_noise=0.0):
  rng = np.random.RandomState(seed)
  mask = np.zeros((B, L))
  for b, n in enumerate(LENGTHS):
    mask[b, P - 1:P - 1 + n] = 1.0
  old = rng.randn(B, L) * 0.5 - 1.5
  scale = np.array([1e-5 if b in NEAR_ON_POLICY else 0.3 for b in range(B)])[:, None]
  logp = old + rng.randn(B, L) * scale
  ref = old + rng.randn(B, L) * 0.2
  ent = rng.rand(B, L) * 2.0
  # Off the completion the scoring passes leave 0 (shared prompt) and the policy's values are
  # arbitrary: none of it may reach the loss.
  old, ref = old * mask, ref * mask
  logp = np.where(mask > 0, logp, 3.0)
  sampler = (old + rng.randn(B, L) * sampler_noise) * mask
  return dict(mask=mask, old=old, logp=logp, ref=ref, ent=ent, sampler=sampler,
              rewards=np.array(REWARDS), valid=np.array(VALID))


def rft_objective(algo, case):
  """(loss, d loss / d logp_bl, adv) from the trainer's assembly and loss terms."""
  m_bt = (np.arange(T)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
  prompts = np.repeat(np.arange(B // G)[:, None] + 2, G, axis=0) * np.ones((1, P), np.int32)
  rollout = Rollout(
      prompt_tokens_bp=jnp.asarray(prompts, jnp.int32),
      prompt_mask_bp=jnp.ones((B, P), jnp.int32),
      tokens_bt=jnp.asarray((np.arange(T)[None] + 3) * m_bt, jnp.int32),
      logp_bt=jnp.asarray(case['sampler'][:, P - 1:], jnp.float32),
      mask_bt=jnp.asarray(m_bt), truncated_b=jnp.asarray(np.array(LENGTHS) == T))
  f32 = lambda k: jnp.asarray(case[k], jnp.float32)

  @jax.jit
  def run(logp, old, ref, ent, rewards, valid):
    batch, _ = grpo.assemble_batch(rollout, old, ref, rewards, valid, algo=algo)

    def mean_loss(lp):
      s, (c, _) = grpo.loss_terms(lp, ent, batch, algo=algo)
      return s / c

    value, grad = jax.value_and_grad(mean_loss)(logp)
    return value, grad, batch['adv'], batch['loss_mask']

  value, grad, adv, loss_mask = run(f32('logp'), f32('old'), f32('ref'), f32('ent'),
                                    f32('rewards'), jnp.asarray(case['valid']))
  np.testing.assert_array_equal(loss_mask, case['mask'] * case['valid'][:, None])
  return value, grad, adv


# ----------------------------------------------------------------------------
# The papers' formulas, one token at a time.


def k3(logp, ref):
  d = ref - logp
  return math.exp(d) - d - 1.0


def group_advantages(kind, r, valid):
  """grpo: (r - mean_g) / (std_g + 1e-6), population std (README); dr_grpo: r - mean_g;
  rloo: r - mean of the other valid rows. Over the valid rows of each group of G."""
  out = [0.0] * len(r)
  for g0 in range(0, len(r), G):
    rows = [i for i in range(g0, g0 + G) if valid[i]]
    vals = [r[i] for i in rows]
    if not vals:
      continue
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    for i in rows:
      if kind == 'grpo':
        out[i] = (r[i] - mean) / (std + 1e-6)
      elif kind == 'dr_grpo':
        out[i] = r[i] - mean
      elif len(vals) > 1:
        out[i] = r[i] - (sum(vals) - r[i]) / (len(vals) - 1)
  return out


def clipped(ratio, a, lo, hi, dual_c=0.0):
  """PPO's -min(rA, clip(r, lo, hi) A) (Ye et al.'s dual clip: min(., -cA) for A < 0) and its
  derivative with respect to log r."""
  c_ratio = min(max(ratio, lo), hi)
  unclipped = ratio * a <= c_ratio * a
  loss, grad = -min(ratio * a, c_ratio * a), (-ratio * a if unclipped else 0.0)
  if dual_c and a < 0 and loss > -dual_c * a:
    loss, grad = -dual_c * a, 0.0
  return loss, grad, not unclipped


def paper_objective(spec, case, *, beta, entropy_coef=0.0, max_len=0, dual_c=0.0, tis_cap=0.0):
  """-> (loss, grad [B][L], adv per row or per token, clipped flags of the active terms)."""
  mask, old, lp, ref, ent = (case[k] for k in ('mask', 'old', 'logp', 'ref', 'ent'))
  r, valid = list(case['rewards']), list(case['valid'])
  toks = {b: [l for l in range(L) if mask[b, l] and valid[b]] for b in range(B)}
  lo, hi = spec['bounds']
  if spec['kl'] == 'reward_seq':      # r_i - beta * sum_t KL_t (Ahmadian et al.'s RLOO)
    r = [r[b] - beta * sum(k3(old[b, l], ref[b, l]) for l in toks[b]) for b in range(B)]
  if spec['adv'] == 'reinforce_pp':   # token returns r - beta * sum_{i>=t} KL_i, whitened
    kl = [[k3(old[b, l], ref[b, l]) if mask[b, l] else 0.0 for l in range(L)] for b in range(B)]
    adv_bl = ref_token_returns(r, valid, mask, kl, beta)
    adv = lambda b, l: adv_bl[b, l]
    adv_out = adv_bl
  else:
    adv_b = group_advantages(spec['adv'], r, valid)
    adv = lambda b, l: adv_b[b]
    adv_out = np.array(adv_b)
  kl_in_loss = beta if spec['kl'] == 'loss' else 0.0
  n_seq = sum(1 for b in range(B) if toks[b])
  n_tok = sum(len(t) for t in toks.values())
  loss, grad, flags = 0.0, np.zeros((B, L)), []
  for b in range(B):
    n = len(toks[b])
    if spec['loss'] == 'gspo':        # one ratio per sequence: (pi / pi_old)^(1 / |y|)
      if not n:
        continue
      s = math.exp(sum(lp[b, l] - old[b, l] for l in toks[b]) / n)
      j, dj, clip = clipped(s, adv(b, None), lo, hi)
      flags.append((clip, adv(b, None)))
      loss += j / n_seq
      for l in toks[b]:   # d s / d logp_t = s / |y|; the KL and entropy as per-sequence means
        loss += (kl_in_loss * k3(lp[b, l], ref[b, l]) - entropy_coef * ent[b, l]) / (n * n_seq)
        grad[b, l] = (dj + kl_in_loss * (1 - math.exp(ref[b, l] - lp[b, l]))) / (n * n_seq)
      continue
    for l in toks[b]:
      a, ratio = adv(b, l), math.exp(lp[b, l] - old[b, l])
      if spec['loss'] == 'cispo':     # -sg(clip(r, lo, hi)) A log pi (MiniMax-M1 eq. 4)
        w = min(max(ratio, lo), hi)
        tok, dtok = -w * a * lp[b, l], -w * a
      else:
        tok, dtok, clip = clipped(ratio, a, lo, hi, dual_c)
        flags.append((clip, a))
      if tis_cap:                      # x sg(min(pi_old / pi_sampler, C)) on the pg term only
        w = min(math.exp(old[b, l] - case['sampler'][b, l]), tis_cap)
        tok, dtok = tok * w, dtok * w
      tok += kl_in_loss * k3(lp[b, l], ref[b, l]) - entropy_coef * ent[b, l]
      dtok += kl_in_loss * (1 - math.exp(ref[b, l] - lp[b, l]))
      norm = {'token_mean': n_tok,                 # DAPO: 1 / sum_i |o_i|
              'seq_mean_token_mean': n * n_seq,    # GRPO: 1/G sum_i 1/|o_i| sum_t
              'seq_mean_token_sum_norm': max_len * n_seq}[spec['agg']]   # Dr.GRPO
      loss += tok / norm
      grad[b, l] = dtok / norm
  return loss, grad, adv_out, flags


PAPERS = {   # recipe: what the paper (or, where marked, the README's documented choice) says
    'grpo_arith': (grpo_arith, dict(adv='grpo', loss='clip', bounds=(0.8, 1.2),
                                    agg='token_mean', kl='loss')),   # README: token mean
    'dapo_arith': (dapo_arith, dict(adv='grpo', loss='clip', bounds=(0.8, 1.28),
                                    agg='token_mean', kl='none')),
    'dr_grpo_arith': (dr_grpo_arith, dict(adv='dr_grpo', loss='clip', bounds=(0.8, 1.2),
                                          agg='seq_mean_token_sum_norm', kl='none')),
    'gspo_arith': (gspo_arith, dict(adv='grpo', loss='gspo', bounds=(1 - 3e-4, 1 + 4e-4),
                                    agg='seq_mean_token_mean', kl='none')),
    'cispo_arith': (cispo_arith, dict(adv='grpo', loss='cispo', bounds=None,
                                      agg='token_mean', kl='none')),
    'rloo_arith': (rloo_arith, dict(adv='rloo', loss='clip', bounds=(0.8, 1.2),
                                    agg='token_mean', kl='reward_seq')),
    'reinforce_pp_arith': (reinforce_pp_arith, dict(adv='reinforce_pp', loss='clip',
                                                    bounds=(0.8, 1.2), agg='token_mean',
                                                    kl='reward_token')),
}


def recipe_algo(module):
  config = module.get_config()
  algo = grpo.GRPOConfig.from_config(config)
  return config, dataclasses.replace(algo, group_size=G)


@pytest.mark.parametrize('recipe', sorted(PAPERS))
def test_recipe_loss_and_gradient_match_the_paper(recipe):
  module, spec = PAPERS[recipe]
  config, algo = recipe_algo(module)
  assert algo.kl_estimator == 'k3' or not algo.kl_coef
  assert algo.kl_in_reward == spec['kl'].startswith('reward') and algo.tis_cap == 0
  beta = algo.kl_coef if spec['kl'] != 'none' else 0.0
  assert (algo.kl_coef > 0) == (spec['kl'] != 'none'), 'a KL term the paper does not have'
  if spec['bounds'] is None:   # CISPO: no lower bound (the recipe's eps_low = 1 -> weight >= 0)
    low = algo.clip_eps if algo.clip_eps_low is None else algo.clip_eps_low
    spec = {**spec, 'bounds': (1.0 - low, 1.0 + algo.clip_eps_high)}
    assert spec['bounds'][0] <= 0.0
  max_len = config.rollout.max_new_tokens   # Dr.GRPO's constant: the generation budget
  case = make_case()
  want, want_grad, want_adv, flags = paper_objective(
      spec, case, beta=beta, entropy_coef=algo.entropy_coef, max_len=max_len)
  got, got_grad, got_adv = rft_objective(algo, case)
  np.testing.assert_allclose(got_adv, want_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(got), want, rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(got_grad, want_grad, rtol=2e-4, atol=1e-7)
  # Not vacuous: both branches of the clip are exercised on tokens (or sequences) with A != 0.
  if flags:
    assert {clip for clip, a in flags if a != 0} == {True, False}, recipe
  # The edge rows: no gradient on the empty, unscored or off-mask positions; length-1 rows do.
  assert not np.asarray(got_grad)[[5, 6]].any()
  assert not np.asarray(got_grad)[case['mask'] == 0].any()
  assert np.abs(np.asarray(got_grad)[[2, 9], P - 1]).max() > 0
  if spec['adv'] in ('grpo', 'dr_grpo') and spec['kl'] != 'reward_seq':
    assert not np.asarray(got_adv)[4:8].any()   # the group of equal rewards: A = 0 exactly


@pytest.mark.parametrize('recipe', ['rloo_arith', 'reinforce_pp_arith'])
def test_a_kl_in_the_reward_that_overflows_off_the_loss_mask_changes_nothing(recipe):
  """On a padding slot the old and reference log-probs are scored but never trained on; where
  the reference's exceeds the old one's by more than 88 nats, k3 = exp(ref - old) - ... is inf
  there, and masking it by a multiplication (inf * 0 = NaN) made the rewards, advantages and
  loss NaN. Same advantages, loss and gradient as with that slot at 0."""
  _, algo = recipe_algo(PAPERS[recipe][0])
  case = make_case()
  wild = {**case, 'old': case['old'].copy(), 'ref': case['ref'].copy()}
  b, l = 1, P - 1 + LENGTHS[1]   # row 1's first padding slot
  assert case['mask'][b, l] == 0 and case['valid'][b]
  wild['old'][b, l], wild['ref'][b, l] = -150.0, -0.5
  got, got_grad, got_adv = rft_objective(algo, wild)
  want, want_grad, want_adv = rft_objective(algo, case)
  assert np.isfinite(float(got)) and float(got) == float(want)
  np.testing.assert_array_equal(got_adv, want_adv)
  np.testing.assert_array_equal(got_grad, want_grad)


def test_grpo_per_sequence_mean_is_the_papers_letter():
  """loss_agg='seq_mean_token_mean' (README: the GRPO paper's 1/G sum_i 1/|o_i| sum_t, with the
  KL term inside and an entropy bonus) against the loops."""
  _, algo = recipe_algo(grpo_arith)
  algo = dataclasses.replace(algo, loss_agg='seq_mean_token_mean', entropy_coef=0.03)
  spec = dict(adv='grpo', loss='clip', bounds=(0.8, 1.2), agg='seq_mean_token_mean', kl='loss')
  case = make_case(seed=1)
  want, want_grad, _, _ = paper_objective(spec, case, beta=algo.kl_coef, entropy_coef=0.03)
  got, got_grad, _ = rft_objective(algo, case)
  np.testing.assert_allclose(float(got), want, rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(got_grad, want_grad, rtol=2e-4, atol=1e-7)


def test_dual_clip_and_truncated_importance_sampling_against_loops():
  """Dual clip (Ye et al. 2020, c = 1.5 so it binds here) and TIS weights from a sampler whose
  log-probs differ from the trainer's (Yao et al. 2025), with GRPO advantages and KL in the
  loss."""
  algo = grpo.GRPOConfig(group_size=G, kl_coef=0.05, clip_c=1.5, tis_cap=1.2, max_len=T)
  spec = dict(adv='grpo', loss='clip', bounds=(0.8, 1.2), agg='token_mean', kl='loss')
  case = make_case(seed=2, sampler_noise=0.3)
  want, want_grad, _, _ = paper_objective(spec, case, beta=0.05, dual_c=1.5, tis_cap=1.2)
  got, got_grad, _ = rft_objective(algo, case)
  np.testing.assert_allclose(float(got), want, rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(got_grad, want_grad, rtol=2e-4, atol=1e-7)
  # Not vacuous: some token has A < 0 and a ratio past c, and some TIS weight is capped.
  ratio = np.exp(case['logp'] - case['old'])
  adv = np.array(group_advantages('grpo', REWARDS, VALID))[:, None]
  lm = case['mask'] * np.array(VALID)[:, None]
  assert ((ratio > 1.5) & (adv < 0) & (lm > 0)).any()
  assert ((np.exp(case['old'] - case['sampler']) > 1.2) & (lm > 0)).any()


@pytest.mark.parametrize('estimator', ['k1', 'k2'])
def test_rloo_kl_in_reward_with_the_other_estimators(estimator):
  """RLOO's sequence KL charge with kl_estimator k1 (the paper's log-ratio, Ahmadian et al.) or
  k2 (d^2 / 2): r_i - beta * sum_t KL_t(old, ref), then the leave-one-out baseline; loops."""
  _, algo = recipe_algo(rloo_arith)
  algo = dataclasses.replace(algo, kl_estimator=estimator)
  case = make_case(seed=3)
  kl = {'k1': lambda lp, rf: lp - rf, 'k2': lambda lp, rf: 0.5 * (rf - lp) ** 2}[estimator]
  r = [REWARDS[b] - algo.kl_coef * sum(kl(case['old'][b, l], case['ref'][b, l])
                                       for l in range(L) if case['mask'][b, l] and VALID[b])
       for b in range(B)]
  _, _, got_adv = rft_objective(algo, case)
  np.testing.assert_allclose(got_adv, group_advantages('rloo', r, VALID), rtol=1e-5, atol=1e-6)
  plain = group_advantages('rloo', REWARDS, VALID)
  assert np.abs(np.asarray(got_adv) - plain).max() > 1e-4   # the charge moved the advantages
