"""The DPO-family and SFT objectives of the train steps (dpo.loss_fn, sft.loss_fn) on a tiny model
against plain-Python loops over the model's log-probs (float64 NumPy): the summed completion
log-probs, the per-pair losses of the papers (DPO, cDPO, IPO, hinge, + RPO's NLL), the mean
over real pairs only, and SFT's token-mean NLL over answer tokens. Edge cases: a padding pair
(pair_mask 0) full of junk, a length-1 completion, an SFT row without answer tokens. Also GAE
(advantages.gae) on an all-masked and a length-1 row. Hand-worked values of dpo.dpo_loss are in
test_policy_losses.py."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from model_fixtures import np_log_softmax, randomize, tiny_model_config
from rft_jax.algorithms import advantages, dpo, sft
from rft_jax.models import create, forward

S = 7   # prompt 3 + completion <= 4 slots


@pytest.fixture(scope='module')
def model():
  graphdef, state = create(tiny_model_config(), seed=0)
  params = randomize(nnx.to_pure_dict(state), seed=3)
  fwd = jax.jit(lambda p, tok, m: forward(graphdef, p, tok, m))
  return graphdef, params, fwd


def np_token_logp(fwd, params, tokens, mask):
  """log pi(token_s | tokens_<s) at every slot s >= 1 (slot 0: 0), float64 [B, S]."""
  lsm = np_log_softmax(np.asarray(fwd(params, jnp.asarray(tokens), jnp.asarray(mask)))[:, :-1])
  out = np.zeros(tokens.shape)
  out[:, 1:] = np.take_along_axis(lsm, tokens[:, 1:, None], axis=-1)[..., 0]
  return out


def side(rng, completion_lengths, prompt=3):
  """tokens, mask (real tokens, right-padded) and loss mask (completion slots) [N, S]."""
  n = len(completion_lengths)
  tokens = rng.randint(2, 16, (n, S)).astype(np.int32)
  mask = np.zeros((n, S), np.int32)
  loss_mask = np.zeros((n, S), np.int32)
  for i, c in enumerate(completion_lengths):
    mask[i, :prompt + c] = 1
    loss_mask[i, prompt:prompt + c] = 1
  return np.where(mask > 0, tokens, 0), mask, loss_mask


def pair_batch(seed=0):
  rng = np.random.RandomState(seed)
  c_tok, c_mask, c_lm = side(rng, [4, 1, 2, 3])    # pair 1: a length-1 chosen answer
  r_tok, r_mask, r_lm = side(rng, [2, 3, 4, 1])
  batch = {'chosen_tokens': c_tok, 'chosen_mask': c_mask, 'chosen_loss_mask': c_lm,
           'rejected_tokens': r_tok, 'rejected_mask': r_mask, 'rejected_loss_mask': r_lm,
           'ref_chosen': rng.randn(4) * 2.0 - 6.0, 'ref_rejected': rng.randn(4) * 2.0 - 6.0,
           'pair_mask': np.array([1.0, 1.0, 0.0, 1.0])}   # pair 2 is padding
  batch['ref_chosen'][2] = 1e4   # junk in the padding pair must not reach the loss
  return batch


def ref_pair_loss(h, beta, loss_type, eps):
  """h = (logp_c - ref_c) - (logp_r - ref_r); the papers' per-pair losses."""
  logsig = lambda z: -math.log1p(math.exp(-z)) if z > 0 else z - math.log1p(math.exp(z))
  if loss_type == 'sigmoid':   # DPO (Rafailov et al. 2023); cDPO label smoothing eps
    return -(1 - eps) * logsig(beta * h) - eps * logsig(-beta * h)
  if loss_type == 'ipo':       # Azar et al. 2023, tau = beta
    return (h - 1 / (2 * beta)) ** 2
  return max(0.0, 1 - beta * h)   # hinge (RSO / SLiC on the reference-normalised margin)


@pytest.mark.parametrize('loss_type,eps,rpo', [('sigmoid', 0.0, 0.0), ('sigmoid', 0.1, 0.5),
                                               ('ipo', 0.0, 0.0), ('hinge', 0.0, 1.0)])
def test_dpo_objective_matches_python_loop(model, loss_type, eps, rpo):
  graphdef, params, fwd = model
  batch = pair_batch()
  beta = 0.3
  dcfg = dpo.DPOConfig(loss_type=loss_type, beta=beta, label_smoothing=eps, rpo_alpha=rpo)
  loss_sum, (count, sums) = jax.jit(functools.partial(dpo.loss_fn, graphdef=graphdef,
                                                      dcfg=dcfg))(
      params, jax.tree.map(jnp.asarray, batch))
  lp = {k: np_token_logp(fwd, params, batch[f'{k}_tokens'], batch[f'{k}_mask'])
        for k in ('chosen', 'rejected')}
  total, real, margins = 0.0, 0, 0.0
  for i in range(4):
    if not batch['pair_mask'][i]:
      continue
    seq = {k: sum(lp[k][i, s] for s in range(S) if batch[f'{k}_loss_mask'][i, s])
           for k in ('chosen', 'rejected')}
    h = (seq['chosen'] - batch['ref_chosen'][i]) - (seq['rejected'] - batch['ref_rejected'][i])
    loss = ref_pair_loss(h, beta, loss_type, eps)
    if rpo:   # RPO (Pang et al. 2024): + alpha * the chosen answer's length-normalised NLL
      loss += rpo * -seq['chosen'] / batch['chosen_loss_mask'][i].sum()
    total, real, margins = total + loss, real + 1, margins + beta * h
  assert float(count) == real == 3
  np.testing.assert_allclose(float(loss_sum) / float(count), total / real, rtol=1e-4)
  np.testing.assert_allclose(float(sums['rewards/margins']) / float(count), margins / real,
                             rtol=1e-4, atol=1e-6)


def test_sft_token_mean_nll_matches_python_loop(model):
  graphdef, params, fwd = model
  rng = np.random.RandomState(1)
  tokens, mask, loss_mask = side(rng, [4, 1, 0, 2])   # row 2: no answer tokens
  loss_sum, (count, sums) = jax.jit(functools.partial(sft.loss_fn, graphdef=graphdef))(
      params, {'tokens': jnp.asarray(tokens), 'mask': jnp.asarray(mask),
               'loss_mask': jnp.asarray(loss_mask)})
  lp = np_token_logp(fwd, params, tokens, mask)
  nll = [-lp[b, s] for b in range(4) for s in range(S) if loss_mask[b, s]]
  assert float(count) == len(nll) == 7
  np.testing.assert_allclose(float(loss_sum) / float(count), sum(nll) / len(nll), rtol=1e-5)
  np.testing.assert_allclose(float(sums['loss']), sum(nll), rtol=1e-5)


def test_gae_on_empty_and_length_one_rows():
  """A_t = sum_k (gamma lam)^k delta_{t+k} by a double loop over each row's tokens, nothing
  bootstrapped past the last one; an all-masked row gets 0 everywhere, whatever its inputs."""
  rng = np.random.RandomState(2)
  r, v = rng.randn(3, 5), rng.randn(3, 5)
  m = np.zeros((3, 5))
  m[0, :4], m[2, :1] = 1, 1   # row 1 all masked, row 2 one token
  adv, ret = advantages.gae(jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32),
                            jnp.asarray(m, jnp.float32), 0.9, 0.7)
  want = np.zeros((3, 5))
  for b in range(3):
    n = int(m[b].sum())
    delta = [r[b, t] + 0.9 * (v[b, t + 1] if t + 1 < n else 0.0) - v[b, t] for t in range(n)]
    for t in range(n):
      want[b, t] = sum((0.9 * 0.7) ** k * delta[t + k] for k in range(n - t))
  np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ret, (want + v) * m, rtol=1e-5, atol=1e-6)
  assert not np.asarray(adv)[1].any() and not np.asarray(ret)[1].any()
  np.testing.assert_allclose(adv[2, 0], r[2, 0] - v[2, 0], rtol=1e-5)
