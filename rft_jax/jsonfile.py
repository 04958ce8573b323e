"""Reading a JSON object file (a model's config.json, a tokenizer's, a run's summary) with an
error that names the file and what was wrong with it, in one line."""
import json


def read_object(path: str) -> dict:
  """The JSON object in `path` -> a dict. ValueError '<path>: not valid JSON (...)' for a torn,
  edited or non-UTF-8 file, '<path>: expected a JSON object, got <type>' for another JSON value;
  OSError as open raises it."""
  with open(path, encoding='utf-8') as f:
    try:
      value = json.load(f)
    except ValueError as e:   # JSONDecodeError, UnicodeDecodeError
      raise ValueError(f'{path}: not valid JSON ({e})') from None
  if not isinstance(value, dict):
    raise ValueError(f'{path}: expected a JSON object, got {type(value).__name__}')
  return value
