"""Writing a params directory (tools.checkpoint convert, tools.export_base) never deletes a
directory that is not one: a mistyped --out was replaced whole (export_base rmtree'd it, orbax's
forced save cleared it), e.g. `--out rft_jax` deleted the package."""
import re

import jax.numpy as jnp
import pytest

from rft_jax import checkpoint


def _victim(tmp_path):
  victim = tmp_path / 'victim'
  victim.mkdir()
  (victim / 'notes.txt').write_text('keep me')
  return victim


def test_save_params_refuses_another_directory_and_replaces_its_own(tmp_path):
  victim = _victim(tmp_path)
  with pytest.raises(FileExistsError, match='is not a parameter checkpoint'):
    checkpoint.save_params(str(victim), {'w': jnp.ones(3)})
  assert (victim / 'notes.txt').read_text() == 'keep me'
  with pytest.raises(FileExistsError, match='is a file'):
    checkpoint.save_params(str(victim / 'notes.txt'), {'w': jnp.ones(3)})
  out = str(tmp_path / 'params')
  checkpoint.save_params(out, {'w': jnp.ones(3)})
  checkpoint.save_params(out, {'w': jnp.zeros(3)})   # an earlier params dir: replaced
  restored = checkpoint.load_params(out, {'w': jnp.ones(3)})
  assert float(restored['w'].sum()) == 0.0
  (tmp_path / 'empty').mkdir()
  checkpoint.save_params(str(tmp_path / 'empty'), {'w': jnp.ones(3)})


def test_tools_refuse_an_out_that_is_not_a_params_directory(tmp_path, capsys):
  from tools import checkpoint as tool  # pylint: disable=g-import-not-at-top
  from tools import export_base  # pylint: disable=g-import-not-at-top
  victim = _victim(tmp_path)
  def refused(call, pattern):   # bad input: exit 2 and one line
    with pytest.raises(SystemExit) as info:
      call()
    err = capsys.readouterr().err
    assert info.value.code == 2 and re.fullmatch(pattern, err), err
  refused(lambda: tool.main(['convert', str(tmp_path / 'no-model'), '--out', str(victim)]),
          'error: --out .* is not a parameter checkpoint.*\n')
  refused(lambda: export_base.main(['--config', 'configs/sft_arith.py:tiny', '--workdir',
                                    str(tmp_path / 'no-run'), '--out', str(victim)]),
          'error: --out .* is not a parameter checkpoint.*\n')
  assert (victim / 'notes.txt').read_text() == 'keep me'
  refused(lambda: export_base.main(['--config', 'configs/sft_arith.py:tiny', '--workdir',
                                    str(tmp_path / 'no-run'), '--out', str(tmp_path / 'new')]),
          'error: no checkpoint in .*no-run/checkpoints.*\n')
  assert not (tmp_path / 'no-run').exists()   # Checkpointer had created it


def test_tools_expand_a_leading_tilde_in_their_paths(tmp_path, monkeypatch, capsys):
  """`--out=~/x` reaches the tool with its `~` (the shell expands only a word that starts with
  it): tools.checkpoint and tools.export_base took it as a directory named `~` in the current
  one. Now expanded, as config paths are: --out ~/victim is the user's victim, refused."""
  from tools import checkpoint as tool  # pylint: disable=g-import-not-at-top
  from tools import export_base  # pylint: disable=g-import-not-at-top
  _victim(tmp_path)
  monkeypatch.setenv('HOME', str(tmp_path))
  def refused(call, message):
    with pytest.raises(SystemExit) as info:
      call()
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(f'error: {message}'), err
  refused(lambda: tool.main(['convert', '~/no-model', '--out=~/victim']),
          f'--out {tmp_path}/victim exists and is not a parameter checkpoint')
  refused(lambda: tool.main(['convert', '~/no-model', '--out=~/new']),
          f'{tmp_path}/no-model/config.json: not found')
  refused(lambda: export_base.main(['--config', 'configs/sft_arith.py:tiny',
                                    '--workdir=~/no-run', '--out=~/victim']),
          f'--out {tmp_path}/victim exists and is not a parameter checkpoint')
  refused(lambda: export_base.main(['--config', 'configs/sft_arith.py:tiny',
                                    '--workdir=~/no-run', '--out=~/new']),
          f'no checkpoint in {tmp_path}/no-run/checkpoints')
  refused(lambda: tool.main(['export', '--config', 'configs/sft_arith.py:tiny',
                             '--workdir=~/no-run', '--out=~/new']),
          f'no checkpoint in {tmp_path}/no-run/checkpoints')
  assert not (tmp_path / 'new').exists()
