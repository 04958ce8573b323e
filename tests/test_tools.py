"""tools/: export and export_base take the run's `--config.a.b=v` overrides; every tool imports."""
import json
import os
import re

import jax
import numpy as np
import pytest

from rft_jax import checkpoint, components, runs
from rft_jax.algorithms import train_state as ts
from tools import checkpoint as checkpoint_tool
from tools import export_base

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, 'configs', 'grpo_arith.py') + ':tiny'


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
  """A run directory holding one checkpoint (step 1) of the tiny GRPO recipe's initial state."""
  workdir = str(tmp_path_factory.mktemp('run'))
  config = export_base.load_config(RECIPE)
  c = components.build(config)
  tx = ts.make_optimizer(config.optim)
  state = runs.init_state(c.params, tx, runs.state_shardings(c, tx))
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'))
  ckpt.save(1, state, {'step': 1}, {})
  ckpt.close()
  return workdir


def _bad_input(capsys, call, pattern):
  """call() exits 2 (bad input, as argparse and rft_jax.main) with one stderr line matching
  pattern (tools.checkpoint and tools.export_base exited 1)."""
  with pytest.raises(SystemExit) as info:
    call()
  err = capsys.readouterr().err
  assert info.value.code == 2 and err.count('\n') == 1 and re.match(pattern, err), err


def export(run_dir, out, *overrides):
  checkpoint_tool.main(['export', '--config', RECIPE, '--workdir', run_dir, '--out', str(out),
                        *overrides])
  with open(os.path.join(out, 'config.json')) as f:
    return json.load(f)


def test_export_applies_the_runs_overrides(run_dir, tmp_path):
  # model.dtype decides the dtype on disk when --dtype is not given
  assert export(run_dir, tmp_path / 'plain')['torch_dtype'] == 'float32'
  assert export(run_dir, tmp_path / 'bf16',
                '--config.model.dtype=bfloat16')['torch_dtype'] == 'bfloat16'


def test_export_reads_no_task_data_and_setup_errors_are_one_line(run_dir, tmp_path, capsys):
  # The task's data is not needed (a GSM8K run's manual_dir need not be given again) ...
  (tmp_path / 'a_file').write_text('')   # a data_dir no dataset can be prepared in
  assert export(run_dir, tmp_path / 'nodata', f'--config.task.data_dir={tmp_path / "a_file"}')
  # ... and a model that does not fit the run is one line, not a traceback.
  _bad_input(capsys, lambda: export(run_dir, tmp_path / 'z',
                                    '--config.tokenizer.path=/no/such/tokenizer.model'),
             r'^error: config.tokenizer.path')


def test_export_override_errors_are_one_line(run_dir, tmp_path, capsys):
  _bad_input(capsys, lambda: export(run_dir, tmp_path / 'x', '--config.model.dtyp=bfloat16'),
             r"^error: unknown config key 'model.dtyp' in --config.model.dtyp=bfloat16.*dtype")
  with pytest.raises(SystemExit) as info:   # argparse: a stray flag, not a config override
    export(run_dir, tmp_path / 'y', '--dtipe=bfloat16')
  assert info.value.code == 2
  with pytest.raises(SystemExit) as info:   # overrides only mean something to export
    checkpoint_tool.main(['inspect', str(tmp_path), '--config.model.dtype=bfloat16'])
  assert info.value.code == 2


def test_export_base_takes_overrides(run_dir, tmp_path, capsys):
  out = tmp_path / 'base'
  export_base.main(['--config', RECIPE, '--workdir', run_dir, '--out', str(out),
                    '--config.train.steps=7'])
  assert os.path.isfile(os.path.join(out, '_CHECKPOINT_METADATA'))
  base = ['--config', RECIPE, '--workdir', run_dir, '--out', str(out)]
  _bad_input(capsys, lambda: export_base.main(base + ['--config.train.stepz=7']),
             r"^error: unknown config key 'train.stepz'")
  _bad_input(capsys, lambda: export_base.main(base + ['--config.tokenizer.path=/no/tok']),
             r'^error: config.tokenizer.path')   # was a SetupError traceback
  _bad_input(capsys, lambda: export_base.main(base + ['--step', '5']),
             r'^error: no checkpoint at step 5 in .* \(there: [0-9, ]+\)$')


def test_export_base_reads_no_task_data(run_dir, tmp_path):
  """As export: only the model is built (the README says so of both tools); export_base read
  the task's data (and scanned its train prompts), so a data_dir no dataset can be prepared in
  refused an export that needs none."""
  (tmp_path / 'a_file').write_text('')
  out = tmp_path / 'base'
  export_base.main(['--config', RECIPE, '--workdir', run_dir, '--out', str(out),
                    f'--config.task.data_dir={tmp_path / "a_file"}'])
  assert os.path.isfile(os.path.join(out, '_CHECKPOINT_METADATA'))


def test_export_base_reads_only_the_params(run_dir, tmp_path, monkeypatch):
  """export_base restored the whole train state (AdamW's two moments: twice the params) and
  built a fresh one to restore into, to write only the params; orbax now reads those alone."""
  ocp = checkpoint.orbax_module()
  restored, manager_restore = [], ocp.CheckpointManager.restore
  monkeypatch.setattr(ocp.CheckpointManager, 'restore', lambda self, *a, **k: restored.append(
      checkpoint.tree_nbytes(dict((out := manager_restore(self, *a, **k)).items()))) or out)
  out = str(tmp_path / 'base')
  export_base.main(['--config', RECIPE, '--workdir', run_dir, '--out', out])
  with ocp.StandardCheckpointer() as ckptr:
    written = ckptr.restore(out)
  assert sum(restored) == checkpoint.tree_nbytes(written), restored
  with checkpoint.Checkpointer(os.path.join(run_dir, 'checkpoints')) as ckpt:
    params = ckpt.restore_params(1, written)   # the run's params: those written
  jax.tree.map(np.testing.assert_array_equal, written, params)


def test_export_of_params_saved_under_other_names_is_refused(run_dir, tmp_path, capsys):
  """A checkpoint whose params have this model's shapes under another name: restore_params
  returned the ShapeDtypeStruct it asked for in that param's place (orbax's partial restore),
  and both tools wrote or failed on it; now one line names the missing param (as
  api.load_policy did)."""
  with checkpoint.Checkpointer(os.path.join(run_dir, 'checkpoints')) as ckpt:
    params = dict(ckpt.restore_params(1, components.build(
        export_base.load_config(RECIPE), data=False, params=False).params))
  params['renamed'] = params.pop('embed_tokens')
  other = str(tmp_path / 'other')
  with checkpoint.Checkpointer(os.path.join(other, 'checkpoints')) as ckpt:
    ckpt.save(1, {'params': params}, {'step': 1}, {})
  with checkpoint.Checkpointer(os.path.join(other, 'checkpoints')) as ckpt:
    with pytest.raises(ValueError, match=r'^no param embed_tokens\.'):
      like = dict(params)
      like['embed_tokens'] = like.pop('renamed')   # this model's names
      ckpt.restore_params(1, like)
  for tool in (export_base.main, lambda a: checkpoint_tool.main(['export', *a])):
    _bad_input(capsys, lambda: tool(['--config', RECIPE, '--workdir', other, '--out',
                                     str(tmp_path / 'out')]),
               r'^error: checkpoint 1 in .* does not fit this config \(no param embed_tokens')


def test_every_tool_module_imports():
  """Each tools/ module imports in a fresh interpreter (tools.bench_mesh had imported a helper
  that had moved, and broke unnoticed). bench_trl needs the optional `compare` extra."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  names = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, 'tools'))
                 if f.endswith('.py') and f not in ('__init__.py', 'bench_trl.py'))
  assert 'bench_mesh' in names and len(names) >= 15
  code = 'import importlib\nfor n in %r:\n  importlib.import_module("tools." + n)' % names
  done = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]


def test_export_of_a_missing_step_or_another_runs_checkpoint_is_one_line(run_dir, tmp_path,
                                                                         capsys):
  _bad_input(capsys, lambda: export(run_dir, tmp_path / 'x', '--step', '5'),
             r'^error: no checkpoint at step 5 in .* \(there: 1\)$')
  wider = ['--config.model.intermediate_size=96', '--config.init_from=']
  _bad_input(capsys, lambda: export(run_dir, tmp_path / 'y', *wider),   # no config.json:
             r'^error: checkpoint 1 in .* does not fit this config')   # shapes compared
  runs.record_workdir_config(export_base.load_config(RECIPE), run_dir)
  try:
    _bad_input(capsys, lambda: export(run_dir, tmp_path / 'z', *wider),
               r'^error: config.model.intermediate_size=96 does not match the run in .*: give '
               r'export the recipe and the')
  finally:
    os.remove(os.path.join(run_dir, runs.RUN_CONFIG))


def test_inspect_of_a_directory_that_holds_no_checkpoint_is_bad_input(tmp_path, capsys,
                                                                     monkeypatch):
  _bad_input(capsys, lambda: checkpoint_tool.main(['inspect', str(tmp_path)]),
             r'^error: .* is neither a HF model dir')
  missing = tmp_path / 'no' / 'such'   # said it was neither a HF dir nor an orbax dir
  _bad_input(capsys, lambda: checkpoint_tool.main(['inspect', str(missing)]),
             rf'^error: {missing} does not exist$')
  monkeypatch.chdir(tmp_path)
  _bad_input(capsys, lambda: checkpoint_tool.main(['inspect', 'no']),
             rf'^error: no does not exist \(relative to {tmp_path}\)$')


def test_inspect_a_run_checkpoint_step(run_dir, capsys):
  """RUN/checkpoints/<step> (its train state) and the state item itself; absl's verbosity is
  put back after (it was left at ERROR for the rest of the process)."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  step_dir = os.path.join(run_dir, 'checkpoints', '1')
  verbosity = absl_logging.get_verbosity()
  for path in (step_dir, os.path.join(step_dir, 'state')):
    checkpoint_tool.inspect(path)
    out = capsys.readouterr().out
    assert 'params.norm.weight' in out and 'orbax pytree: ' in out, out
    assert 'orbax pytree: 0 numbers' not in out
    assert absl_logging.get_verbosity() == verbosity


def test_inspect_puts_back_the_absl_loggers_own_level(run_dir, capsys, caplog):
  """inspect mutes orbax's warning that an item dir has no step metadata. It put absl's
  verbosity back with set_verbosity, which set the absl logger's own level (NOTSET by default:
  it follows the root logger) to WARNING, so a notebook logging at INFO lost absl's INFO lines."""
  import logging  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logger = absl_logging.get_absl_logger()
  level = absl_logger.level
  absl_logger.setLevel(logging.NOTSET)
  try:
    with caplog.at_level(logging.INFO):
      checkpoint_tool.inspect(os.path.join(run_dir, 'checkpoints', '1'))
    assert 'params.norm.weight' in capsys.readouterr().out
    assert absl_logger.level == logging.NOTSET
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warned, warned   # orbax's 'Metadata file does not exist' still muted
  finally:
    absl_logger.setLevel(level)


def test_is_run_workdir(tmp_path):
  """What tools.algo_table and tools.faultbench may delete to start a run afresh."""
  from rft_jax import workdir_config  # pylint: disable=g-import-not-at-top
  run = tmp_path / 'run'
  (run / 'checkpoints').mkdir(parents=True)
  assert workdir_config.is_run_workdir(str(run))   # no file at all: a run stopped at once
  (run / 'config.json').write_text(json.dumps(export_base.load_config(RECIPE).to_dict()))
  (run / 'metrics.jsonl').write_text('')
  assert workdir_config.check_replaceable(str(run)) is None
  for name, text in (('config.json', '{"architectures": ["LlamaForCausalLM"]}'),   # HF model
                     ('config.json', '{"name": '), ('notes.txt', 'keep me')):
    other = tmp_path / f'other_{name}_{len(text)}'
    other.mkdir()
    (other / name).write_text(text)
    assert not workdir_config.is_run_workdir(str(other)), text
  (tmp_path / 'file').write_text('')
  assert 'is not a directory' in workdir_config.check_replaceable(str(tmp_path / 'file'))
  assert workdir_config.check_replaceable(str(tmp_path / 'absent')) is None


def test_algo_table_deletes_only_an_earlier_run_directory(tmp_path, monkeypatch, capsys):
  """<out>/<recipe> was rmtree'd whatever it held. Now a run directory an earlier invocation
  left is replaced, and any other folder of a recipe's name is refused (exit 2) before any
  recipe runs."""
  from tools import algo_table  # pylint: disable=g-import-not-at-top
  ran = []
  monkeypatch.setattr(algo_table.subprocess, 'call', lambda cmd, **kw: ran.append(cmd) or 3)
  out, results = tmp_path / 'out', str(tmp_path / 'results')
  (out / 'grpo').mkdir(parents=True)
  (out / 'grpo' / 'notes.txt').write_text('keep me')
  (out / 'dapo').mkdir()
  (out / 'dapo' / 'config.json').write_text(json.dumps({'name': 'dapo_arith', 'train': {}}))
  argv = ['--out', str(out), '--recipes', 'dapo,grpo', '--results', results]
  with pytest.raises(SystemExit) as info:
    algo_table.main(argv)
  err = capsys.readouterr().err
  assert info.value.code == 2 and f'{out}/grpo exists and is not a run directory' in err, err
  assert (out / 'grpo' / 'notes.txt').exists() and (out / 'dapo' / 'config.json').exists()
  assert not ran
  (out / 'grpo' / 'notes.txt').unlink()
  assert algo_table.main(argv) == 1   # both "ran" (exit 3): their earlier directories removed
  assert len(ran) == 2 and not (out / 'dapo' / 'config.json').exists()


def test_algo_table_keeps_an_earlier_invocations_log(tmp_path, monkeypatch):
  """<out>/<recipe>.log was opened with 'w': a rerun lost the earlier invocation's console output
  without a word. Now each invocation appends under a line with its date and command."""
  from tools import algo_table  # pylint: disable=g-import-not-at-top

  def fake_run(cmd, stdout, **kw):
    stdout.write('this run failed\n')
    return 3
  monkeypatch.setattr(algo_table.subprocess, 'call', fake_run)
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'grpo.log').write_text('the earlier run\n')
  argv = ['--out', str(out), '--recipes', 'grpo', '--results', str(tmp_path / 'results')]
  assert algo_table.main(argv) == 1
  lines = (out / 'grpo.log').read_text().splitlines()
  assert lines[0] == 'the earlier run' and lines[2] == 'this run failed', lines
  assert lines[1].startswith('=== ') and lines[1].endswith(
      f'rft_jax.main --config configs/grpo_arith.py --workdir {out}/grpo'), lines


@pytest.mark.parametrize('argv,said', [
    (['--recipes', ','], "--recipes=',': no recipe named"),   # an IndexError traceback
    (['--steps', '-1'], '--steps=-1: must be >= 0'),   # every recipe's run failed on it
    (['--out', '/proc/x'], '--out=/proc/x: cannot make the directory'),   # FileNotFoundError
    (['--results', '/proc/y'], '--results=/proc/y: cannot make the directory'),
])
def test_algo_table_bad_flags_are_one_line_before_any_run(tmp_path, monkeypatch, capsys, argv,
                                                          said):
  from tools import algo_table  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(algo_table.subprocess, 'call', lambda *a, **kw: pytest.fail('ran'))
  with pytest.raises(SystemExit) as e:
    algo_table.main(['--out', str(tmp_path / 'out'), '--recipes', 'grpo',
                     '--results', str(tmp_path / 'results'), *argv])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(f'error: {said}') and err.count('\n') == 1, err


BAD_VALUES = [   # (tool, its arguments with a value its flag's type refuses, the flag)
    ('bench', ['--steps', 'abc'], '--steps'),
    ('faultbench', ['--jobs', 'abc'], '--jobs'),
    ('scaling', ['fit', 'run', '--n-boot', 'abc'], '--n-boot'),
    ('checkpoint', ['export', '--config', RECIPE, '--workdir', 'w', '--out', 'o', '--step', 'abc'],
     '--step'),
    ('monitor_false_alarms', ['--steps', 'abc'], '--steps'),
    ('export_base', ['--config', RECIPE, '--workdir', 'w', '--out', 'o', '--step', 'abc'],
     '--step'),
    ('algo_table', ['--out', 'o', '--steps', 'abc'], '--steps'),
    ('monitor_replay', ['run', '--warmup', 'abc'], '--warmup'),
    ('bench_layers', ['--batch', 'abc'], '--batch'),
    ('bench_mesh', ['--repeats', 'abc'], '--repeats'),
    ('build_tokenizer', ['--vocab_size', 'abc'], '--vocab_size'),
]


@pytest.mark.parametrize('tool,argv,flag', BAD_VALUES, ids=[t for t, _, _ in BAD_VALUES])
def test_a_bad_flag_value_is_one_line_naming_the_flag(tool, argv, flag, monkeypatch, capsys):
  """`--steps abc` printed argparse's usage block (3 to 8 lines) before the error; the rule is
  one line naming the flag, exit 2 (tools/cli.py ArgumentParser, every tool's parser)."""
  import importlib  # pylint: disable=g-import-not-at-top
  main = importlib.import_module(f'tools.{tool}').main
  monkeypatch.setattr('sys.argv', [tool, *argv])   # the mains that read sys.argv
  with pytest.raises(SystemExit) as e:
    main(argv) if 'argv' in main.__code__.co_varnames else main()
  assert e.value.code == 2
  assert capsys.readouterr().err == f"error: argument {flag}: invalid int value: 'abc'\n"


@pytest.mark.parametrize('tool,commands', [
    ('tools.checkpoint', 'inspect, export, convert, rewind'), ('tools.scaling', 'fit, plan'),
    ('experiments.scaling.run_sweep', 'run, collect, report')])
def test_a_missing_subcommand_is_one_line_naming_the_commands(tool, commands, capsys):
  """argparse names a missing subcommand by its dest ('required: command'); the usage block it
  printed before listed the commands, and the one line lost them. The scaling sweep's README
  command printed the usage block too (a plain argparse parser)."""
  import importlib  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    importlib.import_module(tool).main([])
  assert e.value.code == 2 and capsys.readouterr().err == (
      f'error: the following arguments are required: command (one of {commands})\n')


def test_every_tool_parser_gives_one_line_errors():
  """No tool builds a plain argparse parser (its errors would print the usage block first)."""
  for name in sorted(os.listdir(os.path.join(REPO, 'tools'))):
    if name.endswith('.py'):
      with open(os.path.join(REPO, 'tools', name), encoding='utf-8') as f:
        assert 'argparse.ArgumentParser(' not in f.read(), name


@pytest.mark.parametrize('tool,argv', [('export_base', ['--help']),
                                       ('checkpoint', ['export', '--help']),
                                       ('checkpoint', ['--help'])])
def test_help_says_config_overrides_are_taken(tool, argv, capsys):
  """--help did not say that `--config.a.b=value` overrides are taken (parse_with_overrides)."""
  import importlib  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    importlib.import_module(f'tools.{tool}').main(argv)
  text = ' '.join(capsys.readouterr().out.split())
  assert e.value.code == 0 and ('--config.a.b=value overrides of the --config recipe are taken '
                                "too, each parsed as that key's type") in text, text
