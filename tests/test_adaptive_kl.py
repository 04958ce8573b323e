"""The adaptive KL coefficient (rft_jax/algorithms/kl_control.py): the controller's update by hand,
its coefficient in the loss and in the reward, config checks, and a run whose coefficient follows
the controller from the logged KL and resumes on exactly the same trajectory."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from config_fixtures import config_error
from configs import grpo_arith, reinforce_pp_arith
from rft_jax import trainer
from rft_jax.algorithms import grpo, kl_control
from rft_jax.algorithms import train_state as ts
from rft_jax.models import ModelConfig, create
from rft_jax.sampling.sampler import Rollout
from rft_jax.telemetry.sinks import read_jsonl


def _state(kl_coef=0.05, scale=None):
  return ts.TrainState(step=jnp.int32(0), params={}, opt_state=(),
                       controls={'lr_scale': jnp.float32(1.0), 'kl_coef': jnp.float32(kl_coef)},
                       kl_ctrl=None if scale is None else {'scale': jnp.float32(scale)})


def test_controller_hand_values():
  algo = grpo.GRPOConfig(kl_coef=0.05, kl_ctrl='adaptive', kl_target=0.1, kl_horizon=32.0)
  assert kl_control.init_state(algo) == {'scale': 1.0}
  assert kl_control.init_state(grpo.GRPOConfig(kl_coef=0.05)) is None
  s = _state(scale=1.0)
  np.testing.assert_allclose(kl_control.coef(s, algo), 0.05, rtol=1e-7)
  # n / horizon = 16 / 32 = 0.5; e = clip(kl / 0.1 - 1, -0.2, 0.2).
  for kl, e in ((0.2, 0.2), (0.11, 0.1), (0.0, -0.2), (0.1, 0.0)):
    new = kl_control.update(s, {'kl': jnp.float32(kl)}, algo, rows=16)
    np.testing.assert_allclose(new.kl_ctrl['scale'], 1.0 + e * 0.5, rtol=1e-6)
  s2 = kl_control.update(kl_control.update(s, {'kl': 1.0}, algo, 16), {'kl': 1.0}, algo, 16)
  np.testing.assert_allclose(kl_control.coef(s2, algo), 0.05 * 1.1 * 1.1, rtol=1e-6)
  # Remediation's kl_coef control multiplies the adapted coefficient.
  np.testing.assert_allclose(kl_control.coef(_state(0.2, 1.1), algo), 0.22, rtol=1e-6)
  # A non-finite KL (skipped update) leaves the controller where it was.
  bad = kl_control.update(s, {'kl': jnp.float32(np.nan)}, algo, 16)
  assert float(bad.kl_ctrl['scale']) == 1.0
  fixed = grpo.GRPOConfig(kl_coef=0.05)
  assert kl_control.update(_state(), {'kl': 1.0}, fixed, 16).kl_ctrl is None
  np.testing.assert_allclose(kl_control.coef(_state(0.07), fixed), 0.07, rtol=1e-7)


def test_train_step_uses_the_adapted_coefficient():
  """GRPO's train step with (control 0.1, scale 2) equals one with a fixed coefficient 0.2."""
  cfg = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=8)
  graphdef, state0 = create(cfg, seed=0)
  params = nnx.to_pure_dict(state0)
  rng = np.random.RandomState(0)
  ref = jax.tree.map(lambda x: x + 0.2 * jnp.asarray(rng.randn(*x.shape), jnp.float32), params)
  b, p, t = 4, 2, 4
  rollout = Rollout(prompt_tokens_bp=jnp.asarray(rng.randint(2, 16, (b, p)), jnp.int32),
                    prompt_mask_bp=jnp.ones((b, p), jnp.int32),
                    tokens_bt=jnp.asarray(rng.randint(2, 16, (b, t)), jnp.int32),
                    logp_bt=jnp.zeros((b, t)), mask_bt=jnp.ones((b, t), jnp.int32),
                    truncated_b=jnp.zeros((b,), bool))
  algo = grpo.GRPOConfig(kl_coef=0.1, kl_ctrl='adaptive', group_size=2)
  prepare = jax.jit(functools.partial(grpo.prepare_batch, graphdef=graphdef, algo=algo))
  batch, _ = prepare(params, ref, rollout, jnp.array([1.0, 0.0, 0.0, 1.0]), jnp.ones((b,), bool))
  optim = grpo_arith.get_config().optim
  tx, sched = ts.make_optimizer(optim), ts.lr_schedule(optim)
  step = jax.jit(functools.partial(grpo.train_step, graphdef=graphdef, algo=algo, tx=tx,
                                   schedule=sched))
  mk = lambda kl, scale: ts.TrainState(
      step=jnp.int32(0), params=params, opt_state=tx.init(params),
      controls={'lr_scale': jnp.float32(1.0), 'kl_coef': jnp.float32(kl)},
      kl_ctrl=None if scale is None else {'scale': jnp.float32(scale)})
  _, m_adapted = step(mk(0.1, 2.0), batch)
  _, m_fixed = step(mk(0.2, None), batch)
  _, m_base = step(mk(0.1, 1.0), batch)
  np.testing.assert_allclose(m_adapted['kl_coef'], 0.2, rtol=1e-6)
  np.testing.assert_allclose(m_adapted['loss'], m_fixed['loss'], rtol=1e-6)
  assert float(m_base['kl']) > 1e-3 and abs(float(m_adapted['loss'] - m_base['loss'])) > 1e-4


@pytest.mark.parametrize('changes,message', [
    ({'algo.kl_ctrl': 'pid'}, "config.algo.kl_ctrl='pid': must be one of 'fixed', 'adaptive'"),
    ({'algo.kl_ctrl': 'adaptive', 'algo.kl_coef': 0.0},
     "config.algo.kl_ctrl='adaptive': the adaptive controller adapts algo.kl_coef, which is 0"),
    ({'algo.kl_ctrl': 'adaptive', 'algo.kl_target': 0.0},
     'config.algo.kl_target=0.0: must be > 0'),
    ({'algo.kl_horizon': -1.0}, 'config.algo.kl_horizon=-1.0: must be > 0'),
])
def test_config_errors(changes, message, tmp_path):
  (tmp_path / 'tok.model').write_bytes(b'x')
  (tmp_path / 'base').mkdir()
  config = grpo_arith.get_config()
  config.tokenizer.path, config.init_from = str(tmp_path / 'tok.model'), str(tmp_path / 'base')
  error = config_error(config, changes)
  assert error.startswith(message), error


# ----------------------------------------------------------------------------
# End to end: REINFORCE++ (KL in the reward) with the adaptive controller.

TARGET, ROWS = 0.003, 16   # tiny recipe: 4 prompts x 4 completions


def _config(steps):
  config = reinforce_pp_arith.get_config('tiny')
  config.telemetry.console = False
  config.telemetry.tensorboard = False
  config.rewards.num_workers = 0
  config.update_from_flattened_dict({'train.steps': steps, 'train.ckpt_every': 2,
                                     'algo.kl_coef': 0.05})
  config.algo.kl_ctrl = 'adaptive'
  config.algo.kl_target = TARGET
  config.algo.kl_horizon = 32.0   # n / horizon = 0.5: up to +-10% per step
  return config


def _train(workdir):
  return {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'), kind='train')}


def test_coefficient_follows_the_controller_and_resumes_exactly(tmp_path):
  full_dir, split_dir = str(tmp_path / 'full'), str(tmp_path / 'split')
  trainer.run(_config(5), full_dir)
  trainer.run(_config(2), split_dir)
  trainer.run(_config(5), split_dir)
  full, split = _train(full_dir), _train(split_dir)
  assert sorted(split) == [1, 2, 3, 4, 5]
  coef = [full[s]['kl_coef'] for s in range(1, 6)]
  np.testing.assert_allclose(coef[0], 0.05, rtol=1e-6)
  for s in range(1, 5):   # beta_{t+1} = beta_t (1 + clip(kl_t / target - 1, +-0.2) n / H)
    e = np.clip(full[s]['kl'] / TARGET - 1.0, -0.2, 0.2)
    np.testing.assert_allclose(coef[s], coef[s - 1] * (1 + e * ROWS / 32.0), rtol=1e-5)
  assert len({round(c, 6) for c in coef}) == 5          # it moved every step
  for s in range(1, 6):
    np.testing.assert_allclose(full[s]['actor/kl_coef'], full[s]['kl_coef'], rtol=0)
    # The reward's KL penalty uses the step's adapted coefficient.
    np.testing.assert_allclose(full[s]['kl_reward/penalty'],
                               full[s]['kl_coef'] * full[s]['kl_reward/seq_kl'], rtol=1e-5)
  for s in (3, 4, 5):   # the resumed run: the same coefficients and the same training
    for k in ('kl_coef', 'kl', 'loss', 'reward/mean', 'grad_norm'):
      np.testing.assert_allclose(split[s][k], full[s][k], rtol=1e-6, atol=1e-8,
                                 err_msg=f'{k} at step {s}')
