"""The README's promise, for every registered model: it trains, evaluates, visualises (and, where it
applies, generates or translates) from the command line, on the task it suggests.

Each model runs a few steps of its CPU-sized default configuration on its first suggested task,
in-process (``qkv.cli.main``), with small evaluation sizes. A model whose suggested task needs a
data set that is not cached is skipped with the command that fetches it. Models that form no
attention weights at all (the baselines) must say so in one line instead of drawing.
"""

from __future__ import annotations

import pytest
import torch

import qkv  # noqa: F401  (registers everything)
from qkv.cli import main
from qkv.registry import lookup, names

#: models that, by design, form no attention weights: `qkv viz` must refuse them with a clear message.
NO_ATTENTION = {"deep-sets", "flat-gru", "lstm-seq"}


def _task_for(model: str) -> str:
    cls = lookup("model", model)
    suggested = list(getattr(cls, "suggested_tasks", ()) or ())
    assert suggested, f"model {model!r} names no suggested task (suggested_tasks): `qkv list model` shows none"
    return suggested[0]


def _kind(task: str) -> str:
    return getattr(lookup("task", task), "kind", "")


@pytest.mark.slow
@pytest.mark.parametrize("model", names("model"))
def test_every_model_trains_evaluates_and_draws(model, tmp_path, capsys):
    task = _task_for(model)
    run = tmp_path / "run"
    torch.manual_seed(0)
    code = main(["train", model, "--task", task, "--steps", "2", "--batch-size", "2", "--eval-every", "0",
                 "--eval-max-examples", "4", "--eval-batches", "1", "--threads", "1", "--out", str(run),
                 "--progress", "false"])
    err = capsys.readouterr().err
    if code != 0 and "qkv data fetch" in err:
        pytest.skip(f"{task} data not cached: {err.strip().splitlines()[-1]}")
    assert code == 0, err
    assert (run / "model" / "config.json").is_file()

    assert main(["eval", str(run), "--max-examples", "4", "--threads", "1"]) == 0, capsys.readouterr().err
    png = tmp_path / "attention.png"
    code = main(["viz", str(run), "--out", str(png), "--threads", "1"])
    err = capsys.readouterr().err
    if model in NO_ATTENTION:
        assert code == 2 and "no attention weights" in err, err
    else:
        assert code == 0, err
        assert png.stat().st_size > 1000

    kind = _kind(task)
    if kind == "lm":
        assert main(["generate", str(run), "--prompt", "a", "--max-new-tokens", "4"]) == 0, capsys.readouterr().err
    elif kind == "image":
        assert main(["generate", str(run), "--n", "1", "--out", str(tmp_path / "samples.png")]) == 0, \
            capsys.readouterr().err
    elif kind == "seq2seq":
        assert main(["translate", str(run), "12", "--max-new-tokens", "4"]) == 0, capsys.readouterr().err

