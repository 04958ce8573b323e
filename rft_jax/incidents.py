"""Host side of the failure monitor in an RL run: newly fired incidents are logged
(workdir/incidents.jsonl, the hooks) and handed to the remediation policy
(rft_jax/monitor/remediation.py), whose decision rft_jax/trainer.py executes (its restores:
rewind). The streak of steps with skipped updates is counted here (SkippedStreak) and reported
as an incident like those the device finds (signatures.SKIPPED_STREAK)."""
import json
import os

import jax
import numpy as np

from rft_jax import atomic_file
from rft_jax import rewind as rewind_lib
from rft_jax.monitor import monitor as monlib
from rft_jax.monitor.remediation import Remediator
from rft_jax.monitor.signatures import SIGNATURES, SKIPPED_STREAK
from rft_jax.telemetry import jsonl, sinks


ENTRIES_KEY = 'incident_entries'   # checkpoint meta: how many entries were logged before it


def read_entries(path: str, last_step: int, logged: int | None = None) -> list[dict]:
  """The entries of incidents.jsonl at `path` that a resume from the checkpoint of `last_step`
  keeps, in file order: the first `logged` (meta[ENTRIES_KEY]: those logged before that
  checkpoint was saved; after an `auto` restore they include entries of higher steps, e.g. the
  incident that restored, which a filter on the step dropped when a stop came during the
  replay), else (an older checkpoint) those of steps up to `last_step`. A blank or torn line (a
  write cut by kill -9 or a full disk) is skipped, as in metrics.jsonl (jsonl.read_jsonl)."""
  entries = [e for e in jsonl.read_jsonl(path) if isinstance(e.get('step'), int)]
  return entries[:logged] if logged is not None else [e for e in entries if e['step'] <= last_step]


class IncidentLog:
  """workdir/incidents.jsonl (every incident and action) and the end-of-run report."""

  def __init__(self, workdir: str, resume_step: int, logged: int | None = None):
    self.path = os.path.join(workdir, 'incidents.jsonl')
    self.primary = jax.process_index() == 0   # only process 0 writes; all keep the entries
    self.entries = []
    self._error: OSError | None = None   # a failed write: the file is rewritten when one works
    if os.path.exists(self.path):
      self.entries = read_entries(self.path, resume_step, logged)
      self._rewrite()

  def add(self, entry: dict) -> None:
    """Appends `entry`. A write error (a full disk) does not stop the run, as with the metrics
    log: one line on stderr, the entries are kept in memory, and the whole file is written
    again at the next entry that can be (or at the end of the run: `retry`)."""
    self.entries.append(entry)
    if not self.primary:
      return
    if self._error is not None:
      self.retry()
      return
    try:
      with open(self.path, 'a') as f:
        f.write(json.dumps(entry) + '\n')
    except OSError as e:
      jsonl.warn(f'{self.path}: {e.strerror} (errno {e.errno}): incidents are kept in memory '
                 'and written once a write succeeds again; the run goes on')
      self._error = e

  def retry(self, last: bool = False) -> None:
    """After a failed write, writes the whole file again; at the end of the run (`last`) says
    so if it still cannot."""
    if self._error is None or not self.primary:
      return
    try:
      self._rewrite()
    except OSError as e:
      if last:
        jsonl.warn(f'{self.path}: {len(self.entries)} entries not all written: {e.strerror}')
      return
    jsonl.warn(f'{self.path}: written again after "{self._error.strerror}"')
    self._error = None

  def _rewrite(self) -> None:
    if not self.primary:
      return
    with atomic_file.replacing(self.path) as tmp, open(tmp, 'w') as f:
      f.writelines(json.dumps(e) + '\n' for e in self.entries)

  def count(self, ran: bool) -> int | None:
    """summary.json's 'incidents': how many were raised, or None when nothing watched the run
    (monitor.mode 'off' or no monitor, no live scaling fit): 0 would read as a healthy run."""
    return sum(e['kind'] == 'incident' for e in self.entries) if ran else None

  def report(self) -> str:
    """Human-readable summary of incidents and actions (also written to incidents.md)."""
    incidents = [e for e in self.entries if e['kind'] == 'incident']
    lines = [f'{len(incidents)} incident(s)']
    for e in self.entries:
      if e['kind'] == 'incident':
        ev = ', '.join(map(sinks.evidence_text, e.get('evidence', [])[:3]))
        lines.append(f"- step {e['step']}: {sinks.incident_name(e)} [{e['severity']}] since step "
                     f"{e['onset_step']} (score {sinks.format_value(e['score'])}; {ev}); "
                     f"suggested {e['remediation']}")
      else:
        lines.append('  - ' + sinks.describe_incident(e['step'], e))
    return '\n'.join(lines)


def watched(config) -> bool:
  """Whether anything watched an RL run of config for incidents (IncidentLog.count's `ran`, for
  the trainer and a summary rebuilt from the checkpoint): the failure monitor (a monitor
  section, mode not 'off') or the live scaling fit (scaling.live_every > 0)."""
  monitor, scaling = config.get('monitor'), config.get('scaling')
  return ((monitor is not None and monitor.get('mode', 'off') != 'off')
          or (scaling is not None and int(scaling.get('live_every', 0)) > 0))


def logged_count(config, workdir: str, last_step: int) -> int | None:
  """summary.json's 'incidents' of a finished run, from workdir/incidents.jsonl (its entries up
  to last_step, as IncidentLog reads it) for a summary rebuilt from the checkpoint: the count
  when the file has incidents or the run was watched (the file exists only once there is one:
  0), None when nothing watched it."""
  path = os.path.join(workdir, 'incidents.jsonl')
  entries = read_entries(path, last_step) if os.path.exists(path) else []
  count = sum(e['kind'] == 'incident' for e in entries)
  return count if count or watched(config) else None


def write_report(config, workdir: str, incident_log: IncidentLog, hooks, enabled: bool,
                 stopped: bool = False) -> None:
  """workdir/incidents.md (process 0) and the console's report of the run's incidents, when
  anything watched the run (`enabled`: the monitor or the live scaling fit): at its end, or
  when an error or a stop request ends it (`stopped`: a write error is then a message, never
  raised in place of what stopped the run, e.g. on a full disk)."""
  if not enabled:
    return
  try:
    report = incident_log.report()
    incident_log.retry(last=True)
    if incident_log.primary:
      path = os.path.join(workdir, 'incidents.md')
      # a failed write (a full disk) keeps the earlier report
      with atomic_file.replacing(path) as tmp, open(tmp, 'w') as f:
        f.write(f'# Failure monitor report: {config.name}\n\n{report}\n')
  except OSError as e:
    if not stopped:
      raise
    hooks.on_message(f'incidents.md not written: {e}')
    return
  hooks.on_message('failure monitor: ' + report.replace('\n', '\n  '))


def halt_checkpoints(steps: list[int], onset: int | None, workdir: str | None = None) -> str:
  """Which checkpoints a halt leaves, told apart by the fault's onset: those at or after it may
  already carry the fault. With `workdir`, and such checkpoints after one from before the
  onset: the command that sets them aside (rft_jax/rewind.py), for a resume from that one."""
  before = [s for s in steps if onset is None or s < onset]
  after = [s for s in steps if onset is not None and s >= onset]
  text = (f'last checkpoint before the onset (step {onset}): step {before[-1]}' if before
          else f'no checkpoint before the onset (step {onset})')
  if after:
    text += f'; checkpoint(s) {", ".join(map(str, after))} from after it may carry the fault'
    if before and workdir is not None:
      text += (f'; to resume from step {before[-1]} instead (e.g. with a lower '
               f'--config.optim.lr), first: {rewind_lib.command(workdir, before[-1])}')
  return text


def handle_alarms(alarms, step, remediator: Remediator, hooks, incident_log: IncidentLog,
                  health: float | None = None):
  """Reports newly fired incidents, asks the remediator what to do, judges past actions.

  Returns the Decision to execute (at most one per step), or None: of several, a halt before
  a restore before the rest (a no-op such as skip_batch must not hide the restore that
  non-finite parameters need), else the first.
  """
  decision = None
  for incident in monlib.incidents_from_alarms(alarms, step):
    _report(step, {'kind': 'incident', **incident}, hooks, incident_log)
    decision = _weightier(decision, remediator.on_incident(incident, step))
  active = np.asarray(alarms.active)
  scores = {s.name: float(alarms.score[k]) if active[k] else 0.0
            for k, s in enumerate(SIGNATURES)}
  decision = _weightier(decision, remediator.on_step(step, scores, health))
  for entry in remediator.drain_log():
    _report(step, entry, hooks, incident_log)
  return decision


def _report(step: int, entry: dict, hooks, incident_log: IncidentLog) -> None:
  incident_log.add(entry)
  hooks.on_incident(step, entry)


class SkippedStreak:
  """Steps in a row, up to the current one on this trajectory, with a non-finite loss or
  gradient (runs.check_finite's `bad`; the update of such a gradient is skipped on the device),
  and how many of their `updates` optimiser updates each were skipped ('update_skipped': the
  fraction of the step's updates; step_fns.train_epochs). Saved in each checkpoint's meta, so a
  resume or a remediation rewind carries on the count of the checkpoint it continues from (not
  of the abandoned steps, nor from 0)."""

  def __init__(self, meta: dict, updates: int):
    self.updates = updates
    self.load(meta)

  def load(self, meta: dict) -> None:
    self.steps = int(meta.get('skipped_streak', 0))
    skipped = meta.get('skipped_updates', 0 if not self.steps else None)
    self.skipped = None if skipped is None else int(skipped)   # None: not counted (older meta)

  def save(self, meta: dict) -> None:
    meta['skipped_streak'], meta['skipped_updates'] = self.steps, self.skipped

  def observe(self, bad: str, update_skipped: float) -> int:
    """Counts this step in (bad) or ends the streak -> its length."""
    if not bad:
      self.steps, self.skipped = 0, 0
    else:
      self.steps += 1
      if self.skipped is not None:
        self.skipped += int(round(update_skipped * self.updates))
    return self.steps


def streak_incident(step: int, streak: int, limit: int) -> dict:
  """The incident of `streak` >= `limit` (monitor.max_skipped_steps) steps in a row, up to
  `step`, with skipped updates, shaped as monlib.incidents_from_alarms' are: its onset is the
  streak's first step, its score the streak over the limit."""
  s, score = SKIPPED_STREAK, streak / limit
  return monlib.incident(s, step, step - streak + 1, score,
                         [{'signal': s.conditions[0].signal, 'direction': 'up', 'score': score,
                           'value': float(streak), 'limit': float(limit)}])


def handle_streak(streak: int, limit: int, step: int, remediator: Remediator, hooks,
                  incident_log: IncidentLog):
  """Reports a streak of skipped steps that reached its limit as an incident and asks the
  remediator about it -> its Decision: in mode auto a restore from before the streak with a
  lower learning rate, when the remediator's rules allow one; else None (or a halt)."""
  incident = streak_incident(step, streak, limit)
  _report(step, {'kind': 'incident', **incident}, hooks, incident_log)
  decision = remediator.on_incident(incident, step)
  for entry in remediator.drain_log():
    _report(step, entry, hooks, incident_log)
  return decision


def rewind(ckpt, before: int, state, shardings, like_reference, reference_shardings, data_it,
           meta: dict, hooks, remediator: Remediator, step: int):
  """Executes a remediation restore: the latest checkpoint with a step below `before` (train
  state, data-iterator position, meta['last_eval']); the checkpoints after it (the faulty
  trajectory's) are deleted and the hooks told -> (its step, state, its reference: None unless
  remediation had reset it, its meta). None when no checkpoint precedes `before`: a message
  says so, and the remediator does not count the restore (it did not happen) and watches the
  action from `step`, where the run goes on."""
  steps = ckpt.all_steps()
  good = [s for s in steps if s < before]
  if not good:
    hooks.on_message(missed_restore_message(before, steps))
    remediator.restore_missed(step)
    return None
  state, data_state, restored_meta, reference = ckpt.restore(
      max(good), state, shardings, like_reference=like_reference,
      reference_shardings=reference_shardings)
  data_it.set_state(data_state)
  ckpt.delete_after(max(good))
  meta['last_eval'] = restored_meta.get('last_eval')
  hooks.on_rewind(max(good))   # TensorBoard hides the abandoned steps
  hooks.on_message(f'remediation: restored the checkpoint of step {max(good)} '
                   f'(before onset at step {before})')
  return max(good), state, reference, restored_meta


def missed_restore_message(onset: int, steps: list[int]) -> str:
  """The line of a restore that found no checkpoint before the onset: the onset, the latest
  checkpoint there was (at or after the onset), and the keys that would have kept one."""
  latest = f'the latest is step {max(steps)}' if steps else 'none saved yet'
  return (f'remediation: no checkpoint before the onset (step {onset}) to restore ({latest}); '
          'a smaller train.ckpt_every or a larger train.keep_checkpoints keeps one')


def reset_undoable(remediator: Remediator) -> bool:
  """Whether a reference reset is being watched, so that its undo may still come."""
  return any(w.action == 'reset_reference' for w in remediator.watches)


def undo_reference(meta: dict, remediator: Remediator, ref_before_reset):
  """Records in a checkpoint's meta what an undo of the watched reference reset puts back, and
  returns the params the checkpoint must save for it (its reference_before_reset item) or None.

  ref_before_reset: (reference params, reset reference or None) from before the reset, as the
  trainer holds it. meta['reference_before_reset']: 'initial' when that reference was the
  initial policy (rebuilt at start-up: nothing saved), 'saved' when remediation had reset it
  before (its params saved); absent when no reset is undoable (nothing saved either)."""
  meta.pop('reference_before_reset', None)
  if ref_before_reset is None or not reset_undoable(remediator):
    return None
  saved = ref_before_reset[1]
  meta['reference_before_reset'] = 'initial' if saved is None else 'saved'
  return saved


def resumed_undo_reference(ckpt, step: int, meta: dict, remediator: Remediator, initial,
                           shardings, hooks):
  """What an undo of the watched reference reset puts back in a run resumed from checkpoint
  `step` (meta: its meta, remediator: loaded from it) -> (reference params, reset reference or
  None), as undo_reference recorded it; None when no reset is undoable. A checkpoint written
  before rft_jax saved it (no meta key) gives the initial policy, said in one line."""
  if not reset_undoable(remediator):
    return None
  kind = meta.get('reference_before_reset')
  if kind == 'saved':
    params = ckpt.restore_reference_before_reset(step, initial, shardings)
    return params, params
  if kind is None:
    hooks.on_message(f'checkpoint {step} does not hold the reference from before the watched '
                     'reference reset (older rft_jax): its undo goes back to the initial policy')
  return initial, None


def _weightier(a, b):
  """Of two decisions (None = none), the one the trainer must execute: halt > restore > other;
  the earlier one on a tie."""
  rank = lambda d: -1 if d is None else 2 * d.halt + (d.restore_before is not None)
  return b if rank(b) > rank(a) else a
