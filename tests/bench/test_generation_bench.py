"""qkv bench generation: the Linear Transformer's state has the same size at every context, GPT's
KV cache grows with it; results are written with the machine."""

import json

from qkv.bench import main


def test_generation_bench_state_flat_vs_kv_cache(tmp_path):
    assert main(["generation", "--contexts", "8", "32", "--d-model", "16", "--heads", "2", "--layers", "1",
                 "--vocab", "11", "--target-seconds", "0", "--threads", "1", "--no-plot", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "generation.json").read_text())
    linear, gpt = (results["models"][name]["points"] for name in results["models"])
    assert linear[0]["state_bytes"] == linear[1]["state_bytes"] > 0
    # K and V of 1 layer: (B, H, L, E) float32 each
    assert [p["state_bytes"] for p in gpt] == [2 * 2 * L * 8 * 4 for L in (8, 32)]
    assert "machine" in results and (tmp_path / "generation.md").exists()
