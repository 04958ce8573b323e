"""tools/bench on the tiny workload: the structure of its JSON and markdown (no timing checks)."""
import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from tools import bench, bench_report, bench_workload

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PHASES = ('step_s', 'sample_s', 'ref_s', 'policy_s', 'verify_s', 'host_s', 'prefill_s',
          'decode_s', 'train_s')


def check_phases(phases: dict, keys=PHASES):
  for k in keys:
    assert set(phases[k]) == {'median', 'min', 'max', 'n'}, k
    assert phases[k]['min'] <= phases[k]['median'] <= phases[k]['max'], k


def test_bench_writes_phases_throughput_and_machine(tmp_path):
  bench.main(['--tiny', '--steps', '2', '--warmup', '1', '--skip-first-step',
              '--out', str(tmp_path)])
  result = json.loads((tmp_path / 'grpo_tiny.json').read_text())
  assert result['workload'] == dataclasses.asdict(bench_workload.TINY)
  assert {'cpu', 'cores', 'jax', 'device', 'load_avg_1min'} <= set(result['machine'])
  assert result['matmul_flops_s'] > 0
  rft = result['rft_jax']
  check_phases(rft['phases'])
  assert rft['phases']['step_s']['n'] == 2 and len(rft['steps']) == 2
  for k in ('prefill_tok_s', 'decode_tok_s', 'update_flops_s', 'update_mfu', 'gen_tokens',
            'train_xla_flops_s', 'update_computed_flops_s'):
    assert math.isfinite(rft['derived'][k]) and rft['derived'][k] > 0, k
  # Each prompt once per group (shared_prompt): less work than every row's prompt.
  assert rft['flops']['policy_update_computed'] < rft['flops']['policy_update']
  assert rft['peak_rss_mib'] > 0
  table = (tmp_path / 'grpo_tiny.md').read_text()
  assert '| system | step | generate | reference fwd | policy fwd+bwd+update |' in table
  assert '| rft_jax |' in table and 'update FLOP/s / matmul rate' in table


def test_verifier_and_prompts_are_deterministic():
  a, b = (bench_workload.make_prompts(bench_workload.ISSUE, 2) for _ in range(2))
  assert a == b
  lens = [len(ids) for batch in a for ids in batch['ids']]
  assert min(lens) >= 18 and max(lens) <= 26 and len(a[0]['ids']) == 16
  assert bench_workload.first_even('t10 t3', '') == 1.0
  assert bench_workload.first_even('t11', '') == bench_workload.first_even('', '') == 0.0


def test_the_first_step_child_imports_no_data_or_checkpoint_library():
  """The time-to-first-step child (tools.bench_grpo: components, runs, trainer) has no data set
  and saves nothing: tensorflow_datasets, grain and orbax (~0.45 s of its imports) are imported
  where a task is loaded or a checkpoint read or written, not with those modules."""
  code = ('import sys, tools.bench_grpo\n'
          'print(sorted(m for m in ("tensorflow_datasets", "grain", "orbax.checkpoint") '
          'if m in sys.modules))')
  done = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, timeout=300, check=True)
  assert done.stdout.strip().splitlines()[-1] == '[]'


def test_the_first_step_compiles_only_the_programs_of_a_runs_path(tmp_path):
  """The time-to-first-step child (a cold cache) compiles what a run's first step needs and no
  eager op: optax's step counter (opt-state shardings), the train state's init, the step key,
  the sampler, the fused step and the monitor's observe. It compiled 24: the monitor's and the
  controls' eager zeros, a copy of the reference, the eager key and fold_in, jnp.asarray of
  the rewards (each ~10-100 ms of a cold start, a cache load warm)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from rft_jax.models import functional as lm  # pylint: disable=g-import-not-at-top
  from rft_jax.models.llama import ModelConfig  # pylint: disable=g-import-not-at-top
  w = bench_workload.TINY
  model_cfg = ModelConfig.from_dict(w.model_dict())
  assets = str(tmp_path / 'assets')
  bench_workload.write_assets(w, nnx.to_pure_dict(lm.create(model_cfg, w.seed)[1]), model_cfg,
                              assets, 1)
  done = subprocess.run(bench._child_cmd('tools.bench_grpo', assets, w) + ['--first-step'],
                        cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu',
                             'JAX_COMPILATION_CACHE_DIR': str(tmp_path / 'cache')})
  line = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')][-1]
  result = json.loads(line[len('RESULT '):])
  assert result['xla_compiles'] == 6, result
  assert result['programs'] == ['jit(convert_element_type)', 'jit(<lambda>)', 'jit(_step_key)',
                                'jit(fn)', 'jit(fused_step)', 'jit(observe)']


@pytest.mark.slow
def test_bench_time_to_first_step_and_trl_comparison(tmp_path):
  """The fresh-process time-to-first-step runs, and TRL beside rft_jax when it is installed."""
  args = ['--tiny', '--steps', '2', '--warmup', '1', '--out', str(tmp_path)]
  try:
    import trl  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    args += ['--compare', 'trl']
  except ImportError:
    pass
  result = bench.main(args)
  for name in ('cold', 'warm'):
    f = result['first_step'][name]
    assert f['ttfs_s'] > f['first_step_s'] > 0 and f['xla_compiles'] > 0, f
  assert result['first_step']['warm']['cache_hits'] > 0
  if '--compare' in args:
    check_phases(result['trl']['phases'], ('step_s', 'sample_s', 'ref_s', 'policy_s'))
    assert set(result['ratio']) >= {'step_s', 'sample_s', 'ref_s', 'policy_s'}


def test_compare_without_the_extra_is_a_one_line_error(monkeypatch, capsys):
  """--compare trl where a module of the 'compare' extra is missing stops at once (exit 2) with
  one line naming the module and the install command, before any step runs."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  real = importlib.util.find_spec
  # Every other module of the extra present (whether or not this environment has it).
  present = lambda name: object() if name in bench.COMPARE_MODULES else real(name)
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == 'datasets' else present(name))
  monkeypatch.setattr(bench, 'run_workload', lambda args: pytest.fail('ran the workload'))
  with pytest.raises(SystemExit) as e:
    bench.main(['--compare', 'trl', '--tiny', '--skip-first-step'])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert 'missing: datasets' in err and "pip install -e '.[compare]'" in err, err


def test_gpu_preset_is_qwen2_0p5b_shaped():
  """The accelerator preset's model has Qwen2.5-0.5B's parameter count, by rft_jax's count and
  by transformers' Qwen2 built from the config rft_jax exports (on the meta device: no memory)."""
  from rft_jax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from rft_jax.models.llama import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_dict(bench_workload.GPU_0P5B.model_dict())
  assert cfg.num_params() == 494_032_768
  assert (cfg.num_key_value_heads, cfg.head_dim, cfg.dtype) == (2, 64, 'bfloat16')
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  hf = transformers.AutoConfig.for_model(**hf_checkpoint.hf_config_dict(cfg, 'qwen2',
                                                                        'bfloat16'))
  with torch.device('meta'):
    model = transformers.AutoModelForCausalLM.from_config(hf)
  assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


@pytest.mark.slow
def test_bench_runs_the_gpu_preset_scaled_down(tmp_path, capsys):
  """--preset gpu_0p5b's code path (GQA, q/k/v biases, tied embeddings, bf16) with
  --workload-json shrinking it to CPU size; a bad override is a one-line error."""
  small = {'vocab_size': 96, 'hidden_size': 56, 'intermediate_size': 64, 'num_hidden_layers': 1,
           'prompts_per_step': 2, 'group_size': 4, 'prompt_len_min': 4, 'prompt_len_max': 7,
           'max_new_tokens': 5}
  result = bench.main(['--preset', 'gpu_0p5b', '--workload-json', json.dumps(small),
                       '--steps', '1', '--warmup', '1', '--skip-first-step',
                       '--out', str(tmp_path)])
  w = result['workload']
  assert (w['num_key_value_heads'], w['attention_bias'], w['tie_word_embeddings'],
          w['dtype'], w['hidden_size']) == (2, True, True, 'bfloat16', 56)
  assert result['preset'] == 'gpu_0p5b' and result['peak_flops_s'] is None   # CPU: no MFU
  assert 0 < result['rft_jax']['derived']['gen_tokens'] <= 2 * 4 * 5
  assert result['rft_jax']['derived']['decode_tok_s'] > 0   # decode timed as its own program
  table = (tmp_path / 'grpo_gpu_0p5b.md').read_text()
  assert 'matmul rate (jit bfloat16 2048x2048)' in table and 'bfloat16' in result['workload_text']
  with pytest.raises(SystemExit) as e:
    bench.main(['--preset', 'gpu_0p5b', '--workload-json', '{"hiden_size": 8}',
                '--out', str(tmp_path)])
  assert e.value.code == 2 and "unknown field 'hiden_size'" in capsys.readouterr().err


@pytest.mark.parametrize('argv,message', [
    (['--steps', '0'], '--steps=0: must be >= 1'),   # was a ZeroDivisionError after warm-up
    (['--warmup', '-1'], '--warmup=-1: must be >= 0'),
    (['--workload-json', '[1]'], 'expected a JSON object of workload fields, got list'),
    (['--workload-json', '{"group_size": 1}'], 'group_size=1: must be >= 2'),
    (['--workload-json', '{"rows": 8}'], "unknown field 'rows'"),   # a property: TypeError
    (['--workload-json', '{"hidden_size": "x"}'], "hidden_size='x': expected int"),
    (['--workload-json', '{"dtype": "float16"}'], "dtype='float16': must be"),
    (['--recipe', 'configs/sft_arith.py:tiny'], 'for the GRPO-family recipes'),   # tracebacks
    (['--recipe', 'configs/ppo_arith.py:tiny'], 'for the GRPO-family recipes'),
    (['--out', '/proc/x'], '--out=/proc/x: cannot make the results directory'),   # traceback
    (['--out', 'README.md'], '--out=README.md: cannot make the results directory'),
    # flags the chosen bench does not read were ignored: --recipe with --compare compared nothing
    (['--recipe', 'configs/grpo_arith.py:tiny', '--compare', 'trl', '--steps', '3'],
     'error: --steps, --compare: not used with --recipe (its flag: --repeats)'),
    (['--repeats', '3'], 'error: --repeats: not used without --recipe'),
])
def test_bad_flags_are_usage_errors_before_any_step(monkeypatch, capsys, argv, message):
  monkeypatch.setattr(bench, 'run_workload', lambda args: pytest.fail('ran the workload'))
  with pytest.raises(SystemExit) as e:
    bench.main(argv if '--recipe' in argv else ['--tiny', '--skip-first-step', *argv])
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err, err


def test_report_shows_a_failed_first_step_run_and_no_xla_rate_off_cpu():
  """A time-to-first-step child that failed (as one did on an H200: out of memory beside the
  parent's preallocation) is a row saying so, not a KeyError that loses the whole report."""
  with open(os.path.join(REPO, 'experiments', 'bench', 'grpo_gpu_0p5b.json')) as f:
    result = json.load(f)
  result['machine']['backend'] = 'gpu'
  oom = ('jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to '
         'allocate 43.64GiB with allocator GPU_0_bfc on device 0.')
  result['first_step'] = {'cold': {'error': [oom]}, 'warm': {'error': [oom]}}
  table = bench_report.markdown(result)
  assert '| time to first step, cold compilation cache | failed: jax.errors.JaxRuntimeError: ' \
         'RESOURCE_EXHAUSTED' in table
  assert "XLA's FLOP count" not in table
  assert '| policy update model FLOP/s (6N/token + attention, real tokens) | 323.5 TFLOP/s |' \
      in table


def test_tiny_reports_in_the_checkout_are_ignored_by_git():
  """`python -m tools.bench --tiny` writes experiments/bench/grpo_tiny.{json,md} (its default
  --out): they showed as untracked files. The committed reports of other presets are not."""
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  if not shutil.which('git') or not os.path.isdir(os.path.join(REPO, '.git')):
    pytest.skip('not a git checkout')
  check = lambda path: subprocess.run(['git', 'check-ignore', '-q', '--no-index', path],
                                      cwd=REPO, check=False).returncode
  for name in ('grpo_tiny.json', 'grpo_tiny.md'):
    assert check(f'experiments/bench/{name}') == 0, name
  assert check('experiments/bench/grpo_issue11.json') == 1


def test_exported_tokenizer_config_states_the_models_positions(tmp_path):
  """tokenizer_config.json said model_max_length 128 whatever the model's positions (GPU_0P5B:
  26 + 128 = 154 tokens, so a HF pipeline would truncate its sequences at 128)."""
  w = bench_workload.with_fields(bench_workload.TINY, {'max_new_tokens': 200})
  bench_workload.write_tokenizer(w, str(tmp_path))
  config = json.loads((tmp_path / 'tokenizer_config.json').read_text())
  assert config['model_max_length'] == w.model_dict()['max_position_embeddings'] == 207
