"""rft_jax.monitor.formats on its own: detection, the final trajectory, and a --format that
is not the format detected. Replays of whole logs are in tests/test_monitor_replay.py."""

import json
import warnings

import pytest

from rft_jax.monitor import formats
from rft_jax.telemetry import sinks
from tools import monitor_replay


def test_a_trl_log_exported_from_wandb_is_trl():
  """W&B prefixes TRL's keys with 'train/' (and 'train/global_step' looked like OpenRLHF's)."""
  raw = [{'train/global_step': 3, 'train/reward': 0.5, 'train/reward_std': 0.1,
          'train/entropy': 1.2, 'train/learning_rate': 1e-6}]
  assert formats.detect_format(raw) == 'trl'
  assert formats.map_record(raw[0], 'trl')['entropy'] == 1.2


def test_last_per_step_is_the_final_trajectory():
  """Records of one step merge (TRL logs train and eval apart); a record logging a metric again
  for its step or an earlier one (here a step below the one before it) starts a redo that
  replaces what was logged from that step on. A redo halted at step 5 leaves
  no abandoned step 6 behind (the replay's plot used to keep it, with its abandoned values)."""
  log = [{'step': 1, 'kl': 0.1}, {'step': 2, 'kl': 0.2}, {'step': 2, 'reward/mean': 0.5},
         {'step': 3, 'kl': 0.3}, {'step': 4, 'kl': 0.4}, {'step': 5, 'kl': 0.5},
         {'step': 6, 'kl': 9.0, 'reward/mean': 0.0},
         {'step': 3, 'kl': 0.03}, {'step': 4, 'kl': 0.04}, {'step': 5, 'kl': 0.05}]
  assert formats.last_per_step(log) == [
      {'step': 1, 'kl': 0.1}, {'step': 2, 'kl': 0.2, 'reward/mean': 0.5},
      {'step': 3, 'kl': 0.03}, {'step': 4, 'kl': 0.04}, {'step': 5, 'kl': 0.05}]


def test_a_format_other_than_the_detected_one_is_obeyed_with_a_warning(tmp_path, capsys):
  """rft_jax logs verl's names too ('actor/entropy'), so --format verl read an rft_jax log as a
  partial verl log without a word. It still does (detection goes by marker keys, and --format
  is how to overrule it), with a FormatMismatch warning: one line from the command line."""
  log = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(log)
  for step in (1, 2, 3):
    sink.on_step(step, {'reward/mean': 0.5, 'entropy': 1.0, 'actor/entropy': 1.0})
  sink.close()
  with pytest.warns(formats.FormatMismatch, match=r"its format looks like rft_jax \(records of "
                    r"kind 'train'\), not verl; read as verl$") as caught:
    as_verl = formats.load_run(log, 'verl')
  assert caught[0].message.detected == 'rft_jax'
  assert as_verl == [{'step': s, 'entropy': 1.0} for s in (1, 2, 3)]
  verl = tmp_path / 'verl.jsonl'
  verl.write_text(''.join(json.dumps({'training/global_step': s, 'actor/entropy': 1.0}) + '\n'
                          for s in (1, 2)))
  with warnings.catch_warnings():
    warnings.simplefilter('error')   # the format detected, or 'auto': no warning
    assert formats.load_run(log, 'rft_jax') == formats.load_run(log)
    assert formats.load_run(verl, 'verl') == formats.load_run(verl)
    with pytest.raises(ValueError, match=r'no record with a step and a openrlhf metric'):
      formats.load_run(verl, 'openrlhf')   # nothing read: the one error, no warning before it
  assert monitor_replay.main([str(log), '--format', 'verl', '--out', str(tmp_path / 'out')]) == 0
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"warning: {log}: its format looks like rft_jax (records of kind 'train'), not "
                 'verl; read as verl, as --format asks (leave --format out to read it as '
                 'rft_jax)'], err


def test_an_incidents_file_or_a_log_without_steps_is_named_as_such(tmp_path, capsys):
  """A run's incidents.jsonl passed for its metrics.jsonl said 'cannot detect the log format
  from its keys; pass --format', and with --format rft_jax the replay ran over the incidents'
  numbers (score, onset_step) as if they were steps, exit 0. So did the metrics.jsonl of a run
  stopped before its first step."""
  incidents = tmp_path / 'incidents.jsonl'
  incidents.write_text(''.join(json.dumps(e) + '\n' for e in [
      {'kind': 'incident', 'step': 17, 'onset_step': 15, 'score': 1.5, 'evidence': []},
      {'kind': 'action', 'step': 17, 'action': 'lower_lr', 'restore_before': 15}]))
  for fmt in ('auto', 'rft_jax'):
    with pytest.raises(ValueError, match=r"incidents.jsonl: an incidents file \(the failure "
                       r"monitor's output\), not a training log; pass the run's metrics.jsonl"):
      formats.load_run(incidents, fmt)
  assert monitor_replay.main([str(incidents), '--format', 'rft_jax']) == 2
  assert len(capsys.readouterr().err.splitlines()) == 1
  log = tmp_path / 'metrics.jsonl'
  sink = sinks.JsonlSink(log)
  sink.on_message('memory estimate: 0.18 GiB per device')
  sink.close()
  with pytest.raises(ValueError, match=r'an rft_jax log without train records \(only message\): '
                     'the run stopped before its first step'):
    formats.load_run(tmp_path)
