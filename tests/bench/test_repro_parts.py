"""The reproduction parts added for issue 23's untested claims, smoke-run with ``--quick``: each arm
trains and is scored, results land in the smoke or run folder, and claims.json is never touched;
``_repro.replace_section`` puts a marked section on a page once and then replaces it in place."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from qkv.tasks import data

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "reproductions" / "claims.json"


def test_replace_section_inserts_once_then_replaces(benchmark_script, tmp_path):
    repro = benchmark_script("_repro")
    page = tmp_path / "page.md"
    page.write_text("# title\n\n## What this shows\n\nend\n")
    marks = ("<!-- s -->", "<!-- /s -->")
    repro.replace_section(page, "<!-- s -->\nfirst\n<!-- /s -->", marks, "## What this shows")
    text = page.read_text()
    assert text.index("first") < text.index("## What this shows") and text.count("<!-- s -->") == 1
    repro.replace_section(page, "<!-- s -->\nsecond\n<!-- /s -->", marks, "## What this shows")
    text = page.read_text()
    assert "second" in text and "first" not in text and text.count("<!-- /s -->") == 1
    assert text.startswith("# title") and text.rstrip().endswith("end")
    other = tmp_path / "other.md"  # no anchor on the page: the section goes at the end
    other.write_text("# other\n")
    repro.replace_section(other, "<!-- s -->\nx\n<!-- /s -->", marks, "## missing")
    assert other.read_text().rstrip().endswith("<!-- /s -->")


def smoke_in(script, monkeypatch, tmp_path) -> Path:
    """Send a --quick run's folder into ``tmp_path/smoke`` and the published run directories into
    ``tmp_path/published`` (which a smoke run must leave alone); returns the smoke folder."""
    smoke = tmp_path / "smoke"
    (smoke / "img").mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(script, "smoke_dir", lambda name: smoke)
    monkeypatch.setattr(script, "OUT", tmp_path / "published")
    return smoke


def quick_rnn_parts(script, monkeypatch, tmp_path, parts: str) -> dict:
    smoke = smoke_in(script, monkeypatch, tmp_path)
    monkeypatch.setattr(sys, "argv", ["repro_rnn_attention.py", "--quick", "--parts", parts])
    script.main()
    assert not (tmp_path / "published").exists()  # the published run directories are not overwritten
    return json.loads(next((smoke / "runs").glob("results-quick-*.json")).read_text())


@pytest.mark.skipif(not all(data.is_cached(name) for name in ("shakespeare", "mnist")),
                    reason="run `qkv data fetch shakespeare mnist`")
def test_rnn_parts_lstmn_and_hard(benchmark_script, monkeypatch, tmp_path):
    before = CLAIMS.read_text()
    results = quick_rnn_parts(benchmark_script("repro_rnn_attention"), monkeypatch, tmp_path, "lstmn,hard")
    lstmn = results["lstmn"]["per_seed"]
    assert set(lstmn) == {"lstmn", "lstm"} and all(r["bpc"] > 0 for runs in lstmn.values() for r in runs)
    hard = results["digit-captions-hard"]["per_seed"]
    assert set(hard) == {"soft", "hard", "mean-image", "image-blind"} and all(r["loss"] > 0 for runs in hard.values() for r in runs)
    assert CLAIMS.read_text() == before


def test_rnn_part_hull_pointer_against_dictionary(benchmark_script, monkeypatch, tmp_path):
    before = CLAIMS.read_text()
    results = quick_rnn_parts(benchmark_script("repro_rnn_attention"), monkeypatch, tmp_path, "hull")
    hull = results["pointer-hull"]["per_seed"]
    assert set(hull) == {"pointer", "vocabulary"}
    assert all(0 <= r["exact_match"] <= 1 and r["loss"] > 0 for runs in hull.values() for r in runs)
    assert CLAIMS.read_text() == before


@pytest.mark.skipif(not data.is_cached("bible"), reason="run `qkv data fetch bible`")
def test_rnn_part_transformer_vs_rnn(benchmark_script, monkeypatch, tmp_path):
    before = CLAIMS.read_text()
    results = quick_rnn_parts(benchmark_script("repro_rnn_attention"), monkeypatch, tmp_path, "transformer-vs-rnn")
    vs = results["transformer-vs-rnn"]["per_seed"]
    assert set(vs) == {"transformer", "rnn"} and all(0 <= r["chrf"] <= 100 for runs in vs.values() for r in runs)
    sweep = results["transformer-vs-rnn"]["sweep"]  # each arm at the lr of its lowest validation loss
    for name, runs in sweep.items():
        assert len(runs) == 3 and vs[name][0]["lr"] == min(runs, key=lambda r: r["valid_loss"])["lr"]
    assert CLAIMS.read_text() == before


def test_adaptive_ut_vs_transformer_quick(benchmark_script, monkeypatch, tmp_path, capsys):
    before = CLAIMS.read_text()
    script = benchmark_script("repro_adaptive")
    smoke = smoke_in(script, monkeypatch, tmp_path)
    monkeypatch.setattr(sys, "argv", ["repro_adaptive.py", "--quick", "--part", "ut-vs-transformer"])
    script.main()
    out = capsys.readouterr().out
    assert "ut-vs-transformer ut" in out and "ut-vs-transformer transformer" in out
    assert not (tmp_path / "published").exists() and (smoke / "runs").is_dir()  # a smoke run publishes nothing
    assert CLAIMS.read_text() == before


def test_pooling_memory_san_and_memn2n_quick(benchmark_script, monkeypatch, tmp_path):
    before = CLAIMS.read_text()
    script = benchmark_script("repro_pooling_memory")
    monkeypatch.setattr(script, "OUT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["repro_pooling_memory.py", "--quick", "--only", "san", "memn2n", "--seeds", "1"])
    script.main()
    results = json.loads(script.RESULTS.read_text())
    assert script.RESULTS.parent != ROOT / "docs" / "reproductions"
    assert set(results["san"]["accuracy"]) == {"2", "1"}
    assert set(results["memn2n"]["accuracy"]) == {f"{t}/{k}" for t in ("adjacent", "layer-wise") for k in (1, 2, 3)}
    page = script.DOC.read_text()
    assert "Stacked attention: 2 layers against 1" in page and "| layer-wise | " in page
    assert CLAIMS.read_text() == before


def test_nw_budgets_train_the_width_longer_and_become_curve_points(benchmark_script, monkeypatch):
    """``--nw-budgets``: the learned NW width trained for other numbers of updates against the same
    leave-one-out-tuned grid width, one value per data seed; bad budgets are refused before anything runs."""
    script = benchmark_script("repro_pooling_memory")
    monkeypatch.setattr(script, "train", lambda model, task, name, steps, *a, **kw: model.w.data.fill_(1.0 + steps))
    short, long = script.nw_against_tuned_width(2, steps=1), script.nw_against_tuned_width(2, steps=40)
    assert short["learned_w"] == [2.0, 2.0] and long["learned_w"] == [41.0, 41.0]
    assert short["tuned"] == long["tuned"] and short["tuned_w"] == long["tuned_w"]  # the grid does not train
    assert short["learned"] != long["learned"]
    for bad in (["--nw-budgets", "0"], ["--budgets", "-5"], ["--seeds", "0"]):
        monkeypatch.setattr(sys, "argv", ["repro_pooling_memory.py", "--quick", "--only", "seeded", *bad])
        monkeypatch.setattr(script, "SECTIONS", {k: lambda: pytest.fail("ran") for k in script.SECTIONS})  # nothing may run
        with pytest.raises(SystemExit):
            script.main()


@pytest.mark.skipif(not data.is_cached("shakespeare"), reason="run `qkv data fetch shakespeare`")
def test_long_context_budget_curves(benchmark_script, monkeypatch):
    """``--only lm_budgets tmaze_depth``: the memory sweep after more updates and the T-maze with
    deeper stacks become points of the four claims' curves, and lines of the page."""
    script = benchmark_script("repro_long_context")
    budgets = script.section_lm_budgets(True, 1, [40])
    (point,) = budgets.values()
    assert point["memories"][0] == 0 and len(point["per_seed"][0]["xl_bpc"]) == len(point["memories"])
    depth = script.section_tmaze_depth(True, [3])
    assert set(depth["runs"]) == {"gtrxl", "xl-post-ln"} and len(depth["runs"]["gtrxl"]["3"]) == len(depth["seeds"])
    # three seeds' worth of the same numbers, to pass the claims' seed count
    points = []
    monkeypatch.setattr(script.claims, "add_point", lambda cid, budget, ours, base: points.append((cid, budget, ours, base)))
    point["per_seed"] *= 3
    depth["seeds"] = [0, 1, 2]
    for kind in depth["runs"]:
        depth["runs"][kind]["3"] = (depth["runs"][kind]["3"] * 3)[:3]
    script.record_curves({"lm_budgets": budgets, "tmaze_depth": depth}, ["lm_budgets", "tmaze_depth"])
    assert [(cid, budget) for cid, budget, _, _ in points] == [
        ("transformer-xl-lm", "20 updates"), ("transformer-xl-memory", "20 updates"),
        ("gtrxl-vs-trxl-stability", "3 layers"), ("gtrxl-vs-trxl-speed", "3 layers")]
    memory = points[1]
    assert memory[2] == [r["xl_bpc"][-1] for r in point["per_seed"]] and memory[3] == [r["xl_bpc"][1] for r in point["per_seed"]]
    assert all(x <= depth["updates"] for x in points[3][2])  # a seed that never solved counts the budget
    text = "\n".join(script._lm_budgets_lines(budgets) + script._tmaze_depth_lines(depth))
    assert "| 20 |" in text and "| 3 |" in text


@pytest.mark.skipif(not data.is_cached("enwiki"), reason="run `qkv data fetch enwiki`")
def test_reformer_lm_seeds_and_budgets_stay_out_of_the_docs(benchmark_script, monkeypatch):
    """``repro_reformer.py --quick --only lm --lm-budgets``: both models trained per seed and per
    budget, the page's seed table rendered from them, and nothing written under docs/."""
    script = benchmark_script("repro_reformer")
    doc = script.DOC
    page, claims_before = doc.read_text(), CLAIMS.read_text()
    monkeypatch.setattr(sys, "argv", ["repro_reformer.py", "--quick", "--only", "lm", "--seeds", "1", "--lm-budgets", "7"])
    script.main()
    assert script.DOC != doc and doc.read_text() == page and CLAIMS.read_text() == claims_before
    args = argparse.Namespace(quick=True, seed=0, seeds=3, lm_steps=250, lm_budgets=[7], only=["lm"])
    results = {"lm": script.run_seeds(lambda a: script.language_model(a, plot=False), args)}
    script.run_lm_budgets(args, results)
    ours, base = script.lm_bpb(results["lm_budgets"]["7"]["per_seed"])
    assert len(ours) == len(base) == 3 and all(x > 0 for x in ours + base)
    table = "\n".join(script.lm_seed_lines(results))
    assert "| 5 | 3 |" in table and "| 7 | 3 |" in table


@pytest.mark.skipif(not data.is_cached("enwiki"), reason="run `qkv data fetch enwiki`")
def test_reformer_ablation_arms_train_and_split_the_gap(benchmark_script, monkeypatch):
    """``--only ablation``: the reversible and reversible-shared-QK arms train per seed; the table and
    the reading split the Reformer's gap to the GPT into the parts, from the runs with the same steps."""
    script = benchmark_script("repro_reformer")
    args = argparse.Namespace(quick=True, seed=0, seeds=3, lm_steps=7, only=["ablation"], arms=list(script.ABLATION))
    results = {"lm": {"steps": 250, "seeds": [0, 1, 2], "per_seed": []}}
    script.run_lm_ablation(args, results)
    runs = results["lm_ablation"]["per_seed"]
    assert [r["seed"] for r in runs] == [0, 1, 2] and all(set(r["models"]) == set(script.ABLATION) for r in runs)
    assert "not measured" in script.ablation_reading(results)  # no GPT / Reformer runs at 7 steps yet
    gpt, reformer = {0: 3.0, 1: 3.2, 2: 3.1}, {0: 3.5, 1: 3.6, 2: 3.7}
    for r in runs:  # fixed numbers for the arithmetic: reversible +0.1, shared-QK +0.1 more
        r["models"]["reversible"]["test_bpb"] = gpt[r["seed"]] + 0.1
        r["models"]["reversible-shared-qk"]["test_bpb"] = gpt[r["seed"]] + 0.2
    results["lm_budgets"] = {"7": {"per_seed": [{"seed": s, "models": {"gpt": {"test_bpb": gpt[s]},
                                                                     "reformer": {"test_bpb": reformer[s]}}} for s in gpt]}}
    table = "\n".join(script.ablation_lines(results))
    assert "| reversible | reversible layers, exact softmax | 3.20 ± 0.06 | +0.100 ± 0.000 |" in table
    assert "| reformer |" in table and "+0.500 ± 0.058" in table
    reading = script.ablation_reading(results)
    assert "+0.500" in reading and "reversible layers alone +0.100" in reading and "adding LSH +0.300" in reading
    assert "gap (+0.500) splits into reversible layers +0.100, shared-QK +0.100, LSH +0.300" in script.ablation_why(results)
    assert "eq. 1's scores" not in reading

    # the arms with eq. 1's scores, run later at the same steps: added beside the others, which stay
    args.arms = list(script.EQ1_ARMS)
    script.run_lm_ablation(args, results)
    runs = results["lm_ablation"]["per_seed"]
    assert all(set(r["models"]) == {*script.ABLATION, *script.EQ1_ARMS} for r in runs)
    assert all(r["models"]["reversible"]["test_bpb"] == gpt[r["seed"]] + 0.1 for r in runs)  # kept, not rerun
    for r in runs:
        r["models"]["reversible-shared-qk-eq1"]["test_bpb"] = gpt[r["seed"]] + 0.12
        r["models"]["reformer-eq1"]["test_bpb"] = gpt[r["seed"]] + 0.25
    assert "| reformer-eq1 | as reformer, scores q·k/(‖k‖ sqrt(d)) (eq. 1) |" in "\n".join(script.ablation_lines(results))
    reading = script.ablation_reading(results)
    assert "shared-QK costs +0.020 instead of +0.100, and the Reformer is +0.250 from the GPT" in reading
    recorded = []
    monkeypatch.setattr(script.claims, "record", lambda **fields: recorded.append(fields))
    script.record_shared_qk_claim(results)
    (claim,) = recorded
    assert claim["id"] == "reformer-shared-qk" and claim["ours"] == [gpt[s] + 0.2 for s in (0, 1, 2)]
    assert claim["baseline"] == [gpt[s] + 0.1 for s in (0, 1, 2)] and "score_scale=None" in claim["why"]["not reproduced"]
    assert claim["command"].endswith("--arms reversible reversible-shared-qk reversible-shared-qk-eq1")


def test_with_budgets_runs_the_main_budget_then_each_larger_one(benchmark_script):
    script = benchmark_script("repro_rnn_attention")
    calls = []
    args = argparse.Namespace(budgets=[200, 400], budgets_only=False, tsp_steps=100)
    script.with_budgets(args, "tsp_steps", lambda point: calls.append((args.tsp_steps, point)))
    assert calls == [(100, False), (200, True), (400, True)] and args.tsp_steps == 100
    calls.clear()
    args.budgets_only = True
    script.with_budgets(args, "tsp_steps", lambda point: calls.append((args.tsp_steps, point)))
    assert calls == [(200, True), (400, True)]


def test_rnn_part_tsp_seeds_and_budget(benchmark_script, monkeypatch, tmp_path):
    script = benchmark_script("repro_rnn_attention")
    before = CLAIMS.read_text()
    smoke = smoke_in(script, monkeypatch, tmp_path)
    monkeypatch.setattr(sys, "argv", ["repro_rnn_attention.py", "--quick", "--parts", "tsp", "--seeds", "2",
                                      "--budgets", "5"])
    script.main()
    assert not (tmp_path / "published").exists()
    results = json.loads(next((smoke / "runs").glob("results-quick-*.json")).read_text())
    assert [r["seed"] for r in results["tsp"]["per_seed"]] == [0, 1] and len(results["tsp-5"]["per_seed"]) == 2
    assert all(r["valid"] == 1.0 and r["tour_ratio"] >= 1.0 for r in results["tsp"]["per_seed"])
    assert results["tsp"]["nearest_neighbour_ratio"] >= 1.0
    assert CLAIMS.read_text() == before


def test_bert_quick_clears_its_smoke_folder_not_the_published_runs(benchmark_script, monkeypatch, tmp_path):
    """repro_bert starts by clearing its run folder: a --quick run once cleared runs/repro_bert."""
    script = benchmark_script("repro_bert")
    smoke = smoke_in(script, monkeypatch, tmp_path)
    (tmp_path / "published").mkdir()
    (smoke / "runs").mkdir()
    removed = []

    class Stop(Exception):
        pass

    def rmtree(path, *args, **kwargs):
        removed.append(Path(path))
        raise Stop  # what was to be cleared is all this test needs

    monkeypatch.setattr(script.shutil, "rmtree", rmtree)
    monkeypatch.setattr(sys, "argv", ["repro_bert.py", "--quick"])
    with pytest.raises(Stop):
        script.main()
    assert removed == [smoke / "runs"] and (tmp_path / "published").is_dir()


def test_window_cost_quick_fits_exponents_and_publishes_nothing(benchmark_script, capsys):
    before = CLAIMS.read_text()
    script = benchmark_script("repro_sparse_image")
    page = (ROOT / "docs" / "reproductions" / "sparse-image.md").read_text()
    script.main(["--only", "window-cost", "--quick", "--seeds", "1"])
    out = capsys.readouterr().out
    assert "seed 0 window: time ~ L^" in out and "| window | " in out and "| softmax | " in out
    assert CLAIMS.read_text() == before and script.DOC != ROOT / "docs" / "reproductions" / "sparse-image.md"
    assert (ROOT / "docs" / "reproductions" / "sparse-image.md").read_text() == page


def test_the_captioner_without_attention_sees_the_mean_image(benchmark_script):
    import torch

    script = benchmark_script("repro_rnn_attention")
    torch.manual_seed(0)
    config = script.ShowAttendTellConfig(vocab_size=14)
    mean_model, full_model = script.MeanImageCaptioner(config), script.ShowAttendTell(config)
    full_model.load_state_dict(mean_model.state_dict())
    images = torch.rand(2, 1, 28, 84)
    a, grid = mean_model.encode(images)
    full, _ = full_model.encode(images)
    assert a.shape == full.shape and grid[0] * grid[1] == a.shape[1]
    assert torch.allclose(a, full.mean(1, keepdim=True).expand_as(full))  # every cell the image's mean vector
    assert not torch.allclose(a[0, 0], a[1, 0])  # and that vector depends on the image


def test_adaptive_ut_length_quick_trains_short_and_tests_longer(benchmark_script, monkeypatch, tmp_path, capsys):
    before = CLAIMS.read_text()
    script = benchmark_script("repro_adaptive")
    smoke_in(script, monkeypatch, tmp_path)
    monkeypatch.setattr(sys, "argv", ["repro_adaptive.py", "--quick", "--part", "ut-length", "--digits", "1"])
    script.main()
    out = capsys.readouterr().out
    assert "ut-length ut" in out and "ut-length transformer" in out and "longer_exact_match" in out
    assert not (tmp_path / "published").exists()
    assert CLAIMS.read_text() == before  # a smoke run records no claim
