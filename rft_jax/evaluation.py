"""Held-out evaluation: greedy accuracy and mean@k accuracy on a fixed set of prompts.

greedy_acc = mean over prompts of correct(greedy completion);
mean@k_acc = mean over prompts and k samples (at eval temperature) of correct(sample).
`correct` is the verifier named by eval_batch['verifier'] ('correct' when absent; 'gsm8k' for
GSM8K: see components.TASK_VERIFIERS).
"""
import jax
import numpy as np

from rft_jax.parallel import hostdata
from rft_jax.rewards.runner import RewardRunner
from rft_jax.sampling.sampler import SamplingConfig, extra_stop_ids, shared_sampler
from rft_jax.sampling.text import decode_completions


class Evaluator:
  """Jitted greedy and group samplers over one fixed eval batch, scored by the 'correct'
  verifier."""

  def __init__(self, graphdef, model_cfg, tokenizer, eval_batch: dict, *, max_new_tokens: int,
               k: int, temperature: float, seed: int = 0):
    base = dict(max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                stop_ids=extra_stop_ids(tokenizer))
    self._greedy = shared_sampler(graphdef, model_cfg, SamplingConfig(temperature=0.0, **base))
    self._sampled = shared_sampler(graphdef, model_cfg,
                                   SamplingConfig(temperature=temperature, **base), k)
    self._tokenizer = tokenizer
    self._batch = eval_batch
    self._answers = [str(a) for a in eval_batch['answer']]
    self.k = k
    self._rng = jax.random.key(seed + 1_000_003)   # fixed: every eval sees the same noise
    self._verifier = eval_batch.get('verifier', 'correct')
    self._score = RewardRunner({self._verifier: 1.0}, num_workers=0)

  def _correct(self, rollout, answers) -> np.ndarray:
    texts = decode_completions(self._tokenizer, hostdata.to_host(rollout.tokens_bt),
                               hostdata.to_host(rollout.mask_bt))
    result = self._score(texts, answers)
    return np.where(result.valid, result.per_verifier[self._verifier], 0.0)

  def __call__(self, params) -> dict[str, float]:
    pt, pm = self._batch['prompt_tokens'], self._batch['prompt_mask']
    greedy = self._correct(self._greedy(params, pt, pm, self._rng), self._answers)
    answers_k = [a for a in self._answers for _ in range(self.k)]
    sampled = self._correct(self._sampled(params, pt, pm, self._rng), answers_k)
    return {'eval/greedy_acc': float(greedy.mean()),
            f'eval/mean@{self.k}_acc': float(sampled.mean())}

  def samples(self, params, n: int = 4) -> list[tuple[str, str, str]]:
    """(prompt, greedy completion, answer) for the first n eval prompts, for logs and notebooks."""
    r = self._greedy(params, self._batch['prompt_tokens'], self._batch['prompt_mask'], self._rng)
    texts = decode_completions(self._tokenizer, hostdata.to_host(r.tokens_bt),
                               hostdata.to_host(r.mask_bt))
    return [(str(self._batch['prompt'][i]), texts[i], self._answers[i]) for i in range(n)]
