"""configs/grpo_gsm8k_qwen2.py end to end on a tiny random Qwen2 checkpoint saved by transformers.

The checkpoint directory is what a user downloads from the Hub, shrunk: config.json +
model.safetensors from `Qwen2ForCausalLM(Qwen2Config(tiny)).save_pretrained`, and the Qwen2-style
tokenizer files of tests/tokenizer_fixtures.py. The run goes through `python -m rft_jax.main`
exactly as the recipe's docstring says, with the model fields and sizes overridden on the
command line.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from rft_jax.data import pipeline
from rft_jax.tokenizer import load_tokenizer
import tokenizer_fixtures as fx

RECIPE = 'configs/grpo_gsm8k_qwen2.py'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = dict(vocab_size=448, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=512)

QUESTIONS = [('Natalia sold 48 clips in April and half as many in May. How many in all?', '72'),
             ('Weng earns $12 an hour. How much for 50 minutes?', '10'),
             ('How many clips did Natalia sell?', '1,234'),
             ('She sold 5 and then 3. How many?', '8')]


def write_gsm8k(directory):
  os.makedirs(directory, exist_ok=True)
  for name, rows in (('train.jsonl', QUESTIONS), ('test.jsonl', QUESTIONS[:2])):
    with open(os.path.join(directory, name), 'w') as f:
      for question, final in rows:
        f.write(json.dumps({'question': question, 'answer': f'Some steps.\n#### {final}'}) + '\n')
  return directory


def write_tiny_qwen2(directory):
  transformers = pytest.importorskip('transformers')
  import torch
  torch.manual_seed(0)
  fields = {k: v for k, v in TINY.items() if k != 'head_dim'}
  model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields))
  model.save_pretrained(directory, safe_serialization=True)
  fx.write_qwen2_tokenizer(directory)   # the tokenizer lives in the model dir, as on the Hub
  return directory


def run_main(*args, timeout=240):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run([sys.executable, '-m', 'rft_jax.main', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)


def test_recipe_validates_and_names_missing_inputs(tmp_path):
  bare = run_main('--config', RECIPE, '--validate_only')
  assert bare.returncode == 2
  assert bare.stderr.startswith('error: config.tokenizer.path')   # no model.path, no tokenizer
  model_dir = str(tmp_path / 'qwen')
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, 'config.json'), 'w') as f:
    json.dump({'architectures': ['Qwen2ForCausalLM']}, f)
  no_data = run_main('--config', RECIPE, f'--config.model.path={model_dir}', '--validate_only')
  assert no_data.returncode == 2
  assert no_data.stderr.startswith("error: config.task.manual_dir='': required for task gsm8k")


def test_grpo_gsm8k_on_tiny_qwen2_checkpoint(tmp_path):
  model_dir = write_tiny_qwen2(str(tmp_path / 'tiny-qwen2'))
  manual_dir = write_gsm8k(str(tmp_path / 'gsm8k'))
  with open(os.path.join(manual_dir, 'train.jsonl'), 'a') as f:   # left out under 'skip'
    f.write(json.dumps({'question': 'What is 2+2?'}) + '\n')
  tok = load_tokenizer(model_dir)
  # The recipe's prompt (chat template + instruction) for the longest question sets P.
  from configs import grpo_gsm8k_qwen2  # pylint: disable=g-import-not-at-top
  task = grpo_gsm8k_qwen2.get_config('tiny').task
  fmt = pipeline.PromptFormat(chat=task.chat_template, instruction=task.instruction)
  prompt_len = max(len(tok.encode(fmt.render(q, tok))) for q, _ in QUESTIONS)
  overrides = [f'--config.model.{k}={v}' for k, v in TINY.items()]
  workdir = str(tmp_path / 'run')
  result = run_main(
      '--config', f'{RECIPE}:tiny', f'--config.model.path={model_dir}',
      f'--config.task.manual_dir={manual_dir}', f'--config.task.data_dir={tmp_path / "tfds"}',
      f'--config.task.max_prompt_len={prompt_len}', '--config.train.steps=2', *overrides,
      '--config.task.bad_records=skip', '--workdir', workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  assert summary['steps'] == 2 and summary['recipe'] == 'grpo_gsm8k_qwen2_tiny'
  assert 0.0 <= summary['final_greedy_acc'] <= 1.0   # scored by the gsm8k verifier
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  train = [r for r in records if r['kind'] == 'train']
  assert [r['step'] for r in train] == [1, 2]
  for r in train:   # both verifiers of the recipe scored every completion
    assert 0.0 <= r['reward/gsm8k/mean'] <= 1.0
    assert 0.0 <= r['reward/gsm8k_format/mean'] <= 1.0
    assert r['reward/invalid_frac'] == 0.0
    assert r['data/skipped_records'] == 1.0   # the line without an answer, left out at load
  assert any("train.jsonl line 5 (record 4): missing field 'answer'" in r.get('text', '')
             for r in records if r['kind'] == 'message'), [r for r in records
                                                           if r['kind'] == 'message']
  # A damaged weights file (a download cut short) is one line at load, exit 2.
  weights = os.path.join(model_dir, 'model.safetensors')
  with open(weights, 'r+b') as f:
    f.truncate(os.path.getsize(weights) // 2)
  broken = run_main(
      '--config', f'{RECIPE}:tiny', f'--config.model.path={model_dir}',
      f'--config.task.manual_dir={manual_dir}', f'--config.task.data_dir={tmp_path / "tfds"}',
      f'--config.task.max_prompt_len={prompt_len}', *overrides,
      '--config.task.bad_records=skip',   # the data is read first (train_prompts.check)
      '--workdir', str(tmp_path / 'run2'))
  assert broken.returncode == 2 and 'Traceback' not in broken.stderr, broken.stderr[-3000:]
  assert broken.stderr.strip().splitlines()[-1].startswith(
      f'error: config.model.path={model_dir}: cannot read its weights'), broken.stderr[-3000:]
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '2'))
  checked = run_main(   # --validate_only opens the weight files too (it said 'config OK')
      '--config', f'{RECIPE}:tiny', f'--config.model.path={model_dir}',
      f'--config.task.manual_dir={manual_dir}', *overrides, '--validate_only')
  assert checked.returncode == 2, checked.stdout + checked.stderr
  assert checked.stderr.strip().splitlines()[-1].startswith(
      f'error: config.model.path: {weights}: cannot read its tensors'), checked.stderr


def test_validate_only_reads_the_data_and_the_tokenizer(tmp_path):
  """--validate_only said 'config OK' and the run then failed at its first line of data or at a
  tokenizer larger than the model."""
  model_dir = write_tiny_qwen2(str(tmp_path / 'tiny-qwen2'))
  manual_dir = write_gsm8k(str(tmp_path / 'gsm8k'))
  check = lambda *extra: run_main(
      '--config', f'{RECIPE}:tiny', f'--config.model.path={model_dir}',
      f'--config.task.manual_dir={manual_dir}', *extra,
      *[f'--config.model.{k}={v}' for k, v in TINY.items()], '--validate_only')
  ok = check()
  assert ok.returncode == 0 and ok.stdout.strip() == 'config OK', ok.stderr[-2000:]
  many = check('--config.eval.num_prompts=3')   # test.jsonl holds 2: the run failed at its eval
  assert many.returncode == 2 and many.stderr.startswith(
      'error: config.eval.num_prompts=3: must be <= 2, the number of records in the gsm8k test '
      'split'), many.stderr[-2000:]
  with open(os.path.join(manual_dir, 'test.jsonl'), 'a') as f:
    f.write('{"question": "Q?"\n')
  bad = check()
  assert bad.returncode == 2, bad.stderr[-2000:]
  assert re.match(r"error: config.task.manual_dir: .*test.jsonl line 3 \(record 2\): not valid "
                  r'JSON', bad.stderr), bad.stderr
  os.remove(os.path.join(manual_dir, 'test.jsonl'))
  missing = check()
  assert missing.returncode == 2 and 'missing test.jsonl' in missing.stderr, missing.stderr
  arith = run_main('--config', 'configs/grpo_arith.py:tiny', '--config.model.vocab_size=16',
                   '--validate_only')
  assert arith.returncode == 2 and arith.stderr.startswith(
      'error: config.model.vocab_size=16 is smaller than the tokenizer vocabulary'), arith.stderr


def test_validate_only_finds_a_prompt_longer_than_max_prompt_len(tmp_path):
  """--validate_only said 'config OK' and the run stopped at the step that drew the longest
  train question (maybe hours in); now it names the record and the length to set. The eval
  reads only the first eval.num_prompts test records, and bad_records='skip' leaves long train
  records out: neither is refused for a prompt it never reads."""
  model_dir = write_tiny_qwen2(str(tmp_path / 'tiny-qwen2'))
  manual_dir = write_gsm8k(str(tmp_path / 'gsm8k'))
  long_question = QUESTIONS[0][0] + ' And then in June she sold 7 more clips to her friends.'
  with open(os.path.join(manual_dir, 'train.jsonl'), 'a') as f:   # line 5, record 4
    f.write(json.dumps({'question': long_question, 'answer': 'Steps.\n#### 79'}) + '\n')
  tok = load_tokenizer(model_dir)
  from configs import grpo_gsm8k_qwen2  # pylint: disable=g-import-not-at-top
  task = grpo_gsm8k_qwen2.get_config('tiny').task
  fmt = pipeline.PromptFormat(chat=task.chat_template, instruction=task.instruction)
  length = lambda q: len(tok.encode(fmt.render(q, tok)))   # Qwen2 has no BOS
  longest, first_test = length(long_question), length(QUESTIONS[0][0])
  assert longest > max(length(q) for q, _ in QUESTIONS) > first_test - 1
  check = lambda max_len, *extra: run_main(
      '--config', f'{RECIPE}:tiny', f'--config.model.path={model_dir}',
      f'--config.task.manual_dir={manual_dir}', f'--config.task.max_prompt_len={max_len}',
      *extra, *[f'--config.model.{k}={v}' for k, v in TINY.items()], '--validate_only')
  ok = check(longest)
  assert ok.returncode == 0, ok.stderr[-2000:]
  short = check(longest - 1)
  assert short.returncode == 2 and short.stderr == (
      f'error: config.task.manual_dir: {manual_dir}/train.jsonl line 5 (record 4): its prompt '
      f'is {longest} tokens, more than config.task.max_prompt_len={longest - 1} (the only one '
      f'longer; set --config.task.max_prompt_len={longest})\n'), short.stderr
  only_first = ('--config.task.bad_records=skip', '--config.eval.num_prompts=1')
  skipped = check(first_test, *only_first)
  assert skipped.returncode == 0, skipped.stderr[-2000:]
  first = check(first_test - 1, *only_first)
  assert first.returncode == 2 and first.stderr.startswith(
      f'error: config.task.manual_dir: {manual_dir}/test.jsonl line 1 (record 0): its prompt '
      f'is {first_test} tokens'), first.stderr


def test_run_finds_an_over_long_train_prompt_at_setup(tmp_path):
  """A normal run found a train prompt over task.max_prompt_len only at the step that drew it
  (maybe hours in; here 2 steps never draw it and the run trained): it now stops at set-up,
  before the weights load, with one line naming the file and line, the length and the key;
  with task.bad_records='skip' it says once how many will be skipped, and trains."""
  model_dir = write_tiny_qwen2(str(tmp_path / 'tiny-qwen2'))
  manual_dir = write_gsm8k(str(tmp_path / 'gsm8k'))
  long_question = QUESTIONS[0][0] + ' And then in June she sold 7 more clips to her friends.'
  with open(os.path.join(manual_dir, 'train.jsonl'), 'a') as f:   # lines 5-204, then 205
    for i in range(200):
      f.write(json.dumps({'question': f'She sold {i} and then 3. How many?',
                          'answer': f'Steps.\n#### {i + 3}'}) + '\n')
    f.write(json.dumps({'question': long_question, 'answer': 'Steps.\n#### 79'}) + '\n')
  tok = load_tokenizer(model_dir)
  from configs import grpo_gsm8k_qwen2  # pylint: disable=g-import-not-at-top
  task = grpo_gsm8k_qwen2.get_config('tiny').task
  fmt = pipeline.PromptFormat(chat=task.chat_template, instruction=task.instruction)
  longest = len(tok.encode(fmt.render(long_question, tok)))   # Qwen2 has no BOS
  run = lambda name, *extra: run_main(
      '--config', f'{RECIPE}:tiny', f'--config.model.path={model_dir}',
      f'--config.task.manual_dir={manual_dir}', f'--config.task.data_dir={tmp_path / "tfds"}',
      f'--config.task.max_prompt_len={longest - 1}', '--config.train.steps=1', *extra,
      *[f'--config.model.{k}={v}' for k, v in TINY.items()], '--workdir', str(tmp_path / name))
  refused = run('run')
  assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
      f'error: config.task.manual_dir: {manual_dir}/train.jsonl line 205 (record 204): its '
      f'prompt is {longest} tokens, more than config.task.max_prompt_len={longest - 1} (the '
      f'only one longer; set --config.task.max_prompt_len={longest})'), refused.stderr[-3000:]
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints')
  skipped = run('skip', '--config.task.bad_records=skip')
  assert skipped.returncode == 0, skipped.stderr[-3000:]
  with open(tmp_path / 'skip' / 'metrics.jsonl') as f:
    texts = [r.get('text', '') for r in map(json.loads, f) if r['kind'] == 'message']
  line = (f'gsm8k train split: 1 prompt(s) longer than config.task.max_prompt_len={longest - 1} '
          "will be skipped (task.bad_records='skip'; the first: "
          f'{manual_dir}/train.jsonl line 205 (record 204), {longest} tokens)')
  assert texts.count(line) == 1, texts
