"""Tests for rft_jax.telemetry's TensorBoard sink (read back from its event files, checking
the TFRecord framing) and make_sinks."""

import glob
import math
import os
import struct
import subprocess
import sys

import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from rft_jax.telemetry import sinks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_tfrecords(path):
  """Yields record payloads, checking TFRecord framing and both CRCs."""
  with open(path, 'rb') as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack('<Q', header)
    (len_crc,) = struct.unpack('<I', data[pos + 8:pos + 12])
    assert len_crc == masked_crc32c(header)
    payload = data[pos + 12:pos + 12 + length]
    (data_crc,) = struct.unpack('<I', data[pos + 12 + length:pos + 16 + length])
    assert data_crc == masked_crc32c(payload)
    yield payload
    pos += 16 + length


def _read_scalars(logdir):
  scalars = {}
  for path in glob.glob(os.path.join(logdir, 'events.out.tfevents*')):
    for payload in _read_tfrecords(path):
      event = event_pb2.Event.FromString(payload)
      for value in event.summary.value:
        if value.HasField('simple_value'):
          scalars.setdefault(value.tag, []).append(
              (event.step, value.simple_value))
  return scalars


def test_tensorboard_sink_writes_nan_without_a_warning(tmp_path, caplog):
  """A metric that is NaN by design is written as NaN, and tensorboardX's unnamed
  'NaN or Inf found in input tensor.' warning does not reach the console."""
  logdir = str(tmp_path / 'tb')
  sink = sinks.TensorBoardSink(logdir)
  with caplog.at_level('WARNING'):
    sink.on_step(1, {'credit/adv_reward_corr': float('nan'), 'kl': 0.5})
  sink.close()
  assert not [r for r in caplog.records if 'NaN or Inf' in r.getMessage()], caplog.text
  scalars = _read_scalars(logdir)
  assert math.isnan(scalars['credit/adv_reward_corr'][0][1])
  assert scalars['kl'] == [(1, 0.5)]


def test_tensorboard_sink_writes_readable_scalars(tmp_path):
  logdir = str(tmp_path / 'tb')
  sink = sinks.TensorBoardSink(logdir)
  sink.on_start(0, 3, {'algo': 'grpo'})
  for step in range(1, 4):
    sink.on_step(step, {'reward/mean': 0.25 * step, 'kl': 0.5 / step})
  sink.on_eval(3, {'eval/greedy_acc': 0.75})
  sink.on_message('hello')
  sink.on_end({'steps': 3})
  sink.close()
  scalars = _read_scalars(logdir)
  assert scalars['reward/mean'] == [(1, 0.25), (2, 0.5), (3, 0.75)]
  assert [s for s, _ in scalars['kl']] == [1, 2, 3]
  assert scalars['kl'][1][1] == pytest.approx(0.25)
  assert scalars['eval/greedy_acc'] == [(3, 0.75)]


def test_tensorboard_sink_does_not_import_torch_and_torch_still_imports(tmp_path):
  """tensorboardX would import torch (~1 s) to name it in type hints: the sink refuses that one
  import only. In a fresh process: scalars written, torch not loaded; then torch imports, and
  tensorboardX converts a torch tensor (its own lazy import, from a module already loaded)."""
  logdir = str(tmp_path / 'tb')
  code = f"""
import sys
from rft_jax.telemetry import sinks
sink = sinks.TensorBoardSink({logdir!r})
sink.on_step(1, {{'kl': 0.5}})
sink.close()
print('torch loaded:', 'torch' in sys.modules)
import torch
from tensorboardX import x2num
print('converted:', x2num.make_np(torch.tensor([2.0, 3.0])).tolist())
"""
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == ['torch loaded: False', 'converted: [2.0, 3.0]']
  assert _read_scalars(logdir)['kl'] == [(1, 0.5)]


def test_a_tensorboardx_that_needs_torch_still_imports(tmp_path):
  """Should a tensorboardX release import torch unguarded, the sink imports it the usual way
  (a stand-in package first on the path, in a fresh process)."""
  fake = tmp_path / 'site' / 'tensorboardX'
  fake.mkdir(parents=True)
  (fake / '__init__.py').write_text('import torch\nclass SummaryWriter:\n  pass\n')
  code = ('import sys; from rft_jax.telemetry import sinks; '
          'w = sinks._summary_writer_class(); '
          'print(w.__module__, "torch" in sys.modules)')
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f'{tmp_path / "site"}:{REPO}'),
                       timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  module, torch_loaded = out.stdout.split()
  assert (module, torch_loaded) == ('tensorboardX', 'True')


def test_tensorboard_sink_leaves_an_imported_torch_alone(tmp_path):
  """In this process torch may already be loaded (the HF tests import it): the sink works
  either way and leaves no finder behind."""
  before = list(sys.meta_path)
  sink = sinks.TensorBoardSink(str(tmp_path / 'tb'))
  sink.close()
  assert sys.meta_path == before


def test_make_sinks(tmp_path):
  hl = sinks.make_sinks(tmp_path, console=False, total_steps=2)
  assert [type(h).__name__ for h in hl] == ['JsonlSink', 'TensorBoardSink']
  hl.on_start(0, 2, {})
  hl.on_step(1, {'kl': 0.5})
  hl.close()
  assert sinks.read_jsonl(tmp_path / 'metrics.jsonl')[-1]['kl'] == 0.5
  assert _read_scalars(str(tmp_path / 'tb'))['kl'] == [(1, 0.5)]
  hl = sinks.make_sinks(tmp_path, jsonl=False, tensorboard=False)
  assert [type(h).__name__ for h in hl] == ['ConsoleSink']


def _open_files_under(path):
  """The files under `path` this process holds open (Linux /proc)."""
  fds = '/proc/self/fd'
  held = []
  for fd in os.listdir(fds):
    try:
      target = os.readlink(os.path.join(fds, fd))
    except OSError:   # the listing's own descriptor, closed by now
      continue
    if target.startswith(str(path)):
      held.append(target)
  return held


def _event_threads():
  import threading  # pylint: disable=g-import-not-at-top
  return [t for t in threading.enumerate() if type(t).__name__ == '_EventLoggerThread']


@pytest.mark.skipif(not os.path.isdir('/proc/self/fd'), reason='reads /proc/self/fd')
def test_make_sinks_closes_the_sinks_made_when_a_later_one_fails(tmp_path, monkeypatch):
  """A sink that cannot be made left the ones before it open: metrics.jsonl, and TensorBoard's
  event file and writer thread (when W&B failed to start). They are closed now, and the error
  propagates as it was (one line)."""
  threads = len(_event_threads())
  (tmp_path / 'tb').write_text('')   # TensorBoard's logdir is a file: its sink fails
  with pytest.raises(NotADirectoryError) as e:
    sinks.make_sinks(tmp_path, console=False)
  assert e.value.errno == 20 and len(str(e.value).splitlines()) == 1
  assert _open_files_under(tmp_path) == []   # metrics.jsonl was still open
  (tmp_path / 'tb').unlink()

  def wandb_fails(*args, **kwargs):
    raise RuntimeError('wandb.init: no network')
  monkeypatch.setattr(sinks, 'WandbSink', wandb_fails)
  with pytest.raises(RuntimeError, match='^wandb.init: no network$') as e:
    sinks.make_sinks(tmp_path, console=False, wandb_project='p')
  assert _open_files_under(tmp_path) == [] and len(_event_threads()) == threads, (
      _open_files_under(tmp_path))
  assert (tmp_path / 'metrics.jsonl').read_text() == ''
  assert _read_scalars(str(tmp_path / 'tb')) == {}   # the event file is whole
