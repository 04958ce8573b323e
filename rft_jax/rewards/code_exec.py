"""Verifiers that execute model-generated code, always in the sandbox (rft_jax/rewards/sandbox.py).

  python_tests(completion, answer): answer is test code (asserts) for the program in the
      completion (its last ```python fenced block, or the whole text without a fence);
      1.0 when program + tests exit 0 within SANDBOX_TIMEOUT_S, else 0.0.

A program that fails, loops or exhausts its memory is a wrong answer (0.0), not a verifier
failure. Only a sandbox that cannot start raises (the sample is then left out, as for any
verifier error). Keep config.rewards.timeout_s above SANDBOX_TIMEOUT_S (plus ~0.1 s of start-up),
or the runner's own timeout cuts in first and the sample counts as unscored.
"""
import re

from rft_jax.rewards import sandbox
from rft_jax.rewards.verifiers import register_verifier

SANDBOX_TIMEOUT_S = 1.0
SANDBOX_MEMORY_MB = 512

_FENCE = re.compile(r'```(?:python|py)?[ \t]*\n(.*?)```', re.DOTALL)


def extract_program(completion: str) -> str:
  """The last fenced code block of the completion, or the completion itself if it has none."""
  blocks = _FENCE.findall(completion)
  return blocks[-1] if blocks else completion


@register_verifier('python_tests')
def python_tests(completion: str, answer: str) -> float:
  program = extract_program(completion) + '\n\n' + answer + '\n'
  result = sandbox.run_python(program, timeout_s=SANDBOX_TIMEOUT_S, memory_mb=SANDBOX_MEMORY_MB)
  return 1.0 if result.ok else 0.0
