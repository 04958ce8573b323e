"""config.mesh against the batches: --validate_only refuses what a run refuses, in one line.

A run splits every batch by rows over data*fsdp (after cutting it into micro-/mini-batches or
score chunks); a mesh that cannot split it is refused at start-up with exit 2. --validate_only
used to say 'config OK' for such a mesh, and the RL message left PPO's mini-batches out.
"""
import json
import math
import os
import re
import subprocess
import sys

import pytest

from configs import grpo_gsm8k_qwen2
from rft_jax import api, components, config_rules
from rft_jax import config as config_lib
from rft_jax.parallel import mesh as meshlib
import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('recipe, overrides, shape, message', [
    ('grpo_arith:tiny', {}, (3, 1, 1),
     'config.rollout.prompts_per_step*group_size=16 is not divisible by config.mesh '
     'data*fsdp=3*1=3 times algo.microbatches=1 = 3: rows are split over both axes'),
    ('grpo_arith:tiny', {'algo.score_chunks': 4}, (2, 4, 1),
     'config.rollout.prompts_per_step*group_size=16 is not divisible by config.mesh '
     'data*fsdp=2*4=8 times algo.score_chunks=4 = 32: rows are split over both axes'),
    ('ppo_arith:tiny', {'algo.minibatches': 4}, (8, 1, 1),
     'config.rollout.prompts_per_step*group_size=16 is not divisible by config.mesh '
     'data*fsdp=8*1=8 times algo.microbatches=1 times algo.minibatches=4 = 32: rows are split '
     'over both axes'),
    ('dpo_arith:tiny', {'dpo.microbatches': 4}, (1, 8, 1),
     'config.dpo.batch_size=16 is not divisible by config.mesh data*fsdp=1*8=8 times '
     'dpo.microbatches=4 = 32: rows are split over both axes'),
    ('online_dpo_arith:tiny', {'dpo.microbatches': 2}, (8, 1, 1),
     'config.rollout.prompts_per_step=8 is not divisible by config.mesh data*fsdp=8*1=8 times '
     'dpo.microbatches=2 = 16: rows are split over both axes'),
    ('sft_arith:tiny', {'sft.batch_size': 12}, (8, 1, 1),
     'config.sft.batch_size=12 is not divisible by config.mesh data*fsdp=8*1=8: rows are split '
     'over both axes'),
])
def test_batch_splits_name_every_factor(recipe, overrides, shape, message):
  """PPO's message said '16 is not divisible by data*fsdp=8 times algo.microbatches=1' (it
  is): algo.minibatches=4, which made the divisor 32, was not named."""
  config = api.load_config(recipe, overrides)
  with pytest.raises(components.SetupError) as e:
    components.check_batch_splits(config, shape)
  assert str(e.value) == message
  components.check_batch_splits(config, (1, 1, 2))   # tensor does not split rows


_VALIDATE = """
import contextlib, io, json, sys
from rft_jax import main
out = []
for args in json.loads(sys.argv[1]):
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    rc = main.main(['main', '--validate_only', *args])
  out.append([rc, [l for l in err.getvalue().splitlines() if not l.startswith('WARNING:absl')]])
print('RESULT ' + json.dumps(out))
"""


def test_validate_only_refuses_a_mesh_that_cannot_split_the_batch():
  """On 8 devices, --validate_only said 'config OK' for each of these; the run then exited 2
  after loading the model and the data. Now the same line as the run, exit 2."""
  cases = [
      (['--config', 'grpo_arith:tiny', '--config.mesh.data=3'],
       'config.rollout.prompts_per_step*group_size=16 is not divisible by config.mesh '
       'data*fsdp=3*1=3'),
      (['--config', 'ppo_arith:tiny', '--config.algo.minibatches=4'],
       'times algo.minibatches=4 = 32: rows are split over both axes '
       '(config.mesh.data=-1 resolved to 8)'),
      (['--config', 'dpo_arith:tiny', '--config.dpo.batch_size=12'],
       'config.dpo.batch_size=12 is not divisible by config.mesh data*fsdp=8*1=8'),
      (['--config', 'sft_arith:tiny', '--config.mesh.data=1', '--config.mesh.fsdp=-1',
        '--config.sft.batch_size=12'],
       'config.sft.batch_size=12 is not divisible by config.mesh data*fsdp=1*8=8'),
  ]
  env = {k: v for k, v in os.environ.items()
         if k not in ('JAX_COORDINATOR_ADDRESS', 'RFT_DISTRIBUTED', 'JAX_NUM_PROCESSES',
                      'JAX_PROCESS_ID')}
  env.update(JAX_PLATFORMS='cpu', PYTHONPATH=REPO,
             XLA_FLAGS=xla_flags.with_cpu_devices(8))
  done = subprocess.run([sys.executable, '-c', _VALIDATE, json.dumps([a for a, _ in cases])],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(done.stdout.split('RESULT ', 1)[1])
  for (args, fragment), (rc, err) in zip(cases, results):
    assert rc == 2 and len(err) == 1, (args, rc, err)
    assert err[0].startswith('error: config.') and fragment in err[0], (args, err[0])


def _readme_multihost_commands() -> list[dict[str, str]]:
  """The --config.mesh.* and --config.algo.* overrides of each `rft_jax.main` command in the
  README's Multi-host block (the others name paths: tests/test_doc_commands.py parses them)."""
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    text = f.read()
  block = text[text.index('**Multi-host.**'):text.index('What each process does')]
  commands = re.sub(r'\\\n\s*', ' ', block).split('\n')   # continuation lines joined
  return [dict(re.findall(r'--config\.((?:mesh|algo)\.\S+?)=([^\s"]+)', line)) for line in commands
          if 'python -m rft_jax.main' in line]


def test_readme_multihost_commands_fit_32_devices():
  """The README's TPU and SLURM commands set only --config.mesh.fsdp=-1 on a recipe whose
  mesh.data is -1: both exited 2 ('at most one mesh axis may be -1'); with that fixed, 32
  devices times algo.microbatches=8 did not divide the recipe's 128 rollout rows."""
  commands = _readme_multihost_commands()
  assert len(commands) == 3 and all('mesh.fsdp' in c for c in commands), commands
  for overrides in commands:   # 4 hosts x 8 devices; N (hosts) = 4
    config = grpo_gsm8k_qwen2.get_config()
    api.apply_overrides(config, {k: int(v.replace('N', '4')) for k, v in overrides.items()})
    config_rules.check_mesh(config)
    shape = meshlib.mesh_shape(config.mesh, 32)
    assert math.prod(shape) == 32   # several processes: the mesh must use every device
    meshlib.check_model_fits_mesh(components.model_config(config), shape)
    components.check_batch_splits(config, shape)


def test_two_flexible_axes_say_how_to_fix_it():
  config = grpo_gsm8k_qwen2.get_config()
  config.mesh.fsdp = -1
  with pytest.raises(config_lib.ConfigError, match=r'^config.mesh.fsdp=-1: at most one mesh axis '
                     r'may be -1 \(mesh.data is already -1; give it a size, e\.g\. '
                     r'--config.mesh.data=1\)$'):
    config_rules.check_mesh(config)
