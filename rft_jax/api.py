"""Python API: load a recipe, override fields, train, look at the run, sample and evaluate.

The same code as the command line (`python -m rft_jax.main`, which is a thin layer over
`load_recipe` (rft_jax/recipes.py) and `run_config` here), for notebooks and scripts:

  from rft_jax import api
  config = api.load_config('grpo_arith:tiny', {'train.steps': 8})   # or configs/x.py[:arg]
  api.validate(config)                       # --validate_only: files, devices (optional)
  run = api.train(config)                    # progress bar in a terminal or a notebook
  run.history[-1]['reward/mean']             # one dict per step (its last record in metrics.jsonl)
  run.evals, run.incidents, run.summary      # held-out evals, monitor incidents, summary.json
  api.sample(run.policy, ['12+7='], n=4)     # -> [['19', '19', '18', '19']]
  api.evaluate(run.policy)                   # -> {'eval/greedy_acc': ..., 'eval/mean@K_acc': ...}

Errors are the CLI's, as exceptions with one-line messages: a bad recipe file `RecipeError`, a
bad key, type or value `rft_jax.config.ConfigError` ('config.rollout.group_size=1: GRPO needs at
least 2 completions per prompt'), a run that cannot start `SetupError` (mesh, files), a run that
had to stop `TrainingError`, a stop on SIGINT/SIGTERM (a notebook's interrupt) `Preempted`,
the wrong object (train(run), sample(run)) `TypeError` saying what to pass (run.policy);
train() again with the same workdir resumes. Importing this module does not import JAX.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import ml_collections

from rft_jax import config as config_lib
from rft_jax import jsonfile
from rft_jax.config import ConfigError  # noqa: F401  (api.ConfigError)
from rft_jax.policy import (  # noqa: F401
    Policy, check_arg, choose_mesh, evaluate, load_policy, sample)
from rft_jax.recipes import (  # noqa: F401
    RecipeError, apply_overrides, load_recipe, resolve_recipe)
from rft_jax.recipes import one_line as _one_line  # noqa: F401  (main.py's)
from rft_jax.telemetry.hooks import Recorder  # noqa: F401  (api.Recorder)
from rft_jax.telemetry.records import RECORD_KINDS, final_trajectory

# Also attributes, loaded on use (they import JAX): SetupError, TrainingError, Preempted.
__all__ = ['load_config', 'validate', 'train', 'open_run', 'Run', 'Recorder', 'Policy',
           'load_policy', 'sample', 'evaluate', 'choose_mesh', 'resolve_recipe', 'load_recipe',
           'apply_overrides', 'run_config', 'ConfigError', 'RecipeError']

def __getattr__(name: str):
  """SetupError, TrainingError and Preempted live in modules that import JAX: loaded on use."""
  if name == 'SetupError':
    from rft_jax import components  # pylint: disable=g-import-not-at-top
    return components.SetupError
  if name in ('TrainingError', 'Preempted'):
    from rft_jax import runs  # pylint: disable=g-import-not-at-top
    return getattr(runs, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


# --- Recipes and overrides (rft_jax/recipes.py) ----------------------------------------------

def load_config(recipe: str, overrides: Mapping[str, Any] | None = None,
                **kw_overrides: Any) -> ml_collections.ConfigDict:
  """A recipe with overrides applied, validated like the CLI's.

  recipe: 'grpo_arith', 'grpo_arith:tiny' or 'configs/grpo_arith.py[:tiny]'.
  overrides: dotted keys, {'train.steps': 20, 'optim.lr': 1e-4}; keyword arguments may write
  the dots as double underscores (train__steps=20). A dict for a section merges into it key by
  key ({'monitor': {'mode': 'warn'}} = {'monitor.mode': 'warn'}); one for rewards.weights
  replaces the weights.
  Raises RecipeError or ConfigError, each with a one-line message.
  """
  config = load_recipe(resolve_recipe(recipe), origin=repr(recipe))
  merged = dict(overrides or {})
  merged.update({k.replace('__', '.'): v for k, v in kw_overrides.items()})
  apply_overrides(config, merged)
  config_lib.validate(config)
  return config


def validate(config: ml_collections.ConfigDict) -> None:
  """What the CLI's `--validate_only` checks, building nothing: the config (ConfigError), then
  the files and devices it names (components.check_setup: model.path's config.json and weight
  headers, the tokenizer, init_from's shapes, GSM8K's data, config.mesh against the devices
  here; SetupError), one line each. None when `train(config)` can start. `config` is not
  modified. Counting the devices starts JAX's backend, without preallocating accelerator memory
  (`_no_preallocation`; the CLI's --validate_only is this call): a train() later in the same
  process then allocates as it goes, unless XLA_PYTHON_CLIENT_PREALLOCATE was set before."""
  check_arg('validate', config, 'config')
  config = copy.deepcopy(config)
  config_lib.validate(config)
  from rft_jax import components  # pylint: disable=g-import-not-at-top
  with _no_preallocation():
    components.check_setup(config)


@contextlib.contextmanager
def _no_preallocation():
  """XLA_PYTHON_CLIENT_PREALLOCATE=false inside, unless it is set; restored after (a shell
  command a notebook runs next keeps JAX's default). A GPU backend started inside allocates as
  it goes: with JAX's default it would take 75% of the GPU's memory at once, which on a GPU a
  run already trains on fails or starves that run. A backend started before is left as it is."""
  if 'XLA_PYTHON_CLIENT_PREALLOCATE' in os.environ:
    yield
    return
  os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
  try:
    yield
  finally:
    os.environ.pop('XLA_PYTHON_CLIENT_PREALLOCATE', None)


# --- Running ---------------------------------------------------------------------------------

_distributed_ready = False


def run_config(config: ml_collections.ConfigDict, workdir: str, hooks=()) -> dict:
  """Runs a validated recipe in `workdir` with its trainer (SFT, DPO or RL), resuming if it can;
  returns summary.json's dict. What the CLI runs; jax.distributed is initialised from the
  environment (a no-op without JAX_COORDINATOR_ADDRESS) on the first call."""
  global _distributed_ready
  if not _distributed_ready:
    from rft_jax import components  # pylint: disable=g-import-not-at-top
    components.initialize_distributed()   # a bad variable: SetupError, as a bad mesh
    _distributed_ready = True
  # pylint: disable=g-import-not-at-top
  if config_lib.is_sft(config):
    from rft_jax import sft
    run = sft.run
  elif config_lib.is_dpo(config):
    from rft_jax import dpo_trainer
    run = dpo_trainer.run
  else:
    from rft_jax import trainer
    run = trainer.run
  import jax
  from rft_jax import workdir_lock
  os.makedirs(workdir, exist_ok=True)
  # One run at a time in a workdir (process 0 of a jax.distributed run takes the lock): a
  # second invocation raises workdir_lock.WorkdirBusy before it reads anything there.
  with workdir_lock.held(workdir, take=jax.process_index() == 0):
    return run(config, workdir, hooks_extra=tuple(hooks)) if hooks else run(config, workdir)


def train(config: ml_collections.ConfigDict, workdir: str | None = None, *,
          progress: bool = True) -> Run:
  """Trains `config` (validated again; not modified) and returns the Run.

  workdir: None (or '') = a new temporary directory, so every call trains from scratch; an
  existing run's directory (`~` expanded) resumes it, or returns it untouched when complete.
  progress: the console display (a progress bar in a terminal, or in Jupyter/Colab where
  ipywidgets is installed; plain lines otherwise); False = quiet.
  """
  check_arg('train', config, 'config')
  config = copy.deepcopy(config)
  config_lib.validate(config)
  if not progress:
    config.telemetry.console = False
  workdir = os.path.expanduser(workdir or tempfile.mkdtemp(prefix=f'rft_jax-{config.name}-'))
  problem = workdir_problem(workdir)
  if problem:   # a file, a directory that cannot be made or written (was a raw OSError)
    from rft_jax import components  # pylint: disable=g-import-not-at-top
    raise components.SetupError(f'train: workdir={workdir!r}: {problem}')
  from rft_jax import compile_cache, runs  # pylint: disable=g-import-not-at-top
  compile_cache.enable()   # as the CLI: the next train() in this kernel, or a new one, loads
  recorder = Recorder()
  try:
    summary = run_config(config, workdir, hooks=[recorder])
  except runs.Preempted as e:   # not 'the same command' when that made a new temporary workdir
    raise runs.Preempted(f'{e}; in Python: api.train(config, {workdir!r}) resumes it') from None
  records = recorder.records
  path = os.path.join(workdir, 'metrics.jsonl')
  if config.telemetry.jsonl and os.path.exists(path):
    records = _read_records(path)   # the whole run, earlier invocations (resumes) included
  return Run(config=config, workdir=workdir, summary=dict(summary), records=records)


def workdir_problem(workdir: str) -> str | None:
  """Why a run could not write to `workdir` (created if missing), or None (train, the CLI)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    return 'exists and is not a directory'
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    return f'cannot create it ({e.strerror or e})'
  if not os.access(workdir, os.W_OK | os.X_OK):
    return 'not writable'
  for name in ('checkpoints', 'tb'):   # directories the run writes into
    inside = os.path.join(workdir, name)
    if os.path.exists(inside) and not os.path.isdir(inside):
      return f'{inside} exists and is not a directory'
  return None


def open_run(workdir: str, config: ml_collections.ConfigDict | None = None) -> Run:
  """A finished or interrupted run from its workdir (metrics.jsonl, summary.json if written).

  config: the run's recipe, needed by `Run.policy`; by default the one the run's latest
  invocation recorded in workdir/config.json (values JSON cannot hold were written as strings;
  its mesh is replaced by one that fits the devices present when `policy` loads).
  FileNotFoundError without metrics.jsonl, saying what the workdir is (a run trained with
  telemetry.jsonl=False: then what it holds instead)."""
  workdir = os.path.expanduser(workdir)
  path = os.path.join(workdir, 'metrics.jsonl')
  recorded = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{workdir}: no metrics.jsonl{_no_records(workdir, recorded)}')
  from_record = config is None and os.path.isfile(recorded)
  if from_record:
    config = ml_collections.ConfigDict(_read_json(recorded, 'run the recipe again with --workdir '
                                                  'to record it, or pass config='))
  summary_path = os.path.join(workdir, 'summary.json')
  summary = {}
  if os.path.isfile(summary_path):
    summary = _read_json(summary_path, "rerun the recipe's command: a finished run rewrites it "
                                       "from its checkpoint")
  return Run(config=config, workdir=workdir, summary=summary, records=_read_records(path),
             mesh_from_record=from_record)


def _no_records(workdir: str, recorded: str) -> str:
  """What a workdir without metrics.jsonl is, for open_run's error: no run, or a run whose
  telemetry.jsonl was off (then what it does hold: summary, checkpoints, TensorBoard events)."""
  if not os.path.isfile(recorded):
    return ' (not a run directory?)'
  try:
    jsonl = jsonfile.read_object(recorded)['telemetry']['jsonl']
  except (ValueError, KeyError, TypeError):   # torn, or not a recipe's: as if it wrote one
    jsonl = True
  if jsonl:
    return (', though the run writes it (telemetry.jsonl=True): deleted, or the run stopped '
            'before its telemetry started?')
  have = []
  if os.path.isfile(os.path.join(workdir, 'summary.json')):
    have.append('summary.json (its summary)')
  if os.path.isdir(os.path.join(workdir, 'checkpoints')):
    have.append(f'checkpoints/ (api.load_policy(config, {workdir!r}) loads the latest)')
  if os.path.isdir(os.path.join(workdir, 'tb')):
    have.append('tb/ (TensorBoard events)')
  return (': the run was trained with telemetry.jsonl=False, which keeps no step records on '
          f'disk{"; it has " * bool(have)}{", ".join(have)}; open_run needs '
          "telemetry.jsonl=True (api.train's own Run holds its records in memory)")


def _finished(records: list[dict[str, Any]]) -> bool:
  """Whether the run's latest invocation finished: an 'end' record after its last 'start'."""
  last = {r.get('kind'): i for i, r in enumerate(records)}
  return last.get('end', -1) > last.get('start', -1)


def _check_series(records: list[dict[str, Any]], key: str, kind: str) -> None:
  """ValueError (one line) for a `kind` neither in RECORD_KINDS nor logged, or, in a finished
  run, a `key` that no record of `kind` in the full log has (abandoned steps count). A metric
  is known from what the run logged: an eval's 'eval/X' and step 0's 'eval/base_X' make each
  other known; with no record of `kind`, any `key` passes. A run still going (or stopped, to
  be resumed) may log a metric later (scaling/* once the live fit has enough evals), so there
  any `key` passes until the run ends."""
  kinds = set(RECORD_KINDS) | {r['kind'] for r in records if isinstance(r.get('kind'), str)}
  if kind not in kinds:
    raise ValueError(f'series: no record kind {kind!r}{config_lib.did_you_mean(kind, kinds)}; '
                     f'kinds: {", ".join(sorted(kinds))}')
  names = {name for r in records if r.get('kind') == kind for name in r} - {'step', 'kind'}
  if kind == 'eval':
    names |= ({n.replace('eval/base_', 'eval/', 1) for n in names}
              | {n.replace('eval/', 'eval/base_', 1) for n in names
                 if n.startswith('eval/') and not n.startswith('eval/base_')})
  if names and key not in names and _finished(records):
    hint = config_lib.did_you_mean(key, names) or f'; known: {", ".join(sorted(names))}'
    raise ValueError(f'series: no {kind!r} record of this run logged {key!r}{hint}')


def _read_json(path: str, remedy: str) -> dict:
  """A JSON object file of a run -> its dict; ValueError naming the file when it is not one."""
  try:
    return jsonfile.read_object(path)
  except ValueError as e:   # torn or edited
    raise ValueError(f'{e}; {remedy}') from None


def _read_records(path: str) -> list[dict[str, Any]]:
  from rft_jax.telemetry import sinks  # pylint: disable=g-import-not-at-top
  return sinks.read_jsonl(path)


@dataclasses.dataclass
class Run:
  """A run's record: every telemetry event, the summary, and (loaded on use) its policy.

  records: the full log, metrics.jsonl's records in file order ({'step', 'kind', ...}; kinds
  'start', 'train', 'eval', 'message', 'incident', 'action', 'verdict', 'end'). After a
  remediation rewind (monitor.mode='auto') it holds the abandoned steps and then the redone ones.
  `history`, `evals` and `series` are the run's final trajectory instead
  (`telemetry.records.final_trajectory`): one record per step, the last logged, in step order,
  the abandoned steps dropped. `incidents`, `actions` and `messages` are every one logged.
  """
  config: ml_collections.ConfigDict | None
  workdir: str
  summary: dict
  records: list[dict[str, Any]]
  mesh_from_record: bool = False   # config.mesh is the run's, maybe for other devices than here

  def _kind(self, *kinds: str) -> list[dict[str, Any]]:
    """The records of `kinds` in the full log, in file order."""
    return [r for r in self.records if r.get('kind') in kinds]

  def _final(self, kind: str) -> list[dict[str, Any]]:
    """The records of `kind` ('train' or 'eval') of the final trajectory, in step order."""
    return [r for r in final_trajectory(self.records) if r.get('kind') == kind]

  @property
  def history(self) -> list[dict[str, Any]]:
    """One dict per step of the final trajectory, in step order (rollout batch; with
    algo.updates_per_batch > 1 several optimiser updates, the update metrics from the last):
    'step' and its metrics ('reward/mean', ...). A step re-run after a remediation rewind is
    there once, as re-run; the full log, abandoned steps included, is `records`."""
    return self._final('train')

  @property
  def evals(self) -> list[dict[str, Any]]:
    """Held-out evaluations of the final trajectory, in step order: step 0 has 'eval/base_*'
    keys, later ones 'eval/greedy_acc' and 'eval/mean@K_acc'. An eval of a step abandoned by
    a remediation rewind is left out (it is in `records`)."""
    return self._final('eval')

  @property
  def incidents(self) -> list[dict[str, Any]]:
    """Failure-monitor incidents ('fault_class', 'severity', 'onset_step', 'evidence', ...)."""
    return self._kind('incident')

  @property
  def actions(self) -> list[dict[str, Any]]:
    """Remediation actions and the verdicts on them (monitor.mode='auto')."""
    return self._kind('action', 'verdict')

  @property
  def messages(self) -> list[str]:
    return [r['text'] for r in self._kind('message')]

  def series(self, key: str, kind: str = 'train') -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the records of `kind` that have it: for 'train' and
    'eval' those of `history` / `evals` (the final trajectory, each step once), for another
    kind every one in the full log, in file order. ValueError (one line, did-you-mean) for a
    `key` that no record of `kind` of a finished run logged (`_check_series`); a key not
    logged yet by a run still going, or a known one with no values in the final trajectory,
    gives ([], [])."""
    _check_series(self.records, key, kind)
    rows = [r for r in (self._final(kind) if kind in ('train', 'eval') else self._kind(kind))
            if key in r]
    return [r['step'] for r in rows], [r[key] for r in rows]

  @functools.cached_property
  def policy(self) -> Policy:
    """The policy of the run's latest checkpoint (the final one for a finished run)."""
    if self.config is None:
      raise ValueError(f'{self.workdir}: the run was opened without its config; '
                       'pass config= to open_run')
    config = self.config
    if self.mesh_from_record:   # trained on 8 devices, opened in a 1-device notebook: fine
      import jax  # pylint: disable=g-import-not-at-top
      from rft_jax import components  # pylint: disable=g-import-not-at-top
      from rft_jax.parallel import mesh as meshlib  # pylint: disable=g-import-not-at-top
      try:   # a -1 axis resolves on these devices to a size that may not divide the model
        meshlib.check_model_fits_mesh(components.model_config(config),
                                      meshlib.mesh_shape(config.mesh, jax.device_count()))
      except meshlib.MeshError:
        config = copy.deepcopy(config)
        config.mesh = ml_collections.ConfigDict({'data': -1, 'fsdp': 1, 'tensor': 1})
    return load_policy(config, self.workdir)

  def __repr__(self) -> str:
    name = self.config.name if self.config is not None else '?'
    return (f'Run({name!r}, workdir={self.workdir!r}, steps={len(self.history)}, '
            f'evals={len(self.evals)}, incidents={len(self.incidents)})')
