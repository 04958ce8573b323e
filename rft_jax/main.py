r"""Command line entry point: load a recipe, check it, run it.

  python -m rft_jax.main --config configs/grpo_arith.py [--config.a.b=v ...] [--workdir DIR]
  python -m rft_jax.main --config configs/sft_arith.py:tiny --validate_only

`--config` takes an ml_collections config file (`path.py` or `path.py:arg`, where `arg` goes to
`get_config(arg)`); `--config.a.b=v` overrides one key, parsed as that key's type; an optional
key the recipe leaves out (rft_jax/config_schema.py OPTIONAL_KEYS, e.g. `algo.tis_cap`) is
added, parsed as its schema type. `--workdir`
defaults to `runs/<config.name>`. A recipe with a `sft` section runs `rft_jax.sft.run`, one with a
`dpo` section `rft_jax.dpo_trainer.run` (offline or online DPO), any other the RL trainer
`rft_jax.trainer.run`. `--validate_only` checks the config and the files it names
(api.validate, components.check_setup: model.path's config.json, init_from's shapes,
config.mesh against the devices, the tokenizer, GSM8K's data), prints 'config OK' and exits.
The same steps are a Python API: rft_jax/api.py.

Any bad input (a missing or broken config file, an unknown override key, an override that does
not parse, a config that fails `rft_jax.config.validate`) prints ONE line starting with 'error: '
on stderr and exits with status 2, without a traceback and without importing JAX.

SIGTERM from the command's start to its first step stops it at once with one line on stderr,
exit 75 (Ctrl-C: 130); in the step loop the step is finished and checkpointed first (exit 75).
"""
from rft_jax import stop_signals

if __name__ == '__main__':   # first thing: a signal in the imports below is not a silent exit 143
  stop_signals.install_start_handlers()

# pylint: disable=wrong-import-position
import ast
import os
import re
import signal
import sys
import threading
from typing import Any, Sequence

from absl import flags
import ml_collections
from ml_collections import config_flags

from rft_jax import api
from rft_jax import config as config_lib
from rft_jax import recipes
# pylint: enable=wrong-import-position

USAGE_ERROR = 2
# --validate_only with the multi-host variables: jax.distributed is not started (it would wait
# for every host), so the devices of the other hosts are not known (components.check_mesh).
_UNCHECKED_WITH_SEVERAL_PROCESSES = (
    ' (config.mesh checked against the model and the batches; against the devices of all the '
    'processes when the run starts: jax.distributed finds them)')
_HELP_ARGS = ('-h', '--help', '-help', '--helpshort', '--helpfull')
PREEMPTED = stop_signals.PREEMPTED   # stopped by SIGTERM/SIGINT; rerun the same command


class UsageError(Exception):
  """Bad command-line input; the message is one line, shown after 'error: '."""


def main(argv: Sequence[str]) -> int:
  """Runs the command line `argv` (argv[0] is the program name); returns the exit status."""
  argv = list(argv)
  if any(arg in _HELP_ARGS for arg in argv[1:]):
    help_text = _define_flags(argv).get_help(include_special_flags=False)
    print(__doc__.strip() + '\n\n' + help_text)
    return 0
  try:
    config, workdir, validate_only = parse_command_line(argv)
    config_lib.validate(config)
  except (UsageError, config_lib.ConfigError) as e:
    print(f'error: {_one_line(str(e))}', file=sys.stderr)
    return USAGE_ERROR

  if validate_only:   # the files too: model.path's config.json, the tokenizer, GSM8K's data
    try:   # components.check_setup, as in Python; JAX's backend starts without preallocating
      api.validate(config)
    except api.SetupError as e:
      print(f'error: {_one_line(str(e))}', file=sys.stderr)
      return USAGE_ERROR
    from rft_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
    print('config OK' + _UNCHECKED_WITH_SEVERAL_PROCESSES * distributed.requested())
    return 0
  problem = api.workdir_problem(workdir)
  if problem:   # before anything heavy is loaded
    print(f'error: --workdir={workdir}: {problem}', file=sys.stderr)
    return USAGE_ERROR
  if not flags.FLAGS.is_parsed():  # absl.logging warns until the global flags are parsed.
    flags.FLAGS.mark_as_parsed()
  # pylint: disable-next=g-import-not-at-top
  from rft_jax import compile_cache, components, runs
  from rft_jax.checkpoint_errors import CheckpointReadError  # pylint: disable=g-import-not-at-top
  from rft_jax.workdir_lock import WorkdirBusy  # pylint: disable=g-import-not-at-top
  compile_cache.enable()   # compiled programs are kept on disk for the next run
  # SIGTERM during set-up stops at once (exit 75), Ctrl-C too (KeyboardInterrupt, exit 130);
  # the step loop then installs its own handler, which finishes the current step and
  # checkpoints first (runs.StopRequest).
  in_main_thread = threading.current_thread() is threading.main_thread()
  previous_handlers = stop_signals.set_up_handlers() if in_main_thread else {}
  previous_unraisable, sys.unraisablehook = (
      sys.unraisablehook, stop_signals.quiet_unraisable(sys.unraisablehook))
  try:
    # jax.distributed from JAX_COORDINATOR_ADDRESS etc. (else a no-op), then the recipe's
    # trainer: SFT, DPO or RL.
    api.run_config(config, workdir)
  except (components.SetupError, FileNotFoundError, WorkdirBusy) as e:
    # Problems only visible once files and devices are opened (mesh too large, checkpoint that
    # does not match the model, another run in the workdir): the same one-line usage error as a
    # bad config.
    print(f'error: {_one_line(str(e))}', file=sys.stderr)
    return USAGE_ERROR
  except runs.TrainingError as e:
    print(f'error: {_one_line(str(e))}', file=sys.stderr)
    return 1
  except CheckpointReadError as e:   # an item of the checkpoint resumed from: it is not good
    print(f'error: {e.strerror}: {e.filename}; the checkpoint is left in place: put that back, '
          f'or move {os.path.dirname(e.filename)} aside to resume from the checkpoint before it, '
          'and run the same command', file=sys.stderr)
    return 1
  except OSError as e:   # e.g. a full disk writing incidents.md at the end (the telemetry
    # sinks, incidents.jsonl and a failed checkpoint save report it and go on)
    where = f': {e.filename}' if e.filename else ''
    print(f'error: {e.strerror or _one_line(str(e))}{where}; the run stopped with its last good '
          f'checkpoint kept in {workdir}; fix that and run the same command to resume',
          file=sys.stderr)
    return 1
  except runs.Preempted as e:
    print(f'stopped: {_one_line(str(e))}', file=sys.stderr)
    return PREEMPTED
  except runs.SetupInterrupted as e:
    print(f'stopped: {_one_line(str(e))}', file=sys.stderr)
    _INTERRUPTED[0] = True
    return PREEMPTED
  except KeyboardInterrupt:
    print(f'interrupted; resume with the same command (workdir {workdir})', file=sys.stderr)
    _INTERRUPTED[0] = True
    return stop_signals.INTERRUPTED
  finally:
    for sig, handler in previous_handlers.items():
      signal.signal(sig, handler)
    sys.unraisablehook = previous_unraisable
    stop_signals.PENDING.clear()
  return 0


def _define_flags(argv: list[str]) -> flags.FlagValues:
  """This command's flags, in a fresh FlagValues so that `main` can run more than once."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file(
      'config', None, 'Recipe file, `path.py` or `path.py:arg`, or a shipped recipe by name '
      '(grpo_arith, grpo_arith:tiny).', flag_values=flag_values,
      lock_config=True, sys_argv=argv)
  flags.DEFINE_string('workdir', '', "Output directory; '' = runs/<config.name>.",
                      flag_values=flag_values)
  flags.DEFINE_bool('validate_only', False, "Check the config, print 'config OK' and exit.",
                    flag_values=flag_values)
  return flag_values


def parse_command_line(argv: Sequence[str]) -> tuple[ml_collections.ConfigDict, str, bool]:
  """Parses `argv` into (config with overrides applied, workdir, validate_only).

  Raises UsageError with a one-line message naming the bad file, flag or key.
  """
  argv = list(argv)
  spec = _config_argument(argv)
  if spec is None:
    raise UsageError('missing --config, e.g. --config configs/grpo_arith.py')
  resolved = api.resolve_recipe(spec)   # a shipped recipe's bare name: its file, from anywhere
  if resolved != spec:
    argv = _with_config_argument(argv, resolved)
  # Load the file ourselves first: errors in it are then told apart from errors in overrides,
  # and the overrides can be checked against the keys it really has.
  loaded = _load_config_file(resolved, origin=spec)
  optional = []   # overrides of optional keys the recipe leaves out: set after absl's parse
  set_after = set()   # their argv positions (and their values' in the `--config.k v` form)
  for i, arg, key in _overrides(argv):
    if '=' not in arg and _set_by_us_with_value(key) and i + 1 < len(argv):
      with_value = f'{arg}={argv[i + 1]}'   # `--config.k v`, as absl takes it for other keys
    else:
      with_value = arg
    if key == 'faults':   # a list: absl's config flags override scalars only
      optional.append(('faults', _faults_value(with_value.partition('=')[2])))
    elif key in config_lib.OPTIONAL_KEYS and (key in recipes.RECORDED_KEYS   # absl's config
                                              or not config_lib.has_key(loaded, key)):   # lacks
      section = key.split('.')[0]
      if '.' in key and section not in loaded:
        raise UsageError(f'config key {key!r} in {arg}: this recipe has no {section!r} section')
      optional.append((key, _optional_value(with_value, key)))
    else:
      _check_override_key(loaded, key, arg)
      continue
    set_after.update((i, i + 1) if with_value != arg else (i,))
  argv = [a for j, a in enumerate(argv) if j not in set_after]

  flag_values = _define_flags(argv)
  try:
    rest = flag_values(argv)
    config = flag_values.config
    with config.unlocked():
      for key, value in optional:
        section, _, name = key.rpartition('.')
        (config[section] if section else config)[name] = value
  except flags.Error as e:
    raise UsageError(_flag_error_message(e, loaded)) from None
  except (AttributeError, KeyError) as e:  # An override key we failed to catch above.
    raise UsageError(f'unknown config key in overrides: {e}') from None
  if len(rest) > 1:
    raise UsageError(f'unexpected argument {rest[1]!r}')
  recipes.record_recipe(config, resolved)   # absl loaded it anew: as `loaded`, say which file
  if flag_values.workdir.startswith('-'):   # `--workdir --validate_only`: absl takes the flag
    raise UsageError(f'--workdir needs a directory; it got the flag {flag_values.workdir!r}')
  config_lib.expand_user_paths(config)   # `--config.model.path=~/m`: the shell leaves the `~`
  workdir = os.path.expanduser(flag_values.workdir) or os.path.join('runs', config.name)
  return config, workdir, flag_values.validate_only


def _config_position(argv: list[str]) -> tuple[int, str] | None:
  """(index in argv, prefix) of the value given to --config: prefix '--config=' (or '-config=')
  when flag and value are one argument, '' when the value is the next one; None if absent."""
  for i, arg in enumerate(argv[1:], 1):
    if arg == '--':
      break
    match = re.fullmatch(r'(--?config=).*', arg)
    if match:
      return i, match.group(1)
    if arg in ('--config', '-config') and i + 1 < len(argv):
      return i + 1, ''
  return None


def _config_argument(argv: list[str]) -> str | None:
  """The value given to --config (`path.py` or `path.py:arg`), or None."""
  position = _config_position(argv)
  return None if position is None else argv[position[0]][len(position[1]):]


def _with_config_argument(argv: list[str], spec: str) -> list[str]:
  """argv with the value of --config replaced by spec."""
  i, prefix = _config_position(argv)
  return argv[:i] + [prefix + spec] + argv[i + 1:]


def _load_config_file(spec: str, origin: str) -> ml_collections.ConfigDict:
  """Imports the recipe file and returns its `get_config(arg)`, as ml_collections will."""
  try:
    return api.load_recipe(spec, origin=f'--config={origin}')
  except api.RecipeError as e:
    raise UsageError(str(e)) from None


def _overrides(argv: list[str]) -> list[tuple[int, str, str]]:
  """(position in argv, argument, dotted key) for each `--config.a.b[=v]` (or
  `--noconfig.a.b`) in argv."""
  found = []
  for i, arg in enumerate(argv[1:], start=1):
    if arg == '--':
      break
    match = re.match(r'-{1,2}(?:no)?config\.([^=]*)', arg)
    if match:
      found.append((i, arg, match.group(1)))
  return found


def _set_by_us_with_value(key: str) -> bool:
  """Whether `--config.<key> v` is one of ours (parsed here, not by absl) that takes a value:
  config.faults, or an optional key that is not a bool (a bool flag takes none)."""
  if key == 'faults':
    return True
  return (key in config_lib.OPTIONAL_KEYS
          and config_lib.lookup(config_lib.SCHEMA, key) is not bool)


def _faults_value(text: str) -> list:
  """`--config.faults="[{'type': 'lr_spike', 'onset_step': 15, 'strength': 50}]"` -> the list
  (a Python literal, read with ast.literal_eval); config.validate checks it as a recipe's."""
  try:
    value = ast.literal_eval(text)
  except (SyntaxError, ValueError) as e:
    raise UsageError(f'--config.faults={text!r}: not a Python list of fault dicts '
                     f'({type(e).__name__})') from None
  if not isinstance(value, (list, tuple)):
    raise UsageError(f'--config.faults={text!r}: expected a list of fault dicts')
  return list(value)


def _optional_value(arg: str, key: str) -> Any:
  """The value of `--config.<key>=v` (or `--[no]config.<key>` for a bool) for an optional key
  (config_schema.OPTIONAL_KEYS) the recipe does not set, parsed as the schema's type for it."""
  kind = config_lib.lookup(config_lib.SCHEMA, key)
  negated = re.match(r'-{1,2}noconfig\.', arg) is not None
  raw = arg.split('=', 1)[1] if '=' in arg else None
  if kind is bool:
    if raw is None:
      return not negated
    if raw.lower() in ('true', 't', '1', 'yes'):
      return True
    if raw.lower() in ('false', 'f', '0', 'no'):
      return False
  elif raw is not None and not negated:
    try:
      return kind(raw)
    except ValueError:
      pass
  article = 'an' if kind is int else 'a'   # 'an int value', 'a float value'
  raise UsageError(f'{arg}: config.{key} takes {article} {kind.__name__} value '
                   f'(--config.{key}=VALUE)')


def _check_override_key(config: ml_collections.ConfigDict, key: str, arg: str) -> None:
  """Raises UsageError unless `key` (e.g. 'rollout.top_p') names a key of `config`."""
  node: Any = config
  parts = key.split('.')
  for i, part in enumerate(parts):
    part = re.sub(r'\[.*$', '', part)  # `a.b[0]`-style indexing: check the name only.
    if not isinstance(node, ml_collections.ConfigDict):
      parent = '.'.join(parts[:i])
      raise UsageError(f'unknown config key {key!r} in {arg}: config.{parent}={node!r} '
                       'is a value, not a section')
    if part not in node:
      hint = config_lib.key_hint(parts[:i + 1], node.keys())   # optional keys too
      raise UsageError(f'unknown config key {key!r} in {arg}{hint}')
    node = node[part]


def _flag_error_message(error: flags.Error, config: ml_collections.ConfigDict) -> str:
  """One line for an absl flags error, naming the config key when there is one.

  absl reports a value that does not parse as 'flag --config.a.b=VALUE: reason'.
  """
  text = _one_line(str(error))
  match = re.match(r'flag --config\.([^=\s]+)=(.*?): ', text)
  if not match:
    return text
  key, value = match.groups()
  try:
    expected = f' as {type(config_lib.lookup(config, key)).__name__}'
  except (KeyError, AttributeError):
    expected = ''
  return f'config.{key}: cannot parse {value!r}{expected} (in --config.{key}={value})'


_one_line = api._one_line   # pylint: disable=protected-access


# An interrupt can land inside an XLA compile (its worker threads still running), and the
# interpreter's normal exit then crashed (SIGSEGV, seen with Ctrl-C and SIGTERM during the base
# eval). After one, the command ends with os._exit: nothing is left to save by then (a step's
# checkpoint is written before a clean stop; an interrupted write stays a partial checkpoint,
# which the next run sets aside).
_INTERRUPTED = [False]


if __name__ == '__main__':
  code = main(sys.argv)
  if _INTERRUPTED[0]:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # pylint: disable=protected-access
  sys.exit(code)
