"""GRPO on data and a reward of one's own: the README's "Your own data and reward", runnable.

  python -m rft_jax.main --config experiments/own_data/recipe.py --workdir runs/own_data

The data are this directory's data/train.jsonl and data/test.jsonl, one JSON object a line,
{"question": "...", "answer": "... #### <final answer>"} (the GSM8K layout: task 'gsm8k' reads
any such pair of files); the reward is `exact_answer` below, a verifier of one's own, which
also scores the held-out accuracy (eval.verifier). Everything else is configs/grpo_arith.py's
tiny variant (its tokenizer and base policy know arithmetic only: with a real text task, start
from a Hugging Face checkpoint, model.path, as configs/grpo_gsm8k_qwen2.py does).
"""
import os

from configs import grpo_arith
from rft_jax.rewards.verifiers import register_verifier

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')


@register_verifier('exact_answer')
def exact_answer(completion: str, answer: str) -> float:
  """1.0 when the completion is the text after '####', surrounding spaces aside."""
  return float(completion.strip() == answer.strip())


def get_config(arg: str = ''):
  config = grpo_arith.get_config('tiny')
  config.name = 'own_data'
  config.variant = arg
  config.task.name = 'gsm8k'          # JSONL question/answer files of one's own
  config.task.manual_dir = DATA       # holds train.jsonl and test.jsonl
  config.task.chat_template = False   # plain text; task.instruction would follow each question
  config.task.instruction = ''
  config.rewards.weights = {'exact_answer': 1.0}
  config.eval.verifier = 'exact_answer'
  config.eval.num_prompts = 8         # at most test.jsonl's records
  config.train.steps = 3
  config.monitor.warmup = 2           # below train.steps: the monitor scores the short run
  return config
