"""Scaling foresight for RL post-training: fit a run's eval curve against compute, compare runs,
and split a budget. Pure numpy/scipy (no JAX), so it runs on logs anywhere.

  fit_sigmoid     ScaleRL: R(C) - R0 = (A - R0) / (1 + (C_mid / C)^B)
  fit_power_law   Tan et al.: ln(1 - acc) = -k ln C + E
  fit_k_of_n      k(N) = K_max * N / (N + N0) across model sizes
  compare         which of two fits has the higher asymptote / efficiency, with intervals
  plan            IsoCompute-style group size / prompts per step / steps for a budget
  live.LiveFit    the trainer's refit every k evals: predicted final accuracy, anomaly incident
  backtest        fit the first part of a finished run, score its prediction of the end

Every parameter and prediction carries a percentile interval from a residual block bootstrap
over the eval points (`common`). Bad input raises ScalingFitError (a ValueError) saying why.
"""

from rft_jax.scaling.common import ScalingFitError
from rft_jax.scaling.compare import compare
from rft_jax.scaling.plan import Plan, plan
from rft_jax.scaling.power_law import KofNFit, PowerLawFit, fit_k_of_n, fit_power_law
from rft_jax.scaling.sigmoid import SigmoidFit, fit_sigmoid, sigmoid_curve

__all__ = ['ScalingFitError', 'compare', 'Plan', 'plan', 'KofNFit', 'PowerLawFit', 'fit_k_of_n',
           'fit_power_law', 'SigmoidFit', 'fit_sigmoid', 'sigmoid_curve']
