"""qkv bench generation: the Linear Transformer's state has the same size at every context, GPT's
KV cache grows with it; results are written with the machine."""

import json

from qkv.bench import main


def test_generation_bench_state_flat_vs_kv_cache(tmp_path):
    assert main(["generation", "--contexts", "8", "32", "--d-model", "16", "--heads", "2", "--layers", "1",
                 "--vocab", "11", "--target-seconds", "0", "--threads", "1", "--no-plot", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "generation.json").read_text())
    linear, gpt = (results["models"][name]["points"] for name in list(results["models"])[:2])
    assert linear[0]["state_bytes"] == linear[1]["state_bytes"] > 0
    # K and V of 1 layer: (B, H, L, E) float32 each
    assert [p["state_bytes"] for p in gpt] == [2 * 2 * L * 8 * 4 for L in (8, 32)]
    assert "machine" in results and (tmp_path / "generation.md").exists()


def test_generation_bench_sparse_states(tmp_path):
    """The local-1d GPT's cache stops growing past its block and memory; the strided Sparse
    Transformer's layers keep the band (A1) or every key (A2)."""
    assert main(["generation", "--contexts", "300", "600", "--d-model", "16", "--heads", "2", "--layers", "2",
                 "--vocab", "11", "--target-seconds", "0", "--threads", "1", "--no-plot", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "generation.json").read_text())
    local = next(v["points"] for k, v in results["models"].items() if "local-1d" in k)
    # at most block + memory = 256 positions of K and V, 2 layers, 2 heads of 8 floats, whatever the context
    assert max(p["state_bytes"] for p in local) <= 2 * 2 * 2 * 256 * 8 * 4
    sparse = next(v["points"] for k, v in results["models"].items() if "sparse" in k)
    assert sparse[0]["state_bytes"] < sparse[1]["state_bytes"]


def test_complexity_counts_flops_linear_in_length(tmp_path):
    """--count-flops: linear attention's work doubles with the length (exponent 1, free of timing noise)."""
    assert main(["complexity", "--attention", "linear", "--lengths", "64", "128", "256", "--count-flops",
                 "--heads", "1", "--head-dim", "8", "--target-seconds", "0", "--threads", "1", "--no-plot",
                 "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "complexity.json").read_text())["kernels"]["linear"]
    assert all(p["flops"] > 0 for p in rec["points"])
    assert abs(rec["fit"]["flops"]["exponent"] - 1.0) < 0.01
