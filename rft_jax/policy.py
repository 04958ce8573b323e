"""A policy to sample from and evaluate (rft_jax.api): a recipe's model with its params.

  policy = load_policy(config)                 # the recipe's starting policy (init_from, HF path)
  policy = load_policy(config, workdir)        # the params of a run's latest checkpoint
  sample(policy, ['12+7='], n=4)               # -> [['19', '19', '18', '19']]
  evaluate(policy)                             # the trainer's held-out eval, same numbers
  choose_mesh(config)                          # a mesh for the devices found (any recipe)

Everything is built by rft_jax.components.build, as the trainers build it but without their check
of the train prompts' lengths (a policy is sampled here, not trained); sampling and evaluation
use the trainers' jitted sampler and Evaluator. JAX is imported on first use.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(eq=False)
class Policy:
  """A recipe's model and params.

  config: the recipe; components: rft_jax.components.Components (mesh, tokenizer, model_cfg,
  graphdef, data sources; its params are the starting ones); params: this policy's params (a
  pure dict placed like components.params); step: the checkpoint step (0 = starting policy).
  """
  config: Any
  components: Any
  params: Any
  step: int = 0
  _compiled: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def tokenizer(self):
    return self.components.tokenizer

  @property
  def model_cfg(self):
    return self.components.model_cfg

  def __repr__(self) -> str:
    return (f'Policy({self.config.name!r}, step={self.step}, '
            f'params={self.model_cfg.num_params():,})')


def check_arg(fn: str, value, want: str) -> None:
  """TypeError (one line) for an API call given the wrong kind of object, saying what to pass:
  sample(run) -> 'pass run.policy', train('grpo_arith') -> "pass api.load_config('grpo_arith')".
  want: 'config' (an ml_collections.ConfigDict) or 'policy' (a Policy)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  cls = ml_collections.ConfigDict if want == 'config' else Policy
  if isinstance(value, cls):
    return
  got = type(value).__name__
  if want == 'policy':
    hint = 'run.policy' if got == 'Run' else 'run.policy or api.load_policy(config)'
  else:
    hint = {'Run': 'run.config', 'Policy': 'policy.config',
            'str': f'api.load_config({value!r})'}.get(got, 'api.load_config(recipe, overrides)')
  raise TypeError(f'{fn}: expected a {cls.__name__}, got {got}; pass {hint}')


def load_policy(config, workdir: str | None = None, step: int | None = None) -> Policy:
  """The recipe's starting policy, or with `workdir` the params of that run's checkpoint `step`
  (default: the latest verified one). Raises SetupError (bad files or mesh; a run of another
  recipe or model than `config`) or FileNotFoundError (no checkpoint), one line each."""
  check_arg('load_policy', config, 'config')
  from rft_jax import components, workdir_config  # pylint: disable=g-import-not-at-top
  if workdir is not None:   # another recipe's or model's run: its params were mixed in silently
    workdir_config.check_workdir_config(config, workdir, advice=(
        'pass the config the run was started with (api.open_run(workdir).policy reads it)'),
        training=False)
  # trains nothing: train prompts unchecked; with workdir the initial weights go unread
  c = components.build(config, params=workdir is None, check_prompts=False)
  if workdir is None:
    return Policy(config=config, components=c, params=c.params, step=0)
  from rft_jax.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'{workdir}: no checkpoints directory (not a run directory?)')
  with Checkpointer(directory, keep=0) as ckpt:
    steps = ckpt.all_steps()
    if step is None and not steps:
      raise FileNotFoundError(f'{directory}: no complete checkpoint')
    step = steps[-1] if step is None else step
    if step not in steps:
      raise FileNotFoundError(f'{directory}: no checkpoint of step {step} (have {steps})')
    try:   # its params alone (no optimizer state); ValueError: a run of another model
      params = ckpt.restore_params(step, c.params, c.param_shardings)
    except ValueError as e:
      raise components.SetupError(
          f'{directory}/{step}/state: {str(e).splitlines()[0]}') from None
  return Policy(config=config, components=c, params=params, step=step)


def completion_len(config) -> int:
  """The recipe's completion length: rollout.max_new_tokens, else sft/dpo answer_len."""
  if 'rollout' in config:
    return config.rollout.max_new_tokens
  section = config.sft if 'sft' in config else config.dpo
  return section.answer_len


def sample(policy: Policy, prompts: Sequence[str], *, n: int = 1, temperature: float = 1.0,
           max_new_tokens: int | None = None, top_k: int = 0, top_p: float = 1.0,
           seed: int = 0) -> list[list[str]]:
  """n completions of each prompt (one list per prompt), decoded to text, EOS left out.

  prompts are questions as the task's data holds them ('12+7='); for GSM8K they are rendered
  through the chat template and instruction as in training. temperature 0 = greedy.
  max_new_tokens: default the recipe's completion length. Same seed, same completions.
  """
  check_arg('sample', policy, 'policy')
  if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
    raise TypeError(f'sample: prompts must be a list of strings, got {type(prompts).__name__}'
                    + (" (wrap one prompt in a list: ['12+7='])" if isinstance(prompts, str)
                       else ''))
  if n < 1 or not prompts:
    raise ValueError(f'sample: need n >= 1 and at least one prompt (n={n}, '
                     f'{len(prompts)} prompts)')
  _check_ranges('sample', {'rollout.temperature': temperature, 'rollout.top_k': top_k,
                           'rollout.top_p': top_p, 'rollout.max_new_tokens': max_new_tokens})
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from rft_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  from rft_jax.sampling import sampler as samplerlib  # pylint: disable=g-import-not-at-top
  from rft_jax.sampling.text import decode_completions  # pylint: disable=g-import-not-at-top
  c, config = policy.components, policy.config
  fmt, p_len = pipeline.PromptFormat.of_task(config.task), config.task.max_prompt_len
  rows = []
  for i, prompt in enumerate(prompts):
    record = {'id': i, 'prompt': fmt.render(prompt, c.tokenizer), 'answer': ''}
    try:
      rows.append(pipeline.encode_prompt(record, c.tokenizer, p_len))
    except ValueError as e:
      raise ValueError(f'sample: prompt {i} {str(e).split(": ", 1)[-1]} '
                       '(config.task.max_prompt_len)') from None
  cfg = samplerlib.SamplingConfig(
      max_new_tokens=max_new_tokens or completion_len(config), eos_id=c.tokenizer.eos_id,
      stop_ids=samplerlib.extra_stop_ids(c.tokenizer), pad_id=c.tokenizer.pad_id,
      temperature=float(temperature), top_k=top_k, top_p=top_p)
  key = ('sampler', cfg, n)
  if key not in policy._compiled:
    policy._compiled[key] = samplerlib.make_sampler(c.graphdef, c.model_cfg, cfg, group_size=n)
  rollout = policy._compiled[key](
      policy.params, np.stack([r['prompt_tokens'] for r in rows]),
      np.stack([r['prompt_mask'] for r in rows]), jax.random.key(seed))
  texts = decode_completions(c.tokenizer, rollout.tokens_bt, rollout.mask_bt)
  return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]


def evaluate(policy: Policy, *, num_prompts: int | None = None, k: int | None = None,
             temperature: float | None = None) -> dict[str, float]:
  """Held-out accuracy with the trainer's Evaluator: {'eval/greedy_acc', 'eval/mean@K_acc'}.

  Defaults come from config.eval (the first num_prompts test prompts, K samples each at
  temperature); with them the numbers equal the run's own eval of the same params.
  """
  check_arg('evaluate', policy, 'policy')
  from rft_jax import components, evaluation  # pylint: disable=g-import-not-at-top
  _check_ranges('evaluate', {'eval.num_prompts': num_prompts, 'eval.k': k,
                             'eval.temperature': temperature})
  config = copy.deepcopy(policy.config)
  for name, value in (('num_prompts', num_prompts), ('k', k), ('temperature', temperature)):
    if value is not None:
      config.eval[name] = type(config.eval[name])(value)
  c = policy.components
  key = ('evaluator', config.eval.num_prompts, config.eval.k, config.eval.temperature)
  if key not in policy._compiled:
    policy._compiled[key] = evaluation.Evaluator(
        c.graphdef, c.model_cfg, c.tokenizer, components.eval_batch(c, config),
        max_new_tokens=completion_len(config), k=config.eval.k,
        temperature=config.eval.temperature, seed=config.seed)
  return policy._compiled[key](policy.params)


def _check_ranges(fn: str, values: dict) -> None:
  """ValueError (one line) for an argument the recipe's config rules would refuse, e.g.
  evaluate(k=0) (was a shape error inside JAX), sample(temperature=-1) (sampled garbage)."""
  from rft_jax import config_rules as rules  # pylint: disable=g-import-not-at-top
  for key, ok, requirement in rules.COMMON_RULES + rules.RL_RULES:
    if values.get(key) is not None and not ok(values[key]):
      raise ValueError(f'{fn}: {key.split(".")[1]}={values[key]!r}: {requirement}')


def choose_mesh(config, num_devices: int | None = None,
                device_bytes: int | None = None) -> dict[str, int]:
  """{'data', 'fsdp', 'tensor'} for a recipe (RL, SFT or DPO) on the devices found:
  all-data-parallel when its estimated per-device memory (rft_jax/parallel/memory.py) fits in
  90% of a device, else FSDP over all devices, else FSDP x tensor 2, 4, ...; each candidate must
  also divide the model (heads, hidden size) and the batch as the recipe's trainer checks it
  (RL: the rollout batch; SFT: sft.batch_size; DPO: the pairs per step). device_bytes: default
  the device's own (None on CPU, where every candidate fits). Raises SetupError (one line) when
  none fits."""
  check_arg('choose_mesh', config, 'config')
  import jax  # pylint: disable=g-import-not-at-top
  from rft_jax import components, run_memory  # pylint: disable=g-import-not-at-top
  from rft_jax.parallel import memory  # pylint: disable=g-import-not-at-top
  from rft_jax.parallel import mesh as meshlib  # pylint: disable=g-import-not-at-top
  n = jax.device_count() if num_devices is None else num_devices
  if device_bytes is None:
    device_bytes = memory.device_memory_bytes()
  model_cfg = components.model_config(config)
  sizes = run_memory.memory_sizes(config)
  candidates = [(n, 1, 1)] + [(1, n // t, t) for t in (1, 2, 4, 8) if n % t == 0]
  seen = []
  for shape in candidates:
    try:
      meshlib.check_model_fits_mesh(model_cfg, shape)
    except meshlib.MeshError:
      continue
    try:   # the batch as the recipe's trainer splits it
      components.check_batch_splits(config, shape)
    except components.SetupError:
      continue
    est = memory.estimate(model_cfg, shape, **sizes)
    seen.append((est.peak, shape))
    if device_bytes is None or est.peak <= 0.9 * device_bytes:
      return dict(zip(('data', 'fsdp', 'tensor'), shape))
  if not seen:
    key, rows, _ = components.batch_splits(config)[0]
    raise components.SetupError(f'no mesh of {n} devices divides the model and the batch '
                                f'(config.{key}={rows}); set config.mesh by hand')
  peak, shape = min(seen)
  raise components.SetupError(
      f'no mesh of {n} devices fits: the smallest estimate is {peak / 2**20:,.0f} MiB per device '
      f'(mesh {shape}) > 90% of {device_bytes / 2**20:,.0f} MiB; lower the batch sizes, raise '
      'the microbatches or use more devices')
