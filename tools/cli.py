"""Command-line pieces the tools share: one-line usage errors and --help's word on overrides.

The project's rule for bad input, as rft_jax.main: ONE line on stderr, `error: ...` naming the
flag, exit status 2. argparse alone prints its usage block before the message (a bad value for
a typed flag, `--steps abc`, was three to eight lines); `ArgumentParser` prints the one line.
"""
import argparse
import sys

USAGE_ERROR = 2   # bad input, as argparse and rft_jax.main
_REQUIRED = 'the following arguments are required: '   # argparse's message

# The --help epilog of a tool that takes a run's `--config.a.b=v` overrides
# (tools/export_base.py parse_with_overrides).
OVERRIDES_EPILOG = ('--config.a.b=value overrides of the --config recipe are taken too, each '
                    "parsed as that key's type, as python -m rft_jax.main takes them: give the "
                    'ones the run was started with (e.g. --config.model.path=DIR).')


def usage_exit(message: str) -> SystemExit:
  """Prints `error: message` on stderr; returns the SystemExit (status 2, bad input) to raise."""
  print(f'error: {message}', file=sys.stderr)
  return SystemExit(USAGE_ERROR)


class ArgumentParser(argparse.ArgumentParser):
  """argparse's parser whose usage errors are one line, `error: MESSAGE`, exit 2, without the
  usage block (--help shows it): a bad value for a typed flag ('argument --steps: invalid int
  value: 'abc''), a missing or unknown flag, and the tool's own `ap.error(...)`; a missing
  subcommand names the commands (the usage block listed them). Its subcommands' parsers
  (add_subparsers) are of this class too."""

  def error(self, message: str):
    if message.startswith(_REQUIRED):   # a missing subcommand is named by its dest ('command'):
      # the usage block argparse printed above listed the commands; the one line names them
      commands = {a.dest: list(a.choices) for a in self._actions if a.nargs == argparse.PARSER}
      message = _REQUIRED + ', '.join(
          f'{name} (one of {", ".join(commands[name])})' if name in commands else name
          for name in message[len(_REQUIRED):].split(', '))
    raise usage_exit(message)
