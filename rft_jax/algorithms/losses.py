"""Policy losses, KL estimators and loss aggregations (registry entries). Pure jnp.

Per-token tensors are [B, L] over target positions (index t scores token t+1 of the sequence);
mask_bl is 1 on completion tokens. Advantages are per sequence (adv_b [B]) or per token
(adv_bl [B, L], e.g. from GAE); both broadcast the same way.

Policy losses share one signature and return per-token values plus per-token stats:

  loss(logp_bl, old_logp_bl, adv, mask_bl, *, clip_eps=0.2, clip_eps_low=None,
       clip_eps_high=None, clip_c=0.0) -> (loss_bl, {'clip_low', 'clip_high', 'ratio', ...})

clip_eps_low / clip_eps_high default to clip_eps (asymmetric bounds: DAPO's clip-higher); clip_c
> 1 turns on dual-clip where it applies (0 = off). An aggregation then turns per-token values into
(sum, count) so micro-batches and data-parallel shards add up to the exact global value.
"""
import jax
import jax.numpy as jnp

from rft_jax.algorithms.registry import register_loss, register_loss_agg

sg = jax.lax.stop_gradient


def _per_token(adv, like_bl):
  return adv[:, None] if adv.ndim == 1 else adv.astype(like_bl.dtype)


def _bounds(clip_eps, clip_eps_low, clip_eps_high):
  low = clip_eps if clip_eps_low is None else clip_eps_low
  high = clip_eps if clip_eps_high is None else clip_eps_high
  return 1.0 - low, 1.0 + high


def clipped_surrogate(ratio_bl, adv_bl, lo: float, hi: float, clip_c: float = 0.0):
  """PPO's pessimistic surrogate for a given ratio (token- or sequence-level values):

    loss = -min(ratio * A, clip(ratio, lo, hi) * A)                 (Schulman et al. 2017)
    dual-clip, clip_c > 1, for A < 0:  loss = min(loss, -clip_c * A)   (Ye et al. 2020)

  The dual clip bounds the loss of a negative-advantage token whose ratio has grown past clip_c
  (ratio * |A| would be unbounded). Returns (loss_bl, stats) with per-token indicators:
  clip_low (A < 0 and ratio < lo: the lower bound is active), clip_high (A > 0 and ratio > hi),
  and with dual-clip clip_dual (A < 0 and the -clip_c * A bound is active).
  """
  loss = -jnp.minimum(ratio_bl * adv_bl, jnp.clip(ratio_bl, lo, hi) * adv_bl)
  stats = {'clip_low': ((ratio_bl < lo) & (adv_bl < 0)).astype(jnp.float32),
           'clip_high': ((ratio_bl > hi) & (adv_bl > 0)).astype(jnp.float32)}
  if clip_c:
    dual = (adv_bl < 0) & (loss > -clip_c * adv_bl)
    loss = jnp.where(dual, -clip_c * adv_bl, loss)
    stats['clip_dual'] = dual.astype(jnp.float32)
  return loss, stats


@register_loss('ppo_clip')
def ppo_clip(logp_bl, old_logp_bl, adv_b, mask_bl, *, clip_eps: float = 0.2,
             clip_eps_low: float | None = None, clip_eps_high: float | None = None,
             clip_c: float = 0.0):
  """PPO clipped surrogate (Schulman et al. 2017), as used by GRPO, with DAPO's decoupled bounds
  (Yu et al. 2025: clip_eps_low=0.2, clip_eps_high=0.28) and optional dual-clip (clip_c).

  ratio_t = exp(logp_t - old_logp_t);
  loss_t = -min(ratio_t A, clip(ratio_t, 1 - eps_low, 1 + eps_high) A)   [see clipped_surrogate]
  Returns (loss_bl [B, L], stats): 'clip_low', 'clip_high' (+ 'clip_dual'), 'ratio'.
  """
  del mask_bl   # token-local: masking happens in the aggregation
  lo, hi = _bounds(clip_eps, clip_eps_low, clip_eps_high)
  ratio = jnp.exp(logp_bl - old_logp_bl)
  loss_bl, stats = clipped_surrogate(ratio, _per_token(adv_b, logp_bl), lo, hi, clip_c)
  stats['ratio'] = ratio
  return loss_bl, stats


@register_loss('gspo')
def gspo(logp_bl, old_logp_bl, adv_b, mask_bl, *, clip_eps: float = 0.2,
         clip_eps_low: float | None = None, clip_eps_high: float | None = None,
         clip_c: float = 0.0):
  """GSPO (Zheng et al. 2025), in its GSPO-token form.

  s_i = exp( sum_t m_it (logp_it - old_logp_it) / sum_t m_it )   (length-normalised seq. ratio)
  s_it = sg(s_i) * exp(logp_it - sg(logp_it))     (value s_i, gradient s_i * grad logp_it)
  loss_it = -min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it)  (+ optional dual-clip)

  Every token of a completion carries its sequence's ratio, so a sequence is clipped as a whole.
  With a per-sequence advantage and the seq_mean_token_mean aggregation this is exactly GSPO's
  sequence objective (1/G) sum_i min(s_i A_i, clip(s_i) A_i), value and gradient (paper eq. 5
  vs. GSPO-token eq. 13); GSPO-token also accepts per-token advantages. The paper's bounds are
  tiny (eps_low 3e-4, eps_high 4e-4) because s_i is a per-token geometric mean.
  Returns (loss_bl, stats): 'clip_low', 'clip_high' (+ 'clip_dual'), 'ratio' (= s_i per token).
  """
  lo, hi = _bounds(clip_eps, clip_eps_low, clip_eps_high)
  m = mask_bl.astype(logp_bl.dtype)
  log_s_b = ((logp_bl - old_logp_bl) * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)
  ratio = jnp.exp(sg(log_s_b)[:, None] + logp_bl - sg(logp_bl))
  loss_bl, stats = clipped_surrogate(ratio, _per_token(adv_b, logp_bl), lo, hi, clip_c)
  stats['ratio'] = ratio
  return loss_bl, stats


@register_loss('cispo')
def cispo(logp_bl, old_logp_bl, adv_b, mask_bl, *, clip_eps: float = 0.2,
          clip_eps_low: float | None = None, clip_eps_high: float | None = None,
          clip_c: float = 0.0):
  """CISPO (MiniMax-M1, Chen et al. 2025): clip the importance weight, never drop the token.

  w_t = sg(clip(ratio_t, 1 - eps_low, 1 + eps_high));   loss_t = -w_t * A * logp_t
  Gradient -w_t A grad logp_t at every token (no token leaves the update, unlike PPO's clip);
  only the gradient is meaningful, the value carries logp_t. The paper sets no lower bound
  (eps_low large, e.g. 1.0) and tunes eps_high. clip_c does not apply (validation rejects it).
  Returns (loss_bl, stats): 'clip_low' (ratio < 1 - eps_low: weight raised to the bound),
  'clip_high' (ratio > 1 + eps_high: weight truncated), 'ratio'; any advantage sign.
  """
  del mask_bl, clip_c
  lo, hi = _bounds(clip_eps, clip_eps_low, clip_eps_high)
  ratio = jnp.exp(logp_bl - old_logp_bl)
  weight = sg(jnp.clip(ratio, lo, hi))
  loss_bl = -weight * _per_token(adv_b, logp_bl) * logp_bl
  stats = {'clip_low': (ratio < lo).astype(jnp.float32),
           'clip_high': (ratio > hi).astype(jnp.float32), 'ratio': ratio}
  return loss_bl, stats


# --- KL to the reference ---------------------------------------------------------------------

def kl_penalty(logp_bl, ref_logp_bl, estimator: str = 'k3'):
  """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

  With d = ref_logp - logp: k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1 (unbiased, >= 0).
  """
  d = ref_logp_bl - logp_bl
  if estimator == 'k1':
    return -d
  if estimator == 'k2':
    return 0.5 * d * d
  if estimator == 'k3':
    return jnp.exp(d) - d - 1.0
  raise ValueError(f'unknown KL estimator {estimator!r}; known: k1, k2, k3')


def adaptive_kl_coef(kl_coef, kl, *, target: float, horizon: float, n_steps: float):
  """Adaptive KL controller (Ziegler et al. 2019, eq. 2), pure:

    e = clip(kl / target - 1, -0.2, 0.2);   kl_coef <- kl_coef * (1 + e * n_steps / horizon)

  kl: the measured KL of the last batch; n_steps: samples (or steps) since the last update.
  """
  err = jnp.clip(kl / target - 1.0, -0.2, 0.2)
  return kl_coef * (1.0 + err * n_steps / horizon)


# --- Aggregations: (sum, count) with global value sum_all / count_all -------------------------
#
# Signature: agg(x_bl, mask_bl, *, norm_len=0) -> (sum, count). Micro-batches and data-parallel
# shards split the batch by rows, and every aggregation below is a sum of per-row terms divided
# by a sum of per-row counts, so summing (sum, count) over pieces and dividing once gives the
# exact full-batch value (a mean of per-piece means would not). For the sequence means the
# count is the number of sequences with >= 1 loss token (rows masked out entirely, e.g. invalid
# rewards, neither add nor dilute): the global value is the mean over all such sequences of the
# batch, whichever device or micro-batch holds them.

def masked(x_bl, mask_bl):
  """x * m, exactly 0 where m = 0 even where x is inf or NaN there (inf * 0 = NaN): e.g. k3's
  exp(ref - old) can overflow on a padding slot, whose log-probs are never trained on."""
  return jnp.where(mask_bl > 0, x_bl * mask_bl, 0.0)


def _seq_terms(x_bl, mask_bl):
  m = mask_bl.astype(x_bl.dtype)
  tokens_b = m.sum(-1)
  return masked(x_bl, m).sum(-1), tokens_b, (tokens_b > 0).astype(jnp.float32)


@register_loss_agg('token_mean')
def token_mean(x_bl, mask_bl, *, norm_len: int = 0):
  """Token mean over the whole (global) batch (DAPO): returns (sum_bt x*m, sum_bt m)."""
  del norm_len
  return masked(x_bl, mask_bl).sum(), mask_bl.sum().astype(jnp.float32)


@register_loss_agg('seq_mean_token_mean')
def seq_mean_token_mean(x_bl, mask_bl, *, norm_len: int = 0):
  """Mean over sequences of each sequence's token mean (original GRPO; GSPO):
  (sum_b [n_b > 0] sum_t x m / n_b, #{b: n_b > 0}) with n_b = sum_t m_bt."""
  del norm_len
  s_b, n_b, has_b = _seq_terms(x_bl, mask_bl)
  return (has_b * s_b / jnp.maximum(n_b, 1.0)).sum(), has_b.sum()


@register_loss_agg('seq_mean_token_sum')
def seq_mean_token_sum(x_bl, mask_bl, *, norm_len: int = 0):
  """Mean over sequences of each sequence's token sum: (sum_bt x m, #{b: n_b > 0})."""
  del norm_len
  s_b, _, has_b = _seq_terms(x_bl, mask_bl)
  return s_b.sum(), has_b.sum()


@register_loss_agg('seq_mean_token_sum_norm')
def seq_mean_token_sum_norm(x_bl, mask_bl, *, norm_len: int = 0):
  """Dr.GRPO (Liu et al. 2025): token sums divided by a constant length, mean over sequences:
  (sum_bt x m / norm_len, #{b: n_b > 0}); global value sum_bt x m / (norm_len * n_seq).

  norm_len is a constant (the generation budget, algo.max_len) so no length bias enters; 0 falls
  back to L = x_bl.shape[-1] (verl's choice; includes prompt positions here). As TRL's dr_grpo
  it divides by norm_len * number of sequences, not by norm_len only (verl), so the scale does
  not depend on the batch size.
  """
  s_b, _, has_b = _seq_terms(x_bl, mask_bl)
  return s_b.sum() / float(norm_len or x_bl.shape[-1]), has_b.sum()
