"""Slow: with mode='auto', a run hit by a persistent 50x learning-rate fault recovers.

The acceptance check of the monitor: detect within 10 steps, then restore + lower the LR
(escalating while the reward stays below its pre-onset level) and finish within 2 points of the
healthy run's held-out greedy accuracy. About 3 minutes on 2 CPU cores: run with `-m slow`.
"""
import json
import os

import pytest

from configs import grpo_arith
from rft_jax import trainer

ONSET = 20


def config(faulty: bool):
  c = grpo_arith.get_config()
  c.rollout.prompts_per_step = 16
  c.train.steps, c.train.eval_every = 60, 60
  c.train.ckpt_every, c.train.keep_checkpoints = 5, 10
  c.eval.num_prompts, c.eval.k = 128, 4
  c.telemetry.console = c.telemetry.tensorboard = False
  c.monitor.mode = 'auto' if faulty else 'warn'
  if faulty:
    c.faults = [{'type': 'lr_spike', 'onset_step': ONSET, 'strength': 50.0}]
  return c


@pytest.mark.slow
def test_auto_remediation_recovers_from_a_persistent_lr_fault(tmp_path):
  healthy = trainer.run(config(False), str(tmp_path / 'healthy'))
  faulty = trainer.run(config(True), str(tmp_path / 'faulty'))
  assert healthy['incidents'] == 0
  with open(os.path.join(str(tmp_path / 'faulty'), 'incidents.jsonl')) as f:
    log = [json.loads(line) for line in f]
  first = min((e for e in log if e['kind'] == 'incident'), key=lambda e: e['step'])
  assert ONSET <= first['step'] < ONSET + 10
  assert any(e['kind'] == 'action' for e in log)
  assert faulty['final_greedy_acc'] >= healthy['final_greedy_acc'] - 0.02, (healthy, faulty)
