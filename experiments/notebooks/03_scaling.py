# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Scaling foresight: fit a run's curve and extrapolate it
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/rft-jax/rft_jax/blob/main/experiments/notebooks/03_scaling.ipynb)
#
# Is a run worth more compute? Fit its held-out accuracy against the training FLOPs it has
# spent with ScaleRL's sigmoid, R(C) - R0 = (A - R0) / (1 + (C_mid / C)^B), and extrapolate,
# with 95% intervals from a block bootstrap (`rft_jax/scaling`; the command-line version is
# `python -m tools.scaling fit RUN_DIR`). The asymptote A is only reported once the run has
# passed its midpoint C_mid: before that, a higher ceiling reached later fits the same points.

# %% [markdown]
# **Setup.** Run from a checkout of the repository, this finds it. In Colab it clones the
# repository and installs rft_jax with pip, with the JAX build for the runtime's accelerator
# (if pip replaced packages Colab had already loaded, restart the session and run again).
# That is the only download this notebook makes.

# %%
import os
import shutil
import subprocess
import sys

REPO_URL = 'https://github.com/rft-jax/rft_jax'


def find_checkout():
  """The rft_jax checkout holding the current directory, or None."""
  d = os.path.abspath(os.getcwd())
  while not os.path.isfile(os.path.join(d, 'configs', 'grpo_arith.py')):
    if d == os.path.dirname(d):
      return None
    d = os.path.dirname(d)
  return d


ROOT = find_checkout()
if ROOT is None:
  if 'google.colab' not in sys.modules:
    raise RuntimeError('run this notebook from a checkout of rft_jax (or in Colab)')
  ROOT = os.path.abspath('rft_jax')
  if not os.path.isdir(ROOT):
    subprocess.run(['git', 'clone', '--depth=1', REPO_URL, ROOT], check=True)
    tpu = 'COLAB_TPU_ADDR' in os.environ or os.path.exists('/dev/accel0')
    jax_build = 'jax[tpu]' if tpu else 'jax[cuda12]' if shutil.which('nvidia-smi') else 'jax'
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '-e', ROOT,
                    f'{jax_build}>=0.10,<0.12'], check=True)
os.chdir(ROOT)   # relative paths you give (a workdir like 'runs/x') land in the checkout
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# %%
import jax

from rft_jax import api

BACKEND = jax.default_backend()                       # 'cpu', 'gpu' or 'tpu'
SMALL = os.environ.get('RFT_NOTEBOOK_SMALL') == '1'   # CI: the smallest settings that still run
print(f'{BACKEND}: {jax.device_count()} x {jax.devices()[0].device_kind}'
      + ('  (RFT_NOTEBOOK_SMALL=1: smallest settings)' if SMALL else ''))

# %% [markdown]
# ## A run with frequent evaluations
#
# A fit needs at least 5 eval points after the excluded start, so `train.eval_every` is a tenth
# of the run or less. Set `RFT_SCALING_RUN` to the workdir of a run you already have to fit
# that one instead (its recipe must log `compute/flops_cumulative`, as every RL run does).

# %%
if SMALL:
  OVERRIDES = {'rollout.prompts_per_step': 8, 'train.steps': 18, 'train.eval_every': 2,
               'eval.num_prompts': 32, 'eval.k': 4, 'optim.warmup_steps': 2,
               'rewards.num_workers': 0}
elif BACKEND == 'cpu':
  OVERRIDES = {'rollout.prompts_per_step': 16, 'train.steps': 60, 'train.eval_every': 5,
               'eval.num_prompts': 128, 'eval.k': 4}
else:
  OVERRIDES = {'train.eval_every': 10}
OVERRIDES.update({'train.ckpt_every': OVERRIDES.get('train.steps', 150),
                  'telemetry.tensorboard': False})
N_BOOT = 200 if SMALL else 1000

if os.environ.get('RFT_SCALING_RUN'):
  run = api.open_run(os.environ['RFT_SCALING_RUN'])
else:
  run = api.train(api.load_config('grpo_arith', OVERRIDES))
print(run)

# %% [markdown]
# ## The curve: accuracy against compute
#
# `tools.scaling.load_run` pairs each eval with the cumulative training FLOPs logged at its step
# (`compute/flops_cumulative`: sampling, reference and policy passes, and the updates), and the
# base policy's eval at step 0 with C = 0.

# %%
from rft_jax import scaling
from tools import scaling as scaling_tool

data = scaling_tool.load_run(run.workdir, metric=None, config_spec=None)
compute = [0.0] + data['compute']
values = [data['R0']] + data['value']
print(f"{data['metric']}: {len(data['value'])} eval points; compute from {data['compute_source']}")
for step, c, v in zip([0] + data['step'], compute, values):
  print(f'  step {step:4d}  {c:10.3g} FLOPs  {v:.3f}')

# %% [markdown]
# ## Fit and extrapolate to 10x the compute spent

# %%
TARGET = 10 * max(compute)
fits = {}
for kind, fit_fn in (('sigmoid', scaling.fit_sigmoid), ('power_law', scaling.fit_power_law)):
  try:
    fits[kind] = fit_fn(compute, values, 0.1, target_compute=TARGET, n_boot=N_BOOT)
    print(fits[kind].summary(), end='\n\n')
  except scaling.ScalingFitError as e:   # too few points, a flat curve: says why
    print(f'{kind}: no fit: {e}')

# %%
import matplotlib.pyplot as plt
import numpy as np

fig, ax = plt.subplots(figsize=(8, 4.5))
c, v = np.array(compute), np.array(values)
ax.scatter(c[c > 0], v[c > 0], s=18, facecolors='none', edgecolors='black',
           label='evals (hollow: left out of the fit)')
if data['R0'] is not None:
  ax.axhline(data['R0'], color='gray', lw=0.8, ls=':', label=f"base policy R0 = {data['R0']:.3f}")
for (kind, fit), color in zip(fits.items(), ('tab:blue', 'tab:orange')):
  ax.scatter(fit.compute, fit.values, s=18, color='black')
  seen = np.geomspace(fit.compute[0], fit.compute[-1], 100)
  ahead = np.geomspace(fit.compute[-1], TARGET, 100)
  ax.plot(seen, fit.predict(seen), color=color, label=kind)
  ax.plot(ahead, fit.predict(ahead), color=color, ls='--')
  grid = np.concatenate([seen, ahead])
  lo, hi = fit.band(grid)
  ax.fill_between(grid, lo, hi, color=color, alpha=0.15)
  if fit.prediction is not None:
    lo_t, hi_t = fit.prediction_interval
    ax.errorbar([TARGET], [fit.prediction], yerr=[[fit.prediction - lo_t], [hi_t - fit.prediction]],
                fmt='D', color=color, capsize=3)
  if kind == 'sigmoid' and fit.A_identified:
    ax.axhline(fit.A, color=color, lw=0.8, ls='-.', label=f'asymptote A = {fit.A:.3f}')
ax.set(xscale='log', xlabel='training compute (FLOPs)', ylabel=data['metric'],
       title='fit (solid), extrapolation (dashed), 95% bands')
ax.legend(fontsize=8, loc='lower right')
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Reading it
#
# - `A` is the ceiling the recipe approaches, `B` how steeply it gets there, `C_mid` where half
#   of the gain is reached. A recipe change that raises A is worth more at scale than one that
#   only moves C_mid; `tools.scaling fit RUN_A RUN_B` compares two runs with intervals.
# - The intervals assume independent eval noise; with autocorrelated noise their coverage drops
#   (about 77% on synthetic curves), so treat the bands as optimistic.
# - `python -m tools.scaling plan --budget 1e18 --config configs/grpo_arith.py` splits a budget
#   into group size, prompts per step and steps.
