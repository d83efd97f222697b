"""``qkv bench lra`` end to end at smoke size (no timed asserts): the results file, the page, the
plot, resuming per (task, kernel, seed), and the reading's logic."""

from __future__ import annotations

import json

import pytest

from qkv.bench import lra as bench_lra
from qkv.bench import main
from qkv.tasks.bbc import is_bbc_cached
from qkv.tasks.data import is_cached

FAST = ["lra", "--quick", "--threads", "1", "--no-speed", "--tasks", "listops", "pathfinder",
        "--models", "softmax", "linear", "local-2d"]


def _cells(out):
    return json.loads((out / "lra-results.json").read_text())["cells"]


def test_quick_writes_results_page_and_plot_then_resumes(tmp_path):
    out = tmp_path / "lra"
    assert main(FAST + ["--out", str(out)]) == 0
    cells = _cells(out)
    # local-2d needs an image: it runs on pathfinder only
    assert sorted(cells) == ["listops|linear|0", "listops|softmax|0", "pathfinder|linear|0", "pathfinder|local-2d|0",
                             "pathfinder|softmax|0"]
    for cell in cells.values():
        assert 0.0 <= cell["test_accuracy"] <= 1.0 and cell["test_examples"] == 8
        assert cell["train_loss_curve"] and cell["seconds"] > 0
    page = (out / "lra.md").read_text()
    assert "Table 1" in page and "36.37" in page and "machine:" in page and "brackets kept" in page
    assert "## Reading" in page and "| `softmax` | Transformer |" in page
    assert (out / "img" / "lra.png").stat().st_size > 1000
    assert not (out / "runs" / "listops" / "softmax" / "seed0" / "checkpoints").exists()

    # a finished cell is skipped; a missing one (an interrupted run) is trained again
    results = json.loads((out / "lra-results.json").read_text())
    dropped = results["cells"].pop("listops|linear|0")
    (out / "lra-results.json").write_text(json.dumps(results))
    assert main(FAST + ["--out", str(out)]) == 0
    again = _cells(out)
    assert {k: c["date"] for k, c in again.items() if k != "listops|linear|0"} == \
        {k: c["date"] for k, c in cells.items() if k != "listops|linear|0"}
    assert again["listops|linear|0"]["test_accuracy"] == dropped["test_accuracy"]  # the same cell, deterministic
    # each invocation is recorded with the cells it trained, and the page lists them
    invocations = json.loads((out / "lra-results.json").read_text())["invocations"]
    assert [i["cells_run"] for i in invocations] == [5, 1]
    assert "cells trained" in (out / "lra.md").read_text()

    # a changed setting runs the cells it touches again
    assert main(FAST + ["--out", str(out), "--set", "listops.max_len=48"]) == 0
    changed = _cells(out)
    assert changed["listops|softmax|0"]["settings"]["task_options"]["max_len"] == 48
    assert changed["pathfinder|softmax|0"]["date"] == cells["pathfinder|softmax|0"]["date"]


def test_jobs_train_cells_in_worker_processes_with_the_same_results(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(FAST + ["--out", str(one)]) == 0
    assert main(FAST + ["--out", str(two), "--jobs", "2"]) == 0
    a, b = _cells(one), _cells(two)
    assert sorted(a) == sorted(b)
    for key in a:  # the same cell, trained in another process: the same numbers
        assert b[key]["test_accuracy"] == a[key]["test_accuracy"] and b[key]["train_loss_curve"] == a[key]["train_loss_curve"]
    assert json.loads((two / "lra-results.json").read_text())["invocations"][0]["cells_run"] == 5
    assert "Table 1" in (two / "lra.md").read_text()


def test_bad_arguments_say_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["lra", "--quick", "--models", "relative", "--out", str(tmp_path)])
    assert "relative" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["lra", "--quick", "--set", "listops=3", "--out", str(tmp_path)])
    assert "TASK.OPTION=VALUE" in capsys.readouterr().err
    for flag in ("--jobs", "--steps", "--batch-size", "--eval-examples", "--speed-batch"):  # one line, no traceback
        with pytest.raises(SystemExit):
            main(["lra", "--quick", flag, "0", "--out", str(tmp_path)])
        assert f"{flag} must be > 0, got 0" in capsys.readouterr().err
    for value in ("0", "-1e-3"):
        with pytest.raises(SystemExit):
            main(["lra", "--quick", f"--lr={value}", "--out", str(tmp_path)])
        assert f"--lr must be a positive finite number, got {float(value)}" in capsys.readouterr().err
    for value in ("nan", "inf"):
        with pytest.raises(SystemExit):
            main(["lra", "--quick", f"--lr={value}", "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert "--lr" in err and "finite" in err and "Traceback" not in err  # nan / inf: argparse's finite check


@pytest.mark.skipif(not is_bbc_cached(), reason="needs `qkv data fetch bbc`")
def test_a_bad_task_option_is_refused_before_any_cell_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_lra, "_train_cells", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(SystemExit):
        main(["lra", "--quick", "--no-speed", "--tasks", "bbc-match", "--set", "bbc-match.unit=chars",
              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "unit must be one of ('bytes', 'words'), got 'chars'" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "lra-results.json").exists()


def test_model_fields_reach_the_cells_and_the_page_and_old_cells_stay_valid(tmp_path):
    """--set model.FIELD=VALUE: every cell's encoder takes it, its settings record it (so a cell
    trained without it runs again) and the setup table names it; a cell cached before
    ``pair_features`` existed has the settings of a run that leaves it at its default."""
    import torch

    cpu = torch.device("cpu")
    plan = bench_lra._plan(bench_lra_args(["--quick", "--tasks", "bbc-match", "--set", "model.pair_features=abs-diff",
                                           "--set", "model.mlp_dim=32"]))["bbc-match"]
    assert dict(plan.model) == {"pair_features": "abs-diff", "mlp_dim": 32}
    settings = bench_lra._cell_settings(plan, cpu)
    assert settings["model"]["pair_features"] == "abs-diff" and settings["model"]["mlp_dim"] == 32
    default = bench_lra._plan(bench_lra_args(["--quick", "--tasks", "bbc-match"]))["bbc-match"]
    assert "pair_features" not in bench_lra._cell_settings(default, cpu)["model"]  # what cached cells recorded
    at_default = bench_lra._plan(bench_lra_args(["--quick", "--tasks", "bbc-match",
                                                 "--set", "model.pair_features=lra"]))["bbc-match"]
    assert bench_lra._cell_settings(at_default, cpu) == bench_lra._cell_settings(default, cpu)
    assert settings != bench_lra._cell_settings(default, cpu)
    results = _two_tasks(listops=(0.38, 0.30), pathfinder=(0.50, 0.51))
    for cell in results["cells"].values():
        cell["settings"] = {"task_options": {}, "steps": 100, "batch_size": 32, "lr": 1e-3,
                            "model": settings["model"] if cell["task"] == "listops" else
                            bench_lra._cell_settings(default, cpu)["model"]}
    setup = "\n".join(bench_lra._setup_sections(results))
    assert setup.count("**encoder: ") == 1 and "**encoder: mlp_dim=32, pair_features=abs-diff**" in setup
    # the page's description of the two-tower head follows what its Retrieval cells read
    for heads, expected in ((["lra"], "reading `[u, v, u*v, u-v]` for Retrieval"),
                            (["abs-diff"], "reading `[u, v, u*v, |u-v|]` (`pair_features=abs-diff`, not LRA's head) for"),
                            (["lra", "abs-diff"], "reading `[u, v, u*v, u-v]` or `[u, v, u*v, |u-v|]`")):
        pairs = _fake({("bbc-match", f"k{i}"): 0.6 for i in range(len(heads))}, majority=0.5)
        for cell, head in zip(pairs["cells"].values(), heads):
            cell["settings"] = {"task_options": {}, "steps": 100, "batch_size": 32, "lr": 1e-3,
                                "model": {**bench_lra._model_defaults(),
                                          **({} if head == "lra" else {"pair_features": head})}}
        assert expected in "\n".join(bench_lra._setup_sections(pairs)), heads


@pytest.mark.skipif(not is_bbc_cached(), reason="needs `qkv data fetch bbc`")
def test_pair_features_run_on_retrieval_and_are_refused_elsewhere_before_any_cell_trains(tmp_path, capsys,
                                                                                        monkeypatch):
    out = tmp_path / "out"
    assert main(["lra", "--quick", "--threads", "1", "--no-speed", "--tasks", "bbc-match", "--models", "softmax",
                 "--set", "model.pair_features=abs-diff", "--out", str(out)]) == 0
    cell = _cells(out)["bbc-match|softmax|0"]
    assert cell["settings"]["model"]["pair_features"] == "abs-diff"
    assert "pair_features=abs-diff" in (out / "lra.md").read_text()
    monkeypatch.setattr(bench_lra, "_train_cells", lambda *a, **k: pytest.fail("trained before refusing"))
    for argv, expected in (
            (["--tasks", "listops", "bbc-match", "--set", "model.pair_features=abs-diff"],
             "--set model (listops): pair_features is a field of the two-tower model's config (task bbc-match) only"),
            (["--tasks", "bbc-match", "--set", "model.pair_features=absdiff"],
             "pair_features must be one of ['abs-diff', 'lra'], got 'absdiff'"),
            (["--tasks", "bbc-match", "--set", "model.max_len=9"], "--set model.max_len: the task"),
            (["--tasks", "bbc-match", "--set", "model.attention=linear"], "--set model.attention: the task (or --models"),
            (["--tasks", "bbc-match", "--set", "model.d_model=63"], "d_model (63) must be divisible by n_heads (2)"),
            (["--tasks", "bbc-match", "--set", "model.nope=1"], "unknown --set model option 'nope'")):
        with pytest.raises(SystemExit):
            main(["lra", "--quick", "--no-speed"] + argv + ["--out", str(tmp_path / "refused")])
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, (argv, err)
        assert not (tmp_path / "refused" / "lra-results.json").exists()


def test_lr_reaches_the_cells_and_the_page(tmp_path):
    """--lr is every cell's peak learning rate: recorded in its settings (a cell at another lr is
    trained again), and the setup table names it when it is not the plan's 1e-3."""
    args = bench_lra_args(["--quick", "--tasks", "listops", "--lr", "3e-4"])
    plan = bench_lra._plan(args)
    assert plan["listops"].lr == 3e-4
    assert bench_lra._cell_settings(plan["listops"], __import__("torch").device("cpu"))["lr"] == 3e-4
    assert bench_lra._plan(bench_lra_args(["--quick", "--tasks", "listops"]))["listops"].lr == 1e-3
    results = _two_tasks(listops=(0.38, 0.30), pathfinder=(0.50, 0.51))
    for cell in results["cells"].values():
        cell["settings"] = {"task_options": {}, "steps": 100, "batch_size": 32,
                            "lr": 3e-4 if cell["task"] == "listops" else 1e-3}
    setup = "\n".join(bench_lra._setup_sections(results))
    assert "| 100 x 32, lr 0.0003 |" in setup and "| 100 x 32 |" in setup  # the plan's lr is not repeated


@pytest.mark.skipif(not (is_bbc_cached() and is_cached("fashion-mnist")),
                    reason="needs `qkv data fetch bbc fashion-mnist`")
def test_quick_runs_every_task_and_kernel(tmp_path):
    out = tmp_path / "all"
    assert main(["lra", "--quick", "--threads", "1", "--out", str(out)]) == 0
    results = json.loads((out / "lra-results.json").read_text())
    assert len(results["cells"]) == 5 * 11 + 2  # local-2d on the two image tasks
    speed = results["speed"]
    assert {p["model"] for p in speed.values()} == set(bench_lra.MODELS) - {"local-2d"}
    assert all(p["steps_per_s"] > 0 and p["peak_memory_bytes"] > 0 for p in speed.values())
    page = (out / "lra.md").read_text()
    assert "stand-in" in page and "Speed and memory" in page and "5.7x" in page


def _fake(cells, n=1000, majority=0.2):
    results = {"cells": {}, "tasks": {}}
    for (task, model), acc in cells.items():
        results["cells"][f"{task}|{model}|0"] = {"task": task, "model": model, "seed": 0, "test_accuracy": acc,
                                                 "test_examples": n}
        results["tasks"][task] = {"test_examples": n, "majority": majority}
    return results


def test_reading_agrees_differs_or_declines():
    agree = _fake({("listops", "softmax"): 0.38, ("listops", "linear"): 0.17, ("listops", "performer"): 0.18,
                   ("listops", "local-1d"): 0.16})
    assert "**agrees**" in bench_lra._reading(agree, [0])[0]
    differ = _fake({("listops", "softmax"): 0.38, ("listops", "linear"): 0.37, ("listops", "performer"): 0.18})
    line = bench_lra._reading(differ, [0])[0]
    assert "**differs**" in line and "level: `linear` 37.00%" in line
    noise = _fake({("listops", "softmax"): 0.21, ("listops", "linear"): 0.19})
    assert "Cannot be judged" in bench_lra._reading(noise, [0])[0]
    path = _fake({("pathfinder", "softmax"): 0.70, ("pathfinder", "linear"): 0.69, ("pathfinder", "performer"): 0.75},
                 majority=0.5)
    assert "**agrees**" in bench_lra._reading(path, [0])[0]


def test_tasks_without_their_data_are_skipped_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "empty-cache"))
    out = tmp_path / "missing"
    assert main(["lra", "--quick", "--threads", "1", "--no-speed", "--models", "softmax", "--tasks", "listops",
                 "bbc-bytes", "--out", str(out)]) == 0
    assert list(_cells(out)) == ["listops|softmax|0"]
    assert "**Not run: `bbc-bytes`** — its data is not cached: run `qkv data fetch bbc`" in (out / "lra.md").read_text()


def test_speed_reading_is_computed_from_the_points():
    base = {4096: {"model": "softmax", "length": 4096, "steps_per_s": 1.0, "peak_memory_bytes": 100}}
    speed = [base[4096], {"model": "linear", "length": 4096, "steps_per_s": 4.0, "peak_memory_bytes": 150},
             {"model": "lsh", "length": 4096, "steps_per_s": 0.5, "peak_memory_bytes": 90}]
    text = bench_lra._speed_reading(speed, base, 4096)
    assert "1 of 2 kernels train faster" in text and "`linear` 4.00x" in text and "slowest `lsh` 0.50x" in text
    assert "1 of 2 need more peak memory" in text and "`linear` 1.50x" in text
    assert bench_lra._speed_reading(speed, {}, 4096) == ""


LISTOPS_PATH = [("listops", "ListOps"), ("pathfinder", "Pathfinder")]


def _two_tasks(listops, pathfinder):
    """softmax and linear on ListOps (majority 20% of 1000) and Pathfinder (majority 50% of 1000)."""
    results = _fake({("listops", "softmax"): listops[0], ("listops", "linear"): listops[1],
                     ("pathfinder", "softmax"): pathfinder[0], ("pathfinder", "linear"): pathfinder[1]})
    results["tasks"]["pathfinder"]["majority"] = 0.5
    return results


def _row(table, first):
    return next(line for line in table.splitlines() if line.startswith(f"| {first} |"))


def test_table_average_counts_only_the_learned_tasks():
    results = _two_tasks(listops=(0.38, 0.30), pathfinder=(0.50, 0.51))  # Pathfinder: 51% is within 2 SE of 50%
    ours, published = bench_lra._accuracy_sections(results, ["softmax", "linear"], LISTOPS_PATH, [0])
    assert _row(ours, "`softmax`").endswith("| 38.00 | 50.00 | 38.00 |")  # not (38 + 50) / 2
    assert "| kernel | LRA model | ListOps | Pathfinder | avg (ListOps) |" in ours
    assert bench_lra.learned(results, "listops", [0])[0] and not bench_lra.learned(results, "pathfinder", [0])[0]
    assert _row(ours, "`linear`").endswith("| 30.00 | 51.00 | 30.00 |")
    assert _row(ours, "learned?") == "| learned? |  | yes | no |  |"
    assert "Pathfinder left out, no kernel learned it" in ours
    # the paper's average over all five stays; beside it, its average over the tasks ours counts
    assert "| avg | avg (ListOps) |" in published
    assert _row(published, "Transformer").endswith("| 54.39 | 36.37 |")
    # the reading uses the same test
    listops, pathfinder = bench_lra._reading(results, [0])
    assert "**agrees**" in listops and "Cannot be judged" in pathfinder


def test_table_gives_no_average_when_no_task_was_learned():
    results = _two_tasks(listops=(0.21, 0.19), pathfinder=(0.50, 0.50))
    ours, published = bench_lra._accuracy_sections(results, ["softmax", "linear"], LISTOPS_PATH, [0])
    assert "avg" not in ours.split("\n\n")[2] and "**No task was learned by any kernel**, so no average" in ours
    assert _row(ours, "`softmax`") == "| `softmax` | Transformer | 21.00 | 50.00 |"
    assert _row(ours, "learned?") == "| learned? |  | no | no |"
    assert "avg (" not in published  # only the paper's own average
    assert "Cannot be judged" in bench_lra._reading(results, [0])[0]


def _saved_results(folder):
    """A results file as a run leaves it, without running one: two seeds of softmax and linear."""
    results = _two_tasks(listops=(0.38, 0.30), pathfinder=(0.50, 0.51))
    for key in list(results["cells"]):
        cell = results["cells"][key]
        cell.update(settings={"task_options": {}, "steps": 2, "batch_size": 4}, seconds=1.0)
        results["cells"][key.replace("|0", "|1")] = {**cell, "seed": 1, "test_accuracy": cell["test_accuracy"] + 0.02}
    results.update(machine={"cpu": "test cpu", "cores": 1, "torch_threads": 1, "device": "cpu", "device_name": "cpu",
                            "torch": "x", "python": "y"}, command="qkv bench lra --seeds 0 1", speed={})
    folder.mkdir()
    (folder / "lra-results.json").write_text(json.dumps(results))
    return (folder / "lra-results.json").read_bytes()


def test_report_only_writes_the_page_from_saved_results_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "saved"
    saved = _saved_results(out)
    page = tmp_path / "page.md"
    assert main(["lra", "--report-only", "--out", str(out), "--report", str(page)]) == 0
    text = page.read_text()
    assert "- command: `qkv bench lra --seeds 0 1`" in text  # the command that produced the results
    assert "Ours (2 seed(s); mean ± sd" in text and "| `softmax` | Transformer | 39.00 ± 1.41 |" in text
    assert "avg (ListOps)" in text
    assert (out / "lra-results.json").read_bytes() == saved and sorted(p.name for p in out.iterdir()) == \
        ["lra-results.json"]  # nothing trained, nothing rewritten
    assert main(["lra", "--report-only", "--seeds", "0", "--out", str(out), "--report", str(page)]) == 0
    assert "| `softmax` | Transformer | 38.00 |" in page.read_text()
    with pytest.raises(SystemExit):
        main(["lra", "--report-only", "--out", str(tmp_path / "none"), "--report", str(page)])
    assert "--report-only: no results at" in capsys.readouterr().err
    (out / "lra-results.json").write_text(json.dumps({"cells": {}, "machine": {}, "command": "c"}))
    with pytest.raises(SystemExit):
        main(["lra", "--report-only", "--out", str(out), "--report", str(page)])
    assert "holds no finished cells" in capsys.readouterr().err


def test_the_page_goes_beside_the_results_unless_report_names_another(tmp_path, monkeypatch):
    """Without --report the page is OUT/lra.md: a run started in some folder writes no
    docs/reproductions/lra.md there (it used to, over the published page when run in the repository)."""
    out = tmp_path / "saved"
    _saved_results(out)
    monkeypatch.chdir(tmp_path)
    assert main(["lra", "--report-only", "--out", str(out)]) == 0
    assert (out / "lra.md").is_file() and not (tmp_path / "docs").exists()


def bench_lra_args(argv):
    """``qkv bench lra ARGV`` parsed, as the command line parses it."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-out/lra")
    bench_lra.add_arguments(parser)
    return parser.parse_args(argv)



@pytest.mark.parametrize("value, expected", [
    ("model.n_layers=0", "n_layers must be > 0, got 0"),
    ("model.dropout=2", "dropout must be in [0, 1), got 2.0"),
    ("model.pair_features=", "pair_features must be one of ['abs-diff', 'lra'], got ''"),
    ("model.pair_features=abs-diff,lra", "got 'abs-diff,lra'"),
    ("model.=x", "or model.FIELD=VALUE, got 'model.=x'"),
    ("model.n_layers=abc", "--set model option n_layers must be an int, got 'abc'"),
    ("model.mlp_dim=-3", "mlp_dim must be > 0, got -3"),
    ("model.positional=nope", "unknown positional 'nope'"),
])
@pytest.mark.skipif(not is_bbc_cached(), reason="needs `qkv data fetch bbc`")
def test_hostile_model_fields_are_one_line_refusals(tmp_path, capsys, monkeypatch, value, expected):
    monkeypatch.setattr(bench_lra, "_train_cells", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(SystemExit):
        main(["lra", "--quick", "--no-speed", "--tasks", "bbc-match", "--set", value, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists() or not (tmp_path / "o" / "lra-results.json").exists()


@pytest.mark.skipif(not is_bbc_cached(), reason="needs `qkv data fetch bbc`")
def test_kill_9_while_cells_with_model_fields_are_saved_leaves_whole_results(tmp_path):
    """``kill -9`` at random moments of a run with ``--set model.pair_features=abs-diff`` over a
    results file of LRA's head: the file is always whole JSON, each cell whole, with the settings
    of one head or the other, and a run let finish holds only the new head's cells."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    base = [sys.executable, "-m", "qkv", "bench", "lra", "--quick", "--threads", "1", "--no-speed", "--tasks",
            "bbc-match", "--models", "softmax", "linear", "--seeds", "0", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(base, check=True, env=env, capture_output=True)  # LRA's head: the old state
    rng = random.Random(0)
    for _ in range(3):
        proc = subprocess.Popen(base + ["--set", "model.pair_features=abs-diff"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(4 + rng.random() * 4)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for key, cell in _cells(out).items():  # json.loads fails on a torn file
            assert {"test_accuracy", "settings", "seconds"} <= set(cell), key
            assert cell["settings"]["model"].get("pair_features", "lra") in ("lra", "abs-diff")
    subprocess.run(base + ["--set", "model.pair_features=abs-diff"], check=True, env=env, capture_output=True)
    cells = _cells(out)
    assert len(cells) == 4 and all(c["settings"]["model"]["pair_features"] == "abs-diff" for c in cells.values())
