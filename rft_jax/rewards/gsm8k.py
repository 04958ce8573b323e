r"""GSM8K verifiers: the model's final number against the reference answer.

  gsm8k:        1.0 iff the completion's final answer equals the reference number, else 0.0.
  gsm8k_format: 1.0 iff the completion states its final answer explicitly (`#### N` or
                `\boxed{N}` with a number inside), else 0.0. A small weight on it rewards the
                answer format the prompt asks for, like `format` does for the arithmetic task.

The final answer of a completion is the explicit one when there is one, whichever of these
comes last in the text:
  - the first number after the last `####` (the GSM8K solution format: `#### 72`);
  - the last `\boxed{...}` (braces balanced): a `\frac{a}{b}` / `\dfrac{a}{b}` / `\tfrac{a}{b}`
    inside it is the number a/b, otherwise the first number inside it.
"Comes last" keeps a Markdown heading (`#### Step 1: ...`) early in the reasoning from
overriding a final `\boxed{72}`. When the marker holds no number (`\boxed{x}`), or there is no
marker, the answer is the last number anywhere in the text. Text after an explicit answer
("#### 72\n\nHope this helps, 3 more?") does not change it.

A number is normalised before comparison: thousands commas go (`1,234`; only groups of three
digits, so `3,4` is two numbers), so do `$`, LaTeX `\$`, `\,`, `\!` and a trailing period
(`$42.` is 42); a leading `-` or the Unicode minus `−` makes it negative (not when it follows a
letter, digit or period: in `2015-2020` the last number is 2020); `%` and `\%` are dropped, so
`50%` equals a reference of 50 (GSM8K references are bare numbers, percentages included).
Values are compared exactly as fractions: `0.50` == `.5` == `0.5`, `72.00` == 72,
`\frac{1}{2}` == 0.5; `1/2` written without `\frac` is not evaluated (its last number is 2).

The reference is the text after `#### ` of the official answer field, or a bare number; a
reference without a number raises ValueError (a data bug, not a wrong completion).
"""
import fractions
import re

from rft_jax.rewards.verifiers import register_verifier

# A number: optional sign, optional dollar sign, then 1,234,567 | 1234 | .5, with decimals.
# `[0-9]`, not `\d`: non-ASCII digits are not numbers here.
_NUMBER_RE = re.compile(
    r'(?<![\w.])(?P<sign>[-−]?)\$?'
    r'(?P<digits>[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+)')
_FRAC_RE = re.compile(r'\\[dt]?frac\s*\{\s*([-−]?[0-9.,]+)\s*\}\s*\{\s*([-−]?[0-9.,]+)\s*\}')
_LATEX_NOISE_RE = re.compile(r'\\[$,!% ]|\\(?:text|mathrm|textbf)\{[^{}]*\}|\\left|\\right')


def _to_fraction(sign: str, digits: str) -> fractions.Fraction:
  value = fractions.Fraction(digits.replace(',', ''))
  return -value if sign else value


def _numbers(text: str) -> list[fractions.Fraction]:
  """Every number in `text`, in order (see the module docstring for what counts)."""
  return [_to_fraction(m.group('sign'), m.group('digits')) for m in _NUMBER_RE.finditer(text)]


def _last_boxed(text: str) -> str | None:
  r"""Contents of the last `\boxed{...}` (nested braces balanced), or None."""
  start = text.rfind('\\boxed')
  while start != -1:
    i = start + len('\\boxed')
    while i < len(text) and text[i] == ' ':
      i += 1
    if i < len(text) and text[i] == '{':
      depth = 0
      for j in range(i, len(text)):
        depth += {'{': 1, '}': -1}.get(text[j], 0)
        if depth == 0:
          return text[i + 1:j]
    start = text.rfind('\\boxed', 0, start)
  return None


def _boxed_value(content: str) -> fractions.Fraction | None:
  frac = _FRAC_RE.search(content)
  if frac:
    num, den = (_numbers(part) for part in frac.groups())
    if len(num) == 1 and len(den) == 1 and den[0] != 0:
      return num[0] / den[0]
    return None
  found = _numbers(_LATEX_NOISE_RE.sub(' ', content))
  return found[0] if found else None


def _hash_value(text: str) -> fractions.Fraction | None:
  """The first number after the last `####`, or None."""
  if '####' not in text:
    return None
  found = _numbers(text.rsplit('####', 1)[1])
  return found[0] if found else None


def extract_answer(completion: str) -> fractions.Fraction | None:
  """The completion's final answer as an exact fraction, or None if it has no number."""
  if completion.rfind('####') > completion.rfind('\\boxed'):
    value = _hash_value(completion)
  else:
    boxed = _last_boxed(completion)
    value = _boxed_value(boxed) if boxed is not None else None
  if value is None:
    found = _numbers(completion)
    value = found[-1] if found else None
  return value


def reference_value(answer: str) -> fractions.Fraction:
  """The reference number: after `####` if present, else the first number of `answer`."""
  value = _hash_value(answer)
  if value is None:
    found = _numbers(answer)
    value = found[0] if found else None
  if value is None:
    raise ValueError(f'reference answer has no number: {answer!r}')
  return value


@register_verifier('gsm8k')
def gsm8k_correct(completion: str, answer: str) -> float:
  """1.0 iff the completion's final answer equals the reference number, else 0.0."""
  want = reference_value(answer)
  return 1.0 if extract_answer(completion) == want else 0.0


@register_verifier('gsm8k_format')
def gsm8k_format(completion: str, answer: str) -> float:
  r"""1.0 iff the completion has `#### N` or `\boxed{N}` with a number N, else 0.0."""
  del answer
  if _hash_value(completion) is not None:
    return 1.0
  boxed = _last_boxed(completion)
  return 1.0 if boxed is not None and _boxed_value(boxed) is not None else 0.0
