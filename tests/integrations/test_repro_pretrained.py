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
    scratch = results["finetune"]["scratch"]  # the scratch arm's budget curve and its learning-rate sweep
    assert set(scratch["budgets"]) == {"2", "4"} and len(scratch["lr_sweep"]) == 2
    assert results["finetune"]["accuracy"]["random"] == scratch["budgets"]["4"]  # the claim's: the largest budget
    assert scratch["lr"] in [r["lr"] for r in scratch["lr_sweep"].values()]
    assert "| random (BERT's N(0, 0.02)) | 2 |" in page and "| random (BERT's N(0, 0.02)) | 4 |" in page
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


def _finetune_results(budgets, pretrained=(0.8, 0.82, 0.79), lr_sweep=None):
    stat = lambda xs: {"mean": sum(xs) / len(xs), "std": 0.01, "runs": list(xs)}
    return {"command": "python benchmarks/repro_pretrained.py --part finetune", "wall_seconds": 1.0, "majority_class": 0.25,
            "accuracy": {"pretrained": stat(pretrained), "random": stat(budgets[max(budgets, key=int)])},
            "scratch": {"budgets": {b: stat(v) for b, v in budgets.items()}, "lr": 1e-3, "sweep_seed": 0,
                        "lr_sweep": lr_sweep or {}, "warmup": {b: 1 for b in budgets}},
            "settings": {"steps": 30, "batch_size": 8, "lr": 1e-4, "warmup": 8, "max_len": 64, "seeds": [0, 1, 2],
                         "schedule": "cosine", "eval_examples": None}}


def test_finetune_claim_is_pretrained_against_the_largest_scratch_budget(benchmark_script, monkeypatch):
    script = benchmark_script("repro_pretrained")
    calls = []
    monkeypatch.setattr(script.claims, "record", lambda **kw: calls.append(("record", kw)))
    monkeypatch.setattr(script.claims, "add_point", lambda *a, **kw: calls.append(("point", a)))
    budgets = {"300": [0.6, 0.62, 0.58], "30": [0.23, 0.23, 0.23], "100": [0.3, 0.28, 0.33]}
    script.record_claims({"finetune": _finetune_results(budgets)}, measured=True)
    (kind, main), *points = calls
    assert kind == "record" and main["baseline"] == budgets["300"] and main["ours"] == [0.8, 0.82, 0.79]
    assert main["measured"] is True and "10x" in main["claim"] and "curve: 30, 100, 300" in main["budget"]
    assert "has left the majority-class prior (25.0%" in main["why"]["reproduced"]
    # the smaller budgets become curve points, in order, each against the same pre-trained runs
    assert points == [("point", ("bert-pretrained-finetune", "30 scratch steps", [0.8, 0.82, 0.79], budgets["30"])),
                      ("point", ("bert-pretrained-finetune", "100 scratch steps", [0.8, 0.82, 0.79], budgets["100"]))]


def test_finetune_page_shows_the_curve_and_whether_scratch_left_the_prior(benchmark_script, tmp_path):
    write_page = benchmark_script("repro_pretrained").write_page
    sweep = {"0.0003": {"lr": 3e-4, "valid": 0.4, "test": 0.41}, "0.001": {"lr": 1e-3, "valid": 0.6, "test": 0.58}}
    write_page({"finetune": _finetune_results({"30": [0.23] * 3, "300": [0.6, 0.62, 0.58]}, lr_sweep=sweep)},
               tmp_path / "p.md", quick=False)
    page = (tmp_path / "p.md").read_text()
    assert "| random (BERT's N(0, 0.02)) | 30 | 23.0 ± 1.0 |" in page and "| MiniLM (pretrained) | 30 |" in page
    assert "picked among 0.0003, 0.001 by validation accuracy at 300 steps" in page and "leaves the majority-class prior" in page
    assert "from 300 steps on" in page and "+20.3 points" in page
    write_page({"finetune": _finetune_results({"30": [0.23] * 3, "300": [0.26, 0.31, 0.24]})}, tmp_path / "q.md", quick=False)
    assert "has not left the majority-class prior (25.0%" in (tmp_path / "q.md").read_text()


def test_finetune_claim_with_too_few_seeds_adds_no_curve_point(benchmark_script, monkeypatch):
    script = benchmark_script("repro_pretrained")
    calls = []
    monkeypatch.setattr(script.claims, "record", lambda **kw: calls.append("record"))
    monkeypatch.setattr(script.claims, "add_point", lambda *a, **kw: calls.append("point"))
    script.record_claims({"finetune": _finetune_results({"30": [0.23], "300": [0.6]}, pretrained=(0.8,))})
    assert calls == ["record"]  # record pends it; add_point would fail on a claim not yet recorded
