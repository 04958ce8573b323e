"""Jitted programs shared by the runs of one process (rft_jax/programs.py).

A second run reuses the first's programs only where their keys are equal, so what it trains must
be exactly what a fresh process trains; a run that differs in a keyed value (optimizer, KL
coefficient, sampling temperature, monitor) builds its own.
"""
import json
import os

import jax
import numpy as np

from rft_jax import programs, trainer
from test_trainer import tiny_config

BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'
KEYS = ('reward/mean', 'loss', 'kl', 'entropy', 'grad_norm', 'response/len_mean')


def tiny(**overrides):
  return tiny_config(**{'train.steps': 2, 'train.eval_every': 2, 'train.ckpt_every': 2,
                        'telemetry.plot': False, **overrides})


def run_compiling(config, workdir, evals=False):
  """trainer.run -> ({step: train metrics} (with evals: {(kind, step): train or eval metrics}),
  names of the XLA programs built or loaded)."""
  names = []

  def listen(event, duration_secs, fun_name='?', **_):
    del duration_secs
    if event == BACKEND_COMPILE:
      names.append(fun_name)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    trainer.run(config, workdir)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(l) for l in f]
  if evals:
    return {(r['kind'], r['step']): r for r in rows if r.get('kind') in ('train', 'eval')}, names
  return {r['step']: r for r in rows if r.get('kind') == 'train'}, names


def assert_same_metrics(a, b):
  assert sorted(a) == sorted(b)
  for step in a:
    keys = [k for k in a[step] if k.startswith('eval/')] or KEYS
    for k in keys:
      np.testing.assert_array_equal(a[step][k], b[step][k], err_msg=f'{k} at step {step}')


def test_a_second_run_reuses_the_programs_and_trains_the_same(tmp_path):
  programs.clear()
  first, first_compiled = run_compiling(tiny(), str(tmp_path / 'a'))
  second, second_compiled = run_compiling(tiny(), str(tmp_path / 'b'))
  assert_same_metrics(first, second)
  step_programs = ('jit(train_step)', 'jit(prepare_batch)', 'jit(observe)', 'jit(fn)')
  assert all(name in first_compiled for name in step_programs), first_compiled
  assert not [n for n in second_compiled if n in step_programs], second_compiled


def test_runs_that_differ_in_one_keyed_value_each_train_as_fresh_processes_would(tmp_path):
  """Each configuration differs from the first in one value a program closes over (the
  optimizer's, the loss's, the sampler's, the evaluator's). Run one after another in this
  process, each must match itself run alone, with nothing shared: a key that left the value
  out would hand it the previous run's program."""
  changes = [{}, {'optim.lr': 3e-3}, {'algo.clip_eps': 0.02}, {'rollout.temperature': 0.7},
             {'eval.temperature': 0.5}]
  programs.clear()
  in_turn = [run_compiling(tiny(**c), str(tmp_path / f'turn{i}'), evals=True)[0]
             for i, c in enumerate(changes)]
  for i, change in enumerate(changes[1:], 1):
    programs.clear()
    alone, _ = run_compiling(tiny(**change), str(tmp_path / f'alone{i}'), evals=True)
    assert_same_metrics(in_turn[i], alone)


def test_a_function_patched_between_two_runs_is_traced_again(tmp_path, monkeypatch):
  """A notebook that edits or monkeypatches the loss between two runs trains the new one: the
  shared step program is dropped when its module's functions change (programs.code_versions).
  Here the patched loss is twice the old, so the first step's gradient norm doubles."""
  from rft_jax.algorithms import grpo  # pylint: disable=g-import-not-at-top
  programs.clear()
  first, _ = run_compiling(tiny(), str(tmp_path / 'first'))
  loss_fn = grpo.loss_fn

  def doubled(*args, **kwargs):
    loss_sum, aux = loss_fn(*args, **kwargs)
    return 2.0 * loss_sum, aux

  monkeypatch.setattr(grpo, 'loss_fn', doubled)
  second, _ = run_compiling(tiny(), str(tmp_path / 'second'))
  np.testing.assert_allclose(second[1]['grad_norm'], 2.0 * first[1]['grad_norm'], rtol=1e-4)


def test_shared_builds_once_per_key_and_mesh_and_drops_the_least_recently_used(monkeypatch):
  programs.clear()
  monkeypatch.setattr(programs, 'MAX_PROGRAMS', 2)
  built = []
  build = lambda tag: lambda: built.append(tag) or object()
  a = programs.shared('p', 1, build('a'))
  assert programs.shared('p', 1, build('again')) is a and built == ['a']
  mesh = jax.make_mesh((1,), ('data',), devices=jax.devices()[:1])
  with jax.set_mesh(mesh):   # the same key traced under another mesh is another program
    assert programs.shared('p', 1, build('mesh')) is not a
  assert built == ['a', 'mesh']
  programs.shared('p', 2, build('b'))   # third entry: 'a' (least recently used) is dropped
  assert programs.shared('p', 1, build('a2')) is not a and built[-1] == 'a2'
  assert programs.config_key({'b': 1, 'a': [2]}) == programs.config_key({'a': [2], 'b': 1})
  programs.clear()
