"""Every train prompt against ``task.max_prompt_len`` at set-up, before the weights load.

The input pipeline refuses an over-long prompt (pipeline.encode_prompt) only when a batch
draws it, maybe hours into a run. Both tasks' train splits are finite and held in memory at
little cost (GSM8K's train.jsonl read again, ~35 ms per 7.5k lines; arith's records built,
~40 ms), so ``check`` scans them all first (rft_jax/data/long_prompts.py). Offline DPO trains
on its pair source, not on these prompts: not checked.
"""
from rft_jax import config as config_lib


def skips_bad_records(config) -> bool:
  """Whether the run skips bad train records: task.bad_records='skip' under the RL trainer (the
  SFT and DPO pipelines stop at one)."""
  return (config.task.get('bad_records', 'error') == 'skip'
          and not config_lib.is_sft(config) and not config_lib.is_dpo(config))


def _offline_dpo(config) -> bool:
  return config_lib.is_dpo(config) and config.dpo.mode != 'online'


def _scan(config, tokenizer):
  """(long_prompts.Scan of the task's train split, the prefix that names the source), or None
  where nothing is checked: offline DPO, a GSM8K chat template the tokenizer lacks (load_task
  says so), an unknown task (load_task names it). GSM8K's train.jsonl is parsed in any case:
  a malformed line is the SetupError load_task would raise (left out under 'skip')."""
  from rft_jax.components import SetupError  # pylint: disable=g-import-not-at-top
  from rft_jax.data import arith, gsm8k, long_prompts  # pylint: disable=g-import-not-at-top
  task = config.task
  if task.name == 'gsm8k':
    try:
      train = gsm8k.read_split(task.manual_dir, 'train', skipped=[] if task.get(
          'bad_records', 'error') == 'skip' else None)
    except (FileNotFoundError, ValueError) as e:
      raise SetupError(f'config.task.manual_dir: {e}') from None
    if _offline_dpo(config) or (task.get('chat_template', True)
                                and not getattr(tokenizer, 'chat_template', None)):
      return None
    return gsm8k.long_prompts_in(task, tokenizer, train, 'train'), 'config.task.manual_dir'
  if task.name == 'arith' and not _offline_dpo(config):
    return long_prompts.scan(arith.split_records('train'), tokenizer, task.max_prompt_len,
                             where=lambda rid: f'record id={rid}'), 'arith train split'
  return None


def check(config, tokenizer) -> tuple[str, ...]:
  """() when every train prompt fits task.max_prompt_len. Else SetupError, one line naming the
  first over-long record (file and line, or id), its length, the limit and the key to set; with
  task.bad_records='skip' (RL trainer: the pipeline then skips them, as before) the one line
  saying how many will be skipped instead, for the run's log. --validate_only
  (components.check_setup) and components.build both call it."""
  from rft_jax.components import SetupError  # pylint: disable=g-import-not-at-top
  scanned = _scan(config, tokenizer)
  if scanned is None or not scanned[0].over:
    return ()
  found, prefix = scanned
  if not skips_bad_records(config):
    raise SetupError(f'{prefix}: {found.error()}')
  rid, n = found.over[0]
  return (f'{config.task.name} train split: {len(found.over)} prompt(s) longer than '
          f'config.task.max_prompt_len={found.limit} will be skipped '
          f"(task.bad_records='skip'; the first: {found.where(rid)}, {n} tokens)",)
