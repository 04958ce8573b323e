# ---
# jupyter:
#   accelerator: GPU
#   colab:
#     gpuType: T4
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: accelerator,colab
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
# # GRPO on GSM8K with a real checkpoint (Qwen2.5-0.5B-Instruct)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/rft-jax/rft_jax/blob/main/experiments/notebooks/04_real_checkpoint.ipynb)
#
# `configs/grpo_gsm8k_qwen2.py` on a Hugging Face checkpoint: the Qwen2 chat template with
# "Please reason step by step, and put your final answer within \boxed{}.", reward 1 for the
# right final number plus 0.1 for stating it explicitly. Meant for a Colab GPU or TPU runtime
# (Runtime > Change runtime type); the mesh is chosen from the devices found. On a CPU the
# notebook shrinks the run to a few tiny steps, which only shows that everything connects.
#
# **Downloads.** Besides Colab's setup (clone and pip install), only where you ask for them:
# `DOWNLOAD = True` below fetches the model from the Hugging Face Hub (about 1 GB) and GSM8K's
# two JSONL files from GitHub (about 4 MB). Not yet
# run at full size by the authors (no accelerator was available): treat the recipe's expected
# numbers (greedy test accuracy near 30-50% at the start, several points gained in a few hundred
# steps) as expectations, not results.

# %% [markdown]
# **Setup.** Run from a checkout of the repository, this finds it. In Colab it clones the
# repository and installs rft_jax with pip, with the JAX build for the runtime's accelerator
# (if pip replaced packages Colab had already loaded, restart the session and run again).
# The model and the data are only downloaded where you ask for them, below.

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
# ## Checkpoint and data
#
# Point `RFT_MODEL_DIR` and `RFT_GSM8K_DIR` at local copies (defaults `~/rft_jax_models/...`
# and `~/rft_jax_data/gsm8k`), or set `DOWNLOAD = True`. The recipe's model fields are read
# from the checkpoint's `config.json` below, so another Qwen2/2.5 size (or a Llama-3.x or
# Mistral instruct model with a chat template) loads the same way; the recipe was written for
# Qwen2.5-0.5B/1.5B-Instruct.

# %%
MODEL_ID = 'Qwen/Qwen2.5-0.5B-Instruct'
MODEL_DIR = os.environ.get('RFT_MODEL_DIR',
                           os.path.expanduser('~/rft_jax_models/Qwen2.5-0.5B-Instruct'))
GSM8K_DIR = os.environ.get('RFT_GSM8K_DIR', os.path.expanduser('~/rft_jax_data/gsm8k'))
GSM8K_URL = ('https://raw.githubusercontent.com/openai/grade-school-math/master/'
             'grade_school_math/data/{}.jsonl')
DOWNLOAD = False   # True: the model from the Hugging Face Hub, GSM8K from GitHub (see above)

if DOWNLOAD:
  import urllib.request

  from huggingface_hub import snapshot_download
  snapshot_download(MODEL_ID, local_dir=MODEL_DIR,
                    allow_patterns=['*.json', '*.safetensors', '*.txt', 'tokenizer*'])
  os.makedirs(GSM8K_DIR, exist_ok=True)
  for split in ('train', 'test'):
    urllib.request.urlretrieve(GSM8K_URL.format(split),
                               os.path.join(GSM8K_DIR, f'{split}.jsonl'))
missing = [path for path in (os.path.join(MODEL_DIR, 'config.json'),
                             os.path.join(GSM8K_DIR, 'train.jsonl'),
                             os.path.join(GSM8K_DIR, 'test.jsonl')) if not os.path.isfile(path)]
if missing:
  raise FileNotFoundError(f'missing {missing}: set DOWNLOAD = True above, or RFT_MODEL_DIR and '
                          'RFT_GSM8K_DIR to local copies')

# %%
from rft_jax.models import hf_checkpoint
from rft_jax.tokenizer import load_tokenizer

hf_config = hf_checkpoint.load_hf_config(MODEL_DIR)   # one-line error for anything unsupported
family = hf_checkpoint.family(hf_checkpoint.read_config_json(MODEL_DIR))
tokenizer = load_tokenizer(MODEL_DIR)
print(f'{MODEL_DIR}: {family}, {hf_config.num_params():,} parameters, '
      f'{hf_config.num_hidden_layers} layers, hidden {hf_config.hidden_size}, '
      f'{hf_config.num_attention_heads} heads / {hf_config.num_key_value_heads} KV heads; '
      f'tokenizer {tokenizer!r}')

# %% [markdown]
# ## The recipe, scaled to the backend
#
# On a GPU/TPU: the full recipe (16 prompts x 8 completions of up to 512 tokens per step,
# 300 steps, bf16 compute). On a CPU (or with `RFT_NOTEBOOK_SMALL=1`): its `:tiny` variant,
# 2 steps of 2 prompts x 2 completions of 8 tokens. The prompt length is measured on the data
# (the longest question rendered through the chat template).

# %%
import json

from rft_jax.data import pipeline

SMALL_RUN = SMALL or BACKEND == 'cpu'
RECIPE = 'grpo_gsm8k_qwen2:tiny' if SMALL_RUN else 'grpo_gsm8k_qwen2'
recipe = api.load_recipe(api.resolve_recipe(RECIPE))   # unvalidated: model.path is still ''
recipe_model = recipe.model
overrides = {f'model.{key}': getattr(hf_config, key) for key in recipe_model.keys()
             if key not in ('path', 'dtype', 'remat', 'max_position_embeddings')}
overrides['model.max_position_embeddings'] = min(recipe_model.max_position_embeddings,
                                                 hf_config.max_position_embeddings)
fmt = pipeline.PromptFormat(chat=recipe.task.chat_template, instruction=recipe.task.instruction)
questions = []
for split in ('train', 'test'):
  with open(os.path.join(GSM8K_DIR, f'{split}.jsonl')) as f:
    questions += [json.loads(line)['question'] for line in f if line.strip()]
prompt_len = max(len(tokenizer.encode(fmt.render(q, tokenizer))) for q in questions)
overrides.update({'model.path': MODEL_DIR, 'task.manual_dir': GSM8K_DIR,
                  'task.max_prompt_len': prompt_len, 'telemetry.tensorboard': False})
config = api.load_config(RECIPE, overrides)
print(f'{config.name}: {len(questions)} questions, longest prompt {prompt_len} tokens; '
      f'{config.rollout.prompts_per_step} prompts x {config.rollout.group_size} completions of '
      f'<= {config.rollout.max_new_tokens} tokens, {config.train.steps} steps')

# %% [markdown]
# ## The mesh, from the devices found
#
# `api.choose_mesh` takes all-data-parallel when the estimated per-device memory (params, AdamW
# state, the initial weights, gradients, KV cache, activations: `rft_jax/parallel/memory.py`)
# fits in 90% of one device, else shards the params over the devices (FSDP), then adds tensor
# parallelism. It fails with one line when nothing fits.

# %%
from rft_jax.parallel import memory

mesh = api.choose_mesh(config)
config = api.load_config(RECIPE, {**overrides, **{f'mesh.{k}': v for k, v in mesh.items()}})
shape = tuple(mesh[a] for a in ('data', 'fsdp', 'tensor'))
estimate = memory.estimate_run(config, hf_config, shape, microbatches=config.algo.microbatches)
device_bytes = memory.device_memory_bytes()
print(f'{jax.device_count()} {BACKEND} device(s) -> mesh data x fsdp x tensor = {shape}; '
      f'estimated {estimate.describe()}'
      + (f' of {device_bytes / 2**30:.1f} GiB' if device_bytes else ''))

# %% [markdown]
# ## The starting policy on two test questions

# %%
policy = api.load_policy(config)
test_questions = questions[-2:]
for question, (completion,) in zip(test_questions,
                                   api.sample(policy, test_questions, temperature=0.0)):
  print(f'Q: {question}\nA: {completion}\n')

# %% [markdown] tags=["real-checkpoint"]
# ## Train
#
# From here on the notebook needs the real checkpoint and an accelerator to mean anything (CI
# runs it up to here, with a tiny random checkpoint standing in). The run's workdir keeps its
# checkpoints: if the runtime disconnects, run this cell again to resume from the latest one.

# %%
WORKDIR = os.path.abspath(os.path.join('runs', config.name))
run = api.train(config, WORKDIR)

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 4, figsize=(18, 3.4))
for ax, (key, title) in zip(axes, [('reward/gsm8k/mean', 'right answer (train)'),
                                   ('response/len_mean', 'response length'),
                                   ('kl', 'KL to the reference')]):
  ax.plot(*run.series(key), '.-', lw=1)
  ax.set(title=title, xlabel='step')
k = config.eval.k
for key, label in (('greedy_acc', 'greedy'), (f'mean@{k}_acc', f'mean@{k}')):
  steps, values = run.series(f'eval/{key}', kind='eval')
  axes[-1].plot([0] + steps, [run.evals[0][f'eval/base_{key}']] + values, 'o-', label=label)
axes[-1].set(title='GSM8K test accuracy', xlabel='step')
axes[-1].legend()
fig.tight_layout()
plt.show()

# %%
for question, (completion,) in zip(test_questions,
                                   api.sample(run.policy, test_questions, temperature=0.0)):
  print(f'Q: {question}\nA: {completion}\n')
print(run.summary)

# %% [markdown]
# ## Export
#
# The trained policy as a Hugging Face directory for transformers or vLLM (bf16 on disk), with
# the token ids and tokenizer files of the source checkpoint (as `python -m tools.checkpoint
# export` does for a run of a recipe file).

# %%
EXPORT_DIR = os.path.join(WORKDIR, 'exported')
source = hf_checkpoint.read_config_json(MODEL_DIR)
written = hf_checkpoint.save_hf(
    EXPORT_DIR, run.policy.params, run.policy.model_cfg, dtype='bfloat16', architecture=family,
    extra_config={k: source[k] for k in ('bos_token_id', 'eos_token_id', 'pad_token_id')
                  if k in source})
for name in sorted(os.listdir(MODEL_DIR)):
  if name.startswith(('tokenizer', 'generation_config', 'vocab', 'merges', 'special_tokens')):
    shutil.copy(os.path.join(MODEL_DIR, name), EXPORT_DIR)
    written.append(name)
print(f'{EXPORT_DIR}: {", ".join(written)}')
