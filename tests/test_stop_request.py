"""The step loop's stop request (stop_signals.StopRequest) answers the first Ctrl-C at once."""
import signal

import pytest

from rft_jax import stop_signals


def test_the_first_ctrl_c_says_the_step_is_finished_and_a_second_stops_at_once(capfd):
  stop = stop_signals.StopRequest()
  try:
    signal.raise_signal(signal.SIGINT)
    assert stop.requested and stop.signal_name == 'SIGINT'
    err = capfd.readouterr().err
    assert err.strip().splitlines() == [
        'Ctrl-C: stopping after the current step and its checkpoint; Ctrl-C again to stop at '
        'once (the step is then lost)']
    with pytest.raises(KeyboardInterrupt):
      signal.raise_signal(signal.SIGINT)
    assert capfd.readouterr().err == ''   # said once
  finally:
    stop.restore()


def test_sigterm_is_not_answered_on_the_console(capfd):
  stop = stop_signals.StopRequest()   # a scheduler's SIGTERM: the stop line at the end suffices
  try:
    signal.raise_signal(signal.SIGTERM)
    assert stop.requested and stop.signal_name == 'SIGTERM'
    assert capfd.readouterr().err == ''
  finally:
    stop.restore()
