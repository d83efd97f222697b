"""Every path a run's run.json names stays inside the run (issue 37, item 9): a hostile
``"tokenizer": "../../etc/passwd"`` (or an absolute path, or a link leading out) is refused with one
line naming run.json, before anything is read from it."""

import json
import os

import pytest

from qkv import runs
from qkv.runs.directory import task_options_at
from qkv._errors import UserError
from qkv.cli import main


def _run(tmp_path, tokenizer):
    run = tmp_path / "run"
    run.mkdir()
    info = {"model": "bert", "task": "bbc-news-tokens", "preset": None, "model_config": {},
            "task_options": {"tokenizer": tokenizer}, "train": {}}
    (run / "run.json").write_text(json.dumps(info))
    return run


@pytest.mark.parametrize("tokenizer", ["../../../../../../etc/passwd", "/etc/passwd", "sub/../../outside.json"])
def test_a_tokenizer_path_leading_out_of_the_run_is_refused(tmp_path, capsys, tokenizer):
    run = _run(tmp_path, tokenizer)
    with pytest.raises(UserError, match=r"run.json: task option tokenizer=.* leads outside the run directory"):
        runs.load(run)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "leads outside the run directory" in err


def test_a_link_inside_the_run_leading_out_is_refused_and_the_runs_own_copy_is_used(tmp_path):
    run = _run(tmp_path, "tokenizer.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", run / "tokenizer.json")
    with pytest.raises(UserError, match="leads outside the run directory"):
        task_options_at(run, {"tokenizer": "tokenizer.json"})
    (run / "tokenizer.json").unlink()
    (run / "tokenizer.json").write_text("{}")
    assert task_options_at(run, {"tokenizer": "tokenizer.json", "x": 1}) == {"tokenizer": str(run / "tokenizer.json"), "x": 1}
    assert task_options_at(run, {"x": 1}) == {"x": 1}


TINY = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32", "--set", "task.block_size=16",
        "--threads", "1"]


def test_a_model_that_is_not_the_runs_own_is_refused(shakespeare_cache, train_argv, capsys):
    """Issue 52 item 13: a run whose model/ is a link to another run's, or a copy of it, was read (and
    exported) with this run's tokenizer. A run's id, in run.json and in the model/ it saves, tells a
    copy; a link out of the run is refused as every path out is. Training such a run is refused before
    it trains (its final save would have written into the other run's model). The run's own model/,
    and one of an older qkv (no id), load; a resumed run keeps its id."""
    import shutil

    a, b = shakespeare_cache / "a", shakespeare_cache / "b"
    for run in (a, b):
        assert main(train_argv("gpt", "shakespeare-char", run, *TINY)) == 0, capsys.readouterr().err
    ids = [json.loads((run / "run.json").read_text())["run_id"] for run in (a, b)]
    assert ids[0] != ids[1] and json.loads((a / "model" / "qkv-run.json").read_text()) == {"run_id": ids[0]}
    runs.load(a)
    assert main(train_argv("gpt", "shakespeare-char", a, *TINY, "--resume", steps=3)) == 0
    assert json.loads((a / "run.json").read_text())["run_id"] == ids[0]
    runs.load(a)

    shutil.rmtree(b / "model")
    shutil.copytree(a / "model", b / "model")  # a copy of another run's model
    with pytest.raises(UserError, match=f"was saved by another run .*{ids[0]}"):
        runs.load(b)
    shutil.rmtree(b / "model")
    os.symlink(a / "model", b / "model")  # a link to it
    capsys.readouterr()
    for argv in (["eval", str(b)], ["generate", str(b), "--max-new-tokens", "2"], ["export", str(b), str(b.parent / "out")],
                 train_argv("gpt", "shakespeare-char", b, *TINY, "--resume", steps=4)):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert [line for line in err.splitlines() if "error" in line] == [line for line in err.splitlines()
                                                                            if "leads outside the run" in line], err
    assert not (b.parent / "out").exists() and json.loads((b / "run.json").read_text())["train"]["steps"] == 2
    (b / "model").unlink()
    shutil.copytree(a / "model", b / "model")
    for hostile in ("[" * 100_000, "[1]", '{"run_id": 5}', "\xff"):  # the id file, hostile: one line naming it
        (b / "model" / "qkv-run.json").write_text(hostile, encoding="latin-1")
        with pytest.raises(UserError, match="qkv-run.json is corrupt") as e:
            runs.load(b)
        assert "\n" not in str(e.value)
    (b / "model" / "qkv-run.json").unlink()  # a model/ of an older qkv: no id, read as the run's
    runs.load(b)
