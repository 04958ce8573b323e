"""A resume must start from the initial (reference) policy the run started from: another seed,
init_from or model.path of the same shape is refused before any checkpoint is read."""
import json
import os
import shutil
import subprocess
import sys
import zlib

import ml_collections
import numpy as np
import pytest
from safetensors.numpy import save_file

from rft_jax import components, initial_policy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(init_from='', model_path='', seed=0):
  config = ml_collections.ConfigDict({'init_from': init_from, 'seed': seed,
                                      'model': {'path': model_path}})
  return config


def _hf_dir(path, value):
  os.makedirs(path, exist_ok=True)
  save_file({'w': np.full((4, 4), value, np.float32)}, os.path.join(path, 'model.safetensors'))
  return str(path)


def _recorded(config, workdir):
  initial_policy.record(workdir, initial_policy.describe(config))
  with open(os.path.join(workdir, initial_policy.RECORD)) as f:
    return json.load(f)


def test_random_init_is_its_seed(tmp_path):
  workdir = str(tmp_path)
  assert _recorded(_config(seed=3), workdir) == {'source': 'random', 'seed': 3}
  initial_policy.check(_config(seed=3), workdir)
  with pytest.raises(components.SetupError, match=r'^the initial policy is a random init with '
                     r'config.seed=4, but the run in .* started from a random init with '
                     r'config.seed=3 \(its initial_policy.json\): the reference policy would'):
    initial_policy.check(_config(seed=4), workdir)


def test_model_path_may_move_but_not_change(tmp_path):
  workdir = str(tmp_path / 'run')
  model = _hf_dir(tmp_path / 'model', 1.0)
  record = _recorded(_config(model_path=model), workdir)
  data = open(os.path.join(model, 'model.safetensors'), 'rb').read()
  assert record['files']['model.safetensors']['crc32'] == zlib.crc32(data)
  initial_policy.check(_config(model_path=model), workdir)   # in place: not even read
  moved = str(tmp_path / 'moved')
  shutil.copytree(model, moved)
  initial_policy.check(_config(model_path=moved), workdir)   # same bytes elsewhere
  other = _hf_dir(tmp_path / 'other', 2.0)                   # same shape, other weights
  assert os.path.getsize(os.path.join(other, 'model.safetensors')) == len(data)
  with pytest.raises(components.SetupError, match=r"^config.model.path='.*other': its "
                     r'model.safetensors differs \(size or CRC-32\) from the one the run in .* '
                     r"started from \(config.model.path='.*model', its initial_policy.json\)"):
    initial_policy.check(_config(model_path=other), workdir)


def test_init_from_changed_in_place_or_another_source(tmp_path):
  workdir = str(tmp_path / 'run')
  base = tmp_path / 'base'
  (base / 'd').mkdir(parents=True)
  (base / 'd' / 'a').write_bytes(b'0123')
  _recorded(_config(init_from=str(base)), workdir)
  initial_policy.check(_config(init_from=str(base)), workdir)
  (base / 'd' / 'a').write_bytes(b'0124')   # the same path rewritten (mtime changes)
  with pytest.raises(components.SetupError, match=r'd/a differs'):
    initial_policy.check(_config(init_from=str(base)), workdir)
  with pytest.raises(components.SetupError, match=r'^the initial policy is a random init with '
                     r"config.seed=0, but the run in .* started from config.init_from='.*base'"):
    initial_policy.check(_config(), workdir)


def test_a_workdir_without_a_record_is_not_checked(tmp_path):
  described = initial_policy.check(_config(seed=1), str(tmp_path))
  assert described == {'source': 'random', 'seed': 1}


def test_cli_resume_with_another_seed_is_refused(tmp_path):
  """End to end: a random-init GRPO run (KL to its initial policy) checkpoints; the same
  command with another seed exits 2 in one line before reading the checkpoint, the original
  seed resumes."""
  workdir = str(tmp_path / 'run')
  cmd = [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/grpo_arith.py:tiny',
         '--config.init_from=', '--config.train.steps=2', '--config.train.eval_every=100',
         '--config.rewards.num_workers=0', '--config.telemetry.console=False',
         '--config.telemetry.tensorboard=False', '--workdir', workdir]
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  run = lambda *extra: subprocess.run(cmd + list(extra), cwd=REPO, env=env, capture_output=True,
                                      text=True, timeout=300, check=False)
  first = run()
  assert first.returncode == 0, first.stderr[-2000:]
  assert os.path.isfile(os.path.join(workdir, initial_policy.RECORD))
  refused = run('--config.seed=7', '--config.train.steps=3')
  assert refused.returncode == 2, refused.stderr[-2000:]
  last = refused.stderr.strip().splitlines()[-1]
  assert 'the initial policy is a random init with config.seed=7, but the run in' in last, (
      refused.stderr[-2000:])
  assert run('--config.train.steps=3').returncode == 0


def test_init_from_through_a_symlinked_directory_and_added_files(tmp_path):
  """Files under a symlinked subdirectory count (orbax reads through it); an added or missing
  file of the checkpoint is named in the error, not every file listed."""
  workdir = str(tmp_path / 'run')
  base, elsewhere = tmp_path / 'base', tmp_path / 'elsewhere'
  (elsewhere / 'd').mkdir(parents=True)
  (elsewhere / 'd' / 'data').write_bytes(b'0123')
  base.mkdir()
  (base / '_METADATA').write_bytes(b'm')
  os.symlink(elsewhere, base / 'ocdbt.process_0')
  os.symlink(base, elsewhere / 'loop')   # a loop must not recurse forever
  record = _recorded(_config(init_from=str(base)), workdir)
  assert 'ocdbt.process_0/d/data' in record['files'], sorted(record['files'])
  (elsewhere / 'd' / 'data').write_bytes(b'0124')
  with pytest.raises(components.SetupError, match=r'ocdbt.process_0/d/data differs'):
    initial_policy.check(_config(init_from=str(base)), workdir)
  (elsewhere / 'd' / 'data').write_bytes(b'0123')
  (elsewhere / 'd' / 'more').write_bytes(b'4567')
  with pytest.raises(components.SetupError, match=r"^config.init_from='.*base' holds other "
                     r'files \(added: ocdbt.process_0/d/more\), but the run in'):
    initial_policy.check(_config(init_from=str(base)), workdir)
  (elsewhere / 'd' / 'more').unlink()
  (base / '_METADATA').unlink()
  with pytest.raises(components.SetupError, match=r'other files \(missing: _METADATA\)'):
    initial_policy.check(_config(init_from=str(base)), workdir)


def test_cli_resume_without_a_reference_may_change_the_seed(tmp_path):
  """SFT keeps no reference policy: another seed on resume is not refused."""
  workdir = str(tmp_path / 'sft')
  cmd = [sys.executable, '-m', 'rft_jax.main', '--config', 'configs/sft_arith.py:tiny',
         '--config.telemetry.console=False', '--config.telemetry.tensorboard=False',
         '--workdir', workdir]
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  for extra in (['--config.train.steps=2'], ['--config.train.steps=3', '--config.seed=7']):
    done = subprocess.run(cmd + extra, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_files_beside_an_init_from_checkpoint_are_not_the_policy(tmp_path):
  """Only what orbax reads as the params is the initial policy: a README, .DS_Store (also inside
  its data directory), notes or a copy of something else next to the checkpoint are ignored,
  added, edited or removed (they used to count as other initial weights and refuse the resume).
  A record written when every file counted (README.txt and commit_success.txt in it) still
  resumes; the weights themselves are still checked."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  workdir, base = str(tmp_path / 'run'), tmp_path / 'base'
  checkpoint.save_params(str(base), {'w': jnp.ones((4, 4)), 'b': jnp.zeros(3)})
  saved = sorted(initial_policy.describe(_config(init_from=str(base)))['files'])
  assert '_CHECKPOINT_METADATA' in saved and 'manifest.ocdbt' in saved
  (base / 'README.txt').write_text('the SFT base policy')
  (base / '.DS_Store').write_bytes(b'\0')
  (base / 'd' / '.DS_Store').write_bytes(b'\0')
  (base / 'notes').mkdir()
  (base / 'notes' / 'eval.json').write_text('{}')
  record = _recorded(_config(init_from=str(base)), workdir)
  assert sorted(record['files']) == saved
  (base / 'README.txt').write_text('edited')
  (base / 'd' / '.DS_Store').unlink()
  (base / 'CHANGES.md').write_text('x')
  initial_policy.check(_config(init_from=str(base)), workdir)
  old = dict(record, files={**record['files'], 'README.txt': {'size': 1, 'crc32': 1},
                            'commit_success.txt': {'size': 1, 'crc32': 1}})
  initial_policy.record(workdir, old)
  initial_policy.check(_config(init_from=str(base)), workdir)
  data = next(n for n in saved if n.startswith('d' + os.sep))
  (base / data).write_bytes(b'x' + (base / data).read_bytes()[1:])
  with pytest.raises(components.SetupError, match=f'its {data} differs'):
    initial_policy.check(_config(init_from=str(base)), workdir)
  assert 'commit_success.txt' not in saved   # orbax's marker: the path it wrote, no weights


def test_policy_names_without_ocdbt_and_for_the_shipped_base():
  """Saved without OCDBT, orbax writes one zarr directory per array (its .zarray kept, a
  directory without one ignored); the shipped base policy is every file but commit_success.txt."""
  names = ['_CHECKPOINT_METADATA', '_METADATA', '_sharding', 'array_metadatas/process_0',
           'commit_success.txt', 'embed/.zarray', 'embed/0.0', 'layers.0.w/.zarray',
           'layers.0.w/0.0', 'layers.0.w/.DS_Store', 'misc/0.0', 'README']
  assert initial_policy.policy_names(names) == set(names) - {
      'commit_success.txt', 'layers.0.w/.DS_Store', 'misc/0.0', 'README'}
  base = os.path.join(REPO, 'rft_jax', 'assets', 'arith_base')
  every = {os.path.relpath(os.path.join(d, f), base) for d, _, fs in os.walk(base) for f in fs}
  assert initial_policy.policy_names(every) == every - {'commit_success.txt'}
