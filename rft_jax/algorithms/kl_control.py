"""The KL coefficient: fixed, or adaptive (Ziegler et al. 2019; verl's AdaptiveKLController).

config.algo.kl_ctrl = 'fixed' (default) | 'adaptive', with kl_target and kl_horizon. The adaptive
controller's state is a multiplier of the configured coefficient, kept in TrainState.kl_ctrl
({'scale': float32 scalar}): it is checkpointed with the train state, so a resumed run continues
the same coefficient trajectory. The coefficient a step uses is

  beta_t = controls['kl_coef'] * scale_t        (controls: algo.kl_coef, or what remediation or
                                                 an injected fault set; scale = 1 when fixed)

and after the step, from its measured KL (the step's 'kl' metric: token mean of the configured
estimator between the policy and the reference) over n = rollout rows (sequences),

  scale_{t+1} = scale_t * (1 + clip(kl / kl_target - 1, -0.2, 0.2) * n / kl_horizon)

(losses.adaptive_kl_coef; the update is linear in beta, so scaling the multiplier scales beta).
kl_horizon is in sequences, as verl's (e.g. 10000): the coefficient moves by at most
0.2 * n / kl_horizon per step.
"""
import jax.numpy as jnp

from rft_jax.algorithms.losses import adaptive_kl_coef

KL_CTRLS = ('fixed', 'adaptive')


def init_state(algo):
  """TrainState.kl_ctrl: {'scale': 1.0} for the adaptive controller, None when fixed."""
  if getattr(algo, 'kl_ctrl', 'fixed') != 'adaptive':
    return None
  return {'scale': jnp.float32(1.0)}


def coef(state, algo):
  """beta of this step (float32 scalar): controls['kl_coef'] (default algo.kl_coef) * scale."""
  beta = state.control('kl_coef', algo.kl_coef)
  if getattr(state, 'kl_ctrl', None) is None:
    return beta
  return beta * state.kl_ctrl['scale']


def update(state, metrics: dict, algo, rows: int):
  """The state after the adaptive update from the step's metrics['kl'] over `rows` sequences;
  unchanged with a fixed coefficient, or when the measured KL is not finite (a skipped update).
  Pure (jit it; the trainer runs it once per step)."""
  if getattr(state, 'kl_ctrl', None) is None:
    return state
  old = state.kl_ctrl['scale']
  scale = adaptive_kl_coef(old, metrics['kl'], target=algo.kl_target, horizon=algo.kl_horizon,
                           n_steps=float(rows))
  scale = jnp.where(jnp.isfinite(scale), scale, old).astype(jnp.float32)
  return state.replace(kl_ctrl={'scale': scale})
