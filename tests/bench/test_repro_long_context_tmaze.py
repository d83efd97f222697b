"""repro_long_context's T-maze section (issue 38): corridors whose cue lies beyond the junction's
direct span, every arm over a learning-rate x depth x seed grid, and the three GTrXL claims built
from one value per run of that grid."""

from __future__ import annotations

import copy
import sys

import pytest


def test_reach_of_the_xl_stack(benchmark_script):
    """Layer n sees its segment and the previous segment's memory: the junction of a corridor L sits
    in segment (L + 1) // S and n layers reach the cue at position 0 while that segment is <= n."""
    script = benchmark_script("repro_long_context")
    S = 4
    for n in (1, 2, 4):
        reach = script.tmaze_reach(S, n)
        assert (reach + 1) // S == n and (reach + 2) // S == n + 1
    assert script.tmaze_reach(8, 1) == 14  # the old page's "direct span" L <= 2S - 2


def test_tmaze_grid_and_claims(benchmark_script, monkeypatch, tmp_path):
    script = benchmark_script("repro_long_context")
    tm = script.section_tmaze(True)  # writes its figure to the temp folder, not docs/
    assert tm["direct"] == 6 and tm["lengths"] == list(range(1, 11))
    assert set(tm["runs"]) == {"gtrxl", "xl-post-ln", "lstm"}
    assert set(tm["runs"]["gtrxl"]) == {f"2/{lr:g}" for lr in tm["lrs"]}
    assert set(tm["runs"]["lstm"]) == {f"1/{lr:g}" for lr in tm["lrs"]}
    run = tm["runs"]["gtrxl"]["2/0.001"][0]
    assert set(run["by_length"]) == {str(L) for L in tm["lengths"]}
    # three seeds' worth, and a post-LN run that learns beyond the span while one that does not
    tm["seeds"] = [0, 1, 2]
    for kind in tm["runs"]:
        for cell in tm["runs"][kind]:
            tm["runs"][kind][cell] = [copy.deepcopy(r) for r in tm["runs"][kind][cell] * 3]
    good = tm["runs"]["xl-post-ln"]["2/0.001"][0]
    good["by_length"] = {str(L): 1.0 for L in tm["lengths"]}
    good["solved_at"] = 3
    recorded = {}
    monkeypatch.setattr(script.claims, "record", lambda **kw: recorded.__setitem__(kw["id"], kw))
    script.record_claims({"tmaze": tm}, "cmd", ["tmaze"])
    assert set(recorded) == {"gtrxl-vs-lstm-memory", "gtrxl-vs-trxl-speed", "gtrxl-vs-trxl-stability"}
    n_runs = len(tm["lrs"]) * len(tm["depths"]) * 3
    stab = recorded["gtrxl-vs-trxl-stability"]
    assert len(stab["ours"]) == len(stab["baseline"]) == n_runs and set(stab["baseline"]) <= {0.0, 1.0}
    assert sum(stab["baseline"]) == 1.0  # exactly the one run that learns beyond the span
    speed = recorded["gtrxl-vs-trxl-speed"]
    assert 3 in speed["baseline"] and all(x <= tm["updates"] for x in speed["ours"])
    mem = recorded["gtrxl-vs-lstm-memory"]
    assert len(mem["ours"]) == len(mem["baseline"]) == len(tm["lrs"]) * 3 and mem["better"] == "higher"
    beyond = [script.beyond_success(r, tm) for r in tm["runs"]["lstm"]["1/0.001"]]
    assert mem["baseline"][:3] == beyond and all(r["measured"] is True for r in recorded.values())
    # the page section renders from the same results
    monkeypatch.setattr(script, "DOC", tmp_path / "long-context.md")
    script.write_doc({"tmaze": tm}, "cmd")
    page = script.DOC.read_text()
    assert "cue beyond the attention span" in page and "L <= 6" in page and "| xl-post-ln | 2 |" in page


def test_a_diverged_run_fails_without_stopping_the_grid(benchmark_script, monkeypatch):
    """Non-finite logits (a learning rate too high for the wiring) end that run as not learned, instead
    of Categorical raising and losing the whole section."""
    import torch

    script = benchmark_script("repro_long_context")
    real = script.make_policy

    class Broken(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, obs):
            return self.inner(obs) * float("nan")

    monkeypatch.setattr(script, "make_policy", lambda *a, **k: Broken(real(*a, **k)))
    out = script.train_tmaze("gtrxl", 3, 0, 5, 4, 4, 2, 1e-2, [1, 2, 3], [1, 3])
    assert out["diverged_at"] == 1 and out["solved_at"] is None
    assert out["success"] == 0.0 and out["by_length"] == {"1": 0.0, "3": 0.0}


def test_tmaze_budgets_give_the_memory_claim_its_curve(benchmark_script, monkeypatch, tmp_path):
    """``--only tmaze_budgets``: section 2's 2-layer GTrXL and LSTM at more updates become one curve
    point of gtrxl-vs-lstm-memory, one value per run (greedy success beyond the direct span), and a
    table on the page."""
    script = benchmark_script("repro_long_context")
    tb = script.section_tmaze_budgets(True, [3])
    assert set(tb["budgets"]) == {"3"} and set(tb["budgets"]["3"]["runs"]) == {"gtrxl", "lstm"}
    assert set(tb["budgets"]["3"]["runs"]["gtrxl"]) == {f"2/{lr:g}" for lr in tb["lrs"]}
    tb["seeds"] = [0, 1, 2]
    for kind, cells in tb["budgets"]["3"]["runs"].items():
        for cell in cells:
            cells[cell] = [copy.deepcopy(r) for r in cells[cell] * 3]
    best = tb["budgets"]["3"]["runs"]["lstm"]["1/0.001"][0]
    best["by_length"] = {str(L): 1.0 for L in tb["lengths"]}  # one LSTM run learns beyond the span
    points = []
    monkeypatch.setattr(script.claims, "add_point", lambda *a, **kw: points.append(a))
    script.record_curves({"tmaze_budgets": tb}, ["tmaze_budgets"])
    ((claim, budget, ours, base),) = points
    assert claim == "gtrxl-vs-lstm-memory" and budget == "3 updates"
    assert len(ours) == len(base) == len(tb["lrs"]) * 3 and base[0] == 1.0
    assert ours == [script.beyond_success(r, tb) for c in tb["budgets"]["3"]["runs"]["gtrxl"].values() for r in c]
    script.record_curves({"tmaze_budgets": tb}, ["tmaze"])  # not run now: no point
    assert len(points) == 1
    lines = "\n".join(script._tmaze_budget_lines(tb, None))
    assert "| 3 | " in lines and "--tmaze-budgets 3" in lines


def test_bad_budgets_are_refused_before_anything_runs(benchmark_script, monkeypatch):
    script = benchmark_script("repro_long_context")
    monkeypatch.setattr(script, "section_tmaze_budgets", lambda *a: pytest.fail("ran"))
    for bad in (["--tmaze-budgets", "0"], ["--tmaze-budgets", "-3"], ["--lm-budgets", "0"], ["--depths", "0"],
                ["--seeds", "0"], ["--tmaze-budgets", "many"]):
        monkeypatch.setattr(sys, "argv", ["repro_long_context.py", "--quick", "--only", "tmaze_budgets", *bad])
        with pytest.raises(SystemExit) as e:
            script.main()
        assert e.value.code == 2
