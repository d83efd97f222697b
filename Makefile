# qkv — set up and run on a fresh machine.
#   make test   create .venv, install torch 2.13.0 (CPU wheel), qkv and its dev tools; run the tests
#   make run    the same set-up, then the main job
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qkv-installed
PYTEST_WORKERS ?= 2

.PHONY: setup test run bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q --upgrade pip
	# torch first and pinned: it takes the CPU wheel on disk; nothing later may pull a CUDA build.
	$(BIN)/python -m pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[dev]"
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) tests

run: setup
	$(BIN)/qkv bench complexity --quick

bench: setup
	$(BIN)/qkv bench complexity
	$(BIN)/qkv bench kernels

clean:
	rm -rf $(VENV) bench-out runs
