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
value, never an object compared by identity (an optax transform, a schedule). The abstract mesh
the program is traced under is added to the key here. Inputs' shapes, dtypes and shardings
need not be: jax.jit keys its own cache on them.
"""
import collections
import json
import threading

import jax

MAX_PROGRAMS = 64   # the least recently used beyond this are dropped (with their executables)

_programs: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def shared(name: str, key, build):
  """build() the first time (name, key, current abstract mesh) is asked for in this process;
  the same object after that (least recently used dropped past MAX_PROGRAMS)."""
  full_key = (name, key, jax.sharding.get_abstract_mesh())
  with _lock:
    if full_key in _programs:
      _programs.move_to_end(full_key)
      return _programs[full_key]
  program = build()
  with _lock:
    program = _programs.setdefault(full_key, program)
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
