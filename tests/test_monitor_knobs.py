"""config.monitor's detector knobs (rft_jax/monitor/knobs.py): set from a config (recipe, CLI,
Python API), checked like every key, and turned into the MonitorConfig of the live monitor, of
tools.monitor_replay and of a resumed run by one function."""
import dataclasses
import functools
import json
import os

import jax
import numpy as np
import pytest

from checkpoint_fixtures import assert_trees_equal, make_state
from config_fixtures import config_error
from rft_jax import api, trainer
from rft_jax import main as main_lib
from rft_jax.checkpoint import Checkpointer
from rft_jax.monitor import knobs, monitor, signatures as sigs
from rft_jax.monitor.detectors import MonitorConfig
from rft_jax.telemetry import sinks
from tools import monitor_false_alarms, monitor_replay

# reward/mean steady at 0.5 (+-0.01) for 20 steps, then 0.03 lower (two of its scale units) for
# 12: the default CUSUM threshold (cusum_h 8) does not call it (the adapting baseline holds
# the down score near 0.6), cusum_h 4 calls it a reward collapse at step 27.
REWARD = np.r_[0.5 + 0.01 * (-1.0) ** np.arange(20), 0.47 + 0.01 * (-1.0) ** np.arange(12)]


@functools.partial(jax.jit, static_argnames='cfg')
def _fired(reward, cfg):
  return monitor.run_monitor({'reward/mean': reward}, cfg)[1].fired


def fired_names(cfg, reward=REWARD):
  fired = np.asarray(_fired(reward, cfg))
  return [(int(t), sigs.SIGNATURE_NAMES[k]) for t, k in zip(*np.nonzero(fired))]


# --- The knob table and the mapping -----------------------------------------------------------

def test_every_tunable_monitor_config_field_is_a_knob_of_its_type():
  fields = {f.name: f.default for f in dataclasses.fields(MonitorConfig)}
  assert set(knobs.KNOBS) == set(fields) - {'invariant_score'}   # a rank, not a detector knob
  for name, (kind, ok, _) in knobs.KNOBS.items():
    assert type(fields[name]) is kind and ok(fields[name]), name   # the defaults are in range
  assert knobs.monitor_config(None) == MonitorConfig()
  assert knobs.problem(dataclasses.asdict(MonitorConfig())) is None


def test_a_config_with_cusum_h_gives_the_live_monitor_a_monitor_config_with_it():
  config = api.load_config('grpo_arith:tiny', {'monitor.cusum_h': 4, 'monitor.persistence': 2,
                                               'monitor.not_up_max': 0.25})
  assert config.monitor.cusum_h == 4.0 and isinstance(config.monitor.cusum_h, float)
  mode, cfg, _, _ = trainer.monitor_settings(config)
  assert mode == 'warn' and cfg == MonitorConfig(cusum_h=4.0, persistence=2, not_up_max=0.25)
  assert trainer.monitor_settings(api.load_config('grpo_arith:tiny'))[1] == MonitorConfig()
  off = api.load_config('grpo_arith:tiny', {'monitor.mode': 'off', 'monitor.cusum_h': 4})
  assert trainer.monitor_settings(off)[1] is None


def test_knobs_are_set_from_the_command_line(monkeypatch):
  monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  base = ['main', '--config', 'grpo_arith:tiny']
  config, _, _ = main_lib.parse_command_line(
      base + ['--config.monitor.cusum_h=4', '--config.monitor.persistence', '2'])
  assert trainer.monitor_settings(config)[1] == MonitorConfig(cusum_h=4.0, persistence=2)
  with pytest.raises(main_lib.UsageError, match="did you mean 'cusum_h'"):
    main_lib.parse_command_line(base + ['--config.monitor.cusum_hh=4'])
  with pytest.raises(main_lib.UsageError, match='config.monitor.persistence takes an int value'):
    main_lib.parse_command_line(base + ['--config.monitor.persistence=1.5'])


def test_a_lower_cusum_threshold_detects_a_drop_the_default_does_not():
  assert fired_names(MonitorConfig()) == []
  assert fired_names(knobs.monitor_config({'cusum_h': 4})) == [(27, 'reward_collapse')]


@pytest.mark.parametrize('key, value, message', [
    ('cusum_h', 0.0, 'config.monitor.cusum_h=0.0: must be > 0'),
    ('cusum_h', -2, 'config.monitor.cusum_h=-2: must be > 0'),
    ('persistence', 0, 'config.monitor.persistence=0: must be >= 1'),
    ('not_up_max', -0.5, "config.monitor.not_up_max=-0.5: must be > 0 (at 0 no 'not_up' gate"),
    ('release', 1.5, 'config.monitor.release=1.5: must be in (0, 1]'),
    ('cusum_cap', 0.5, 'config.monitor.cusum_cap=0.5: must be >= 1'),
    ('baseline_rate', 2.0, 'config.monitor.baseline_rate=2.0: must be in [0, 1]'),
    ('warmup', 1, 'config.monitor.warmup=1: must be >= 2'),
    ('z_clip', 0.4, 'config.monitor.z_clip=0.4: must keep cusum_k < z_clip (cusum_k=0.5'),
    ('cusum_k', 3.0, 'config.monitor.cusum_k=3.0: must keep cusum_k < z_clip'),
    ('cusum_h', float('inf'), 'config.monitor.cusum_h=inf: must be a finite number'),
    ('cusum_h', '8', "config.monitor.cusum_h='8': expected float, got str"),
    ('persistence', 2.0, 'config.monitor.persistence=2.0: expected int, got float'),
    ('stall_persistence', True, 'config.monitor.stall_persistence=True: expected int, got bool'),
    ('cusum_hh', 4.0, "config.monitor.cusum_hh: unknown key (did you mean 'cusum_h'?)"),
])
def test_a_bad_knob_is_a_one_line_config_error(key, value, message):
  config = api.load_config('grpo_arith:tiny')
  assert config_error(config, {f'monitor.{key}': value}).startswith(message)


def test_the_python_api_refuses_bad_knobs_naming_them():
  with pytest.raises(api.ConfigError, match=r'^config\.monitor\.cusum_h=0\.0: must be > 0$'):
    api.load_config('grpo_arith:tiny', {'monitor.cusum_h': 0})
  with pytest.raises(api.ConfigError, match="did you mean 'not_up_max'"):
    api.load_config('grpo_arith:tiny', {'monitor.not_upmax': 0.3})


def test_validate_only_checks_the_knobs(capsys):
  assert main_lib.main(['main', '--config', 'grpo_arith:tiny', '--config.monitor.cusum_h=0',
                        '--validate_only']) == 2
  assert capsys.readouterr().err == 'error: config.monitor.cusum_h=0.0: must be > 0\n'


# --- Resume: a checkpointed monitor state under other knobs ----------------------------------

def test_a_checkpointed_monitor_state_resumes_under_other_knobs(tmp_path):
  """MonitorConfig is static under jit: another knob compiles another program, but the state's
  shapes depend on warmup alone, so a run resumed with a changed knob restores its monitor
  exactly (not started afresh) and goes on under the new knob."""
  default, lower = MonitorConfig(), knobs.monitor_config({'cusum_h': 4, 'persistence': 2})
  shapes = lambda cfg: jax.tree.map(lambda x: (x.shape, x.dtype), jax.eval_shape(
      functools.partial(monitor.init_monitor, cfg)))
  assert shapes(lower) == shapes(default)
  assert shapes(MonitorConfig(warmup=4)) != shapes(default)   # the window: reset on resume
  update = lambda cfg: jax.jit(functools.partial(monitor.monitor_update, cfg=cfg))
  state = monitor.init_monitor(default)
  for reward in REWARD[:24]:            # 4 steps into the drop under the default knobs
    state, _ = update(default)(state, {'reward/mean': np.float32(reward)})
  ckpt = Checkpointer(str(tmp_path / 'ckpts'))
  ckpt.save(24, make_state(0, 1).replace(monitor=state), {}, {})
  restored, _, _, _ = ckpt.restore(24, make_state(1, 0).replace(
      monitor=monitor.init_monitor(lower)))
  ckpt.close()
  assert ckpt.problems == []
  assert_trees_equal(restored.monitor, state)
  fired = []
  for reward in REWARD[24:]:
    restored_monitor, alarms = update(lower)(restored.monitor, {'reward/mean': np.float32(reward)})
    restored = restored.replace(monitor=restored_monitor)
    fired += [sigs.SIGNATURE_NAMES[k] for k in np.flatnonzero(np.asarray(alarms.fired))]
  assert fired == ['reward_collapse']   # as the run that had cusum_h 4 from the start
  # A changed warmup restarts the statistics, and the line says so (it blamed 'this version').
  ckpt = Checkpointer(str(tmp_path / 'ckpts'))
  ckpt.restore(24, make_state(1, 0).replace(monitor=monitor.init_monitor(MonitorConfig(warmup=4))))
  ckpt.close()
  assert len(ckpt.problems) == 1 and 'monitor.warmup changed' in ckpt.problems[0], ckpt.problems


# --- tools.monitor_replay --------------------------------------------------------------------

def _write_run(run_dir, monitor_section=None):
  run_dir.mkdir()
  sink = sinks.JsonlSink(str(run_dir / 'metrics.jsonl'))
  for step, reward in enumerate(REWARD, start=1):
    sink.on_step(step, {'reward/mean': float(reward)})
  sink.close()
  if monitor_section is not None:
    (run_dir / 'config.json').write_text(json.dumps({'monitor': monitor_section}))
  return str(run_dir)


def _replay(capsys, *argv):
  code = monitor_replay.main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


def test_replay_uses_the_runs_knobs_and_its_flags_override_them(tmp_path, capsys):
  tuned = _write_run(tmp_path / 'tuned', {'mode': 'warn', 'warmup': 10, 'cusum_h': 4.0})
  code, out, _ = _replay(capsys, tuned, '--out', str(tmp_path / 'o1'))
  assert code == 0 and 'step 28: reward_collapse' in out, out   # logged steps count from 1
  assert '(monitor warm-up 10 steps, cusum_h=4.0)' in out
  code, out, _ = _replay(capsys, tuned, '--set', 'cusum_h=8', '--out', str(tmp_path / 'o2'))
  assert code == 0 and out.startswith('0 incident(s)'), out
  plain = _write_run(tmp_path / 'plain', {'mode': 'warn', 'warmup': 10})
  code, out, _ = _replay(capsys, plain, '--out', str(tmp_path / 'o3'))
  assert code == 0 and out.startswith('0 incident(s)') and '(monitor warm-up 10 steps)' in out
  code, out, _ = _replay(capsys, plain, '--set', 'cusum_h=4', '--out', str(tmp_path / 'o4'))
  assert code == 0 and 'step 28: reward_collapse' in out, out


@pytest.mark.parametrize('section, argv, message', [
    ({'warmup': 10, 'cusum_h': 0}, [],
     'error: monitor.cusum_h=0: must be > 0 (in {run}/config.json)\n'),
    ({'warmup': 10}, ['--set', 'persistence=0'],
     'error: monitor.persistence=0: must be >= 1 (from --set/--warmup)\n'),
    ({'warmup': 10}, ['--set', 'persistence=2.5'],
     'error: --set persistence=2.5: monitor.persistence takes an int value\n'),
    ({'warmup': 10}, ['--set', 'cusum_hh=4'],
     "error: --set cusum_hh=4: expected KNOB=VALUE with a monitor knob (did you mean 'cusum_h'?)"
     '; knobs: warmup, cusum_k, cusum_h,'),
    ({'warmup': 10}, ['--set', 'cusum_h'], 'error: --set cusum_h: expected KNOB=VALUE'),
    # the flag broke the pair, not config.json's cusum_k: it was blamed on config.json
    ({'warmup': 10, 'cusum_k': 1.0}, ['--set', 'z_clip=0.8'],
     'error: monitor.z_clip=0.8: must keep cusum_k < z_clip (cusum_k=1.0, z_clip=0.8): else the '
     'CUSUM never grows (from --set/--warmup)\n'),
])
def test_replay_refuses_bad_knobs_in_one_line(tmp_path, capsys, section, argv, message):
  run = _write_run(tmp_path / 'run', section)
  code, out, err = _replay(capsys, run, *argv, '--out', str(tmp_path / 'out'))
  assert code == 2 and out == '' and err.startswith(message.format(run=run)), err
  assert len(err.splitlines()) == 1


@pytest.mark.parametrize('argv, message', [
    (['--set', 'nosuch=1'], '--set nosuch=1: expected KNOB=VALUE with a monitor knob; knobs:'),
    (['--set', 'cusum_h'], '--set cusum_h: expected KNOB=VALUE'),
    (['--set', 'persistence=x'], '--set persistence=x: monitor.persistence takes an int value'),
    (['--set', 'cusum_h=0'], 'monitor.cusum_h=0.0: must be > 0'),
    (['--traces', '0'], '--traces=0: must be at least 1'),    # an IndexError traceback
    (['--seed', '-1'], '--seed=-1: must be at least 0'),      # numpy's ValueError traceback
    (['--window', '-1'], '--window=-1: must be at least 0'),  # ran, and detected nothing
])
def test_false_alarm_tool_refuses_bad_knobs_as_usage_errors(capsys, argv, message):
  """An unknown field ended in an AttributeError traceback (and one without '=' in a
  ValueError); now the knobs' parser and ranges, as tools.monitor_replay: exit 2, one line
  (argparse's usage line before it is gone: tools.checkpoint.usage_exit, as the other tools)."""
  with pytest.raises(SystemExit) as e:
    monitor_false_alarms.main(['--traces', '1', '--steps', '81', *argv])
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  assert err.startswith(f'error: {message}'), err
