"""A HF checkpoint (model.path) through tools.checkpoint (inspect, export, convert) and
api.load_policy / validate, with the mistakes a user makes: --out naming the source checkpoint
(its weights were overwritten by the trained ones, then a SameFileError traceback), the run
directory or another directory (written into); the run's --config.model.path left out
(`tokenizer file not found: ` with an empty name); a run trained with another tokenizer.path
(its files were not exported); a shard missing, cut short or not holding what the index says
(tracebacks); `inspect RUN`; a hub cache entry as model.path; a tokenizer larger than the
checkpoint; api.load_policy(config, workdir) of a run of another model (its params mixed in)."""
import hashlib
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from rft_jax import api, checkpoint, components, runs
from rft_jax.algorithms import train_state as ts
from rft_jax.models import hf_checkpoint as hc
from rft_jax.tokenizer import load_tokenizer
from rft_jax.workdir_config import record_workdir_config
from tools import checkpoint as tool
import tokenizer_fixtures as fx

FIELDS = dict(vocab_size=448, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=500000.0,
              tie_word_embeddings=False, max_position_embeddings=512)
OVERRIDES = [f'--config.model.{k}={v}' for k, v in FIELDS.items()] + [
    '--config.init_from=', '--config.tokenizer.path=']


@pytest.fixture(scope='module')
def llama_run(tmp_path_factory):
  """(HF llama dir saved sharded, a run dir with a checkpoint at step 1 started from it)."""
  transformers = pytest.importorskip('transformers')
  root = tmp_path_factory.mktemp('export')
  model_dir = str(root / 'llama')
  config = transformers.LlamaConfig(**{k: v for k, v in FIELDS.items() if k != 'head_dim'})
  transformers.LlamaForCausalLM(config).save_pretrained(model_dir, max_shard_size='50KB')
  fx.write_llama3_tokenizer(model_dir)
  config = api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in FIELDS.items()}, 'model.path': model_dir,
      'init_from': '', 'tokenizer.path': ''})
  workdir = str(root / 'run')
  c = components.build(config, data=False)
  tx = ts.make_optimizer(config.optim)
  state = runs.init_state(c.params, tx, runs.state_shardings(c, tx))
  with checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
    ckpt.save(1, state, {'step': 1}, {})
  record_workdir_config(config, workdir)
  return model_dir, workdir


def _digest(directory) -> dict:
  """{file name: sha256} of the files at the top of `directory`."""
  out = {}
  for name in sorted(os.listdir(directory)):
    if os.path.isfile(os.path.join(directory, name)):
      with open(os.path.join(directory, name), 'rb') as f:
        out[name] = hashlib.sha256(f.read()).hexdigest()
  return out


def _export(workdir, out, *overrides):
  tool.main(['export', '--config', 'configs/grpo_arith.py:tiny', '--workdir', workdir,
             '--out', str(out), *overrides])


def _refused(capsys, call, pattern):
  with pytest.raises(SystemExit) as info:
    call()
  err = capsys.readouterr().err
  assert info.value.code == 2 and err.count('\n') == 1 and re.match(pattern, err), err


def test_convert_of_a_run_directory_points_to_export(llama_run, tmp_path, capsys):
  """A run's config.json is not a HF model's: convert said 'model_type=None: supported: ...'."""
  _, workdir = llama_run
  _refused(capsys, lambda: tool.main(['convert', workdir, '--out', str(tmp_path / 'o')]),
           rf'error: {re.escape(workdir)} is a run directory, not a Hugging Face model: .* '
           rf'python -m tools.checkpoint export --config RECIPE --workdir {re.escape(workdir)} ')
  assert not os.path.exists(tmp_path / 'o')


def test_export_never_writes_into_the_source_checkpoint(llama_run, tmp_path, capsys):
  model_dir, workdir = llama_run
  before = _digest(model_dir)
  _refused(capsys, lambda: _export(workdir, model_dir, f'--config.model.path={model_dir}',
                                   *OVERRIDES),
           r'error: --out .*llama is config.model.path, a directory the run reads')
  link = tmp_path / 'link'   # the same directory by another name
  link.symlink_to(model_dir)
  _refused(capsys, lambda: _export(workdir, link, f'--config.model.path={model_dir}',
                                   *OVERRIDES), r'error: --out .*link is config.model.path')
  assert _digest(model_dir) == before
  instruct = str(tmp_path / 'instruct')   # the tokenizer.path of a run: another checkpoint
  shutil.copytree(model_dir, instruct)
  _refused(capsys, lambda: _export(workdir, instruct, f'--config.model.path={model_dir}',
                                   *OVERRIDES, f'--config.tokenizer.path={instruct}'),
           r'error: --out .*instruct is config.tokenizer.path')
  assert _digest(instruct) == before


def test_export_writes_only_into_a_new_empty_or_hf_directory(llama_run, tmp_path, capsys):
  model_dir, workdir = llama_run
  run_files = _digest(workdir)
  args = (f'--config.model.path={model_dir}', *OVERRIDES)
  _refused(capsys, lambda: _export(workdir, workdir, *args),
           r'error: --out .*run exists and is not a HF model directory')
  assert _digest(workdir) == run_files   # the run's own config.json was replaced
  notes = tmp_path / 'notes'
  notes.mkdir()
  (notes / 'todo.txt').write_text('keep me')
  _refused(capsys, lambda: _export(workdir, notes, *args),
           r'error: --out .*notes exists and is not a HF model directory')
  assert os.listdir(notes) == ['todo.txt']
  _export(workdir, tmp_path / 'hf', *args)
  _export(workdir, tmp_path / 'hf', *args)   # an earlier export: written again
  (tmp_path / 'empty').mkdir()
  _export(workdir, tmp_path / 'empty', *args)
  assert _digest(tmp_path / 'empty') == _digest(tmp_path / 'hf')
  died = tmp_path / 'died'   # an export killed while writing its shards: no config.json yet
  died.mkdir()
  (died / '.shard0.tmp').write_bytes(b'partial')
  _export(workdir, died, *args)
  assert _digest(died) == _digest(tmp_path / 'hf')


def test_export_names_the_model_path_the_run_was_started_with(llama_run, tmp_path, capsys):
  model_dir, workdir = llama_run
  _refused(capsys, lambda: _export(workdir, tmp_path / 'out', *OVERRIDES),
           rf"error: config.model.path='': the run in {re.escape(workdir)} was started with "
           rf'--config.model.path={re.escape(model_dir)} ')
  assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('damage', ['missing', 'truncated'])
def test_convert_names_a_missing_or_damaged_shard(llama_run, tmp_path, capsys, damage):
  model_dir = str(tmp_path / 'llama')
  shutil.copytree(llama_run[0], model_dir)
  shard = sorted(f for f in os.listdir(model_dir) if f.startswith('model-'))[1]
  if damage == 'missing':
    os.remove(os.path.join(model_dir, shard))
  else:
    os.truncate(os.path.join(model_dir, shard), 100)
  _refused(capsys, lambda: tool.main(['convert', model_dir, '--out', str(tmp_path / 'o')]),
           rf'error: {re.escape(os.path.join(model_dir, shard))}: cannot read its tensors')
  assert not (tmp_path / 'o').exists()


def test_inspect_a_run_directory_names_its_checkpoints(llama_run, capsys):
  """`inspect RUN` read the run's config.json as a HF config ('loadable by rft_jax: no
  (...model_type=None...)', then 'no model.safetensors'); RUN/checkpoints was 'neither a HF
  model dir nor ...'. Both now name the step directories to inspect."""
  workdir = llama_run[1]
  steps = os.path.join(workdir, 'checkpoints')
  for path, what in ((workdir, 'a run directory'),
                     (steps, 'the checkpoints directory of a run')):
    _refused(capsys, lambda p=path: tool.main(['inspect', p]),
             rf'error: {re.escape(path)} is {what}; inspect one of its checkpoints, '
             rf'{re.escape(os.path.join(steps, "STEP"))} \(steps there: 1\)$')
  tool.main(['inspect', os.path.join(steps, '1')])
  assert 'orbax pytree: ' in capsys.readouterr().out


def test_load_policy_refuses_a_run_of_another_model(llama_run, tmp_path):
  """A Qwen2-shaped config (q/k/v biases) given the Llama run: load_policy returned a Policy
  of the run's tensors where the names matched and ShapeDtypeStructs for the biases."""
  _, workdir = llama_run
  qwen_like = api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in FIELDS.items()}, 'model.attention_bias': True,
      'init_from': ''})   # random init, no model.path
  with pytest.raises(components.SetupError, match=r'^config.model.attention_bias=True does not '
                     r'match the run in .*: pass the config the run was started with'):
    api.load_policy(qwen_like, workdir)
  unrecorded = str(tmp_path / 'run')   # no config.json (an older run): the params are checked
  shutil.copytree(workdir, unrecorded)
  os.remove(os.path.join(unrecorded, 'config.json'))
  with pytest.raises(components.SetupError, match=r'/checkpoints/1/state: its params arrays '
                     r'have other shapes than this config builds'):
    api.load_policy(qwen_like, unrecorded)
  config = api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in FIELDS.items()}, 'model.path': llama_run[0],
      'init_from': '', 'tokenizer.path': ''})
  assert api.load_policy(config, unrecorded).step == 1   # its own model: loads


def test_export_carries_the_tokenizer_the_run_used(llama_run, tmp_path):
  """A base checkpoint trained with its family's instruct tokenizer (tokenizer.path, another EOS
  and chat template, the same vocabulary: README) was exported with model.path's tokenizer and
  generation files: served, it neither stopped at the EOS it was trained to emit nor had its
  chat template."""
  model_dir, workdir = llama_run
  instruct = fx.write_llama3_tokenizer(str(tmp_path / 'instruct'))
  with open(os.path.join(instruct, 'tokenizer_config.json')) as f:
    tokenizer_config = json.load(f)
  tokenizer_config['chat_template'] += '{#- the instruct template #}'
  with open(os.path.join(instruct, 'tokenizer_config.json'), 'w') as f:
    json.dump(tokenizer_config, f)
  eot = load_tokenizer(instruct).encode('<|eot_id|>')
  with open(os.path.join(instruct, 'generation_config.json'), 'w') as f:
    json.dump({'eos_token_id': eot}, f)   # <|eot_id|> alone (model.path's: two ids)
  out = tmp_path / 'out'
  _export(workdir, out, f'--config.model.path={model_dir}', *OVERRIDES,
          f'--config.tokenizer.path={instruct}')
  for name in ('tokenizer_config.json', 'generation_config.json', 'tokenizer.json'):
    assert _digest(out)[name] == _digest(instruct)[name], name
  assert _digest(model_dir)['generation_config.json'] != _digest(instruct)[
      'generation_config.json']



def test_a_shard_without_the_tensor_its_index_places_there_is_one_line(llama_run, tmp_path,
                                                                      capsys):
  """Shards of two downloads mixed: the index places a tensor in a shard that does not hold it.
  inspect, convert and --validate_only (check_readable) ended in a SafetensorError traceback
  ('File does not contain tensor ...'); now one line naming the shard and the tensor."""
  model_dir = str(tmp_path / 'llama')
  shutil.copytree(llama_run[0], model_dir)
  index = os.path.join(model_dir, 'model.safetensors.index.json')
  with open(index) as f:
    weight_map = json.load(f)
  placed = weight_map['weight_map']
  wrong = next(f for f in sorted(set(placed.values())) if f != placed['model.norm.weight'])
  placed['model.norm.weight'] = wrong
  with open(index, 'w') as f:
    json.dump(weight_map, f)
  message = (f'{os.path.join(model_dir, wrong)}: holds no tensor model.norm.weight (1 absent), '
             'which model.safetensors.index.json places there')
  with pytest.raises(SystemExit, match=f'^error: {re.escape(message)}'):
    tool.main(['inspect', model_dir])   # exit 1: the verdict, not bad input
  _refused(capsys, lambda: tool.main(['convert', model_dir, '--out', str(tmp_path / 'o')]),
           f'error: {re.escape(message)}')
  config = api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in FIELDS.items()}, 'model.path': model_dir,
      'init_from': '', 'tokenizer.path': ''})
  with pytest.raises(components.SetupError, match=f'^config.model.path: {re.escape(message)}'):
    api.validate(config)


def test_a_hub_cache_entry_names_its_snapshot(llama_run, tmp_path, capsys):
  """`huggingface-cli download` without --local-dir: model.path given as the cache entry
  (models--ORG--NAME, no config.json of its own) was 'not a HF model directory' with no word of
  the snapshot directory that holds the model."""
  entry = tmp_path / 'models--meta-llama--tiny'
  snapshot = entry / 'snapshots' / 'abc123'
  shutil.copytree(llama_run[0], snapshot)
  (entry / 'refs').mkdir()
  (entry / 'refs' / 'main').write_text('abc123')
  hint = f'; it is a Hugging Face hub cache entry: use {snapshot}'
  with pytest.raises(api.ConfigError, match=re.escape(hint)):
    api.load_config('grpo_arith:tiny', {**{f'model.{k}': v for k, v in FIELDS.items()},
                                        'model.path': str(entry), 'init_from': ''})
  _refused(capsys, lambda: tool.main(['inspect', str(entry)]), f'error: .*{re.escape(hint)}$')
  _refused(capsys, lambda: tool.main(['convert', str(entry), '--out', str(tmp_path / 'o')]),
           f'error: .*config.json: not found .*{re.escape(hint)}$')


def test_a_tokenizer_larger_than_the_checkpoint_is_not_its_tokenizer(llama_run, tmp_path):
  """A checkpoint whose tokenizer has more tokens than its config.json's vocab_size: the error
  said 'config.model.vocab_size=N is smaller than the tokenizer vocabulary', and raising it as
  told then failed on 'does not match config.json' (the checkpoint's embedding is fixed)."""
  model_dir, _ = llama_run
  small = {**FIELDS, 'vocab_size': 300}   # the tokenizer of the llama fixture has 425 tokens
  other = str(tmp_path / 'other')
  transformers = pytest.importorskip('transformers')
  config = transformers.LlamaConfig(**{k: v for k, v in small.items() if k != 'head_dim'})
  transformers.LlamaForCausalLM(config).save_pretrained(other)
  config = api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in small.items()}, 'model.path': other, 'init_from': '',
      'tokenizer.path': model_dir})
  with pytest.raises(components.SetupError, match=(
      rf"^config.model.path={re.escape(other)}: its config.json's vocab_size=300 is smaller "
      rf"than the tokenizer vocabulary \(425, {re.escape(model_dir)}\): not its tokenizer$")):
    api.validate(config)


def _trained_run(model_dir, workdir):
  """A run of llama_run's model with a checkpoint at step 2 whose params are not model_dir's
  (as after training), and AdamW moments that are not zero. -> the checkpoint's params."""
  config = api.load_config('grpo_arith:tiny', {
      **{f'model.{k}': v for k, v in FIELDS.items()}, 'model.path': model_dir,
      'init_from': '', 'tokenizer.path': ''})
  c = components.build(config, data=False)
  tx = ts.make_optimizer(config.optim)
  params = jax.tree.map(lambda x: x * 1.5 + 0.25, c.params)
  state = runs.init_state(params, tx, runs.state_shardings(c, tx))
  state = state.replace(opt_state=jax.tree.map(lambda x: x + 1, state.opt_state))
  with checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints')) as ckpt:
    ckpt.save(2, state, {'step': 2}, {})
  record_workdir_config(config, workdir)
  return params


def test_export_reads_only_the_params_of_the_checkpoint(llama_run, tmp_path, monkeypatch):
  """Export restored the whole train state (the AdamW moments: twice the params, the monitor)
  into a fresh one built from model.path's weights, to write only the params: a 7B run's export
  needed ~7x its weights in memory. Now orbax reads state.params alone (partial restore) and
  no initial weights are built; the exported weights are the checkpoint's."""
  model_dir, _ = llama_run
  workdir = str(tmp_path / 'run')
  trained = _trained_run(model_dir, workdir)
  restored, held = [], []   # bytes orbax restored; bytes export made and held while writing
  ocp = checkpoint.orbax_module()
  manager_restore = ocp.CheckpointManager.restore
  monkeypatch.setattr(ocp.CheckpointManager, 'restore', lambda self, *a, **k: restored.append(
      checkpoint.tree_nbytes(dict((out := manager_restore(self, *a, **k)).items()))) or out)
  before = {id(x) for x in jax.live_arrays()}
  save_hf = hc.save_hf
  monkeypatch.setattr(hc, 'save_hf', lambda *a, **k: held.append(checkpoint.tree_nbytes(
      [x for x in jax.live_arrays() if id(x) not in before])) or save_hf(*a, **k))
  out = str(tmp_path / 'hf')
  _export(workdir, out, f'--config.model.path={model_dir}', *OVERRIDES, '--dtype', 'float32')
  nbytes = checkpoint.tree_nbytes(trained)
  assert sum(restored) == nbytes and held == [nbytes], (restored, held, nbytes)
  cfg = hc.load_hf_config(out)
  exported = hc.load_hf_params(out, cfg, jax.tree.map(lambda x: x.sharding, trained))
  jax.tree.map(np.testing.assert_array_equal, exported, trained)


def test_export_copies_no_weights_of_other_formats(llama_run, tmp_path):
  """model.path's weights in other formats (a PyTorch, Flax, TF, GGUF copy) were copied beside
  the trained safetensors: stale weights that a loader may pick. Its other files still are."""
  model_dir, workdir = llama_run
  source = str(tmp_path / 'llama')
  shutil.copytree(model_dir, source)
  stale = ['pytorch_model.bin', 'pytorch_model.bin.index.json', 'flax_model.msgpack',
           'tf_model.h5', 'model-Q4_K_M.gguf', 'consolidated.00.pth', 'model.ckpt.index']
  for name in stale + ['README.md', 'tekken.json']:
    with open(os.path.join(source, name), 'w') as f:
      f.write('{}')
  out = tmp_path / 'out'
  _export(workdir, out, f'--config.model.path={source}', *OVERRIDES)
  names = set(os.listdir(out))
  assert not names & set(stale), names & set(stale)
  assert {'README.md', 'tekken.json', 'tokenizer.json', 'generation_config.json'} <= names
  assert all(tool.is_weight_file(n) for n in stale)
