"""Train prompts longer than task.max_prompt_len, found at set-up (rft_jax/data/long_prompts.py,
rft_jax/train_prompts.py) instead of at the step that draws one. The GSM8K CLI run:
tests/test_gsm8k_recipe.py."""
import pytest

from rft_jax import tokenizer as tok_lib
from rft_jax.data import arith
from rft_jax.data import pipeline


@pytest.fixture(scope='module')
def tok():
  return tok_lib.load_tokenizer()


def test_long_prompts_scan_finds_what_tokenizing_every_prompt_finds(tok):
  """long_prompts.scan tokenizes only prompts its byte bound cannot clear; at every limit it
  finds exactly the over-long prompts that tokenizing all of them finds, in source order."""
  from rft_jax.data import long_prompts  # pylint: disable=g-import-not-at-top
  source = [{'id': i, 'prompt': '+'.join(['12'] * (1 + i % 7)) + '=', 'answer': '0'}
            for i in range(60)]
  source.append({'id': 60, 'prompt': 'x', 'answer': '0'})   # a letter the vocabulary lacks
  source.append({'id': 61, 'prompt': ' ', 'answer': '0'})   # empty: left to the pipeline
  lengths = {r['id']: len(pipeline.prompt_ids(r['prompt'], tok)) for r in source}
  for limit in range(2, max(lengths.values()) + 2):
    found = long_prompts.scan(source, tok, limit)
    over = [(i, n) for i, n in lengths.items() if n > limit and i != 61]
    assert found.over == tuple(over), limit
    assert found.longest == max((n for _, n in over), default=0)
  found = long_prompts.scan(source, tok, 6)
  first, n = found.over[0]
  assert found.error() == (
      f'record id={first}: its prompt is {n} tokens, more than config.task.max_prompt_len=6 '
      f'({len(found.over)} prompts are longer, the longest {found.longest} tokens; set '
      f'--config.task.max_prompt_len={found.longest})')


def test_arith_run_refuses_over_long_train_prompts_at_setup():
  """The arith train split against task.max_prompt_len before anything is built (was: at the
  step that drew the first 'a op b=' longer than the limit); 'skip' says how many."""
  from rft_jax import api  # pylint: disable=g-import-not-at-top
  from rft_jax import train_prompts  # pylint: disable=g-import-not-at-top
  config = api.load_config('configs/grpo_arith.py:tiny', {'task.max_prompt_len': 6})
  with pytest.raises(api.SetupError) as e:
    api.validate(config)
  over = [r for r in arith.split_records('train')
          if len(pipeline.prompt_ids(r['prompt'], tok_lib.load_tokenizer())) > 6]
  assert str(e.value) == (
      f"arith train split: record id={over[0]['id']}: its prompt is 7 tokens, more than "
      f'config.task.max_prompt_len=6 ({len(over)} prompts are longer, the longest 7 tokens; '
      'set --config.task.max_prompt_len=7)')
  config = api.load_config('configs/grpo_arith.py:tiny',
                           {'task.max_prompt_len': 6, 'task.bad_records': 'skip'})
  api.validate(config)   # skipped, as the pipeline skips them
  notes = train_prompts.check(config, tok_lib.load_tokenizer())
  assert len(notes) == 1 and notes[0].startswith(
      f'arith train split: {len(over)} prompt(s) longer than config.task.max_prompt_len=6 will '
      'be skipped'), notes
