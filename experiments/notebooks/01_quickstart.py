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
# # rft_jax quick start: GRPO on arithmetic
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/rft-jax/rft_jax/blob/main/experiments/notebooks/01_quickstart.ipynb)
#
# Post-train the built-in tiny policy (a 0.8M-parameter Llama-style model, SFT'd on `a+b=`,
# `a-b=`, `a*b=` problems) with GRPO, through the Python API (`rft_jax/api.py`) over the same
# code as `python -m rft_jax.main --config configs/grpo_arith.py`. Then plot the run and
# compare completions before and after. Everything is offline: the task is generated locally.

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
# ## The recipe, scaled to the machine
#
# `configs/grpo_arith.py` is the full recipe (150 steps of 32 prompts x 8 completions: about
# 2.5 minutes on 2 CPU cores, seconds on an accelerator). On a CPU this notebook runs a shorter
# version; `RFT_NOTEBOOK_SMALL=1` (CI) runs the `:tiny` variant. Overrides are dotted keys,
# checked like the CLI's `--config.a.b=v`.

# %%
if SMALL:
  RECIPE, OVERRIDES = 'grpo_arith:tiny', {'train.steps': 6, 'train.eval_every': 3,
                                          'rewards.num_workers': 0}
elif BACKEND == 'cpu':
  RECIPE, OVERRIDES = 'grpo_arith', {'train.steps': 40, 'train.eval_every': 10,
                                     'rollout.prompts_per_step': 16, 'eval.num_prompts': 128}
else:
  RECIPE, OVERRIDES = 'grpo_arith', {}
OVERRIDES['telemetry.tensorboard'] = False
config = api.load_config(RECIPE, OVERRIDES)
print(f'{config.name}: {config.train.steps} steps of {config.rollout.prompts_per_step} prompts x '
      f'{config.rollout.group_size} completions; held-out eval on {config.eval.num_prompts} '
      f'prompts every {config.train.eval_every} steps')

# %% [markdown]
# A bad key or value is a one-line `ConfigError`, as on the command line:

# %%
try:
  api.load_config(RECIPE, {'rollout.group_size': 1})
except api.ConfigError as e:
  print('ConfigError:', e)

# %% [markdown]
# ## Before training
#
# The starting policy (`config.init_from`, the shipped SFT base) on a few problems: its greedy
# answer and four samples at temperature 1. It often makes a careless slip (a lost carry, a
# dropped minus sign) while still giving the right answer some probability: GRPO with the
# exact-answer reward repairs that.

# %%
PROBLEMS = ['47+38=', '91-56=', '23*7=', '12-85=', '68+79=', '9*9=']


def show(policy, title):
  greedy = api.sample(policy, PROBLEMS, temperature=0.0)
  samples = api.sample(policy, PROBLEMS, n=4, temperature=1.0, seed=1)
  print(title)
  for problem, g, s in zip(PROBLEMS, greedy, samples):
    answer = str(eval(problem[:-1]))  # the right answer, for the table
    marks = ' '.join(x + ('✓' if x == answer else '✗') for x in s)
    print(f'  {problem:8s} answer {answer:>5s}   greedy {g[0]:>5s}{"✓" if g[0] == answer else "✗"}'
          f'   samples {marks}')


base = api.load_policy(config)
show(base, 'base policy')

# %% [markdown]
# ## Train
#
# `api.train` runs the recipe and returns a `Run`. A progress bar shows reward, KL, entropy
# and response length (plain lines where no live display is available). With no `workdir` the
# run goes to a new temporary directory; pass one to keep it, or to resume it.

# %%
run = api.train(config)
run

# %% [markdown]
# ## Plots
#
# `run.history` has one dict per step with every logged metric (the rows of the run's
# `metrics.jsonl`); `run.evals` the held-out evaluations, the base policy's at step 0.

# %%
import matplotlib.pyplot as plt

print(f'{len(run.history)} steps; metrics per step: {len(run.history[0])}, e.g. '
      + ', '.join(sorted(run.history[0])[:8]))
panels = [('reward/mean', 'reward'), ('kl', 'KL to the reference'), ('entropy', 'entropy'),
          ('response/len_mean', 'response length (tokens)')]
fig, axes = plt.subplots(1, 5, figsize=(19, 3.4))
for ax, (key, title) in zip(axes, panels):
  ax.plot(*run.series(key), '.-', lw=1)
  ax.set(title=title, xlabel='step')
k = config.eval.k
for key, label in (('greedy_acc', 'greedy'), (f'mean@{k}_acc', f'mean@{k}')):
  steps, values = run.series(f'eval/{key}', kind='eval')
  axes[-1].plot([0] + steps, [run.evals[0][f'eval/base_{key}']] + values, 'o-', label=label)
axes[-1].set(title='held-out accuracy', xlabel='step', ylim=(0, 1))
axes[-1].legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## After training
#
# `run.policy` is the policy of the run's last checkpoint. `api.evaluate` is the trainer's own
# held-out evaluation, so it gives the run's final numbers again.

# %%
show(run.policy, f'trained policy (step {run.policy.step})')
print(api.evaluate(run.policy))
print({key: value for key, value in run.summary.items() if 'acc' in key})

# %% [markdown]
# ## Change one thing and run again
#
# For example without the KL penalty, or with a larger group:
#
# ```python
# run2 = api.train(api.load_config(RECIPE, {**OVERRIDES, 'algo.kl_coef': 0.0}))
# ```
#
# The same run from a terminal: `python -m rft_jax.main --config configs/grpo_arith.py
# --workdir runs/grpo_arith`; its `metrics.jsonl` reads back with `api.open_run(workdir)`.
