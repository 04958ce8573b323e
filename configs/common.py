"""Pieces shared by the arithmetic recipes: the task, tokenizer and tiny model.

Both `sft_arith.py` (which builds the base policy) and `grpo_arith.py` (which post-trains it) use
exactly these, so the GRPO recipe can load the SFT checkpoint without shape surprises.
"""
import os

import ml_collections

# The checkout these recipes belong to (configs/..).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_variant(arg: str, variants: tuple[str, ...]) -> None:
  """ValueError when arg is not one of the recipe's VARIANTS, so that a direct call
  such as get_config('tinyy') fails instead of returning the full recipe (the CLI and
  rft_jax.api check before calling)."""
  if arg not in variants:
    raise ValueError(f"unknown variant {arg!r}; this recipe's variants: "
                     + ', '.join(repr(v) for v in variants))


def shipped_asset(name: str) -> str:
  """'rft_jax/assets/<name>' when the current directory is the repository (the README's
  commands), else its absolute path in this checkout, so that a notebook or script started
  from another directory finds the shipped tokenizer and base policy too. Paths a user sets
  stay relative to the current directory."""
  path = os.path.join('rft_jax', 'assets', name)
  return path if os.path.exists(path) else os.path.join(REPO_ROOT, path)


def arith_task():
  task = ml_collections.ConfigDict()
  task.name = 'arith'            # TFDS builder in rft_jax/data/arith.py
  task.data_dir = ''             # '' = ~/.cache/rft_jax/tfds (generated offline on first use)
  task.max_prompt_len = 8        # prompts are left-padded to this many tokens (BOS + "99+99=" is 7)
  return task


def tiny_tokenizer():
  tok = ml_collections.ConfigDict()
  tok.path = shipped_asset('arith_spm.model')  # SentencePiece, trained on the task corpus
  return tok


def tiny_model():
  """A ~0.8M-parameter Llama-style decoder. Field names follow HF `config.json`."""
  model = ml_collections.ConfigDict()
  model.vocab_size = 18          # = the shipped SentencePiece vocabulary
  model.hidden_size = 128
  model.intermediate_size = 384
  model.num_hidden_layers = 4
  model.num_attention_heads = 4
  model.num_key_value_heads = 2
  model.head_dim = 32
  model.rope_theta = 10000.0
  model.rms_norm_eps = 1e-6
  model.tie_word_embeddings = True
  model.attention_bias = False
  model.max_position_embeddings = 64
  model.dtype = 'float32'        # activation/compute dtype; params are always float32
  memory_options(model)
  return model


def memory_options(model):
  """Run-time options of the train step's forward pass (rft_jax/models/llama.py ModelConfig),
  not architecture: rematerialisation per layer, and one lax.scan over the layers."""
  model.remat = 'none'           # 'full' | 'dots' | 'dots_no_batch' trade compute for memory
  model.scan_layers = False      # True: compile time independent of depth
  return model


def mesh():
  m = ml_collections.ConfigDict()
  m.data = -1   # -1 = all devices not used by the other axes
  m.fsdp = 1
  m.tensor = 1
  return m


def optim(lr: float, warmup_steps: int = 10, b2: float = 0.99, weight_decay: float = 0.0):
  """AdamW with linear warm-up (warmup_steps counts optimiser updates: algo.updates_per_batch
  of them per RL step), constant after; gradients clipped at global norm 1."""
  o = ml_collections.ConfigDict()
  o.lr = lr
  o.warmup_steps = warmup_steps
  o.b1 = 0.9
  o.b2 = b2
  o.weight_decay = weight_decay
  o.grad_clip = 1.0
  return o


def train(steps: int, eval_every: int, ckpt_every: int, keep_checkpoints: int = 2):
  """The loop's length and cadence. A checkpoint that cannot be written (full disk) stops the
  run unless at least min_good_checkpoints good ones exist; then training goes on, reported."""
  t = ml_collections.ConfigDict()
  t.steps = steps
  t.eval_every = eval_every
  t.ckpt_every = ckpt_every
  t.keep_checkpoints = keep_checkpoints
  t.min_good_checkpoints = 1
  return t


def evaluation(num_prompts: int = 256, k: int = 8):
  """Held-out eval: greedy accuracy and mean@k (mean accuracy of k samples at temperature 1)."""
  e = ml_collections.ConfigDict()
  e.num_prompts = num_prompts   # the first num_prompts records of the test split
  e.k = k
  e.temperature = 1.0
  return e


def monitor(mode: str = 'warn'):
  """Failure monitor (rft_jax/monitor), updated on device every step from the telemetry.
  mode: off | warn (report incidents) | halt (stop on a critical one) | auto (restore the last
  checkpoint before onset, apply one targeted action, undo it if it does not help)."""
  m = ml_collections.ConfigDict()
  m.mode = mode
  m.warmup = 10        # steps used to learn each signal's baseline
  m.watch_steps = 10   # steps to judge a remediation before undoing it
  m.lr_factor = 0.1    # 'lower_lr' multiplies the learning rate by this
  m.max_skipped_steps = 5   # stop after this many steps in a row with a non-finite loss or grad
  return m


def telemetry():
  """Console, metrics.jsonl, TensorBoard and run.png on; W&B off ('' = no project).

  run.png is drawn from metrics.jsonl at the end of the run: jsonl = False means no run.png
  either, whatever `plot` says."""
  t = ml_collections.ConfigDict()
  t.console = True
  t.jsonl = True       # workdir/metrics.jsonl (run.png is drawn from it)
  t.tensorboard = True
  t.plot = True        # workdir/run.png; needs jsonl
  t.wandb_project = ''
  return t


def scaling(live_every: int = 0):
  """Live scaling fit (rft_jax/scaling/live.py): every `live_every` held-out evals, fit the eval
  curve against compute, log the predicted final accuracy (scaling/pred_final, _lo, _hi) and
  raise a 'scaling_anomaly' incident for an eval far below the previous fit's band. 0 = off."""
  s = ml_collections.ConfigDict()
  s.live_every = live_every
  s.model = 'sigmoid'          # or 'power_law'
  s.exclude_first = 0.1        # leave out evals with compute <= this fraction of the latest
  s.n_boot = 200               # bootstrap replicates: < 1 s per fit on one CPU core
  s.anomaly_sd = 3.0           # anomaly: eval < band low - max(anomaly_sd * residual sd,
  s.anomaly_min_drop = 0.05    #                                anomaly_min_drop)
  return s
