"""Per-device memory of a run on a (data, fsdp, tensor) mesh, checked before the first step.

With mesh (d, f, t), n = d * f (batch rows are split n ways), c = bytes of the compute dtype:

  params       sum_p 4 * size(p) / shards(p)   float32; shards(p) is the product of the mesh axes
               its logical names map to ('embed' -> f; 'vocab', 'heads', 'kv_heads', 'mlp' -> t);
               data replicates params
  optimizer    2 * params                      AdamW mu and nu, float32, sharded like the params
                                               (the step counters are scalars: ignored)
  initial      params: the build's initial weights (components.build's params), which every
               recipe keeps for the whole run next to the trained copy: the base eval (RL,
               DPO), the template a checkpoint's reference is restored against (runs.open_run),
               and, where the recipe has a reference policy (kl_coef > 0 / monitor 'auto';
               DPO), the reference itself (the same arrays, not a copy: counted once)
  reset_references  2 * params with monitor.mode 'auto', else 0: what 'auto' remediation's
               reset_reference can hold at most (rft_jax/trainer.py execute), each a copy of
               its own: the reset reference (the policy it reset to, or one read back from a
               checkpoint by a restore or resume) and, while that reset is watched, the
               reference its undo puts back when that was itself a reset one (after an earlier
               reset was kept; the initial policy is the `initial` arrays, no copy). Not
               counted: while a remediation restore (or a resume) reads a checkpoint, the old
               train state and reference are still held beside the restored ones (the restored
               train state and one params' worth of reference more, between steps: no KV cache
               or activations are alive then)
  grads        params, x 2 with micro-batches > 1 (the accumulator and one micro-batch's grads)
  kv_cache     2 * layers * (B / n) * S * (K / t) * D * c
               B = prompts_per_step * group_size rows, S = max_prompt_len + max_new_tokens;
               the cache [B, K, S, D] is split as the model constrains it: rows over data * fsdp,
               KV heads over tensor (llama.py; B / n is rounded up when n does not divide B)
  activations  an ESTIMATE of what the train step's backward pass keeps:
               b = B / (minibatches * microbatches * n) rows (PPO's algo.minibatches: one
               mini-batch update at a time; 1 for the other recipes), L = S tokens, E hidden,
               F MLP, H, K heads, D, V;
               one layer's activations A = b * L * (c * (6E + 3(H + K)D / t + 4F / t)
                                                    + 12 * (H / t) * L)
               (residual / norm / attention-out / MLP-out tensors (6E), q before and after rope,
               k, v and attention output (3(H + K)D), gate, up, silu, product (4F), float32
               scores, softmax and probabilities ([H, L, L])), and the LM head's float32 logits,
               their log-softmax, softmax and gradient: 16 * b * L * V / t.
                 no rematerialisation:  layers * A + 16 b L V / t
                 model.scan_layers with model.remat (the layers in one lax.scan, each under
                 jax.checkpoint): what each layer saves, layers * b * L * s, one layer
                 recomputed at a time, A, the weights stacked inside the step and their
                 stacked gradient, 2 * params, and the LM head:
                   s = c * E                                      remat 'full' (the input)
                   s = c * (2E + (H + 2K)D / t + 2F / t)          'dots_no_batch' (+ q, k, v,
                                                                  o- and down-proj, gate, up)
                   s = that + c * H D / t + 4 (H / t) L           'dots' (+ the attention's
                                                                  batched dots: scores, p v)
                 scan_layers without remat: layers * A + 2 * params + the LM head.
               Unrolled layers with model.remat are counted as without: XLA on CPU keeps nearly
               all of it there (README, tools/bench_layers: -10%); on GPU/TPU it may keep less,
               so the estimate is an upper bound there. XLA fuses some tensors and keeps others:
               treat the estimate as within a factor ~2 (tests/test_memory.py checks it against
               XLA's own temp memory on CPU for each layout).

  sampling_weights  params with the fsdp axis unsplit, when rollout.weights_layout = 'no_fsdp'
               (mesh.sampling_shardings: the copy the sampler reads), else 0

  PPO's critic (config.algo.critic; rft_jax/algorithms/critic.py, ppo.extra_state), 0 without:
  critic       3 * C: its params C and their AdamW mu and nu (its own optimiser), float32, where
               C = 4 * (E + 1)              'shared': a value head (kernel [E], bias; replicated)
               C = 4 * (E + 1) + params     'separate': + a second backbone of the policy's
                                            architecture, sharded like the policy's params
  critic_step  what the train step adds for it: its grads, C (x 2 with micro-batches > 1: they
               are summed with the policy's), the batch's old values and returns,
               2 * 4 * ceil(B / n) * (S - 1) (float32 [B, L]), and for 'separate' the backbone's
               forward + backward activations on the same rows: activations without the LM-head
               term (the critic's logits are unused; XLA drops them)

  peak = params + optimizer + initial + reset_references + critic
         + max(kv_cache + sampling_weights, grads + activations + critic_step)
  (sampling and the train step run one after the other; the KV cache and the sampling copy live
  only while sampling)

device_memory_bytes() reads jax.devices()[0].memory_stats()['bytes_limit'] (None on CPU, where
check_fits checks nothing). check_fits raises MemoryBudgetError, one line, when the peak exceeds
`fraction` of it.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from rft_jax.config_schema import critic_layout, ppo_minibatches
from rft_jax.models import functional as lm
from rft_jax.models.llama import ModelConfig
from rft_jax.parallel.rules import LOGICAL_RULES, MESH_AXES

GIB = 2 ** 30


class MemoryBudgetError(ValueError):
  """The estimated per-device memory exceeds the device's (one-line message)."""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Per-device bytes of each part (see the module docstring for the formulas)."""
  params: int
  optimizer: int
  initial: int              # the build's initial weights (the reference, where there is one)
  grads: int
  kv_cache: int
  activations: int
  sampling_weights: int = 0
  critic: int = 0           # PPO's critic: params + AdamW state (persistent)
  critic_step: int = 0      # its grads, activations, old values and returns (train step only)
  reset_references: int = 0   # 'auto' remediation's reset reference and the one an undo needs

  @property
  def persistent(self) -> int:
    return self.params + self.optimizer + self.initial + self.reset_references + self.critic

  @property
  def peak(self) -> int:
    return self.persistent + max(self.kv_cache + self.sampling_weights,
                                 self.grads + self.activations + self.critic_step)

  def describe(self) -> str:
    """'<peak> GiB per device (<part> <GiB>, ...)'; the optional parts only when non-zero."""
    optional = ('sampling_weights', 'critic', 'critic_step', 'reset_references')
    parts = ', '.join(f'{k} {getattr(self, k) / GIB:.2f}' for k in
                      ('params', 'optimizer', 'initial', 'reset_references', 'critic', 'grads',
                       'kv_cache', 'activations', 'critic_step', 'sampling_weights')
                      if k not in optional or getattr(self, k))
    return f'{self.peak / GIB:.2f} GiB per device ({parts} GiB)'


def _mesh_sizes(mesh) -> dict:
  """A Mesh, a {'data', 'fsdp', 'tensor'} dict or a (data, fsdp, tensor) tuple -> dict."""
  if hasattr(mesh, 'shape') and hasattr(mesh, 'axis_names'):
    return {a: int(mesh.shape[a]) for a in MESH_AXES}
  if isinstance(mesh, dict):
    return {a: int(mesh[a]) for a in MESH_AXES}
  return dict(zip(MESH_AXES, (int(s) for s in mesh)))


def _shards(logical_name, sizes: dict) -> int:
  axes = LOGICAL_RULES.get(logical_name) if logical_name else None
  axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
  return math.prod(sizes[a] for a in axes)


def param_bytes(model_cfg: ModelConfig, mesh) -> int:
  """Per-device bytes of the float32 params: sum_p 4 * prod_i ceil(shape_i / shards_i)."""
  sizes = _mesh_sizes(mesh)
  _, abstract = lm.abstract_params(model_cfg)
  specs = jax.tree.leaves(nnx.to_pure_dict(nnx.get_partition_spec(abstract)),
                          is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  shapes = jax.tree.leaves(nnx.to_pure_dict(abstract))
  total = 0
  for spec, x in zip(specs, shapes):
    names = tuple(spec) + (None,) * (len(x.shape) - len(spec))
    local = [-(-d // _shards(n, sizes)) for d, n in zip(x.shape, names)]
    total += math.prod(local) * jnp.dtype(x.dtype).itemsize
  return total


def kv_cache_bytes(model_cfg: ModelConfig, mesh, rows: int, seq_len: int) -> int:
  """2 * layers * ceil(B / n) * S * (K / t) * D * c per device (module docstring)."""
  s = _mesh_sizes(mesh)
  b_local = -(-rows // (s['data'] * s['fsdp']))
  k_local = -(-model_cfg.num_key_value_heads // s['tensor'])
  c = jnp.dtype(model_cfg.compute_dtype).itemsize
  return 2 * model_cfg.num_hidden_layers * b_local * seq_len * k_local * model_cfg.head_dim * c


def activation_bytes(model_cfg: ModelConfig, mesh, rows: int, seq_len: int,
                     microbatches: int = 1, lm_head: bool = True) -> int:
  """The train step's activation ESTIMATE per device (formulas in the module docstring), for
  model_cfg's remat and scan_layers; lm_head=False leaves out the 16 b L V / t logits term (a
  separate critic's backbone, whose logits nothing reads)."""
  s = _mesh_sizes(mesh)
  t = s['tensor']
  b = -(-rows // (microbatches * s['data'] * s['fsdp']))
  m, L = model_cfg, seq_len
  c = jnp.dtype(m.compute_dtype).itemsize
  # Per device: heads, KV heads and MLP columns split over tensor (KV heads replicated when
  # fewer than t, as kv_cache_bytes counts them).
  heads, kv_heads, ffn = (-(-n // t) for n in (m.num_attention_heads, m.num_key_value_heads,
                                                m.intermediate_size))
  per_token = (c * (6 * m.hidden_size + 3 * (heads + kv_heads) * m.head_dim + 4 * ffn)
               + 12 * heads * L)
  layer = b * L * per_token                       # A: one layer's activations
  lm_head = 16 * b * L * (m.vocab_size // t) if lm_head else 0
  if not m.scan_layers:
    return m.num_hidden_layers * layer + lm_head
  stacked = 2 * param_bytes(model_cfg, mesh)      # the weights stacked in the step, their grads
  if m.remat == 'none':
    return m.num_hidden_layers * layer + stacked + lm_head
  saved = c * m.hidden_size                       # 'full': each layer's input
  if m.remat in ('dots', 'dots_no_batch'):
    saved += c * (m.hidden_size + (heads + 2 * kv_heads) * m.head_dim + 2 * ffn)
  if m.remat == 'dots':
    saved += c * heads * m.head_dim + 4 * heads * L
  return m.num_hidden_layers * b * L * saved + layer + stacked + lm_head


def critic_bytes(model_cfg: ModelConfig, mesh, critic: str) -> int:
  """C: per-device bytes of PPO's critic params (module docstring); 0 for critic 'none'."""
  if critic == 'none':
    return 0
  head = 4 * (model_cfg.hidden_size + 1)
  return head + (param_bytes(model_cfg, mesh) if critic == 'separate' else 0)


def _algo(config):
  return config.get('algo', None) or {}


def run_critic(config) -> str:
  """The recipe's critic layout as ppo.algo_config reads it: algo.critic (PPOConfig's default
  'shared') for a critic-based advantage ('gae'), else 'none'."""
  return critic_layout(_algo(config))


def run_reset_references(config) -> int:
  """Copies of the params 'auto' remediation's reference resets can hold at once (module
  docstring): 2 with monitor.mode 'auto', else 0."""
  m = config.get('monitor', None)
  return 2 if m is not None and m.get('mode', 'off') == 'auto' else 0


def estimate(model_cfg: ModelConfig, mesh, *, rows: int, seq_len: int, microbatches: int = 1,
             sampling_layout: str = 'train',
             sample_rows: int | None = None, critic: str = 'none',
             minibatches: int = 1, reset_references: int = 0) -> MemoryEstimate:
  """Per-device MemoryEstimate for B = rows trained rows of seq_len tokens, sample_rows of them
  sampled with a KV cache (default: all rows; 0 for a recipe that does not sample, e.g. SFT);
  critic: PPO's critic layout ('none' | 'shared' | 'separate'); minibatches: PPO's updates per
  epoch, each on B / minibatches rows (the activations'); reset_references: params copies held
  for remediation's reference resets (run_reset_references)."""
  p = param_bytes(model_cfg, mesh)
  sampling = (param_bytes(model_cfg, {**_mesh_sizes(mesh), 'fsdp': 1})
              if sampling_layout == 'no_fsdp' else 0)
  grads_x = 2 if microbatches > 1 else 1
  c = critic_bytes(model_cfg, mesh, critic)
  critic_step = 0
  if critic != 'none':
    s = _mesh_sizes(mesh)
    values_returns = 2 * 4 * -(-rows // (s['data'] * s['fsdp'])) * (seq_len - 1)
    backbone = (activation_bytes(model_cfg, mesh, rows, seq_len, minibatches * microbatches,
                                 lm_head=False)
                if critic == 'separate' else 0)
    critic_step = c * grads_x + values_returns + backbone
  return MemoryEstimate(
      params=p, optimizer=2 * p, initial=p,
      grads=p * grads_x,
      kv_cache=kv_cache_bytes(model_cfg, mesh, rows if sample_rows is None else sample_rows,
                              seq_len),
      activations=activation_bytes(model_cfg, mesh, rows, seq_len, minibatches * microbatches),
      sampling_weights=sampling, critic=3 * c, critic_step=critic_step,
      reset_references=reset_references * p)


def estimate_run(config, model_cfg: ModelConfig, mesh, *, microbatches: int = 1,
                 critic: str | None = None,
                 minibatches: int | None = None) -> MemoryEstimate:
  """estimate() with the recipe's sizes: rows = rollout.prompts_per_step * rollout.group_size,
  seq_len = task.max_prompt_len + rollout.max_new_tokens; critic: default run_critic(config);
  minibatches: default ppo_minibatches (algo.minibatches with PPO, else 1); reset_references:
  run_reset_references(config)."""
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  seq_len = config.task.max_prompt_len + config.rollout.max_new_tokens
  return estimate(model_cfg, mesh, rows=rows, seq_len=seq_len, microbatches=microbatches,
                  sampling_layout=config.rollout.get('weights_layout', 'train'),
                  critic=run_critic(config) if critic is None else critic,
                  minibatches=(ppo_minibatches(_algo(config)) if minibatches is None
                               else minibatches),
                  reset_references=run_reset_references(config))


def device_memory_bytes(device=None) -> int | None:
  """The device's usable bytes (memory_stats()['bytes_limit']), or None where unreported (CPU)."""
  device = jax.devices()[0] if device is None else device
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-exception-caught  (backends without the call)
    return None
  if not stats or 'bytes_limit' not in stats:
    return None
  return int(stats['bytes_limit'])


RL_REMEDY = ('raise config.algo.microbatches, or lower rollout.prompts_per_step / group_size / '
             'max_new_tokens')


def check_fits(est: MemoryEstimate, device_bytes: int | None = None,
               fraction: float = 0.9, remedy: str = RL_REMEDY) -> None:
  """Raises MemoryBudgetError when est.peak > fraction * device memory (unknown memory: no-op).
  remedy: the recipe's own keys that shrink the estimate (default: an RL recipe's)."""
  device_bytes = device_memory_bytes() if device_bytes is None else device_bytes
  if device_bytes is None or est.peak <= fraction * device_bytes:
    return
  raise MemoryBudgetError(
      f'estimated {est.describe()} exceeds {fraction:.0%} of the device\'s '
      f'{device_bytes / GIB:.2f} GiB; shard more (config.mesh.fsdp / tensor), {remedy}')
