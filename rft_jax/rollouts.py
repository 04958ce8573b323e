"""The RL loop's rollout stage: prompts -> completions -> rewards (-> DAPO's group refill).

Called by rft_jax/trainer.py once per step. One round draws a prompt batch from the data
iterator, samples G completions per prompt with key round_rng(seed, step, round), decodes and
scores them, and applies the soft overlong punishment (algo.overlong == 'soft'). Without
algo.dynamic_sampling a step is exactly one round and its arrays go to the train step as they
are. With it, rounds repeat until the step holds rollout.prompts_per_step informative groups (or
algo.max_sampling_rounds rounds), and the batch is gathered from the picked groups (see
rft_jax/algorithms/dynamic_sampling.py). A group is informative when its accuracy varies (the
verifier with the largest reward weight; DAPO eq. 11), or with algo.dynamic_sampling_metric =
'reward' when its total reward does (format bonus and overlong penalty included). Every draw
advances the data iterator, whose state is checkpointed after the step, and every key is a function
of (seed, step, round): resume is exact.
"""
import dataclasses
import time
from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from rft_jax import runs
from rft_jax.algorithms import corrections
from rft_jax.algorithms import dynamic_sampling as ds
from rft_jax.parallel import hostdata
from rft_jax.rewards.runner import RewardResult
from rft_jax.sampling.text import decode_completions


@jax.jit
def _step_key(seed, step) -> jax.Array:
  """fold_in(key(seed), step) as one XLA program (eagerly, key and fold_in compile four)."""
  return jax.random.fold_in(jax.random.key(seed), step)


def round_rng(seed: int, step: int, round_: int) -> jax.Array:
  """Sampling key of one round: fold_in(key(seed), step) for round 0 (the trainer's step key),
  fold_in(that, round) for the refill rounds. The seed enters as its low 32 bits, as
  jax.random.key takes a Python int (a jit argument would overflow above int32), the step as a
  uint32, as fold_in converts it."""
  key = _step_key(np.uint32(seed & 0xFFFFFFFF), np.uint32(step))
  return key if round_ == 0 else jax.random.fold_in(key, round_)


@dataclasses.dataclass
class StepRollout:
  """What the train step consumes. rewards_b: float32 [B] (soft overlong penalty included);
  rewards: the verifiers' RewardResult of these rows (error/timeout counts over all rounds)."""
  rollout: object
  rewards_b: np.ndarray
  valid_b: np.ndarray
  rewards: RewardResult
  texts: list
  metrics: dict
  gen_tokens: float
  reward_s: float


def check_rewards(rewards, max_invalid_frac: float, step: int, texts, kept,
                  timeout_s: float) -> None:
  """Stops the run (before any update from this batch) when too many samples went unscored;
  kept() -> runs.kept_note, the checkpoint the run keeps (asked only then: it lists the disk);
  timeout_s: config.rewards.timeout_s, named when a timeout is the cause."""
  invalid = 1.0 - float(np.mean(rewards.valid)) if len(texts) else 0.0
  if invalid <= max_invalid_frac:
    return
  failing = {**{k: v for k, v in rewards.errors.items() if v},
             **{k: v for k, v in rewards.timeouts.items() if v}}
  name = max(failing, key=failing.get) if failing else '?'
  detail = rewards.error_messages.get(
      name, f'timed out (> config.rewards.timeout_s={timeout_s} s)')
  raise runs.TrainingError(
      f'reward failure at step {step}: {invalid:.0%} of samples unscored '
      f'(> config.rewards.max_invalid_frac={max_invalid_frac}); verifier {name!r}: {detail}; '
      f'{kept()}')


def score_rows(runner, texts: list, answers: list) -> RewardResult:
  """Scores completions; with several processes each scores its own rows
  (hostdata.process_rows) and the global result is gathered onto every process.
  error_messages are this process's (the first message of each failing verifier among its rows)."""
  if jax.process_count() == 1:
    return runner(texts, answers)
  rows = hostdata.process_rows(len(texts))
  local = runner(texts[rows], answers[rows])
  stuck = hostdata.sum_counts({'stuck': local.stuck_chunks})['stuck']
  return RewardResult(
      total=hostdata.gather_rows(local.total), valid=hostdata.gather_rows(local.valid),
      per_verifier={k: hostdata.gather_rows(v) for k, v in local.per_verifier.items()},
      errors=hostdata.sum_counts(local.errors), timeouts=hostdata.sum_counts(local.timeouts),
      error_messages=local.error_messages, stuck_chunks=stuck)


def unscored_notes(rewards: RewardResult, n: int, timeout_s: float,
                   reported: set) -> list[str]:
  """One line for each verifier that failed on some of this batch's `n` samples and was not in
  `reported` (added to it): a batch below rewards.max_invalid_frac trains on, and without this
  the user's verifier raising on a tenth of the samples showed only in reward/errors/<name>."""
  notes = []
  for name in sorted({*rewards.errors, *rewards.timeouts}):
    errors, timeouts = rewards.errors.get(name, 0), rewards.timeouts.get(name, 0)
    if name in reported or not errors + timeouts:
      continue
    reported.add(name)
    why = [f'{errors} raised or gave no finite number, the first: '
           f'{rewards.error_messages.get(name, "?")}'] if errors else []
    if timeouts:
      why.append(f'{timeouts} ran past config.rewards.timeout_s={timeout_s} s')
    notes.append(f'verifier {name!r} left {errors + timeouts} of {n} samples unscored '
                 f'({"; ".join(why)}); they are left out of the loss (reward/errors/{name}, '
                 f'reward/timeouts/{name}; said once per verifier)')
  return notes


def say_unscored(on_message: Callable, step: int, rewards: RewardResult, n: int,
                 timeout_s: float, reported: set) -> None:
  """Says step `step`'s unscored_notes through on_message(step, text), one 'step N: ...' line
  each: the one call RolloutStage and online DPO (dpo_trainer.OnlinePairs) make after scoring."""
  for note in unscored_notes(rewards, n, timeout_s, reported):
    on_message(step, f'step {step}: {note}')


def _any_process(short: bool) -> bool:
  if jax.process_count() == 1:
    return short
  return bool(np.max(multihost_utils.process_allgather(np.int32(short))))


class RolloutStage:
  """Callable (params, step, temperature) -> StepRollout; see the module docstring.

  sampler(temperature) returns the jitted group sampler; check(rewards, step, texts) raises
  when a batch is too badly scored (check_rewards); on_message(step, text) reports a
  note about `step` to the sinks (hooks.on_step_message: recorded at that step).
  place_prompts(host array) -> device array: where the prompt batch goes (the trainer shards
  it over data x fsdp so that sampling is split like the train step's batch). data_it yields
  the global prompt batch, the same on every process, each process having read only its share
  of it (hostdata.GlobalBatches). sample_shardings (parallel/mesh.sampling_shardings), when
  given, is where the params go for sampling: the copy is made once per step, lives only while
  sampling, and its time is reported as metrics['time/reshard_s'] (part of the sampling time).
  """

  def __init__(self, config, algo, data_it, tokenizer, runner, sampler: Callable,
               check: Callable, on_message: Callable, skipped=None, injector=None,
               hard_it=None, place_prompts: Callable = lambda x: x, sample_shardings=None):
    self.config, self.algo, self.data_it = config, algo, data_it
    self.tokenizer, self.runner, self.sampler = tokenizer, runner, sampler
    self.check, self.on_message, self.skipped = check, on_message, skipped
    self.injector, self.hard_it = injector, hard_it   # FaultBench (rft_jax/faults.py)
    self.group_size = config.rollout.group_size
    self.place_prompts = place_prompts
    self.sample_shardings = sample_shardings
    self.limit_reported = False
    self.unscored_reported = set()   # verifiers whose failures were reported (unscored_notes)

  def _round(self, params, step: int, round_: int, temperature: float):
    """One prompt batch sampled and scored -> (payload dict, reward seconds)."""
    faulty = self.injector is not None and self.injector.enabled
    use_hard = faulty and self.hard_it is not None and self.injector.hard_prompts(step)
    prompts = runs.next_batch(self.hard_it if use_hard else self.data_it, step)
    for reason in self.skipped.drain() if self.skipped is not None else ():
      self.on_message(step, f'skipped a bad record: {reason}')
    max_new, ignore_eos = self.config.rollout.max_new_tokens, False
    if faulty:
      temperature, max_new, ignore_eos = self.injector.sampling(step, temperature, max_new)
    sample = self.sampler(temperature, max_new, ignore_eos) if faulty else self.sampler(temperature)
    rollout = sample(params, self.place_prompts(prompts['prompt_tokens']),
                     self.place_prompts(prompts['prompt_mask']),
                     round_rng(self.config.seed, step, round_))
    host = jax.tree.map(hostdata.to_host, rollout)   # the global rollout, on every process
    texts = decode_completions(self.tokenizer, host.tokens_bt, host.mask_bt)
    t = time.time()
    answers = list(np.repeat(prompts['answer'], self.group_size))
    if faulty:
      answers = self.injector.answers(step, np.repeat(prompts['id'], self.group_size), answers)
    rewards = score_rows(self.runner, texts, answers)
    if faulty:
      rewards = self.injector.rewards(step, rewards, texts, self.config.rewards.weights, max_new)
    self.check(rewards, step, texts)
    say_unscored(self.on_message, step, rewards, len(texts), self.config.rewards.timeout_s,
                 self.unscored_reported)
    reward_s = time.time() - t
    total = rewards.total
    if self.algo.overlong == 'soft':
      pen = corrections.overlong_penalty(host.lengths_b,
                                         self.config.rollout.max_new_tokens,
                                         self.algo.overlong_cache)
      total = np.where(rewards.valid, total + pen, 0.0).astype(np.float32)
    return {'rollout': rollout, 'host': host, 'total': total, 'rewards': rewards,
            'texts': texts}, reward_s

  def __call__(self, params, step: int, temperature: float) -> StepRollout:
    reward_s, t0 = [0.0], time.time()
    if self.sample_shardings is not None:   # config.rollout.weights_layout
      params = jax.block_until_ready(jax.device_put(params, self.sample_shardings))
    reshard_s = time.time() - t0

    def draw(round_):
      payload, secs = self._round(params, step, round_, temperature)
      reward_s[0] += secs
      x = ds.filter_signal(payload['total'], payload['rewards'].per_verifier,
                           self.algo.dynamic_sampling_metric, self.config.rewards.weights)
      return payload, ds.informative_groups(x, payload['rewards'].valid, self.group_size)

    if not self.algo.dynamic_sampling:
      p, _ = draw(0)
      out = StepRollout(p['rollout'], p['total'], p['rewards'].valid, p['rewards'], p['texts'],
                        {}, float(p['host'].mask_bt.sum()), reward_s[0])
    else:
      out = self._dynamic(draw, step, reward_s)
    if self.sample_shardings is not None:
      out.metrics['time/reshard_s'] = reshard_s
    if self.algo.overlong == 'soft':
      out.metrics['overlong/penalty_mean'] = float(
          np.mean((out.rewards_b - out.rewards.total)[out.valid_b])) if out.valid_b.any() else 0.0
    return out

  def _dynamic(self, draw, step: int, reward_s: list) -> StepRollout:
    got = ds.collect(draw, num_groups=self.config.rollout.prompts_per_step,
                     max_rounds=self.algo.max_sampling_rounds, agree_short=_any_process)
    g = self.group_size
    rows = ds.gather_groups([{'rollout': p['host'], 'total': p['total'],
                              'raw_total': p['rewards'].total, 'valid': p['rewards'].valid,
                              'per_verifier': p['rewards'].per_verifier,
                              'texts': np.asarray(p['texts'], object)} for p in got.payloads],
                            got.picks, g)
    counts = lambda field: {k: sum(getattr(p['rewards'], field)[k] for p in got.payloads)
                            for k in getattr(got.payloads[0]['rewards'], field)}
    rewards = RewardResult(
        total=rows['raw_total'], per_verifier=rows['per_verifier'], valid=rows['valid'],
        errors=counts('errors'), timeouts=counts('timeouts'),
        stuck_chunks=sum(p['rewards'].stuck_chunks for p in got.payloads))
    if got.padded and not self.limit_reported:
      self.limit_reported = True
      self.on_message(step, f'dynamic sampling: step {step} hit algo.max_sampling_rounds='
                      f'{self.algo.max_sampling_rounds} with {got.padded} uninformative '
                      'group(s) padding the batch (counted in sampling/padded_groups from now on)')
    gen_tokens = float(sum(p['host'].mask_bt.sum() for p in got.payloads))
    return StepRollout(jax.tree.map(np.asarray, rows['rollout']), rows['total'], rows['valid'],
                       rewards, list(rows['texts']), got.metrics(g), gen_tokens, reward_s[0])
