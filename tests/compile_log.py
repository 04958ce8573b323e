"""Counting a run's compiles from JAX's compile log (jax_log_compiles)."""
import jax

from rft_jax import programs


def assert_compiled_once(run, caplog, names=('train_step', 'prepare_batch', 'observe')):
  """Calls run() with JAX's compile log on and asserts each jitted function in names compiled
  exactly once ('Compiling jit(<name>)' lines): later steps reused the executable. Programs an
  earlier run in this process built (rft_jax/programs.py) are forgotten first."""
  programs.clear()
  jax.config.update('jax_log_compiles', True)
  try:
    with caplog.at_level('WARNING'):
      run()
  finally:
    jax.config.update('jax_log_compiles', False)
  compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Compiling')]
  for name in names:
    n = sum(m.startswith(f'Compiling jit({name})') for m in compiles)
    assert n == 1, (name, n, compiles)


BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


def programs_compiled(fn, *args, **kwargs) -> list[str]:
  """Names of the XLA programs fn(*args, **kwargs) builds or loads from the persistent cache
  (jax.monitoring's backend-compile events), after jax.clear_caches(): eager ops compiled
  earlier in this process count again."""
  names = []

  def listen(event, duration_secs, fun_name='?', **_):
    del duration_secs
    if event == BACKEND_COMPILE:
      names.append(fun_name)

  jax.clear_caches()
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    fn(*args, **kwargs)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  return names
