"""workdir/incidents.jsonl as the trainer reads it back (rft_jax/incidents.py)."""
import json
import os

import pytest

from rft_jax import incidents


def test_a_torn_incidents_jsonl_line_is_skipped_on_resume_not_a_traceback(tmp_path):
  """A kill -9 (or a full disk) in the middle of appending to incidents.jsonl leaves half a
  line; the resume read it with json.loads and stopped with a JSONDecodeError traceback, as did
  a summary rebuilt from the checkpoint (logged_count). metrics.jsonl's torn lines are skipped:
  these are too, and the entries up to the resume's step kept."""
  path = tmp_path / 'incidents.jsonl'
  whole = [{'kind': 'incident', 'step': 4, 'onset_step': 3, 'signature': 'kl_explosion'},
           {'kind': 'action', 'step': 4, 'action': 'raise_kl_coef'},
           {'kind': 'incident', 'step': 9, 'onset_step': 8, 'signature': 'reward_collapse'}]
  path.write_text(''.join(json.dumps(e) + '\n' for e in whole) + '\n{"kind": "incid')
  log = incidents.IncidentLog(str(tmp_path), resume_step=6)
  assert log.entries == whole[:2]
  assert path.read_text().splitlines() == [json.dumps(e) for e in whole[:2]]   # rewritten whole
  path.write_text(''.join(json.dumps(e) + '\n' for e in whole) + '{"kind": "incid')
  assert incidents.logged_count(None, str(tmp_path), 10) == 2



def test_the_report_words_scores_as_the_console_does(tmp_path):
  """incidents.md said 'score 100.00' where the console said 'score 100', and an entry without
  a finite score (null in the file) stopped the end-of-run report with a TypeError."""
  log = incidents.IncidentLog(str(tmp_path), resume_step=0)
  for score in (100.0, None):
    log.add({'kind': 'incident', 'step': 4, 'onset_step': 4, 'signature': 'nan_loss',
             'fault_class': 'nan_loss', 'severity': 'critical', 'remediation': 'skip_batch',
             'score': score, 'evidence': []})
  lines = log.report().splitlines()
  assert lines[1] == ('- step 4: nan_loss [critical] since step 4 (score 100; ); '
                      'suggested skip_batch')
  assert '(score None; )' in lines[2]


def test_a_stop_during_an_auto_replay_keeps_the_incident_that_restored(tmp_path):
  """auto restores a checkpoint from before the onset and replays from it; a SIGTERM during the
  replay checkpoints a step below the one that detected the incident. The resume kept the
  entries of steps up to that checkpoint's, so the incident and its action vanished from
  incidents.jsonl, incidents.md and summary.json's count, while the checkpoint's remediator
  still watched that action; metrics.jsonl lost their records too. Now what was logged before
  the checkpoint is kept."""
  import os  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from rft_jax import runs, trainer  # pylint: disable=g-import-not-at-top
  from rft_jax.telemetry.hooks import Hook  # pylint: disable=g-import-not-at-top
  from test_monitor_live import faulty_config  # pylint: disable=g-import-not-at-top

  class StopOnTheReplay(Hook):
    restored = stopped = None

    def on_rewind(self, step):
      self.restored = step

    def on_step(self, step, metrics):
      if self.restored is not None and self.stopped is None:
        self.stopped = step   # the replay's first step: SIGTERM, stop after it
        os.kill(os.getpid(), signal.SIGTERM)

  hook = StopOnTheReplay()
  with pytest.raises(runs.Preempted):
    trainer.run(faulty_config('auto'), str(tmp_path), hooks_extra=(hook,))
  log = [json.loads(line) for line in open(tmp_path / 'incidents.jsonl')]
  restoring = [e for e in log if e['kind'] == 'action' and e['restore_before'] is not None][0]
  assert hook.stopped == hook.restored + 1 < restoring['step'], (hook.stopped, restoring)
  summary = trainer.run(faulty_config('auto'), str(tmp_path))
  after = [json.loads(line) for line in open(tmp_path / 'incidents.jsonl')]
  assert after[:len(log)] == log   # the incident and its action are still there
  assert summary['incidents'] == sum(e['kind'] == 'incident' for e in after) >= 1
  assert 'remediation lower_lr' in (tmp_path / 'incidents.md').read_text()
  # metrics.jsonl (api.Run.incidents / actions) keeps them too: it dropped every record of a
  # step above the checkpoint's, though these were logged before the checkpoint was saved.
  from rft_jax import api  # pylint: disable=g-import-not-at-top
  run = api.open_run(str(tmp_path))
  assert [e for e in run.incidents if e['step'] == restoring['step']], run.incidents
  assert restoring in [{k: a.get(k) for k in restoring} for a in run.actions]
  assert [r['step'] for r in run.history] == list(range(1, 31))   # the final trajectory


def test_an_incidents_md_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path,
                                                                             monkeypatch):
  """A full disk at a run's end said 'incidents.md not written' but left it empty in place of
  the report an earlier invocation wrote."""
  import builtins  # pylint: disable=g-import-not-at-top
  import errno  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  report = tmp_path / 'incidents.md'
  report.write_text('# the earlier report\n')
  log = incidents.IncidentLog(str(tmp_path), resume_step=0)
  messages = []

  class Hooks:
    def on_message(self, text):
      messages.append(text)

  def full_disk(path, mode='r', *args, **kwargs):
    if 'incidents.md' in str(path) and 'w' in mode:
      f = builtins.open(path, mode, *args, **kwargs)
      f.close()   # created (truncated), then the write fails
      raise OSError(errno.ENOSPC, 'No space left on device')
    return builtins.open(path, mode, *args, **kwargs)

  monkeypatch.setattr(incidents, 'open', full_disk, raising=False)
  incidents.write_report(ml_collections.ConfigDict({'name': 'r'}), str(tmp_path), log, Hooks(),
                         enabled=True, stopped=True)
  assert messages == ['incidents.md not written: [Errno 28] No space left on device']
  assert report.read_text() == '# the earlier report\n'
  assert sorted(os.listdir(tmp_path)) == ['incidents.md']


def test_a_rewrite_that_fails_keeps_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
  """incidents.jsonl is rewritten whole (on resume, and after a failed append) through
  atomic_file.replacing: a write that fails (a full disk) left incidents.jsonl.tmp behind."""
  path = tmp_path / 'incidents.jsonl'
  before = json.dumps({'kind': 'incident', 'step': 4, 'onset_step': 3}) + '\n'
  path.write_text(before)

  def full_disk(*args, **kwargs):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(incidents.json, 'dumps', full_disk)
  with pytest.raises(OSError, match='No space left'):
    incidents.IncidentLog(str(tmp_path), resume_step=6)
  assert sorted(os.listdir(tmp_path)) == ['incidents.jsonl'] and path.read_text() == before
