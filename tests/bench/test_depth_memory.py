"""``qkv bench depth-memory``: a smoke run writes its results, and reversible layers' peak memory
grows less with depth than the ordinary residual stack's."""

import json

from qkv.bench import main


def test_quick_run_writes_results(tmp_path):
    assert main(["depth-memory", "--quick", "--threads", "1", "--out", str(tmp_path), "--length", "64", "--d-model", "32",
                 "--d-ff", "64", "--heads", "2", "--bucket-size", "8", "--ff-chunk-size", "16"]) == 0
    res = json.loads((tmp_path / "depth_memory.json").read_text())
    ratio = {(p["reversible"], p["depth"]): p["memory_vs_shallowest"] for p in res["points"]}
    assert set(ratio) == {(True, 1), (True, 2), (False, 1), (False, 2)}
    assert ratio[(True, 2)] < ratio[(False, 2)]
    assert "reversible" in (tmp_path / "depth_memory.md").read_text()
