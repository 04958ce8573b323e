r"""GRPO on GSM8K for Qwen2.5-0.5B-Instruct (or 1.5B), from a local Hugging Face checkpoint.

  python -m rft_jax.main --config configs/grpo_gsm8k_qwen2.py \
      --config.model.path=/data/Qwen2.5-0.5B-Instruct \
      --config.task.manual_dir=/data/gsm8k --workdir runs/grpo_gsm8k_qwen2

  --config configs/grpo_gsm8k_qwen2.py:1.5b   the same for Qwen2.5-1.5B-Instruct
  --config configs/grpo_gsm8k_qwen2.py:tiny   a few tiny steps: tests (tests/test_gsm8k_recipe.py)

`model.path` is the HF directory as downloaded (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, generation_config.json); the tokenizer is read from the same directory
(`tokenizer.path = ''`). `task.manual_dir` holds the official GSM8K `train.jsonl` and
`test.jsonl` (see rft_jax/data/gsm8k.py); nothing is downloaded at run time.

Meant for one GPU/TPU host (bf16 compute, float32 params and Adam state: ~8 GB for 0.5B, ~25 GB
for 1.5B before activations). Each question is sent as the user turn of the Qwen chat template
with "Please reason step by step, and put your final answer within \boxed{}."; the reward is 1
for the right final number (rft_jax/rewards/gsm8k.py) plus 0.1 for stating it explicitly
(\boxed{} or ####). Published GRPO runs at this scale start near ~30-50% (0.5B) / ~60-70%
(1.5B) greedy test accuracy and gain several points in a few hundred steps; this recipe has not
been run at full size here (no accelerator), so treat those as expectations, not results.
"""
import ml_collections

from configs import common

# Qwen2.5-*-Instruct architectures, as in their config.json (components.model_config checks
# every field against the checkpoint's config.json and names any that differ).
QWEN25 = {
    '0.5b': dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, head_dim=64),
    '1.5b': dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, head_dim=128),
}


VARIANTS = ('', *QWEN25, 'tiny')   # '' = '0.5b'


def get_config(arg: str = ''):
  common.check_variant(arg, VARIANTS)
  size = arg if arg in QWEN25 else '0.5b'
  config = ml_collections.ConfigDict()
  config.name = f'grpo_gsm8k_qwen2_{size}' if arg != 'tiny' else 'grpo_gsm8k_qwen2_tiny'
  config.variant = arg   # recorded with the run: config.json, summary.json, metrics.jsonl
  config.seed = 0

  # Input: GSM8K from local JSONL files (TFDS builder, array_record), through the chat template.
  config.task = ml_collections.ConfigDict()
  config.task.name = 'gsm8k'
  config.task.data_dir = ''          # prepared TFDS data; '' = ~/.cache/rft_jax/tfds
  config.task.manual_dir = ''        # REQUIRED: --config.task.manual_dir=DIR with the .jsonl files
  config.task.max_prompt_len = 384   # longest GSM8K question + template + instruction < 300 tokens
  config.task.chat_template = True   # render with tokenizer_config.json's chat_template
  config.task.system_prompt = ''     # '' = the template's default system turn
  config.task.instruction = ('Please reason step by step, and put your final answer within '
                             '\\boxed{}.')
  config.tokenizer = ml_collections.ConfigDict()
  config.tokenizer.path = ''         # '' = config.model.path (the checkpoint's own tokenizer)

  # Policy: the HF checkpoint at model.path. The fields below must equal its config.json.
  config.model = ml_collections.ConfigDict(dict(
      path='',                       # REQUIRED: --config.model.path=DIR
      vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
      attention_bias=True, max_position_embeddings=32768,
      dtype='bfloat16',              # compute dtype; params and optimiser state stay float32
      **QWEN25[size]))
  common.memory_options(config.model)   # e.g. --config.model.remat=full for a larger model
  config.init_from = ''              # params come from model.path

  # Rollouts: G completions for each prompt; long enough for step-by-step reasoning.
  config.rollout = ml_collections.ConfigDict()
  config.rollout.prompts_per_step = 16
  config.rollout.group_size = 8      # 128 completions per step
  config.rollout.max_new_tokens = 512
  config.rollout.temperature = 1.0
  config.rollout.top_k = 0           # 0 = off
  config.rollout.top_p = 1.0         # 1.0 = off
  # With mesh.fsdp > 1, 'no_fsdp' gathers the weights once per step for the whole decode loop
  # instead of in every decode step (memory: params / tensor per device while sampling).
  config.rollout.weights_layout = 'train'

  # Rewards: the right final number, plus a little for stating it explicitly.
  config.rewards = ml_collections.ConfigDict()
  config.rewards.weights = ml_collections.ConfigDict({'gsm8k': 1.0, 'gsm8k_format': 0.1})
  config.rewards.timeout_s = 2.0
  config.rewards.num_workers = 4
  config.rewards.max_invalid_frac = 0.5
  config.rewards.memory_mb = 1024

  # Algorithm: GRPO with a small k3 KL to the initial policy, one update per rollout batch.
  config.algo = ml_collections.ConfigDict()
  config.algo.advantage = 'grpo'
  config.algo.loss = 'ppo_clip'
  config.algo.loss_agg = 'token_mean'
  config.algo.clip_eps = 0.2
  config.algo.kl_coef = 0.001        # keeps a second (reference) copy of the params
  config.algo.kl_estimator = 'k3'
  config.algo.updates_per_batch = 1  # on-policy
  # 128 rows of 384 + 512 tokens: 16 rows of [896, 151936] logits per micro-batch.
  config.algo.microbatches = 8

  # The small learning rate that full fine-tuning of an instruct model needs.
  config.optim = common.optim(1e-6, b2=0.999)

  # Loop, eval and checkpoints: 300 steps * 16 prompts = 4800 questions (~0.65 epoch).
  config.train = common.train(300, eval_every=50, ckpt_every=50)

  config.eval = common.evaluation(k=4)

  config.mesh = common.mesh()        # all devices data-parallel; set fsdp for larger models

  config.monitor = common.monitor('warn')   # see configs/common.py for the modes

  config.faults = []

  config.telemetry = common.telemetry()

  if arg == 'tiny':   # a tiny random checkpoint on CPU: the model fields come from the command line
    config.model.dtype = 'float32'
    config.task.max_prompt_len = 160
    config.rollout.prompts_per_step = 2
    config.rollout.group_size = 2
    config.rollout.max_new_tokens = 8
    config.rewards.num_workers = 0
    config.algo.microbatches = 1
    config.train.steps = 2
    config.train.eval_every = 2
    config.train.ckpt_every = 2
    config.eval.num_prompts = 2
    config.eval.k = 2
    config.monitor.warmup = 2
    config.telemetry.tensorboard = False
    config.telemetry.plot = False
  return config
