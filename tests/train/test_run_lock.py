"""One writer per run directory (issue 20, item 4): ``qkv train`` holds an OS lock on ``--out`` that
dies with its process; a second writer is refused with one line naming the holder."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.train import RunLock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the run lock is flock, POSIX only")

TINY = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
        "--set", "task.block_size=8", "--threads", "1"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(extra=None):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    env.update(extra or {})
    return env


def _wait_for(condition, proc, seconds=120.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the holder ended early: {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the holder")
        time.sleep(0.1)


def _train_steps(run: Path):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"train"' in line]


def test_lock_is_reentrant_in_a_process_and_refused_across_processes(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        with RunLock(run):  # the command and its Trainer both hold it
            pass
        code = f"from qkv.train import RunLock\nRunLock({str(run)!r}).acquire()"
        child = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
        assert child.returncode != 0 and "RunLockError" in child.stderr and f"pid {os.getpid()}" in child.stderr
    # released: another process takes it
    child = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr


def test_second_writer_is_refused_and_a_killed_holder_leaves_nothing(shakespeare_cache, train_argv, capsys):
    run = shakespeare_cache / "run"
    argv = train_argv("gpt", "shakespeare-char", run, *TINY, "--log-every", "1", "--eval-every", "1000",
                      "--save-every", "5", steps=100000)
    first = subprocess.Popen([sys.executable, "-m", "qkv", *argv], env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        # wait until it trains and has a checkpoint to resume from
        _wait_for(lambda: (run / "checkpoints").is_dir() and any((run / "checkpoints").glob("step-*.safetensors")), first)
        for extra in ([], ["--resume"]):
            before = (run / "run.json").read_bytes()
            second = subprocess.run([sys.executable, "-m", "qkv", *train_argv("gpt", "shakespeare-char", run, *TINY, *extra,
                                                                              steps=100000)],
                                    env=_env(), capture_output=True, text=True, timeout=120)
            err = second.stderr.strip()
            assert second.returncode == 2 and len(err.splitlines()) == 1, err
            assert f"pid {first.pid}" in err and "qkv train gpt" in err, err
            assert (run / "run.json").read_bytes() == before
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    steps = _train_steps(run)
    assert steps == list(range(1, len(steps) + 1))  # one writer: one record per step, in order
    # kill -9 left a .lock file but no lock: the next run takes the directory and continues it
    last_saved = max(int(p.stem.split("-")[1]) for p in (run / "checkpoints").glob("step-*.safetensors"))
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY, "--resume", steps=last_saved + 2)) == 0
    assert _train_steps(run) == list(range(1, last_saved + 3))


def test_resume_without_a_run_starts_one(shakespeare_cache, train_argv, capsys):
    run = shakespeare_cache / "fresh"
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY, "--resume")) == 0
    err = capsys.readouterr().err
    assert "holds no run yet; starting a new one" in err
    assert (run / "model" / "config.json").is_file()


def test_resume_of_a_finished_run_says_how_to_extend_it(shakespeare_cache, train_argv, capsys):
    run = shakespeare_cache / "done"
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY, steps=2)) == 0
    capsys.readouterr()
    records = (run / "metrics.jsonl").read_text()
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY, "--resume", steps=2)) == 0
    out, err = capsys.readouterr()
    assert out == "" and "finished at step 2" in err and "--steps N, N > 2" in err
    assert (run / "metrics.jsonl").read_text() == records  # nothing written
