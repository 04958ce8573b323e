"""Jitted programs shared by the runs of one process (a notebook, a sweep, the tests).

jax.jit caches traces and executables on the jitted function object. A run that builds its
programs afresh (jax.jit(functools.partial(...))) traces and lowers them all again even when an
earlier run in the same process built the same ones: ~6 s of a tiny run's ~9 s on 2 cores, and
the persistent compilation cache saves only the XLA compile, not the trace. `shared` hands back
the earlier run's jitted function when the key is equal, so JAX's own caches hit:

  step_fns = programs.shared('step_fns', (graphdef, algo, programs.config_key(config.optim),
                                          programs.tree_key(shardings)),
                             lambda: make_step_fns(graphdef, algo, tx, ...))

The key must determine the program: every value the build closes over (model graphdef and
config, algorithm config, the optimizer's config section, shardings...) as an equal-comparing
value, never an object compared by identity (an optax transform, a schedule). Added here: the
abstract mesh the program is traced under, and `code_versions()`, so that a function edited,
reloaded or monkeypatched between two runs in a notebook is traced again, not reused stale.
Inputs' shapes, dtypes and shardings need not be in the key: jax.jit keys its own cache on them.
"""
import collections
import inspect
import json
import sys
import threading

import jax

MAX_PROGRAMS = 64   # the least recently used beyond this are dropped (with their executables)

_programs: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def shared(name: str, key, build):
  """build() the first time (name, key, current abstract mesh) is asked for in this process;
  the same object after that while the rft_jax code it was built with is unchanged
  (`code_versions`), least recently used dropped past MAX_PROGRAMS."""
  full_key = (name, key, jax.sharding.get_abstract_mesh())
  versions = code_versions()
  with _lock:
    entry = _programs.get(full_key)
    if entry is not None and all(versions.get(m) == v for m, v in entry[1].items()):
      _programs.move_to_end(full_key)
      return entry[0]
  program = build()
  with _lock:
    _programs[full_key] = program, versions
    _programs.move_to_end(full_key)
    while len(_programs) > MAX_PROGRAMS:
      _programs.popitem(last=False)
  return program


def clear() -> None:
  """Forget every shared program (tests that count what a run compiles start from here)."""
  with _lock:
    _programs.clear()


def config_key(section) -> str:
  """A ConfigDict section (or a plain dict) as a hashable value: its JSON, keys sorted."""
  as_dict = section.to_dict() if hasattr(section, 'to_dict') else dict(section)
  return json.dumps(as_dict, sort_keys=True, default=repr)


def tree_key(tree):
  """A pytree of hashable leaves (shardings, dataclasses) as a hashable value."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(leaves)


def code_versions() -> dict[str, int]:
  """{module name: a hash of which functions it (and its classes) holds and of their code
  objects} over the loaded rft_jax modules. A module's changes when it is reloaded, a function
  of it monkeypatched, or its code replaced in place (IPython's %autoreload); a module imported
  later leaves earlier programs valid (they could not have called it). ~1-5 ms."""
  versions = {}
  for name, module in list(sys.modules.items()):
    if module is None or not (name == 'rft_jax' or name.startswith('rft_jax.')):
      continue
    parts = []
    for attr, value in list(vars(module).items()):
      if inspect.isclass(value) and value.__module__ == name:
        parts.extend((attr, a, _code_id(v)) for a, v in list(vars(value).items()) if callable(v))
      elif callable(value):
        parts.append((attr, _code_id(value)))
    versions[name] = hash(tuple(parts))
  return versions


def _code_id(fn) -> tuple:
  """(id of the object, id of its code object, where it has one)."""
  return id(fn), id(getattr(fn, '__code__', None))
