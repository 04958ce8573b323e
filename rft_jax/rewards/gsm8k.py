r"""GSM8K verifiers: the model's final number against the reference answer.

  gsm8k:        1.0 iff the completion's final answer equals the reference number, else 0.0.
  gsm8k_format: 1.0 iff the completion states its final answer explicitly (`#### N` or
                `\boxed{N}` with a number inside), else 0.0. A small weight on it rewards the
                answer format the prompt asks for, like `format` does for the arithmetic task.

The final answer of a completion is the explicit one when there is one, whichever of these
comes last in the text:
  - the number right after the last `####` that has one (the GSM8K solution format: `#### 72`;
    spaces, one line break, `:` or `=`, and `**`, `$` or `\(` may come between); when that
    line is a calculation (`#### 48+24=72`) the number after its last `=`; a Markdown
    heading (`#### Step 1: ...`) is not an answer marker and earns no `gsm8k_format` (nor does
    `#### The answer is 72`: its answer is then the last number of the text);
  - the last `\boxed{...}` (braces balanced): a `\frac{a}{b}` / `\dfrac{a}{b}` / `\tfrac{a}{b}`
    inside it (a `-` before it negates it) is the number a/b, a whole number right before it
    makes a mixed number (`2\frac{1}{2}` is 5/2, `-2\frac{1}{2}` is -5/2), otherwise the first
    number inside it; `\text{72}`, `\textbf{}`, `\mathrm{}`, `\mathbf{}` are read as their
    content.
  A minus that starts the answer is its sign even with spaces after it (`#### - 5`,
  `\boxed{- 5}` are -5); in running text `10 - 5` stays a subtraction (last number 5).
When the marker holds no number (`\boxed{x}`), or there is no marker, the answer is the last
number anywhere in the text. Text after an explicit answer ("#### 72\n\nHope this helps, 3
more?") does not change it.

A number is normalised before comparison: thousands commas go (`1,234`; only groups of three
digits, so `3,4` is two numbers; LaTeX's `1\,000`, `1{,}000` and `1\ 000` are thousands
separators too), so do `$`, LaTeX `\$`, `\!` (`\,` elsewhere is a space) and a trailing period
(`$42.` is 42); a leading `-` or the Unicode minus `−` makes it negative (not when it follows a
letter, digit or period: in `2015-2020` the last number is 2020); `%` and `\%` are dropped, so
`50%` equals a reference of 50 (GSM8K references are bare numbers, percentages included).
Values are compared exactly as fractions: `0.50` == `.5` == `0.5`, `72.00` == 72,
`\frac{1}{2}` == 0.5; `1/2` written without `\frac` is not evaluated (its last number is 2).

A number of over 1,000 digits is never equal to anything (fractions.Fraction refuses 4,300).

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
_FRAC_RE = re.compile(
    r'(?P<sign>[-−]\s*)?\\[dt]?frac\s*\{\s*([-−]?[0-9.,]+)\s*\}\s*\{\s*([-−]?[0-9.,]+)\s*\}')
# LaTeX thousands separators between digit groups: 1\,000, 1{,}000, 1\ 000 -> 1,000.
_LATEX_THOUSANDS_RE = re.compile(r'(?<=[0-9])(?:\{,\}|\\,|\\ )(?=[0-9]{3}(?![0-9]))')
_LATEX_TEXT_RE = re.compile(r'\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}')
_LATEX_NOISE_RE = re.compile(r'\\[,% ]|\\left|\\right')
# `####` as the answer marker: a number right after it (spaces, `**`, `$` or `\(` allowed
# between), so a Markdown heading (`#### Step 1: ...`) is not an answer.
_HASH_ANSWER_RE = re.compile(
    r'####[ \t]*(?:\n[ \t]*)?(?:[:=][ \t]*)?(?:(?:\*\*|\\\(|\$)[ \t]*)?'
    r'(?=(?:[-−][ \t]*)?(?:\\?\$)?[.0-9])')
# A minus that starts an answer, spaces before the number: `- 5` (after `####`, in \boxed{}).
_LEADING_MINUS_RE = re.compile(r'\s*[-−]\s+(?=\$?[.0-9])')
# A whole number (optional sign and $) and nothing else: the whole part of a mixed number.
_WHOLE_RE = re.compile(r'\s*(?:(?P<sign>[-−])\s*)?\$?(?P<digits>[0-9]+)\s*')
# Digits past this are not read as a number (never equal to a reference): fractions.Fraction
# refuses strings over 4300 digits, which made the verifier raise and the sample unscored.
_MAX_DIGITS = 1000


def _normalise(text: str) -> str:
  r"""LaTeX number spelling as plain text: thousands separators as commas, `\text{...}`
  unwrapped, `\$` as `$`, `\!` removed, other spacing commands and `\left`/`\right` blank."""
  text = _LATEX_THOUSANDS_RE.sub(',', text)
  text = _LATEX_TEXT_RE.sub(r' \1 ', text)
  text = text.replace('\\$', '$').replace('\\!', '')
  return _LATEX_NOISE_RE.sub(' ', text)


def _to_fraction(sign: str, digits: str) -> fractions.Fraction | float:
  if len(digits) > _MAX_DIGITS:
    return float('nan')
  value = fractions.Fraction(digits.replace(',', ''))
  return -value if sign else value


def _numbers(text: str) -> list[fractions.Fraction | float]:
  """Every number in `text`, in order (see the module docstring for what counts)."""
  return [_to_fraction(m.group('sign'), m.group('digits'))
          for m in _NUMBER_RE.finditer(_normalise(text))]


def _last_boxed(text: str) -> str | None:
  r"""Contents of the last `\boxed{...}` whose brace is closed (nested braces balanced), or
  None. One pass from the first `\boxed` matches every brace (was a scan to the end of the
  text per unclosed `\boxed{`: quadratic, 2 s on 10k characters of them)."""
  first = text.find('\\boxed')
  if first == -1:
    return None
  close, open_at = {}, []   # index of '{' -> index of its matching '}'
  for j in range(first, len(text)):
    if text[j] == '{':
      open_at.append(j)
    elif text[j] == '}' and open_at:
      close[open_at.pop()] = j
  start = text.rfind('\\boxed')
  while start != -1:
    i = start + len('\\boxed')
    while i < len(text) and text[i] == ' ':
      i += 1
    if i in close:
      return text[i + 1:close[i]]
    start = text.rfind('\\boxed', first, start)
  return None


def _first_value(text: str) -> fractions.Fraction | float | None:
  """The first number of an answer's text; a minus that starts the text negates it also when
  spaces follow it (`- 5` is -5)."""
  found = _numbers(text)
  if not found:
    return None
  return -found[0] if _LEADING_MINUS_RE.match(_normalise(text)) else found[0]


def _boxed_value(content: str) -> fractions.Fraction | float | None:
  frac = _FRAC_RE.search(content)
  if frac:
    num, den = (_numbers(part) for part in frac.groups()[1:])
    if len(num) == 1 and len(den) == 1 and den[0] != 0:
      value = num[0] / den[0]
      before = content[:frac.start()]
      whole = _WHOLE_RE.fullmatch(_normalise(before))
      if whole and not frac.group('sign'):   # a mixed number: 2\frac{1}{2} = 2 + 1/2
        value = _to_fraction('', whole.group('digits')) + value
        return -value if whole.group('sign') else value
      negative = frac.group('sign') and not before.strip()   # not `1 - \frac`
      return -value if negative else value
    return None
  return _first_value(content)


def _last_hash(text: str):
  """The match of the last `####` answer marker (a number right after it), or None."""
  last = None
  for last in _HASH_ANSWER_RE.finditer(text):
    pass
  return last


def _hash_value(text: str) -> fractions.Fraction | float | None:
  """The first number after the last `####` answer marker, or None; when the marker's line is
  an equation whose left side has several numbers (`#### 48+24=72`), the first number after
  its last `=` (`#### 5 = 2+3` stays 5)."""
  marker = _last_hash(text)
  if marker is None:
    return None
  after = text[marker.end():]
  line = after.split('\n', 1)[0]
  if '=' in line and len(_numbers(line.split('=', 1)[0])) > 1:
    result = _first_value(line.rsplit('=', 1)[1])
    if result is not None:
      return result
  return _first_value(after)


def extract_answer(completion: str) -> fractions.Fraction | float | None:
  """The completion's final answer as an exact fraction, or None if it has no number (NaN for
  a number of over _MAX_DIGITS digits: never equal)."""
  marker = _last_hash(completion)
  if marker is not None and marker.start() > completion.rfind('\\boxed'):
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
  if value is None or value != value:   # none, or NaN (too many digits)
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
