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
