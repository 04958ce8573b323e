"""TRL side of `python -m tools.bench --compare trl`: TRL's GRPOTrainer on the same workload.

Runs in its own process (torch and JAX each want the cores), driven step by step by tools.bench
so the two systems alternate: before each step it reads a line ('go') from stdin, after it it
prints 'STEP {json}' with the step's phases:

  step_s      on_step_begin -> on_step_end (generation, scoring, reference pass, policy
              forward + backward, clipping, AdamW)
  generate_s  GRPOTrainer._generate_single_turn (transformers generate, KV cache)
  verify_s    GRPOTrainer._calculate_rewards (the same `first_even` verifier, in process)
  ref_s       the reference model's forward pass (_get_per_token_logps_and_entropies on it)
  policy_s    step_s minus _generate_and_score_completions: policy forward + backward + update
  host_s      the rest of _generate_and_score_completions (tokenising, advantages, metrics)

Settings follow the workload: the HF export of the identical model as both policy and
reference, fp32, gradient checkpointing off, num_iterations 1 (no old-policy pass), beta 0.04,
temperature 1, top-k/top-p off, AdamW (lr as rft_jax, betas 0.9/0.999, clip 1.0), loss_type
'dapo' (a global token mean, as rft_jax's token_mean), prompts in the same order.

  python -m tools.bench_trl --assets DIR --steps N     (normally started by tools.bench)
"""
import json
import os
import resource
import sys
import tempfile
import time

T_START = time.time()

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402

from tools import bench_workload as wl, cli  # noqa: E402


def first_even_reward(completions, **_):
  return wl.reward_texts(completions)


class Timers:
  """Wraps trainer methods to add their wall time to the current step's phases."""

  def __init__(self, trainer):
    self.phases = {}
    self._wrap(trainer, '_generate_single_turn', 'generate_s')
    self._wrap(trainer, '_calculate_rewards', 'verify_s')
    self._wrap(trainer, '_generate_and_score_completions', 'prep_s')
    self._wrap(trainer, '_get_per_token_logps_and_entropies', 'ref_s',
               only=lambda model, *a, **k: model is trainer.ref_model)

  def _wrap(self, obj, name, phase, only=None):
    fn = getattr(obj, name)

    def timed(*args, **kwargs):
      t = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        if only is None or only(*args, **kwargs):
          self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - t
    setattr(obj, name, timed)


class Lockstep(transformers.TrainerCallback):
  """Waits for 'go' on stdin before each step; prints the step's phases after it."""

  def __init__(self, timers: Timers):
    self.timers, self.t0 = timers, 0.0

  def on_step_begin(self, args, state, control, **kwargs):
    if sys.stdin.readline().strip() != 'go':
      control.should_training_stop = True
    self.timers.phases = {}
    self.t0 = time.perf_counter()

  def on_step_end(self, args, state, control, **kwargs):
    p = dict(self.timers.phases)
    p['step_s'] = time.perf_counter() - self.t0
    p['policy_s'] = p['step_s'] - p.get('prep_s', 0.0)
    p['host_s'] = p.get('prep_s', 0.0) - sum(p.get(k, 0.0)
                                            for k in ('generate_s', 'verify_s', 'ref_s'))
    print('STEP ' + json.dumps(p), flush=True)


def build(assets: str, w: wl.Workload, steps: int, out_dir: str):
  with open(os.path.join(assets, 'prompts.json')) as f:
    batches = json.load(f)['batches']
  prompts = [t for i in range(steps) for t in batches[i % len(batches)]['text']]
  args = trl.GRPOConfig(
      output_dir=out_dir, per_device_train_batch_size=w.rows, num_generations=w.group_size,
      gradient_accumulation_steps=1, num_iterations=1, max_completion_length=w.max_new_tokens,
      beta=w.kl_coef, learning_rate=w.lr, adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.0,
      max_grad_norm=1.0, lr_scheduler_type='constant', warmup_steps=0, max_steps=steps,
      temperature=1.0, top_p=1.0, top_k=0, loss_type='dapo', shuffle_dataset=False,
      gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True, logging_steps=1,
      report_to='none', save_strategy='no', disable_tqdm=True, seed=w.seed,
      dataloader_num_workers=0, log_completions=False)
  tokenizer = transformers.AutoTokenizer.from_pretrained(assets)
  trainer = trl.GRPOTrainer(model=assets, reward_funcs=first_even_reward, args=args,
                            train_dataset=datasets.Dataset.from_dict({'prompt': prompts}),
                            processing_class=tokenizer)
  return trainer


def main():
  ap = cli.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--assets', required=True)
  ap.add_argument('--steps', type=int, required=True)
  ap.add_argument('--workload', default='{}', help='Workload fields as JSON')
  args = ap.parse_args()
  w = wl.Workload(**json.loads(args.workload))
  transformers.logging.set_verbosity_error()
  with tempfile.TemporaryDirectory() as out_dir:
    trainer = build(args.assets, w, args.steps, out_dir)
    trainer.add_callback(Lockstep(Timers(trainer)))
    n = sum(p.numel() for p in trainer.model.parameters())
    print('READY ' + json.dumps({
        'setup_s': time.time() - T_START, 'params': n, 'torch_threads': torch.get_num_threads(),
        'versions': {'trl': trl.__version__, 'transformers': transformers.__version__,
                     'torch': torch.__version__}}), flush=True)
    trainer.train()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print('DONE ' + json.dumps({'peak_rss_mib': peak}), flush=True)


if __name__ == '__main__':
  main()
