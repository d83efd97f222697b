"""benchmarks/repro_pretrained.py --quick on a tiny random checkpoint: every part runs, writes its
JSON and page to the folder given (never docs/reproductions), and the numbers it writes hold what
they claim where that can be checked (softmax against itself has no error)."""

import json
from pathlib import Path

import pytest
import torch

from qkv.tasks.bbc import is_bbc_cached

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not is_bbc_cached(), reason="BBC News is not cached (qkv data fetch bbc)")
def test_quick_run_writes_every_part(benchmark_script, wordpiece_dir, tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=24, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(wordpiece_dir)
    published = (ROOT / "docs" / "reproductions" / "pretrained.md")
    before = published.read_text() if published.exists() else None
    results = benchmark_script("repro_pretrained").main(["--quick", "--checkpoint", str(wordpiece_dir), "--out", str(tmp_path)])
    assert set(results) == {"finetune", "swap", "speed"}
    assert json.loads((tmp_path / "pretrained.json").read_text()) == json.loads(json.dumps(results))
    page = (tmp_path / "pretrained.md").read_text()
    assert "Smoke run" in page and "| MiniLM (pretrained) |" in page and "**gpt2**" in page
    assert (published.read_text() if published.exists() else None) == before
    swap = results["swap"]["kernels"]
    assert max(swap["softmax"]["layer_error"]) < 1e-6 and min(swap["window"]["layer_error"]) > 0
    controls = results["swap"]["controls"]
    assert set(controls) == {"embeddings only", "random weights"} and len(controls["random weights"]["runs"]) == 2
    assert all(0.0 <= r <= 1.0 for c in controls.values() for r in c["runs"]) and "control: embeddings only" in page
    assert len(results["finetune"]["accuracy"]["random"]["runs"]) == 2
    assert "qkv-bench-efficient" not in results["speed"]["seconds"]["gpt2"]  # not causal
    assert set(results["speed"]["seconds"]["bert"]["sdpa"]) == {"32", "64"}


def test_speed_ratios_are_read_from_the_rows(benchmark_script):
    ratios = benchmark_script("repro_pretrained")._speed_ratios
    rows = {"sdpa": {"1024": 1.0, "4096": 4.0}, "qkv-softmax": {"1024": 1.1, "4096": 4.4},
            "qkv-bench-window": {"1024": 0.5, "4096": 1.0, "16384": 2.0}, "qkv-bench-lsh": {}}
    text = ratios(rows, ["1024", "4096", "16384"])
    # the longest length both reached (window's 16384 has no sdpa time), sorted fastest first
    assert "`qkv-bench-window` 0.25 at 4096, `qkv-softmax` 1.10 at 4096" in text and "1 of 2 faster" in text
    assert ratios({"sdpa": {}}, ["1024"]).startswith("No kernel")
