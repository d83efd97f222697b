"""benchmarks/lra_merge.py: the results of one-cell runs (benchmarks/gpu_lra.sh) merged into one page."""

import json

import pytest


def _run_dir(folder, task, model, seed, accuracy, device="cuda", steps=12000):
    """One `qkv bench lra` run's results file, as a one-cell process leaves it."""
    cell = {"task": task, "model": model, "seed": seed, "test_accuracy": accuracy, "test_loss": 0.69,
            "test_examples": 1000, "seconds": 300.0,
            "settings": {"task_options": {}, "steps": steps, "batch_size": 32, "device": device}}
    command = f"qkv bench lra --tasks {task} --models {model} --seeds {seed}"
    results = {"cells": {f"{task}|{model}|{seed}": cell}, "speed": {},
               "tasks": {task: {"test_examples": 1000, "majority": 0.5 if task == "pathfinder" else 0.2,
                                "n_classes": 2 if task == "pathfinder" else 10}},
               "missing": {}, "machine": {"cpu": "x", "cores": 16, "torch_threads": 1, "device": device,
                                          "device_name": "NVIDIA H200", "torch": "t", "python": "p"},
               "command": command, "date": f"2026-11-27T00:0{seed}:00+00:00", "last_run_seconds": 300.0,
               "invocations": [{"command": command, "seconds": 300.0 + seed, "date": "d", "cells_run": 1,
                                "machine": "m"}]}
    folder.mkdir(parents=True)
    (folder / "lra-results.json").write_text(json.dumps(results))
    return folder


def test_merge_joins_every_run_and_writes_the_page(benchmark_script, tmp_path):
    script = benchmark_script("lra_merge")
    runs = [_run_dir(tmp_path / f"pf-{s}", "pathfinder", "softmax", s, a) for s, a in ((0, 0.62), (1, 0.58), (2, 0.55))]
    runs.append(_run_dir(tmp_path / "lo", "listops", "softmax", 0, 0.39, steps=5000))
    (tmp_path / "killed").mkdir()  # a run cut at the deadline leaves no results file: left out, not an error
    merged = script.merge(runs + [tmp_path / "killed"])
    assert sorted(merged["cells"]) == ["listops|softmax|0", "pathfinder|softmax|0", "pathfinder|softmax|1",
                                       "pathfinder|softmax|2"]
    assert len(merged["invocations"]) == 4 and merged["last_run_seconds"] == 302.0
    assert merged["tasks"]["listops"]["majority"] == 0.2 and merged["tasks"]["pathfinder"]["majority"] == 0.5
    with pytest.raises(SystemExit, match="is in an earlier run too"):
        script.merge([runs[0], runs[0]])
    with pytest.raises(SystemExit, match="no finished cell"):
        script.merge([tmp_path / "killed"])
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "lra-results.json").write_text('{"cells": {')  # a file cut mid-write: one clear line
    with pytest.raises(SystemExit, match="torn/lra-results.json is not a `qkv bench lra` results file"):
        script.merge([runs[0], tmp_path / "torn"])

    from qkv.bench import lra as bench_lra
    out = tmp_path / "merged"
    out.mkdir()
    (out / "README.md").write_text("kept")  # a hand-written page beside the results stays
    assert script.main([str(out), *map(str, runs), str(tmp_path / "killed")]) == 0
    assert (out / "README.md").read_text() == "kept" and (out / "img" / "lra.png").stat().st_size > 0
    assert sorted(json.loads((out / "lra-results.json").read_text())["cells"]) == sorted(merged["cells"])
    page = out / "lra.md"
    text = page.read_text()
    # seeds differ per task: the table says so instead of claiming three seeds everywhere
    assert "Ours (seeds per task: ListOps 1, Pathfinder 3; mean ± sd" in text
    assert "| `softmax` | Transformer | 39.00 | 58.33 ± 3.51 |" in text
    # the scale sentence gives the updates and the device the cells ran with, not a CPU's few hundred
    assert "train for 5,000-12,000 updates on a GPU" in text and "hundred updates on a CPU" not in text
    assert "summed over the cells; cells of parallel processes overlap" in text
    # a run with no finished cell still gets its sentence (a page is written even then)
    assert "no cell was trained" in bench_lra._scale_sentence({"cells": {}})


def test_bad_options_are_refused_before_anything_is_written(benchmark_script, tmp_path, capsys):
    script = benchmark_script("lra_merge")
    run = _run_dir(tmp_path / "pf", "pathfinder", "softmax", 0, 0.6)
    out = tmp_path / "out"
    for argv, said in (([str(out)], "the following arguments are required: runs"),
                       ([str(out), str(tmp_path / "nowhere")], "nowhere: not a folder"),
                       ([str(run / "lra-results.json"), str(run)], "a file, not a folder for the merged results")):
        with pytest.raises(SystemExit):
            script.main(argv)
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit, match="is in an earlier run too"):  # checked before the folder changes
        script.main([str(out), str(run), str(run)])
    assert not out.exists()


def _merge_forever(script, out, small, large):
    """Merge one run, then four, then one, ... into ``out`` until killed."""
    while True:
        for runs in (small, large):
            script.write(out, script.merge(runs))


def test_kill_9_while_merging_leaves_the_old_or_the_new_folder(benchmark_script, tmp_path):
    """The results and the page change together: a merge killed at any point leaves a folder whose
    page counts the cells its results file holds (1 or 4), never new results beside an old page."""
    import multiprocessing
    import random
    import re
    import time

    from qkv._io import settle_directory

    script = benchmark_script("lra_merge")
    small = [_run_dir(tmp_path / "one", "listops", "softmax", 0, 0.39)]
    large = small + [_run_dir(tmp_path / f"pf-{s}", "pathfinder", "softmax", s, 0.6) for s in range(3)]
    out = tmp_path / "out"
    script.write(out, script.merge(small))
    ctx, rng = multiprocessing.get_context("fork"), random.Random(0)
    for _ in range(5):
        proc = ctx.Process(target=_merge_forever, args=(script, out, small, large))
        proc.start()
        time.sleep(0.5 + rng.random() * 1.0)
        proc.kill()
        proc.join()
        settle_directory(out)  # what any reader does first: finishes or undoes a half-done swap
        cells = len(json.loads((out / "lra-results.json").read_text())["cells"])
        counted = int(re.search(r"training and testing (\d+) cells", (out / "lra.md").read_text()).group(1))
        assert cells in (1, 4) and counted == cells

