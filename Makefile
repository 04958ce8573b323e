# Two commands do everything on a fresh machine (python3, pip and make are all it needs):
#   make run    set up .venv if needed, then run the default recipe (GRPO on the arithmetic task)
#   make test   set up .venv if needed, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/grpo_arith
CONFIG ?= configs/grpo_arith.py
export JAX_PLATFORMS ?= cpu
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.jax_cache
# Cache every compiled program, not only those over JAX's default 1 s (most of the tiny model's).
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0

.PHONY: run test test-all setup bench base clean notebooks

# uv installs the ~150 packages in a fraction of pip's time (set-up 94 -> 57 s on 2 cores, empty
# caches). torch goes first, through pip: pip takes a local CPU wheel where the machine has one,
# uv would download a CUDA build of several GB. pip does it all if uv cannot. The torch pin is
# read from pyproject.toml's test extra, so there is one place to change it.
TORCH_PIN := $(shell grep -o -m1 'torch==[0-9.]*' pyproject.toml)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv '$(TORCH_PIN)'
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -e '.[test]' \
	  || $(PY) -m pip install --quiet -e '.[test]'
	touch $@

# Bytecode is compiled ahead, not left to the first import: where PYTHONDONTWRITEBYTECODE is set
# (as on the machines this project is developed and tested on) Python writes no caches, and every
# process (a run, each test worker and subprocess, each reward worker) compiled ~1,700 modules
# from source again, ~2.9 s of a 3-step tiny run's 9.6 s. uv compiles the installed packages (pip
# does by default); compileall the project's own files, only those changed since it last ran.
setup: $(VENV)/.installed
	$(PY) -m compileall -q -j 0 rft_jax tools configs tests > /dev/null || true

run: setup
	$(PY) -m rft_jax.main --config $(CONFIG) --workdir $(WORKDIR)

# --dist loadscope: each test module runs whole on one worker, so module-scoped fixtures (a model,
# the sharded-step check) are built once, not once per worker (875 -> 785 s on 2 cores).
test: setup
	$(PY) -m pytest -q -n 2 --dist loadscope

test-all: setup  # includes the slow end-to-end runs
	$(PY) -m pytest -q -n 2 --dist loadscope -m ''

# Regenerate the notebooks' .ipynb from their jupytext sources (or the sources from an edited .ipynb).
notebooks: setup
	$(VENV)/bin/jupytext --sync experiments/notebooks/*.py

bench: setup  # the issue-11 GRPO workload; `--compare trl` needs pip install -e '.[compare]'
	$(PY) -m tools.bench

# Rebuild the shipped base policy (rft_jax/assets/arith_base) from scratch with the SFT recipe.
base: setup
	rm -rf runs/sft_arith
	$(PY) -m rft_jax.main --config configs/sft_arith.py --workdir runs/sft_arith
	$(PY) -m tools.export_base --config configs/sft_arith.py --workdir runs/sft_arith \
	  --out rft_jax/assets/arith_base

clean:
	rm -rf runs .jax_cache
