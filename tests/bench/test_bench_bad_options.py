"""Issue 37 item 6: every ``qkv bench`` command checks its options as user input, before anything
runs: each bad value below is one ``qkv bench NAME: error: ...`` line and exit status 2, without a
traceback, in well under a second (nothing is measured first). A new benchmark gets a row here."""

from __future__ import annotations

import time

import pytest

from qkv.bench import BENCHMARKS, main

#: (command line, a part of the message)
BAD = [
    (["complexity", "--lengths", "0"], "--lengths must be 1 to"),
    (["complexity", "--lengths", "1000000000"], "1,048,576 tokens"),
    (["complexity", "--budget-seconds", "nan"], "finite float"),
    (["complexity", "--fit-min-length", "0"], "--fit-min-length"),
    (["complexity", "--heads", "0"], "--heads must be >= 1"),
    (["complexity", "--seed", "-1"], "--seed must be >= 0"),
    (["complexity", "--threads", "0"], "--threads must be >= 1"),
    (["complexity", "--device", "tpu"], "--device"),
    # knobs a kernel refuses: checked before the ladder (they were a "stopped" row in a written report)
    (["complexity", "--attention", "window", "--kernel-kwargs", "window:radius=-1"], "--kernel-kwargs window: radius"),
    (["complexity", "--attention", "window", "--kernel-kwargs", "window:bogus=1"], "bogus"),
    (["complexity", "--attention", "performer", "--kernel-kwargs", "performer:nb_features=0"], "nb_features"),
    (["kernels", "--target-seconds", "nan"], "finite float"),
    (["kernels", "--kernel-sizes", "0x1x8x4"], "four positive integers"),
    (["kernels", "--kernel-sizes", "1x1x2000000x4"], "1,048,576 tokens"),
    (["kernels", "--kernel-sizes", "100000x1000x1000x1000"], "out of memory"),  # 4e14 numbers
    (["gpt", "--dropout", "2"], "--dropout must be >= 0.0 and < 1.0"),
    (["gpt", "--target-seconds", "-1"], "--target-seconds must be >= 0"),
    (["gpt", "--length", "0"], "--length must be >= 1"),
    (["gpt", "--heads", "3"], "divisible"),
    (["generation", "--contexts", "0"], "--contexts must be positive"),
    (["generation", "--contexts", "1000000000"], "1,048,576 tokens"),
    (["generation", "--heads", "3"], "divisible"),
    (["generation", "--target-seconds", "inf"], "finite float"),
    (["generation", "--attention", "linear"], "give --model"),
    (["generation", "--model", "x", "--memory-budget", "lots"], "--memory-budget"),
    (["generation", "--model", "x", "--attention", "softmaks"], "unknown attention 'softmaks'"),
    (["generation", "--model", "x", "--attention", "window:3"], "keyword arguments as a dict"),
    (["generation", "--model", "x", "--attention", "linear", "linear"], "--attention names 'linear' twice"),
    (["generation", "--model", "x", "--prefill-tokens", "0"], "--prefill-tokens must be 1 to"),
    (["generation", "--model", "/nonexistent/qkv-model"], "--model /nonexistent/qkv-model"),
    (["depth-memory", "--length", "1000000000"], "1,048,576 tokens"),
    (["depth-memory", "--bucket-size", "0"], "--bucket-size must be >= 1"),
    (["depth-memory", "--heads", "3"], "divisible"),
    (["depth-memory", "--depths", "0"], "--depths"),
    (["depth-memory", "--depths", "1000000000"], "--depths must be >= 1 and <= 1024"),
    (["throughput", "--pattern-lengths", "0"], "--pattern-lengths must be 4 to"),
    (["throughput", "--matmul-size", "0"], "--matmul-size must be >= 1"),
    (["throughput", "--matmul-size", "1000000000"], "out of memory"),
    (["throughput", "--sizes", "1x2x3"], "four positive integers"),
    (["throughput", "--sizes", "1x1x1000000000x64"], "1,048,576 tokens"),
    (["models", "--lengths", "1"], "--lengths must be 2 to"),
    (["models", "--target-seconds", "-1"], "--target-seconds must be >= 0"),
    (["models", "--batch", "0"], "--batch must be >= 1"),
    (["peers", "--lengths", "1000000000"], "1,048,576 tokens"),
    (["peers", "--heads", "0"], "--heads must be >= 1"),
    (["peers", "--target-seconds", "nan"], "finite float"),
    (["lra", "--quick", "--set", "listops.max_len=0"], "max_len must be an int >= 3"),
    (["lra", "--quick", "--set", "listops.bogus=1"], "unknown --set listops option 'bogus'"),
    (["lra", "--quick", "--set", "listops.max_len=abc"], "must be an int, got 'abc'"),
    (["lra", "--quick", "--set", "listops.max_len=1000000000"], "at most 16,384 tokens per input"),
    (["lra", "--quick", "--set", "pathfinder.size=1000000000"], "at most 16,384 tokens per input"),
    (["lra", "--quick", "--set", "pathfinder.contour_length=1000000000"], "contour_length must be at most 100 dashes"),
    (["lra", "--quick", "--set", "listops.eval_size=1000000000"], "at most 100,000 held-out examples"),
    (["lra", "--quick", "--set", "listops=3"], "TASK.OPTION=VALUE"),
    (["lra", "--quick", "--batch-size", "1000000000"], "tokens per step"),
    (["lra", "--quick", "--speed-lengths", "0"], "--speed-lengths must be > 0"),
    (["lra", "--quick", "--speed-lengths", "1000000000"], "at most 16,384 tokens per input"),
    (["lra", "--quick", "--speed-batch", "1000000000"], "tokens per step"),
    (["lra", "--quick", "--jobs", "1000"], "cells at once"),
    (["lra", "--quick", "--models", "nope"], "unknown attention"),
    (["lra", "--quick", "--report", "page.txt"], "--report"),
    (["context-parallel", "--ranks", "0"], "--ranks must be >= 1"),
    (["context-parallel", "--ranks", "1000"], "--ranks must be >= 1 and <= 64"),
    (["context-parallel", "--length", "0"], "--length must be 1 to"),
    (["context-parallel", "--length", "6", "--ranks", "4"], "multiple of 2P"),
    (["context-parallel", "--heads", "0"], "--heads must be >= 1"),
    (["context-parallel", "--repeats", "0"], "--repeats must be >= 1"),
    (["context-parallel", "--batch", "4096", "--heads", "4096"], "numbers per tensor"),
    (["context-parallel", "--heads", "4096", "--head-dim", "4096"], "numbers per tensor"),
    # 134M numbers per tensor, within the bound of one tensor: the step's ten of them (5.4 GB) were allocated first
    (["context-parallel", "--heads", "4096", "--head-dim", "4096", "--batch", "1", "--length", "8"], "about 5.4 GB"),
    (["context-parallel", "--heads", "4096", "--head-dim", "4096", "--batch", "1", "--length", "2", "--ranks", "1",
      "--budget-mb", "100"], "a GPT of width 16,777,216"),
    (["context-parallel", "--kernels", "nope"], "unknown attention"),
    (["context-parallel", "--device", "cuda"], "gloo processes on the CPU"),
    (["context-parallel", "--budget-mb", "0"], "--budget-mb must be >= 0.01"),
    (["context-parallel", "--budget-mb", "-5", "--ranks", "1"], "--budget-mb must be >= 0.01"),
]


def test_every_benchmark_has_rows():
    assert {argv[0] for argv, _ in BAD} == set(BENCHMARKS)


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_option_is_one_line_before_anything_runs(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--threads", "1", "--out", str(out)] if "--threads" not in argv else [*argv, "--out", str(out)])
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"qkv bench {argv[0]}: error: ") and message in line, err
    assert seconds < 10, seconds  # refused at once, not after measuring (the lra cases: their tasks are built)
    assert not (out / "lra-results.json").exists()


def test_lra_report_at_an_existing_folder_is_refused_before_any_cell(tmp_path, capsys):
    """It failed only after every cell had run."""
    folder = tmp_path / "page"
    folder.mkdir()
    with pytest.raises(SystemExit):
        main(["lra", "--quick", "--tasks", "listops", "--models", "softmax", "--report", str(folder),
              "--threads", "1", "--out", str(tmp_path / "out")])
    assert "is a directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
