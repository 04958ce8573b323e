"""workdir/incidents.jsonl as the trainer reads it back (rft_jax/incidents.py)."""
import json

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

