"""Every command the docs tell a user to run parses, and every path they cite exists.

The docs: README.md, experiments/**/*.md, and the module docstrings of configs/, tools/ and
experiments/ (their usage text). A command is `python -m MODULE ARGS` or `python FILE.py ARGS`
(to the end of its line or inline code span; `\\` continuations joined), or `make TARGET`.
- `rft_jax.main`: parsed and validated as the CLI does before any file is opened (a recipe, its
  variant and every `--config.*` key and value).
- a tool: parsed by the tool's own argparse parser (and, for tools.faultbench, its run plan);
  a usage synopsis (`[--steps N]`, `a|b`, `...`, CAPS placeholders) only has its flags checked.
- `make TARGET`: a target of the Makefile.
Nothing runs: the tool's main() is stopped at its parser.
"""
import argparse
import ast
import glob
import importlib
import os
import re
import shlex
import sys

import jax  # noqa: F401  # before tools.bench_mesh, which sets 8 fake devices when jax is not in
import pytest

from rft_jax import config as config_lib
from rft_jax import main as main_lib
from tools import faultbench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNOPSIS = re.compile(r'[\[|]|\.\.\.|(^|\s)[A-Z][A-Z_]*(\.\w+)?(\s|$)')
OVERRIDE_TOOLS = ('tools.export_base', 'tools.checkpoint')   # take `--config.a.b=v` overrides
OPTIONAL_EXTRA = ('trl', 'datasets', 'accelerate')   # `.[compare]`, for tools.bench_trl only


def doc_texts() -> list[tuple[str, str]]:
  """(path, text) of every doc that shows commands; code files give their module docstring."""
  texts = []
  for path in ['README.md', *sorted(glob.glob('experiments/**/*.md', root_dir=REPO,
                                              recursive=True))]:
    with open(os.path.join(REPO, path), encoding='utf-8') as f:
      texts.append((path, f.read()))
  for pattern in ('configs/*.py', 'tools/*.py', 'experiments/**/*.py'):
    for path in sorted(glob.glob(pattern, root_dir=REPO, recursive=True)):
      with open(os.path.join(REPO, path), encoding='utf-8') as f:
        doc = ast.get_docstring(ast.parse(f.read()))
      if doc:
        texts.append((path, doc))
  return texts


def commands(text: str) -> list[tuple[str, str]]:
  """(module, the arguments as written) of each `python -m MODULE ...` / `python F.py ...`."""
  text = re.sub(r'(?<!`)`(?!`)[^`]+`', lambda m: m.group(0).replace('\n', ' '), text)
  text = re.sub(r'\\\n\s*', ' ', text)             # shell continuations
  text = re.sub(r'\n\s+(?=\[)', ' ', text)          # a usage synopsis continued on the next line
  found = []
  for m in re.finditer(r'\bpython\s+(?:-m\s+([\w.]+)|([\w/]+)\.py)', text):
    module = m.group(1) or m.group(2).replace('/', '.')
    found.append((module, re.split(r'[`"#\n]|\s\(', text[m.end():], maxsplit=1)[0].strip()))
  return found


def all_commands() -> list[tuple[str, str, str]]:
  return [(path, module, args) for path, text in doc_texts() for module, args in commands(text)]


class _GotParser(Exception):
  pass


def tool_parser(module: str, monkeypatch) -> argparse.ArgumentParser:
  """The parser `module`'s main() builds: main() is stopped when it starts to parse."""
  main = importlib.import_module(module).main
  original = argparse.ArgumentParser.parse_known_args

  def stop(self, args=None, namespace=None):
    raise _GotParser(self)
  monkeypatch.setattr(argparse.ArgumentParser, 'parse_known_args', stop)
  monkeypatch.setattr(sys, 'argv', [module])   # the mains that read sys.argv
  try:
    main()
  except _GotParser as got:
    return got.args[0]
  finally:
    monkeypatch.setattr(argparse.ArgumentParser, 'parse_known_args', original)
  raise AssertionError(f'{module}.main() parsed no arguments')


def option_strings(parser: argparse.ArgumentParser) -> tuple[set[str], dict]:
  """(every option string of the parser and its subcommands, {subcommand: its parser})."""
  options, subparsers = set(parser._option_string_actions), {}  # pylint: disable=protected-access
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      subparsers.update(action.choices)
      for sub in action.choices.values():
        options |= set(sub._option_string_actions)  # pylint: disable=protected-access
  return options, subparsers


def check_synopsis(parser: argparse.ArgumentParser, args: str) -> None:
  """Each flag of a usage synopsis is one of the parser's; a leading word is a subcommand."""
  options, subparsers = option_strings(parser)
  words = args.split()
  if subparsers and words and not words[0].startswith(('-', '[')):
    for name in words[0].split('|'):
      assert name in subparsers, f'no subcommand {name!r} (there: {sorted(subparsers)})'
  for flag in re.findall(r'(?<![\w-])--[\w-]+', args):
    assert flag in options, f'no option {flag} (there: {sorted(options)})'


def check_tool(module: str, args: str, monkeypatch, capsys) -> None:
  parser = tool_parser(module, monkeypatch)
  if SYNOPSIS.search(args):
    check_synopsis(parser, re.sub(r'--config\.[\w.]+=\S*', '', args))
    return
  argv = shlex.split(args)
  try:
    namespace, extra = parser.parse_known_args(argv)
    if extra and module in OVERRIDE_TOOLS and all(a.startswith('--config.') for a in extra):
      main_lib.parse_command_line(['tool', '--config', namespace.config, *extra])
    elif extra:
      parser.error(f'unrecognized arguments: {" ".join(extra)}')
    if module == 'tools.faultbench' and not namespace.rescore:
      faultbench._plan_from_args(parser, namespace)  # pylint: disable=protected-access
  except SystemExit:
    raise AssertionError(capsys.readouterr().err.strip().splitlines()[-1]) from None


def check_main(args: str, stand_ins: dict[str, str]) -> None:
  """Parsed and validated as rft_jax.main does before it opens a file. Placeholders: `...`
  (more arguments) is dropped, N (the number of hosts) is 4, and a directory the user supplies
  (`stand_ins`' keys, e.g. the HF checkpoint) that is not here is a stand-in."""
  argv = [a for a in shlex.split(args) if a != '...']
  argv = [re.sub(r'^(--config\.[\w.]+)=N$', r'\1=4', a) for a in argv]
  for key, stand_in in stand_ins.items():
    argv = [f'--config.{key}={stand_in}' if a.startswith(f'--config.{key}=')
            and not os.path.exists(a.partition('=')[2]) else a for a in argv]
  config, _, _ = main_lib.parse_command_line(['rft_jax.main', *argv])
  config_lib.validate(config)


def test_the_docs_show_the_commands_this_test_checks():
  found = {(path, module) for path, module, _ in all_commands()}
  for expected in [('README.md', 'rft_jax.main'), ('README.md', 'tools.checkpoint'),
                   ('configs/sft_arith.py', 'tools.export_base'),
                   ('experiments/faultbench/README.md', 'tools.faultbench'),
                   ('tools/monitor_replay.py', 'tools.monitor_replay'),
                   ('experiments/bench/README.md', 'experiments.bench.decode_ab')]:
    assert expected in found, expected


def test_every_documented_command_parses(monkeypatch, capsys, tmp_path):
  """`configs/sft_arith.py` told users to run `python -m tools.export_base runs/sft_arith`
  (the tool takes --config, --workdir and --out: exit 2), and the README's multi-host commands
  named no checkpoint or data (exit 2: config.tokenizer.path='': required)."""
  (tmp_path / 'model').mkdir()
  (tmp_path / 'model' / 'config.json').write_text('{}')
  (tmp_path / 'gsm8k').mkdir()
  stand_ins = {'model.path': str(tmp_path / 'model'), 'task.manual_dir': str(tmp_path / 'gsm8k')}
  failures = []
  for path, module, args in all_commands():
    if module == 'rft_jax.main' and not args:
      continue   # the program named in prose, not a command
    try:
      if module == 'rft_jax.main':
        check_main(args, stand_ins)
      else:
        check_tool(module, args, monkeypatch, capsys)
    except ModuleNotFoundError as e:
      if e.name not in OPTIONAL_EXTRA:
        raise
    except (AssertionError, main_lib.UsageError, config_lib.ConfigError) as e:
      failures.append(f'{path}: python -m {module} {args}: {e}')
  assert not failures, '\n'.join(failures)


def test_every_documented_make_target_exists():
  with open(os.path.join(REPO, 'Makefile'), encoding='utf-8') as f:
    targets = set(re.findall(r'^([\w-]+):', f.read(), re.MULTILINE))
  named = {(path, target) for path, text in doc_texts()
           for target in re.findall(r'(?:^\s*|(?<!`)`)make ([\w-]+)', text, re.MULTILINE)}
  assert {t for _, t in named} >= {'run', 'test', 'test-all', 'base', 'bench', 'notebooks'}
  assert not [(p, t) for p, t in named if t not in targets]


def cited_path_exists(name: str) -> bool:
  """`name` exists as written, with an extension (`tools/bench`, the prefix `.../arith_spm`),
  or as a module whose attribute it names (`configs/common.tiny_model`)."""
  full = os.path.join(REPO, name)
  return (os.path.exists(full) or bool(glob.glob(full + '.*'))
          or os.path.isfile(os.path.join(REPO, name.split('.')[0] + '.py')))


def test_every_file_the_docs_cite_exists():
  """Paths under the repo's top-level folders, `{a,b}` expanded; placeholders (`x.py`, `X.py`,
  `<step>`, `*`) are left out."""
  missing = []
  for path, text in doc_texts():
    for m in re.finditer(r'(?<![\w/.~-])((?:rft_jax|tools|configs|tests|experiments)/'
                         r'[\w./{},<>*-]*)', text):
      cited = m.group(1).rstrip('.,:;')
      pre, alternatives, post = re.fullmatch(r'(.*?)(?:\{(.*?)\}(.*))?', cited).groups()
      for name in ([pre + a + post for a in alternatives.split(',')] if alternatives else [pre]):
        if not re.search(r'[<*]|/[xX]\.py$', name) and not cited_path_exists(name):
          missing.append(f'{path}: {name}')
  assert not missing, '\n'.join(missing)


@pytest.mark.parametrize('module,args,message', [
    ('tools.export_base', 'runs/sft_arith', 'required: --config, --workdir, --out'),
    ('tools.export_base', '--config c.py --workdir w --out o --stepz 1', 'unrecognized'),
    ('tools.faultbench', '--suite full --faults lr_spyke', "unknown ['lr_spyke']"),
    ('tools.bench', '[--stepz 20] [--warmup 2]', 'no option --stepz'),
    ('tools.scaling', 'fit|plot RUN [--out DIR]', "no subcommand 'plot'"),
])
def test_a_wrong_command_is_caught(module, args, message, monkeypatch, capsys):
  with pytest.raises(AssertionError, match=re.escape(message)):
    check_tool(module, args, monkeypatch, capsys)
