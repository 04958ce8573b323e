"""workdir/config.json: the config of a run's latest invocation that trained, and the check
that a later invocation continues the same run (its recipe, model and algorithm)."""
import json
import os

import jax

from rft_jax import components, config_schema


RUN_CONFIG = 'config.json'
# What the workdir's checkpoints are shaped by, so a resume must keep it: the recipe, the model
# (but not its compute options, nor where its files are), the algorithm's choices (DPO's loss
# type among them) and the held-out eval (summary.json compares the base eval of step 0 with
# the final one: another eval.k has no base mean@k, another eval set no comparison). Everything
# else (train.steps, the learning rate, telemetry, the monitor) may change between invocations.
_RUN_IDENTITY = ('name', 'model.', 'algo.advantage', 'algo.loss', 'algo.critic', 'dpo.loss_type',
                 'eval.')
_TRAINING_ONLY = ('dpo.loss_type', 'eval.')   # not compared by an export or load_policy
_MAY_CHANGE = ('model.dtype', 'model.remat', 'model.scan_layers', 'model.path')


def _config_json(config) -> dict:
  """config.to_dict() as JSON holds it (values JSON cannot hold become strings)."""
  return json.loads(json.dumps(config.to_dict(), default=str))


def _flat(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def check_workdir_config(config, workdir: str,
                         advice: str = 'resume it with the config that started it, or use a new '
                         '--workdir', training: bool = True) -> None:
  """Refuses to continue a workdir that another recipe, model or algorithm wrote (then
  record_workdir_config records the config of a run that opened).

  workdir/config.json is written each time a run opens the workdir (JSON of config.to_dict();
  values JSON cannot hold are written as strings). A later invocation whose recipe name, model
  section (except dtype, remat, scan_layers, path), algo.advantage/loss, the critic it trains
  (config_schema.critic_layout: algo.critic, or 'none' for a non-critic advantage), dpo.loss_type
  or eval section differ raises (the last two only for a run that trains: training=False for
  one that reads its weights, an export or api.load_policy)
  SetupError naming the first differing key, before any checkpoint is touched: restoring would
  fail on shapes (and used to set good checkpoints aside as unusable) or silently continue one
  algorithm's run with another's. A workdir without config.json (written by an older rft_jax) is
  not checked and gets one. model.path may change (a moved directory; recorded absolute, the
  same directory reached by another relative path would read as another); the weights it holds
  are checked by initial_policy.check.
  """
  path = os.path.join(workdir, RUN_CONFIG)
  if os.path.isfile(path):
    try:
      with open(path, encoding='utf-8') as f:
        theirs = _flat(json.load(f))
    except (OSError, ValueError) as e:
      raise components.SetupError(f'{path}: unreadable ({type(e).__name__}: {e}); it records '
                                  'the config this workdir was started with') from None
    flat = _flat(_config_json(config))
    for d in (flat, theirs):   # the critic a run trains: 'none' for a non-critic advantage
      d['algo.critic'] = config_schema.critic_layout(
          {k[len('algo.'):]: v for k, v in d.items() if k.startswith('algo.')})
    for key in sorted(set(flat) | set(theirs), key=lambda k: (k != 'name', k)):   # name first
      if (not key.startswith(_RUN_IDENTITY) or key in _MAY_CHANGE
          or not training and key.startswith(_TRAINING_ONLY)):
        continue
      if flat.get(key) != theirs.get(key):
        raise components.SetupError(
            f'config.{key}={flat.get(key)!r} does not match the run in {workdir} '
            f'({theirs.get(key)!r} in its {RUN_CONFIG}): {advice}')


# Config keys that name files: recorded as absolute paths, so that api.open_run(workdir) finds
# them from any directory.
_PATH_KEYS = ('tokenizer.path', 'init_from', 'model.path', 'task.data_dir', 'task.manual_dir',
              'recipe_file')


def record_workdir_config(config, workdir: str) -> None:
  """Writes workdir/config.json (see check_workdir_config): this invocation's config, so the
  latest train.steps, mesh, ...; file paths made absolute (_PATH_KEYS)."""
  if jax.process_index() != 0:
    return
  record = _config_json(config)
  for key in _PATH_KEYS:
    section, _, name = key.rpartition('.')
    holder = record.get(section, {}) if section else record
    if isinstance(holder, dict) and isinstance(holder.get(name), str) and holder[name]:
      holder[name] = os.path.abspath(os.path.expanduser(holder[name]))
  path = os.path.join(workdir, RUN_CONFIG)
  os.makedirs(workdir, exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(record, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def is_run_workdir(path: str) -> bool:
  """Whether the existing directory `path` may be deleted to start a run there afresh (what
  tools.algo_table and tools.faultbench do to their own sub-directories): it holds no file at
  all (a run stopped before it wrote one), or the config.json every run records when it opens
  (a JSON object with the recipe's 'name' and a 'train' section). Anything else (a HF model's
  config.json, notes, another tool's output) is not a run's."""
  if not any(files for _, _, files in os.walk(path)):
    return True
  try:
    with open(os.path.join(path, RUN_CONFIG), encoding='utf-8') as f:
      record = json.load(f)
  except (OSError, ValueError):
    return False
  return (isinstance(record, dict) and isinstance(record.get('name'), str)
          and isinstance(record.get('train'), dict))


def check_replaceable(path: str) -> str | None:
  """None when `path` is absent or is_run_workdir, else why a tool must not delete it (one
  clause naming it)."""
  if not os.path.lexists(path):
    return None
  if not os.path.isdir(path) or os.path.islink(path):
    return f'{path} exists and is not a directory'
  if not is_run_workdir(path):
    return (f'{path} exists and is not a run directory (no {RUN_CONFIG} of an rft_jax run); '
            'refusing to delete it')
  return None
