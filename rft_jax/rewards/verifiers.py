"""Rule-based verifiers: pure-Python functions that score one completion.

A verifier has the signature `fn(completion: str, answer: str) -> float`, where `completion` is the
decoded model output (already cut at EOS) and `answer` is the reference answer string. Verifiers
are registered by name with `@register_verifier('name')` and looked up in `VERIFIERS`.

Verifiers run in worker processes (see `rft_jax.rewards.runner`), which get them by cloudpickle:
a function of an importable module by module path and name (the worker imports the module), any
other (defined in a notebook cell or `__main__`, a lambda, a closure) by value. A verifier
registered with `inline=True` runs in the training process instead, with no time limit: for
checks whose time is bounded by the completion's length and that cannot take the process down
(a regex full-match, a string compare), such as the built-in `correct` and `format`.

A verifier scores in [0, 1] (the failure monitor flags totals outside the range the weighted
verifiers can produce: RewardResult.out_of_range_frac). A verifier signals bad input (e.g. a
malformed reference answer) by raising; the runner records that as an error for the sample
instead of scoring it 0.

Built-in verifiers for the arithmetic task (prompts like "37+48=", answers like "85" or "-33"),
both inline (a strip, a linear-time regex full-match and a string compare):
  correct: 1.0 iff the completion is exactly the integer answer (surrounding whitespace allowed).
  format:  1.0 iff the completion is a bare integer of at most 6 digits.
"""
import os
import re
from typing import Callable

Verifier = Callable[[str, str], float]

VERIFIERS: dict[str, Verifier] = {}
_INLINE: set[str] = set()   # names registered with inline=True


def primary_verifier(weights) -> str | None:
  """The verifier with the largest reward weight (the task's correctness check), or None."""
  weights = {k: float(v) for k, v in dict(weights).items()}
  return max(weights, key=weights.get) if weights else None


# A bare ASCII integer with an optional minus sign. `[0-9]`, not `\d`: `\d` also matches
# non-ASCII digits such as '٨', which `int()` would happily accept.
_INT_RE = re.compile(r'-?[0-9]+')

FORMAT_MAX_DIGITS = 6


def register_verifier(name: str, inline: bool = False) -> Callable[[Verifier], Verifier]:
  """Decorator that registers `fn` under `name` in `VERIFIERS` and returns it.

  inline: score `name` in the calling process, without the per-call timer or a worker process
    (is_inline). Only for a verifier that always returns promptly and cannot crash or exhaust
    the process: a hang there hangs the run. Saves the pipe round trip to the workers and their
    wake-up, ~0.3-1 ms a step on 2 cores. A property of the name, not of the function: the same
    function registered under another name without inline runs in the workers. Registering the
    same definition again under the same name (a module imported again) keeps the flag.

  Registering the same function again (its module imported twice, e.g. in a worker process, or a
  recipe file loaded under two module names, as the command line does) is allowed; registering
  a different function under a taken name raises ValueError.
  """
  def wrap(fn: Verifier) -> Verifier:
    old = VERIFIERS.get(name)
    if old is not None and not _same_definition(old, fn):
      raise ValueError(f'verifier {name!r} is registered twice: '
                       f'{_qualified_name(old)} and {_qualified_name(fn)}')
    if inline or old is None or not _same_definition(old, fn):
      (_INLINE.add if inline else _INLINE.discard)(name)
    VERIFIERS[name] = fn
    return fn
  return wrap


def is_inline(name: str) -> bool:
  """Whether verifier `name` was registered with inline=True (runs in the calling process,
  untimed)."""
  return name in _INLINE


def get_verifier(name: str) -> Verifier:
  """Returns the verifier registered as `name`; KeyError listing the known names otherwise."""
  if name not in VERIFIERS:
    raise KeyError(f'unknown verifier {name!r}; known: {", ".join(sorted(VERIFIERS))}')
  return VERIFIERS[name]


def _qualified_name(fn: Callable) -> str:
  return f'{getattr(fn, "__module__", "?")}.{getattr(fn, "__qualname__", repr(fn))}'


def _same_definition(a: Callable, b: Callable) -> bool:
  """The same function: the same module and name, or the same source (file, line, name). The
  file as an absolute path: the command line loads a recipe given as `x.py` twice, once by that
  relative path (ml_collections) and once by the absolute one (api.load_recipe)."""
  if _qualified_name(a) == _qualified_name(b):
    return True

  def where(f):
    code = getattr(f, '__code__', None)
    filename = getattr(code, 'co_filename', None)
    return (filename and os.path.abspath(filename), getattr(code, 'co_firstlineno', None),
            getattr(f, '__qualname__', None))
  return where(a)[0] is not None and where(a) == where(b)


def _canonical_int(text: str) -> str | None:
  """Canonical form of a bare integer string ('-007' -> '-7', '-0' -> '0'), or None.

  Compares integers as strings rather than with `int()`, which accepts '1_000', '+5' and
  non-ASCII digits and refuses strings longer than 4300 digits.
  """
  if not _INT_RE.fullmatch(text):
    return None
  negative = text.startswith('-')
  digits = text.lstrip('-').lstrip('0') or '0'
  return '-' + digits if negative and digits != '0' else digits


@register_verifier('correct', inline=True)
def correct(completion: str, answer: str) -> float:
  """1.0 iff `completion.strip()` is an integer equal to the integer `answer`, else 0.0.

  Strict: '85', ' 85 ' and '085' match answer '85'; '85.0', '8 5', '+85', '85!' and '' do not.
  Raises ValueError if `answer` itself is not an integer (a data bug, not a wrong completion).
  """
  want = _canonical_int(answer.strip())
  if want is None:
    raise ValueError(f'reference answer is not an integer: {answer!r}')
  return 1.0 if _canonical_int(completion.strip()) == want else 0.0


@register_verifier('format', inline=True)
def format_ok(completion: str, answer: str) -> float:
  """1.0 iff `completion.strip()` matches ^-?[0-9]+$ with at most 6 digits, else 0.0.

  Leading zeros count as digits. `answer` is unused; it is part of the verifier signature.
  """
  del answer
  text = completion.strip()
  if not _INT_RE.fullmatch(text):
    return 0.0
  return 1.0 if len(text.lstrip('-')) <= FORMAT_MAX_DIGITS else 0.0


# Task verifiers in their own modules register on import (kept last: they import this module).
# pylint: disable-next=g-import-not-at-top,wrong-import-position,unused-import
from rft_jax.rewards import gsm8k  # noqa: E402,F401
