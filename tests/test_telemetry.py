"""Tests for rft_jax.telemetry: hooks, the JSONL and console sinks, plot. The TensorBoard sink
is tested in tests/test_telemetry_tensorboard.py."""

import io
import json
import math
import os
import struct

import numpy as np
import pytest
from rich.console import Console

from rft_jax.telemetry import hooks as hooks_lib
from rft_jax.telemetry import plot as plot_lib
from rft_jax.telemetry import sinks


def _metrics(step):
  return {'reward/mean': 0.1 * step, 'reward/std': 0.05, 'kl': 0.001 * step,
          'entropy': 1.0 / step, 'response/len_mean': 3.0 + step,
          'response/len_max': 8.0 + step, 'grad_norm': 1.5, 'loss': -0.2}


# ----------------------------------------------------------------------------
# Hooks.


class _Recorder(hooks_lib.Hook):

  def __init__(self, name, log):
    self.name, self.log = name, log

  def on_start(self, step, total_steps, config_summary):
    self.log.append((self.name, 'start', step, total_steps))

  def on_step(self, step, metrics):
    self.log.append((self.name, 'step', step, dict(metrics)))

  def on_eval(self, step, results):
    self.log.append((self.name, 'eval', step, dict(results)))

  def on_message(self, text):
    self.log.append((self.name, 'message', text))

  def on_end(self, summary):
    self.log.append((self.name, 'end', dict(summary)))

  def close(self):
    self.log.append((self.name, 'close'))


def test_base_hook_methods_are_noops():
  hook = hooks_lib.Hook()
  hook.on_start(0, 10, {'a': 'b'})
  hook.on_step(1, {'kl': 0.1})
  hook.on_eval(1, {'eval/greedy_acc': 0.5})
  hook.on_message('hi')
  hook.on_end({})
  hook.close()


def test_hooklist_fans_out_in_order():
  log = []
  hl = hooks_lib.HookList([_Recorder('a', log), _Recorder('b', log)])
  hl.append(_Recorder('c', log))
  assert len(hl) == 3
  hl.on_start(0, 5, {})
  hl.on_step(1, {'kl': 0.5})
  hl.on_eval(1, {'eval/greedy_acc': 0.25})
  hl.on_message('resumed')
  hl.on_end({'steps': 1})
  hl.close()
  names = [entry[0] for entry in log]
  assert names == ['a', 'b', 'c'] * 6
  assert log[3] == ('a', 'step', 1, {'kl': 0.5})
  assert log[11] == ('c', 'message', 'resumed')
  assert [entry[1] for entry in log[::3]] == [
      'start', 'step', 'eval', 'message', 'end', 'close']


def test_hooklist_close_closes_all_then_reraises():
  log = []

  class Broken(hooks_lib.Hook):

    def close(self):
      raise RuntimeError('boom')

  hl = hooks_lib.HookList([Broken(), _Recorder('b', log)])
  with pytest.raises(RuntimeError, match='boom'):
    hl.close()
  assert log == [('b', 'close')]


# ----------------------------------------------------------------------------
# JSONL.


def test_jsonl_round_trip_with_nonfinite(tmp_path):
  path = tmp_path / 'run' / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  sink.on_start(0, 3, {'algo': 'grpo'})
  sink.on_step(1, {'reward/mean': 0.5, 'kl': float('nan'),
                   'grad_norm': float('inf'), 'loss': -float('inf'),
                   'entropy': np.float32(0.25), 'tokens': np.int64(7)})
  sink.on_eval(1, {'eval/greedy_acc': 0.41, 'eval/mean@8_acc': 0.33})
  sink.on_message('NaN')  # text is never decoded as a number
  sink.on_end({'steps': 1, 'wall_s': 2.5})
  # Flushed per line: readable before close.
  lines = path.read_text().splitlines()
  assert len(lines) == 5
  for line in lines:
    json.loads(line)  # strict JSON, no bare NaN tokens
  assert 'NaN' not in lines[1].replace('"NaN"', '')
  sink.close()

  records = sinks.read_jsonl(path)
  assert [r['kind'] for r in records] == ['start', 'train', 'eval', 'message',
                                          'end']
  assert records[0]['config'] == {'algo': 'grpo'}
  train = records[1]
  assert train['step'] == 1 and train['reward/mean'] == 0.5
  assert math.isnan(train['kl'])
  assert train['grad_norm'] == math.inf and train['loss'] == -math.inf
  assert train['entropy'] == 0.25 and train['tokens'] == 7
  assert records[2]['eval/mean@8_acc'] == 0.33
  assert records[3] == {'step': 1, 'kind': 'message', 'text': 'NaN'}
  assert records[4]['wall_s'] == 2.5
  assert [r['step'] for r in sinks.read_jsonl(path, kind='eval')] == [1]


def test_jsonl_resume_drops_later_steps(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  sink.on_start(0, 10, {})
  for step in range(1, 8):
    sink.on_step(step, _metrics(step))
    if step % 3 == 0:
      sink.on_eval(step, {'eval/greedy_acc': step / 10})
  sink.close()
  with open(path, 'a') as f:
    f.write('{"step": 8, "kind": "tra')  # torn write from the crash

  resumed = sinks.JsonlSink(path, resume_step=5)
  assert not os.path.exists(str(path) + '.tmp')
  kept = sinks.read_jsonl(path)
  assert max(r['step'] for r in kept) == 5
  assert [r['step'] for r in kept if r['kind'] == 'train'] == [1, 2, 3, 4, 5]
  assert [r['step'] for r in kept if r['kind'] == 'eval'] == [3]
  resumed.on_message('resumed from step 5')
  resumed.on_step(6, _metrics(6))
  resumed.close()
  records = sinks.read_jsonl(path)
  assert [r['step'] for r in records if r['kind'] == 'train'] == [
      1, 2, 3, 4, 5, 6]
  assert records[-2] == {'step': 5, 'kind': 'message',
                         'text': 'resumed from step 5'}


def test_jsonl_resume_keeps_what_was_logged_before_a_checkpoint_of_a_replay(tmp_path):
  """An auto restore at step 6 (to checkpoint 2) replays steps 3-4, checkpoint 4 is saved, and
  the run dies at step 5. The resume from 4 dropped every record of a step above 4: the
  incident that restored and the abandoned steps 5-6, though logged before checkpoint 4."""
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  for step in range(1, 7):
    sink.on_step(step, _metrics(step))
  sink.on_incident(6, {'kind': 'incident', 'signature': 'kl_explosion', 'onset_step': 3})
  sink.on_message('remediation: restored the checkpoint of step 2 (before onset at step 3)')
  for step in (3, 4, 5):   # the replay; checkpoint 4 is saved after step 4's record
    sink.on_step(step, _metrics(step))
  sink.close()
  sinks.JsonlSink(path, resume_step=4).close()
  kept = [(r['kind'], r['step']) for r in sinks.read_jsonl(path)]
  assert kept == [('train', s) for s in range(1, 7)] + [('incident', 6), ('message', 6),
                                                         ('train', 3), ('train', 4)], kept


def test_jsonl_resume_without_file_creates_it(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path, resume_step=4)
  sink.on_step(5, {'kl': 0.0})
  sink.close()
  assert sinks.read_jsonl(path) == [{'step': 5, 'kind': 'train', 'kl': 0.0}]


# ----------------------------------------------------------------------------
# Console.


def _plain_console():
  buf = io.StringIO()
  return Console(file=buf, force_terminal=False, width=120), buf


def test_console_non_tty_prints_periodic_step_lines():
  console, buf = _plain_console()
  sink = sinks.ConsoleSink(console=console)
  sink.on_start(0, 40, {'algo': 'grpo'})
  for step in range(1, 41):
    metrics = _metrics(step)
    if step == 20:
      metrics['kl'] = float('nan')
      del metrics['entropy']
    sink.on_step(step, metrics)
  sink.on_eval(40, {'eval/greedy_acc': 0.41, 'eval/mean@8_acc': 0.33})
  sink.on_message('resumed from step [3]')
  out = buf.getvalue()
  step_lines = [l for l in out.splitlines() if l.startswith('step ')]
  # Every 40 // 20 = 2 steps, plus the first step.
  assert len(step_lines) == 21
  assert step_lines[0].startswith('step 1/40  reward 0.1  kl 0.001  '
                                  'entropy 1  len 4  (')
  line_20 = [l for l in step_lines if l.startswith('step 20/40')][0]
  assert 'kl nan' in line_20 and 'entropy' not in line_20
  assert step_lines[-1].startswith('step 40/40  reward 4  kl 0.04  '
                                   'entropy 0.025  len 43')
  assert step_lines[-1].endswith(' s)')
  assert 'algo=grpo' in out
  assert 'eval @ step 40:  greedy_acc 41.0%  mean@8_acc 33.0%' in out
  assert 'resumed from step [3]' in out  # brackets are not rich markup
  assert '\x1b[' not in out  # no escape codes / live bar redraws


def test_console_summary_table_and_early_end():
  console, buf = _plain_console()
  sink = sinks.ConsoleSink(console=console)
  sink.on_start(0, 100, {})
  for step in range(1, 8):  # stops before a 5%-of-run boundary at 7
    sink.on_step(step, {'reward/mean': 0.5})
  sink.on_end({'eval/greedy_acc/base': 0.2, 'eval/greedy_acc/final': 0.415,
               'eval/mean@8_acc/final': float('nan'), 'steps': 7,
               'wall_s': 1234.56, 'status': 'ok'})
  sink.close()
  out = buf.getvalue()
  assert 'step 7/100  reward 0.5' in out  # last step printed at end
  assert 'run summary' in out
  for text in ('20.0%', '41.5%', 'nan', '1235', 'ok'):
    assert text in out
  row = [l for l in out.splitlines() if 'steps' in l and 'step ' not in l][0]
  assert '7' in row


def test_console_tty_progress_bar_does_not_crash():
  buf = io.StringIO()
  console = Console(file=buf, force_terminal=True, width=120)
  sink = sinks.ConsoleSink(console=console)
  sink.on_start(0, 5, {})
  for step in range(1, 6):
    sink.on_step(step, {'reward/mean': float('nan'), 'kl': 0.5})
  sink.on_eval(5, {'eval/greedy_acc': 0.5})
  sink.on_end({'steps': 5})
  sink.close()
  out = buf.getvalue()
  assert '5/5' in out and 'greedy_acc 50.0%' in out and 'run summary' in out


def test_format_value():
  assert sinks.format_value(0.51234) == '0.512'
  assert sinks.format_value(0.0031) == '0.0031'
  assert sinks.format_value(12345.6) == '12346'
  assert sinks.format_value(float('-inf')) == '-inf'
  assert sinks.format_value(3) == '3'
  assert sinks.format_summary_value('eval/acc', 0.5) == '50.0%'
  assert sinks.format_summary_value('steps', 150) == '150'


def test_incident_line_names_the_signature_like_the_replay():
  """The live console's incident line names the signature where it differs from the fault
  class, as tools.monitor_replay does; where they are equal it is named once."""
  from tools import monitor_replay   # pylint: disable=g-import-not-at-top
  incident = {'kind': 'incident', 'step': 12, 'fault_class': 'kl_explosion',
              'signature': 'kl_explosion_with_clipping', 'severity': 'critical',
              'onset_step': 9, 'score': 4.0, 'remediation': 'restore_and_raise_kl',
              'evidence': [{'signal': 'kl', 'direction': 'up', 'score': 4.0}]}
  line = sinks.describe_incident(12, incident)
  assert line.startswith('step 12: INCIDENT kl_explosion (kl_explosion_with_clipping) ')
  assert 'kl_explosion (kl_explosion_with_clipping)' in monitor_replay.format_incident(incident)
  plain = dict(incident, signature='kl_explosion')
  assert sinks.describe_incident(12, plain).startswith('step 12: INCIDENT kl_explosion [')
  assert 'kl_explosion  severity' in monitor_replay.format_incident(plain)


# ----------------------------------------------------------------------------
# Plot.


def _check_png(path):
  with open(path, 'rb') as f:
    data = f.read()
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  assert len(data) > 20_000
  (width, height) = struct.unpack('>II', data[16:24])
  assert width > 1000 and height > 600


def test_plot_run_full(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  sink.on_start(0, 60, {})
  rng = np.random.default_rng(0)
  for step in range(1, 61):
    metrics = _metrics(step)
    metrics['reward/mean'] = 0.3 + 0.005 * step + 0.05 * rng.normal()
    metrics['grad_norm'] = float(np.exp(rng.normal()))
    if step == 30:
      metrics['kl'] = float('nan')
    sink.on_step(step, metrics)
    if step % 20 == 0:
      sink.on_eval(step, {'eval/greedy_acc': 0.3 + step / 200,
                          'eval/mean@8_acc': 0.25 + step / 300})
  sink.close()
  png = tmp_path / 'out' / 'run.png'
  plot_lib.plot_run(path, png, title='synthetic')
  _check_png(png)


def test_plot_run_missing_series(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(path)
  for step in range(1, 4):
    sink.on_step(step, {'kl': 0.01 * step})  # only KL: five panels 'no data'
  sink.close()
  png = tmp_path / 'run.png'
  plot_lib.plot_run(path, png)
  _check_png(png)
  empty = tmp_path / 'empty.jsonl'
  empty.write_text('')
  plot_lib.plot_run(empty, tmp_path / 'empty.png')
  _check_png(tmp_path / 'empty.png')


def test_sft_and_dpo_logs_plot_their_own_signals(tmp_path):
  """An SFT or DPO log has no reward, KL, entropy or length: its loss, accuracy, implicit
  rewards, log-probs (DPO) or learning rate and param norm (SFT) take those four panels (they
  said 'no data', and the loss was not drawn at all)."""
  dpo = [{'step': s, 'loss': 1.0 / s, 'nll_loss': 0.5, 'rewards/accuracies': 0.5,
          'rewards/chosen': 0.1 * s, 'rewards/rejected': -0.1 * s, 'rewards/margins': 0.2 * s,
          'logps/chosen': -1.0, 'logps/rejected': -2.0, 'lr': 1e-4, 'param_norm': 9.0,
          'grad_norm': 1.0} for s in range(1, 5)]
  sft = [{'step': s, 'loss': 1.0 / s, 'token_acc': 0.1 * s, 'lr': 1e-4, 'param_norm': 9.0,
          'grad_norm': 1.0} for s in range(1, 5)]
  rl = [{'step': s, 'reward/mean': 0.5, 'loss': 1.0, 'lr': 1e-4} for s in range(1, 5)]
  titles = lambda records: [ax.get_title() for ax in plot_lib.plot_records(
      records, tmp_path / 'run.png').axes]
  assert titles(dpo) == ['loss', 'accuracy', 'DPO implicit reward', 'log-prob', 'grad norm',
                         'eval accuracy']
  assert titles(sft) == ['loss', 'accuracy', 'learning rate', 'param norm', 'grad norm',
                         'eval accuracy']
  assert titles(rl) == ['reward', 'KL', 'entropy', 'response length', 'grad norm',
                        'eval accuracy']   # RL logs keep their panels, loss or not
  _check_png(tmp_path / 'run.png')


def test_ema_debiased_and_skips_nan():
  assert plot_lib.ema([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
  out = plot_lib.ema([1.0, float('nan'), 3.0], weight=0.5)
  assert out[0] == pytest.approx(1.0) and math.isnan(out[1])
  assert out[2] == pytest.approx((0.5 * 0.5 * 1.0 + 0.5 * 3.0) / 0.75)


def test_completion_diversity_against_hand_counts():
  from rft_jax.telemetry.metrics import completion_diversity
  tokens = np.array([[5, 6, 5, 6, 0], [7, 8, 9, 0, 0]])
  mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
  # bigrams: (5,6),(6,5),(5,6) and (7,8),(8,9): 5 in all, 4 distinct; row 0 repeats (5,6).
  out = completion_diversity(tokens, mask)
  assert out['response/distinct_2'] == pytest.approx(4 / 5)
  assert out['response/repetition_frac'] == pytest.approx(0.5)
