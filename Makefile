# credo: `make run` trains the built-in agent, `make test` runs the test suite.
# Both create .venv on first use. GPU machines: make run TORCH_SPEC="torch==2.13.0" (or
# any build you like, e.g. TORCH_SPEC=torch TORCH_INDEX=https://download.pytorch.org/whl/cu128).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.credo-installed

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/credo train

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/rollout_throughput.py
	$(BIN)/python benchmarks/credit.py
	$(BIN)/python benchmarks/default_run.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
