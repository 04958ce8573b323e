"""Stopping a run on request: SIGTERM / SIGINT during the step loop (finish the step, then
checkpoint: StopRequest), before it (stop at once: preempt_at_once) and in the command's start,
its imports and config checks (exit at once: exit_at_once).

Imports nothing heavy (JAX only in StopRequest.agreed): rft_jax/main.py imports this module
first thing, to install exit_at_once before its other imports (~1.5 s with JAX's).
"""
import os
import signal
import sys
import threading

PREEMPTED = 75   # EX_TEMPFAIL: stopped by SIGTERM/SIGINT; rerun the same command to resume
INTERRUPTED = 130   # 128 + SIGINT: Ctrl-C that stopped at once


class SetupInterrupted(BaseException):
  """SIGTERM before a run's step loop. A BaseException, as KeyboardInterrupt: no `except
  Exception` on its way (a checkpoint restore sets aside a checkpoint it cannot read) may take
  it for a problem of the data it was reading."""


# The signal preempt_at_once was called for, until the command line's run ends: Python drops
# an exception raised where it cannot propagate (a gc callback, such as jax's, a __del__; it
# printed 'Exception ignored in ...'), and set-up then went on to train the whole run.
PENDING: list[str] = []


def preempt_at_once(signum, frame):
  """SIGTERM handler for the set-up before a run's step loop (model load, restore, compiles, the
  base eval), where there is no step to finish: stop now, with nothing to save (exit 75). Should
  the exception be dropped, StopRequest raises it again before the first step."""
  del frame
  PENDING[:] = [signal.Signals(signum).name]
  raise _setup_interrupted(PENDING[0])


def exit_at_once(signum, frame):
  """SIGTERM / SIGINT handler for the command's start (install_start_handlers), before the run
  exists: nothing to save or close, so it prints the stop line on stderr and ends the process at
  once, exit 75 on SIGTERM (as preempt_at_once), 130 on SIGINT (as a Ctrl-C in set-up). os._exit:
  an exception raised here could land in an import or a gc callback and be lost or printed as a
  traceback."""
  del frame
  try:   # what was printed so far (a signal in the middle of a print: RuntimeError)
    sys.stdout.flush()
  except (OSError, RuntimeError, ValueError):
    pass
  line = f'stopped: {_setup_interrupted(signal.Signals(signum).name)}\n'
  os.write(2, line.encode())
  status = PREEMPTED if signum == signal.SIGTERM else INTERRUPTED
  os._exit(status)   # pylint: disable=protected-access


def install_start_handlers() -> None:
  """exit_at_once for SIGTERM, and for SIGINT unless Python's default is not in place (a job
  started in the background has SIGINT ignored: it stays so). set_up_handlers takes over before
  the run's set-up."""
  signal.signal(signal.SIGTERM, exit_at_once)
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, exit_at_once)


def set_up_handlers() -> dict:
  """Handlers for a run's set-up (main thread only): SIGTERM -> preempt_at_once, SIGINT ->
  Python's KeyboardInterrupt where exit_at_once had it. -> {signal: the handler before}."""
  previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
  signal.signal(signal.SIGTERM, preempt_at_once)
  if previous[signal.SIGINT] is exit_at_once:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  return previous


def _setup_interrupted(name: str) -> SetupInterrupted:
  return SetupInterrupted(f'{name} outside the step loop (set-up or wrap-up): nothing new to '
                          'save; run the same command again to resume')


def quiet_unraisable(hook):
  """sys.unraisablehook that leaves out the SetupInterrupted Python drops (StopRequest raises
  it again) and hands anything else to `hook`."""
  def quiet(unraisable):
    if not isinstance(unraisable.exc_value, SetupInterrupted):
      hook(unraisable)
  return quiet


# Said on stderr at the first Ctrl-C in the step loop, which otherwise showed nothing until the
# step ended (and a second Ctrl-C, pressed for want of an answer, gave up the step's checkpoint).
FIRST_CTRL_C = ('\nCtrl-C: stopping after the current step and its checkpoint; '
                'Ctrl-C again to stop at once (the step is then lost)\n')


class StopRequest:
  """Turns SIGTERM and SIGINT into a flag the loop checks between steps (main thread only).

  The first signal asks for a clean stop after the current step; a second SIGINT interrupts at
  once (KeyboardInterrupt), for a user who really means it.
  """

  def __init__(self):
    if PENDING:   # a set-up SIGTERM whose exception was dropped: no step may start
      raise _setup_interrupted(PENDING[0])
    self.requested = False
    self.signal_name = ''
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    if signum == signal.SIGINT and not self.requested:   # a step can take minutes: say so
      os.write(2, FIRST_CTRL_C.encode())   # os.write: a print here could be inside a print
    self.requested = True
    self.signal_name = signal.Signals(signum).name

  def agreed(self) -> bool:
    """Whether any process was asked to stop. Every process calls this at the same point of
    each step (a collective when there are several), so all of them stop after the same step."""
    import jax  # pylint: disable=g-import-not-at-top  (none at this module's import: see above)
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if jax.process_count() == 1:
      return self.requested
    flags = multihost_utils.process_allgather(np.int32(self.requested))
    if np.max(flags) and not self.requested:
      self.requested, self.signal_name = True, 'stop on another process'
    return bool(np.max(flags))

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
