"""DAPO's overlong handling and the sampler/trainer mismatch correction (TIS). Pure functions.

Overlong (Yu et al. 2025, DAPO, arXiv:2503.14476, section 3.4), config.algo.overlong:
  'none'  nothing.
  'mask'  overlong filtering: truncated completions (no EOS within Lmax) leave the loss; they
          still count in their group's advantage statistics.
  'soft'  soft overlong punishment, added to the reward of each valid completion of length L
          (tokens, EOS included), with Lmax = rollout.max_new_tokens, Lc = algo.overlong_cache:
              R_len(L) = 0                              L <= Lmax - Lc
                       = ((Lmax - Lc) - L) / Lc         Lmax - Lc < L <= Lmax
                       = -1                             L > Lmax
          A truncated completion has L = Lmax here, so it gets -1.

Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"), config.algo.tis_cap = C > 0. The sampler's log-probs (logp_s) and the
trainer's recomputation at the same params (old_logp) differ numerically; the policy-gradient
loss of each token is multiplied by the stop-gradient weight
    w_t = min(exp(old_logp_t - logp_s_t), C)
(the KL and entropy terms are not reweighted). Mismatch telemetry, from samples of the sampler:
    mismatch/logp_abs_diff      token mean of |old_logp - logp_s|
    mismatch/logp_abs_diff_max  max over loss tokens
    mismatch/k3                 token mean of k3 = exp(d) - d - 1, d = old_logp - logp_s: an
                                estimate of KL(pi_sampler || pi_trainer) (>= 0)
    mismatch/tis_weight_mean, mismatch/tis_clip_frac (with tis_cap): mean weight, fraction of
                                tokens whose ratio exceeds C.
"""
import jax
import jax.numpy as jnp
import numpy as np

OVERLONG_MODES = ('none', 'mask', 'soft')


def overlong_penalty(lengths_b, max_len: int, cache: int) -> np.ndarray:
  """Soft overlong punishment R_len(L) per completion (formula above) -> float32 [B], in [-1, 0].

  lengths_b: int [B] completion lengths in tokens (EOS included). Host-side numpy.
  """
  if not 1 <= cache <= max_len:
    raise ValueError(f'overlong cache must be in [1, max_len={max_len}], got {cache}')
  lengths_b = np.asarray(lengths_b, np.float64)
  start = max_len - cache
  pen = np.where(lengths_b <= start, 0.0, (start - lengths_b) / cache)
  return np.where(lengths_b > max_len, -1.0, pen).astype(np.float32)


def overlong_loss_mask(loss_mask_bl, truncated_b):
  """Overlong filtering: zero the loss mask of truncated rows. [B, L], [B] bool -> [B, L]."""
  return loss_mask_bl * (1.0 - truncated_b.astype(loss_mask_bl.dtype))[:, None]


def tis_weights(old_logp_bl, sampler_logp_bl, loss_mask_bl, cap: float):
  """w = sg(min(exp(old_logp - sampler_logp), cap)) on loss tokens, 1 elsewhere. -> [B, L]."""
  ratio = jnp.exp(old_logp_bl - sampler_logp_bl)
  w = jnp.where(loss_mask_bl > 0, jnp.minimum(ratio, cap), 1.0)
  return jax.lax.stop_gradient(w)


def mismatch_metrics(old_logp_bl, sampler_logp_bl, loss_mask_bl, tis_cap: float = 0.0) -> dict:
  """Sampler/trainer log-prob mismatch on the loss tokens (see the module docstring)."""
  m = loss_mask_bl.astype(jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  d = old_logp_bl - sampler_logp_bl
  out = {'mismatch/logp_abs_diff': (jnp.abs(d) * m).sum() / n,
         'mismatch/logp_abs_diff_max': jnp.max(jnp.where(m > 0, jnp.abs(d), 0.0)),
         'mismatch/k3': ((jnp.exp(d) - d - 1.0) * m).sum() / n}
  if tis_cap:
    ratio = jnp.exp(d)
    out['mismatch/tis_weight_mean'] = (jnp.minimum(ratio, tis_cap) * m).sum() / n
    out['mismatch/tis_clip_frac'] = ((ratio > tis_cap) * m).sum() / n
  return out


def add_mismatch(batch: dict, metrics: dict, old_logp_bl, sampler_logp_bl, loss_mask_bl,
                 tis_cap: float) -> None:
  """In place: the sampler/trainer mismatch metrics (mismatch_metrics) and, with tis_cap > 0,
  batch['tis_weight'] [B, L] (tis_weights). Shared by the GRPO and PPO batch preparation."""
  metrics.update(mismatch_metrics(old_logp_bl, sampler_logp_bl, loss_mask_bl, tis_cap))
  if tis_cap:
    batch['tis_weight'] = tis_weights(old_logp_bl, sampler_logp_bl, loss_mask_bl, tis_cap)
