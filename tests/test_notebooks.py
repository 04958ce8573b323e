"""The notebooks in experiments/notebooks, executed headless as CI runs them.

Notebooks 1-3 (2 and 3 only in `make test-all`: marked slow) run to the end with
RFT_NOTEBOOK_SMALL=1 in a Jupyter kernel (nbclient); a cell that raises fails the test, and each
must leave an image/png output (its plots). Notebook 4 runs
up to its first cell tagged 'real-checkpoint', with a tiny random Qwen2 checkpoint and four GSM8K
questions standing in for the real model and data (RFT_MODEL_DIR, RFT_GSM8K_DIR). The committed
.ipynb of each notebook must hold the cells of its jupytext .py source.
"""
import glob
import os

import pytest

jupytext = pytest.importorskip('jupytext')
nbclient = pytest.importorskip('nbclient')
nbformat = pytest.importorskip('nbformat')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(ROOT, 'experiments', 'notebooks')
SOURCES = sorted(glob.glob(os.path.join(NOTEBOOK_DIR, '*.py')))
STOP_TAG = 'real-checkpoint'
REGENERATE = 'make notebooks'


def _name(path):
  return os.path.splitext(os.path.basename(path))[0]


@pytest.fixture
def kernel_env(monkeypatch, tmp_path):
  """The kernel inherits this process's environment: small CPU settings, temp dirs in tmp."""
  monkeypatch.setenv('RFT_NOTEBOOK_SMALL', '1')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.setenv('TMPDIR', str(tmp_path))   # the runs' temporary workdirs
  monkeypatch.setenv('MPLBACKEND', 'module://matplotlib_inline.backend_inline')
  return tmp_path


def execute(source, stop_tag=None):
  """Runs the notebook of `source` (a jupytext .py) in a python3 kernel from the repository
  root, up to (not including) the first cell tagged `stop_tag`; returns the executed notebook.
  A cell error fails the test with the cell's source and the error."""
  nb = jupytext.read(source)
  if stop_tag is not None:
    tagged = [i for i, cell in enumerate(nb.cells) if stop_tag in cell.metadata.get('tags', [])]
    assert tagged, f'{source}: no cell tagged {stop_tag!r}'
    nb.cells = nb.cells[:tagged[0]]
  client = nbclient.NotebookClient(nb, kernel_name='python3', timeout=600,
                                   resources={'metadata': {'path': ROOT}})
  try:
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f'{_name(source)}: a cell failed:\n{e}')
  return nb


def outputs(nb):
  return [out for cell in nb.cells if cell.cell_type == 'code' for out in cell.get('outputs', [])]


def images(nb):
  return [out for out in outputs(nb) if 'image/png' in out.get('data', {})]


def text(nb):
  parts = []
  for out in outputs(nb):
    parts.append(out.get('text', '') or out.get('data', {}).get('text/plain', ''))
  return '\n'.join(parts)


def test_there_are_four_notebooks():
  assert [_name(p)[:2] for p in SOURCES] == ['01', '02', '03', '04'], SOURCES


@pytest.mark.parametrize('source', SOURCES, ids=_name)
def test_ipynb_is_generated_from_its_source(source):
  ipynb = os.path.splitext(source)[0] + '.ipynb'
  assert os.path.isfile(ipynb), f'{ipynb} missing: run {REGENERATE}'
  want = jupytext.read(source)
  have = nbformat.read(ipynb, as_version=4)
  cells = lambda nb: [(c.cell_type, c.source, c.metadata.get('tags', [])) for c in nb.cells]
  assert cells(have) == cells(want), f'{ipynb} is out of date: run {REGENERATE}'
  assert not [o for c in have.cells for o in c.get('outputs', [])], f'{ipynb}: clear outputs'
  assert have.metadata['kernelspec']['name'] == 'python3'


@pytest.mark.parametrize('source', SOURCES, ids=_name)
def test_colab_install_pins_jax_as_pyproject_does(source):
  """The jax the notebook installs in Colab is the range pyproject.toml allows (they pinned
  <0.11 after pyproject had moved to <0.12)."""
  import tomllib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    deps = tomllib.load(f)['project']['dependencies']
  spec = next(d for d in deps if d.startswith('jax>') or d.startswith('jax<'))[len('jax'):]
  with open(source, encoding='utf-8') as f:
    text = f.read()
  assert "f'{jax_build}" + spec + "'" in text, f'{source}: pin jax as pyproject does ({spec})'


def test_quickstart(kernel_env):
  nb = execute(os.path.join(NOTEBOOK_DIR, '01_quickstart.py'))
  assert images(nb), 'no plot rendered'
  out = text(nb)
  assert 'base policy' in out and 'trained policy' in out    # samples before and after
  assert "{'eval/greedy_acc'" in out                          # api.evaluate


# Notebooks 2 and 3 train two and one small runs in a kernel (~45 and ~30 s of the default
# suite on 2 cores): `make test-all` runs them. The monitor's detection and remediation on live
# runs are tests/test_monitor_live.py's, the scaling fit's tests/test_scaling*.py's.
@pytest.mark.slow
def test_failure_monitor(kernel_env):
  nb = execute(os.path.join(NOTEBOOK_DIR, '02_failure_monitor.py'))
  assert len(images(nb)) >= 3, 'expected the warn and auto plots and run.png'
  out = text(nb)
  assert 'evidence: ' in out, 'no incident with evidence was shown'
  assert 'remediation ' in out, 'auto mode took no action'
  # summary['steps'] counts RL steps; grpo_arith makes algo.updates_per_batch=2 optimiser
  # updates on each (summary['optim_updates']); the label had called the 24 steps optimiser steps.
  assert out.count('for 24 RL steps: 48 optimiser updates)') == 2, out[-1000:]


@pytest.mark.slow
def test_scaling(kernel_env):
  nb = execute(os.path.join(NOTEBOOK_DIR, '03_scaling.py'))
  assert images(nb), 'no plot rendered'
  out = text(nb)
  assert 'sigmoid fit on' in out, 'the sigmoid fit failed'


def test_real_checkpoint_until_it_needs_the_checkpoint(kernel_env, monkeypatch):
  from test_gsm8k_recipe import write_gsm8k, write_tiny_qwen2  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('RFT_MODEL_DIR', write_tiny_qwen2(str(kernel_env / 'tiny-qwen2')))
  monkeypatch.setenv('RFT_GSM8K_DIR', write_gsm8k(str(kernel_env / 'gsm8k')))
  monkeypatch.setenv('RFT_JAX_DATA_DIR', str(kernel_env / 'tfds'))
  nb = execute(os.path.join(NOTEBOOK_DIR, '04_real_checkpoint.py'), stop_tag=STOP_TAG)
  out = text(nb)
  assert 'qwen2, ' in out and 'mesh data x fsdp x tensor = (1, 1, 1)' in out, out[-2000:]
  assert out.count('Q: ') == 2          # the starting policy answered two test questions
