"""The KL diagnostics ('kl', 'kl/k1', 'kl/k3'; verl's 'actor/kl_loss') are KL(pi || pi_ref), as
the README's metric table says. A recipe without a reference (kl_coef = 0 and no `auto`
monitor: DAPO, Dr.GRPO, GSPO, CISPO) has nothing to measure them against: its batch holds the
old log-probs in place of the reference's, and logging KL(pi || pi_old) under the reference's
name made its curve incomparable with GRPO's (and different between monitor modes)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rft_jax.algorithms import grpo

KL_KEYS = ('kl', 'kl/k1', 'kl/k3')


def _batch(seed=0, b=4, l=5):
  rng = np.random.RandomState(seed)
  mask = (rng.rand(b, l) > 0.3).astype(np.float32)
  old = rng.randn(b, l).astype(np.float32) - 1.5
  logp = old + 0.3 * rng.randn(b, l).astype(np.float32)
  ref = old + 0.2 * rng.randn(b, l).astype(np.float32)
  adv = rng.randn(b).astype(np.float32)
  return logp, mask, old, ref, adv


@pytest.mark.parametrize('agg', ['token_mean', 'seq_mean_token_mean'])
def test_kl_metrics_only_with_a_reference(agg):
  logp, mask, old, ref, adv = _batch()
  ent = jnp.zeros_like(logp)
  # Without a reference the batch's ref_logp is old_logp (grpo.prepare_batch).
  no_ref = grpo.GRPOConfig(kl_coef=0.0, loss_agg=agg, group_size=2)
  batch = {'loss_mask': mask, 'old_logp': old, 'ref_logp': old, 'adv': adv}
  _, (_, sums) = grpo.loss_terms(jnp.asarray(logp), ent, batch, algo=no_ref)
  assert not set(KL_KEYS) & set(sums), sorted(sums)
  assert float(sums['ppo_kl']) != 0.0   # the drift from pi_old keeps its own name
  # With one, 'kl' is the token mean of k3(logp, ref) over the loss tokens (plain loop).
  with_ref = grpo.GRPOConfig(kl_coef=0.1, loss_agg=agg, group_size=2)
  batch = {**batch, 'ref_logp': ref}
  _, (count, sums) = grpo.loss_terms(jnp.asarray(logp), ent, batch, algo=with_ref)
  tokens = sums.get('count/tokens', count)   # the token count (grpo.token_means)
  num = den = 0.0
  for b in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[b, t]:
        d = float(ref[b, t]) - float(logp[b, t])
        num, den = num + np.exp(d) - d - 1.0, den + 1.0
  assert float(tokens) == den
  np.testing.assert_allclose(float(sums['kl']) / den, num / den, rtol=1e-5)
  assert num > 0


@pytest.mark.parametrize('agg', ['token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum',
                                 'seq_mean_token_sum_norm'])
def test_an_overflowing_kl_off_the_loss_mask_leaves_the_loss_and_metrics_finite(agg):
  """On a padding slot the reference's log-prob can exceed the old one's by more than 88 nats
  (a token the policy all but rules out), so k3 = exp(ref - logp) - ... is inf there; masked
  out by a multiplication, inf * 0 made the logged loss and KL NaN (the gradient stayed finite).
  The loss, its gradient and the metrics equal those of the same batch with that slot tame."""
  logp, mask, old, ref, adv = _batch(seed=1)
  b, t = np.argwhere(mask == 0)[0]
  wild_old, wild_ref = old.copy(), ref.copy()
  wild_old[b, t], wild_ref[b, t] = -150.0, -0.5   # exp(149.5) overflows float32
  algo = grpo.GRPOConfig(kl_coef=0.1, loss_agg=agg, group_size=2, max_len=5)

  def loss(logp_bl, old_bl, ref_bl):
    batch = {'loss_mask': mask, 'old_logp': old_bl, 'ref_logp': ref_bl, 'adv': adv}
    total, (_, sums) = grpo.loss_terms(logp_bl, jnp.zeros_like(logp_bl), batch, algo=algo)
    return total, sums
  (wild, wild_sums), wild_grad = jax.value_and_grad(loss, has_aux=True)(
      jnp.asarray(logp), wild_old, wild_ref)
  (tame, tame_sums), tame_grad = jax.value_and_grad(loss, has_aux=True)(
      jnp.asarray(logp), old, ref)
  assert np.isfinite(float(wild)) and float(wild) == float(tame)
  np.testing.assert_array_equal(wild_grad, tame_grad)
  assert {k: float(v) for k, v in wild_sums.items()} == {k: float(v) for k, v in
                                                          tame_sums.items()}
