"""``qkv bench context-parallel``: the bytes each strategy sends, as measured on the wire, equal its
formula; the results are written."""

import json

from qkv.bench import main


def test_quick_run_measures_the_formula_bytes(tmp_path, capsys):
    out = tmp_path / "cp"
    kernels = ("softmax", "window", "local-1d", "linear")
    assert main(["context-parallel", "--quick", "--threads", "1", "--kernels", *kernels,
                 "--ranks", "1", "2", "--length", "256", "--repeats", "1", "--out", str(out)]) == 0
    results = json.loads((out / "context_parallel.json").read_text())
    points = {(p["kernel"], p["P"]): p for p in results["points"]}
    assert set(points) == {(k, P) for k in kernels for P in (1, 2)}
    assert [points[k, 2]["strategy"] for k in kernels] == ["ring", "halo", "halo", "state"]
    # per-rank memory (deterministic) at P = 2 against one process: the ring passes its shards on in
    # place and copies no block (before: 1.25), the halo adds no rows outside the sequence and no mask
    # (0.82, 0.94), causal state passing keeps no features for its sums (0.68)
    bounds = {"softmax": 1.0, "window": 0.7, "local-1d": 0.8, "linear": 0.65}
    for k in kernels:
        assert points[k, 2]["memory_vs_fewest_ranks"] < bounds[k], (k, points[k, 2]["memory_vs_fewest_ranks"])
    for p in points.values():
        assert p["sent_forward_bytes"] == p["expected_forward_bytes"], p
        assert p["peak_memory_bytes"] > 0 and p["time_median_s"] > 0
    assert points["softmax", 2]["sent_forward_bytes"] > 0 and points["softmax", 1]["sent_forward_bytes"] == 0
    assert "| kernel | P | strategy" in (out / "context_parallel.md").read_text()


def test_bad_arguments_say_what_is_wrong(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["context-parallel", "--ranks", "3", "--length", "64", "--out", str(tmp_path / "x")])
    assert "multiple of 2P" in capsys.readouterr().err


def test_budget_reports_the_longest_length_that_fits(tmp_path, capsys):
    """``--budget-mb``: L doubles until a GPT step's per-rank peak exceeds the budget; the reported
    length fitted, the next did not; two ranks fit a longer sequence than one."""
    out = tmp_path / "budget"
    assert main(["context-parallel", "--quick", "--threads", "1", "--kernels", "softmax", "--ranks", "1", "2",
                 "--length", "64", "--heads", "2", "--head-dim", "8", "--budget-mb", "0.5",
                 "--out", str(out)]) == 0
    results = json.loads((out / "context_parallel_budget.json").read_text())
    points = {p["P"]: p for p in results["points"]}
    budget = 0.5 * 2**20
    for p in points.values():
        *fitted, over = p["tried"]
        assert [t["length"] for t in p["tried"]] == [64 * 2**i for i in range(len(p["tried"]))]
        assert all(t["peak_memory_bytes"] <= budget for t in fitted) and over["peak_memory_bytes"] > budget
        assert p["longest_length"] == (fitted[-1]["length"] if fitted else None)
    assert points[2]["strategy"] == "ring" and points[2]["longest_length"] > points[1]["longest_length"]
    assert "longest L, P=2" in (out / "context_parallel_budget.md").read_text()
