"""HF checkpoints in and out, against transformers on random tiny Llama (llama3 rope scaling),
Qwen2 (q/k/v bias, tied embeddings) and Mistral (an active sliding window) models: logits with
left padding, greedy generation, export -> from_pretrained, sharded loading, and the one-line
errors for configs and tensors rft_jax cannot load exactly."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from rft_jax import components
from rft_jax.models import functional as lm
from rft_jax.models import hf_checkpoint as hc
from rft_jax.models.hf_checkpoint import HFCheckpointError
from rft_jax.parallel import mesh as meshlib
from rft_jax.sampling.sampler import SamplingConfig, make_sampler
from xla_flags import with_cpu_devices

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
              max_position_embeddings=128, bos_token_id=None, eos_token_id=None, pad_token_id=0)
# original_max_position_embeddings=64 with head_dim 16 and theta 5e5 puts the rotary
# frequencies in all three llama3 regimes (kept, smoothed, divided by factor).
LLAMA3 = {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
          'original_max_position_embeddings': 64}
FAMILIES = {
    'llama': (transformers.LlamaConfig, dict(head_dim=16, rope_theta=500000.0)),
    'qwen2': (transformers.Qwen2Config, dict(tie_word_embeddings=True, rope_theta=10000.0)),
    'mistral': (transformers.MistralConfig, dict(head_dim=16, sliding_window=8)),
}
MAX_LOGIT_DIFF = 1e-4
MESH1 = dict(data=1, fsdp=1, tensor=1)


def _randomize(model, seed):
  """O(1)-scale weights so that every tensor matters: norms 1 + 0.3 N, biases 0.3 N,
  embeddings N, linear weights N / sqrt(fan_in)."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      z = torch.randn(p.shape, generator=g)
      if name.endswith('norm.weight'):
        p.copy_(1 + 0.3 * z)
      elif name.endswith('bias'):
        p.copy_(0.3 * z)
      elif 'embed_tokens' in name:
        p.copy_(z)
      else:
        p.copy_(z / p.shape[1] ** 0.5)


@pytest.fixture(scope='module')
def hf_models(tmp_path_factory):
  """{family: (torch model, its save_pretrained dir)}; llama is also saved sharded."""
  root = tmp_path_factory.mktemp('hf')
  out = {}
  for i, (name, (cls, extra)) in enumerate(FAMILIES.items()):
    torch.manual_seed(i)
    if name == 'llama':
      extra = dict(extra, rope_scaling=dict(LLAMA3))   # transformers edits this dict
    model = transformers.AutoModelForCausalLM.from_config(cls(**COMMON, **extra),
                                                          dtype=torch.float32).eval()
    _randomize(model, i)
    model.save_pretrained(root / name)
    out[name] = (model, str(root / name))
  out['llama_sharded'] = (out['llama'][0], str(root / 'llama_sharded'))
  out['llama'][0].save_pretrained(root / 'llama_sharded', max_shard_size='100KB')
  return out


def _load(model_dir):
  cfg = hc.load_hf_config(model_dir)
  graphdef, abstract = lm.abstract_params(cfg)
  shardings = meshlib.param_shardings(abstract, meshlib.make_mesh(MESH1))
  return cfg, graphdef, hc.load_hf_params(model_dir, cfg, shardings)


def _left_padded_batch(seed, b=4, t=12):
  rng = np.random.RandomState(seed)
  tokens = rng.randint(1, VOCAB, (b, t))
  mask = np.ones((b, t), np.int64)
  for row, pad in enumerate((0, 3, 7, 1)[:b]):
    mask[row, :pad] = 0
    tokens[row, :pad] = 0
  return tokens, mask


def _torch_logits(model, tokens, mask):
  """HF logits with rft_jax's position ids (cumsum(mask) - 1, 0 on pads)."""
  positions = np.asarray(lm.positions_from_mask(jnp.asarray(mask)))
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()


def _max_logit_diff(graphdef, params, model, tokens, mask):
  mine = np.asarray(lm.forward(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask)))
  return float(np.abs(mine - _torch_logits(model, tokens, mask))[mask.astype(bool)].max())


@pytest.mark.parametrize('name', ['llama', 'qwen2', 'mistral', 'llama_sharded'])
def test_logits_match_transformers(hf_models, name):
  model, model_dir = hf_models[name]
  cfg, graphdef, params = _load(model_dir)
  tokens, mask = _left_padded_batch(0)
  diff = _max_logit_diff(graphdef, params, model, tokens, mask)
  print(f'{name}: max |logit diff| = {diff:.2e}')
  assert diff < MAX_LOGIT_DIFF
  assert cfg.num_params() == sum(p.numel() for p in model.parameters())


def test_config_fields(hf_models):
  llama = hc.load_hf_config(hf_models['llama'][1])
  assert dict(llama.rope_scaling) == LLAMA3
  assert (llama.rope_theta, llama.head_dim, llama.attention_bias) == (500000.0, 16, False)
  qwen = hc.load_hf_config(hf_models['qwen2'][1])
  assert qwen.attention_bias and qwen.tie_word_embeddings and qwen.rope_scaling is None
  assert hc.load_hf_config(hf_models['mistral'][1]).sliding_window == 8


@pytest.mark.parametrize('name', ['llama', 'qwen2', 'mistral'])
def test_greedy_generation_matches_transformers(hf_models, name):
  """32 greedy tokens after left-padded prompts; Mistral's window (8) is crossed early."""
  model, model_dir = hf_models[name]
  cfg, graphdef, params = _load(model_dir)
  tokens, mask = _left_padded_batch(1, b=3, t=10)
  sampler = make_sampler(graphdef, cfg, SamplingConfig(max_new_tokens=32, eos_id=VOCAB,
                                                       pad_id=0, temperature=0.0))
  mine = np.asarray(sampler(params, jnp.asarray(tokens), jnp.asarray(mask),
                            jax.random.key(0)).tokens_bt)
  with torch.no_grad():
    ref = model.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                         max_new_tokens=32, do_sample=False,
                         pad_token_id=0).numpy()[:, tokens.shape[1]:]
  np.testing.assert_array_equal(mine, ref)


@pytest.mark.parametrize('name,dtype,shard_bytes', [('qwen2', 'float32', 40_000),
                                                    ('llama', 'float32', 2 << 30),
                                                    ('mistral', 'bfloat16', 2 << 30)])
def test_export_loads_in_transformers(hf_models, tmp_path, name, dtype, shard_bytes):
  model, model_dir = hf_models[name]
  cfg, graphdef, params = _load(model_dir)
  files = hc.save_hf(str(tmp_path), params, cfg, dtype=dtype, max_shard_bytes=shard_bytes)
  assert (hc.INDEX in files) == (shard_bytes < 1e6)
  assert hc.load_hf_config(str(tmp_path)) == dataclasses.replace(cfg, dtype=dtype)
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path),
                                                           dtype=torch.float32).eval()
  assert type(back) is type(model)
  tokens, mask = _left_padded_batch(2)
  if dtype == 'float32':
    assert _max_logit_diff(graphdef, params, back, tokens, mask) < MAX_LOGIT_DIFF
    ref = _torch_logits(model, tokens, mask)
    np.testing.assert_array_equal(_torch_logits(back, tokens, mask)[mask.astype(bool)],
                                  ref[mask.astype(bool)])
  else:   # bf16 on disk: transformers holds exactly the bf16-rounded rft_jax params
    for (n, p), (_, q) in zip(back.named_parameters(), model.named_parameters()):
      np.testing.assert_array_equal(p.detach().numpy(),
                                    q.detach().to(torch.bfloat16).float().numpy(), err_msg=n)


@pytest.mark.parametrize('umask', [0o022, 0o027])
def test_exported_files_follow_the_umask(tmp_path, umask):
  """Exported weights get config.json's mode from the umask (safetensors 0.8 wrote 0600)."""
  cfg = lm.ModelConfig(VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16)
  params = nnx.to_pure_dict(lm.create(cfg)[1])
  previous = os.umask(umask)
  try:
    for out, shard_bytes in (('single', 2 << 30), ('sharded', 10_000)):
      files = hc.save_hf(str(tmp_path / out), params, cfg, max_shard_bytes=shard_bytes)
      assert (hc.INDEX in files) == (out == 'sharded')
      modes = {f: os.stat(tmp_path / out / f).st_mode & 0o777 for f in files}
      assert modes == dict.fromkeys(files, 0o666 & ~umask), modes
  finally:
    os.umask(previous)


def test_sharded_load_on_8_devices_equals_single_device(hf_models):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO, XLA_FLAGS=with_cpu_devices(8))
  out = subprocess.run([sys.executable, os.path.join(REPO, 'tests', 'hf_sharded_load_check.py'),
                        hf_models['llama_sharded'][1]], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300, check=True)
  result = json.loads(out.stdout)
  assert result['devices'] == 8
  assert result['q_kernel_blocks'] == 8 and result['q_kernel_block_shape'] == [16, 32]
  assert result['max_param_diff'] == 0.0
  assert result['max_logit_diff'] < 1e-5


def _edited_copy(src, dst, **changes):
  shutil.copytree(src, dst)
  with open(os.path.join(dst, 'config.json')) as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(os.path.join(dst, 'config.json'), 'w') as f:
    json.dump(cfg, f)
  return str(dst)


@pytest.mark.parametrize('name,changes,field', [
    ('llama', dict(rope_parameters={'rope_type': 'yarn', 'factor': 4.0, 'rope_theta': 1e4}),
     'rope_parameters.rope_type'),
    ('llama', dict(rope_scaling={'type': 'dynamic', 'factor': 2.0}), 'rope_scaling.rope_type'),
    ('llama', dict(hidden_act='gelu'), 'hidden_act'),
    ('llama', dict(mlp_bias=True), 'mlp_bias'),
    ('llama', dict(attention_bias=True), 'attention_bias'),
    ('qwen2', dict(use_sliding_window=True, sliding_window=16), 'use_sliding_window'),
    ('qwen2', dict(architectures=['GPT2LMHeadModel']), 'architectures'),
    ('mistral', dict(torch_dtype='float8_e4m3fn', dtype=None), 'torch_dtype'),
    ('llama', dict(rms_norm_eps=None), 'rms_norm_eps'),   # was a TypeError traceback
    ('llama', dict(num_hidden_layers=0), 'num_hidden_layers'),   # was accepted
    ('llama', dict(head_dim='16'), 'head_dim'),   # were TypeError/ValueError tracebacks
    ('qwen2', dict(rope_scaling='x'), 'rope_scaling'),
    ('qwen2', dict(rope_parameters={'rope_type': 'default', 'rope_theta': 0}),   # was 10000
     'rope_parameters.rope_theta'),
])
def test_unsupported_config_is_one_line_error(hf_models, tmp_path, name, changes, field):
  model_dir = _edited_copy(hf_models[name][1], tmp_path / 'm', **changes)
  with pytest.raises(HFCheckpointError) as e:
    hc.load_hf_config(model_dir)
  msg = str(e.value)
  assert '\n' not in msg and 'config.json' in msg and f'{field}=' in msg, msg


def test_bad_tensors_are_one_line_errors(hf_models, tmp_path):
  src = hf_models['llama'][1]
  cfg = hc.load_hf_config(src)
  with safe_open(os.path.join(src, hc.SINGLE), framework='np') as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  _, abstract = lm.abstract_params(cfg)
  shardings = meshlib.param_shardings(abstract, meshlib.make_mesh(MESH1))
  bad = {'missing tensor model.norm.weight': {k: v for k, v in tensors.items()
                                              if k != 'model.norm.weight'},
         'unexpected tensor model.layers.9.mlp.up_proj.weight': {
             **tensors, 'model.layers.9.mlp.up_proj.weight': tensors['model.norm.weight']},
         'tensor lm_head.weight has shape [95, 64], the config needs [96, 64]': {
             **tensors, 'lm_head.weight': tensors['lm_head.weight'][:-1]},
         # an int8 tensor (a quantized weight without its scales) was read as float32
         'tensor model.norm.weight is I8 on disk': {
             **tensors, 'model.norm.weight': tensors['model.norm.weight'].astype(np.int8)}}
  for i, (message, contents) in enumerate(bad.items()):
    d = tmp_path / str(i)
    shutil.copytree(src, d)
    save_file(contents, str(d / hc.SINGLE), metadata={'format': 'pt'})
    with pytest.raises(HFCheckpointError, match=message.replace('[', r'\[').replace(']', r'\]')):
      hc.load_hf_params(str(d), cfg, shardings)


def test_model_config_from_path_checks_config_model(hf_models, capsys):
  model_dir = hf_models['qwen2'][1]
  hf = hc.load_hf_config(model_dir)
  section = {k: getattr(hf, k) for k in (
      'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
      'num_attention_heads', 'num_key_value_heads', 'head_dim', 'rope_theta', 'rms_norm_eps',
      'tie_word_embeddings', 'attention_bias', 'max_position_embeddings')}
  config = ml_collections.ConfigDict({'model': {**section, 'dtype': 'bfloat16',
                                                'path': model_dir}})
  got = components.model_config(config)
  assert got.dtype == 'bfloat16' and got.attention_bias and got.max_position_embeddings == 128
  config.model.hidden_size = 32
  with pytest.raises(components.SetupError,
                     match=r'config.model.hidden_size=32 does not match .* \(1 field\(s\) differ; '
                           r'set: --config.model.hidden_size=64\)$'):
    components.model_config(config)
  config.model.num_hidden_layers = 7   # every field to change, in one message
  with pytest.raises(components.SetupError, match=r'\(2 field\(s\) differ; set: --config.model.'
                     r'hidden_size=64 --config.model.num_hidden_layers=\d+\)$'):
    components.model_config(config)
  # --validate_only checks them too (it said 'config OK' and the run then failed).
  from rft_jax import main as main_lib  # pylint: disable=g-import-not-at-top
  status = main_lib.main(['main', '--config', 'configs/grpo_gsm8k_qwen2.py:tiny',
                          f'--config.model.path={model_dir}', '--config.task.manual_dir=/tmp',
                          '--validate_only'])
  err = capsys.readouterr().err.strip()
  assert status == 2 and re.match(r'error: config.model.\w+=.* does not match .*config.json \(\d+ '
                                  r'field\(s\) differ; set: ', err) and '\n' not in err, err


def test_tool_inspect_and_convert(hf_models, tmp_path, capsys):
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from tools import checkpoint as tool  # pylint: disable=g-import-not-at-top
  model_dir = hf_models['llama_sharded'][1]
  tool.inspect(model_dir)
  out = capsys.readouterr().out
  count = sum(p.numel() for p in hf_models['llama'][0].parameters())
  assert 'family: llama  loadable by rft_jax: yes' in out
  assert f'21 tensors, {count:,} parameters, dtype on disk: F32' in out
  # A tensor missing on disk (or of another shape) is not loadable, though config.json is fine.
  broken = tmp_path / 'no_norm'
  shutil.copytree(hf_models['llama'][1], broken)
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  tensors = load_file(str(broken / 'model.safetensors'))
  del tensors['model.norm.weight']
  save_file(tensors, str(broken / 'model.safetensors'))
  with pytest.raises(SystemExit, match=r'^error: not loadable by rft_jax: .*missing tensor '
                                       r'model.norm.weight$'):
    tool.inspect(str(broken))
  assert 'loadable by rft_jax: no (' in capsys.readouterr().out
  tool.convert(type('Args', (), {'hf_dir': model_dir, 'out': str(tmp_path / 'orbax')}))
  _, _, params = _load(model_dir)
  restored = checkpoint.load_params(str(tmp_path / 'orbax'), params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tool_inspect_exits_non_zero_when_rft_jax_cannot_load_or_read(hf_models, tmp_path):
  """A config rft_jax does not load: the report, then the reason as the last (stderr) line and a
  non-zero exit (was exit 0). A truncated safetensors file: one line naming it (was a
  SafetensorError traceback)."""
  gelu = tmp_path / 'gelu'
  shutil.copytree(hf_models['qwen2'][1], gelu)
  hf = json.loads((gelu / 'config.json').read_text())
  (gelu / 'config.json').write_text(json.dumps({**hf, 'hidden_act': 'gelu'}))
  truncated = tmp_path / 'truncated'
  shutil.copytree(hf_models['qwen2'][1], truncated)
  weights = truncated / 'model.safetensors'
  os.truncate(weights, os.path.getsize(weights) // 2)
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  run = lambda d: subprocess.run([sys.executable, '-m', 'tools.checkpoint', 'inspect', str(d)],
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  done = run(gelu)
  assert done.returncode == 1 and 'loadable by rft_jax: no (' in done.stdout, done
  assert ' tensors, ' in done.stdout   # the report is still printed
  assert re.fullmatch(r"error: not loadable by rft_jax: .*config.json: hidden_act='gelu': "
                      r"only 'silu' .*\n", done.stderr), done.stderr
  done = run(truncated)
  assert done.returncode == 1 and done.stdout == '', done
  assert re.fullmatch(rf'error: {re.escape(str(weights))}: cannot read its tensors '
                      r'\(SafetensorError: .*\)\n', done.stderr), done.stderr


@pytest.mark.parametrize('text,reason', [('not json', 'not valid JSON'),
                                         ('[1]', 'expected a JSON object, got list')])
def test_unreadable_config_json_is_one_line_error(tmp_path, capsys, text, reason):
  """A config.json that is not a JSON object: one line naming it and exit 2, with
  --validate_only as without (was a JSONDecodeError traceback and exit 1)."""
  (tmp_path / 'config.json').write_text(text)
  with pytest.raises(HFCheckpointError, match=f'config.json: {reason}'):
    hc.load_hf_config(str(tmp_path))
  from rft_jax import main as main_lib  # pylint: disable=g-import-not-at-top
  status = main_lib.main(['main', '--config', 'configs/grpo_arith.py:tiny',
                          f'--config.model.path={tmp_path}', '--validate_only'])
  err = capsys.readouterr().err
  assert status == 2 and err.startswith('error: config.model.path: ') and reason in err, err
  assert err.count('\n') == 1, err


def test_validate_only_checks_the_weight_files(hf_models, tmp_path):
  """check_setup (--validate_only) finds a checkpoint without its weights file (it said
  'config OK' and the run then stopped at load)."""
  from rft_jax import api  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path / 'llama')
  shutil.copytree(hf_models['llama'][1], model_dir)
  hf = hc.load_hf_config(model_dir)
  fields = {f'model.{k}': getattr(hf, k) for k in (
      'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
      'num_attention_heads', 'num_key_value_heads', 'head_dim', 'rope_theta', 'rms_norm_eps',
      'tie_word_embeddings', 'attention_bias', 'max_position_embeddings')}
  config = api.load_config('grpo_arith:tiny', {**fields, 'model.path': model_dir,
                                               'init_from': ''})
  components.check_setup(config)
  from rft_jax import checkpoint  # pylint: disable=g-import-not-at-top
  checkpoint.save_params(str(tmp_path / 'params'), _load(model_dir)[2])
  os.remove(os.path.join(model_dir, hc.SINGLE))
  with pytest.raises(components.SetupError, match=f'no {hc.SINGLE} or {hc.INDEX}'):
    components.check_setup(config)
  config.init_from = str(tmp_path / 'params')   # the run reads its weights there, not model.path's
  components.check_setup(config)
  components.build(config, data=False)


@pytest.mark.parametrize('text,reason', [('{"weight_map": ', 'not valid JSON'),
                                         ('{"metadata": {}}', 'no "weight_map"')])
def test_damaged_shard_index_is_one_line_error(hf_models, tmp_path, text, reason):
  """A sharded checkpoint's index cut short or without its map (was a JSONDecodeError or
  KeyError traceback, exit 1)."""
  model_dir = str(tmp_path / 'm')
  shutil.copytree(hf_models['llama_sharded'][1], model_dir)
  with open(os.path.join(model_dir, hc.INDEX), 'w') as f:
    f.write(text)
  with pytest.raises(HFCheckpointError, match=f'{hc.INDEX}: {reason}'):
    hc.weight_map(model_dir)
