"""DAPO's dynamic sampling resumes exactly: refill rounds advance the data iterator and draw keys
from (seed, step, round), both restored from the checkpoint, so a run stopped after step 2 and
resumed logs the same per-step metrics as an uninterrupted one, sampling counts included."""
import os

import numpy as np
import pytest

from configs import dapo_arith
from rft_jax import trainer
from rft_jax.telemetry.sinks import read_jsonl


def _config(steps):
  config = dapo_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0
  config.update_from_flattened_dict({'train.steps': steps, 'train.ckpt_every': 2})
  return config


def _rows(workdir):
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


@pytest.mark.slow   # ~1 min on 2 cores: three tiny DAPO runs
def test_dynamic_sampling_resumes_exactly(tmp_path):
  full_dir, split_dir = str(tmp_path / 'full'), str(tmp_path / 'split')
  trainer.run(_config(5), full_dir)
  trainer.run(_config(2), split_dir)
  trainer.run(_config(5), split_dir)
  full, split = _rows(full_dir), _rows(split_dir)
  assert sorted(split) == [1, 2, 3, 4, 5]
  # Not vacuous: some step after the resume point needed a refill round.
  assert max(full[s]['sampling/rounds'] for s in (3, 4, 5)) > 1, full
  keys = ('sampling/rounds', 'sampling/prompts_drawn', 'sampling/informative_frac',
          'sampling/padded_groups', 'reward/mean', 'overlong/penalty_mean', 'loss', 'entropy',
          'grad_norm', 'response/len_mean', 'compute/flops_cumulative')
  for s in (3, 4, 5):
    for k in keys:
      np.testing.assert_allclose(split[s][k], full[s][k], rtol=1e-6, atol=1e-8,
                                 err_msg=f'{k} at step {s}')
