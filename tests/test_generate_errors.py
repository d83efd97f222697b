"""``qkv generate``: the user's sampling options that are out of range are one-line errors (exit 2);
a failure inside ``model.generate`` is the library's, and keeps its traceback."""

import pytest

from qkv.cli import main
from qkv.registry import lookup


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("gen") / "run"
    assert main(["train", "gpt", "--task", "shakespeare-char", "--out", str(run), "--steps", "1", "--batch-size", "2",
                 "--warmup", "1", "--eval-batches", "1", "--eval-max-examples", "2", "--progress", "false",
                 "--tensorboard", "false", "--set", "n_layers=1", "--set", "d_model=8", "--set", "n_heads=2",
                 "--set", "d_ff=8", "--set", "task.block_size=8", "--threads", "1"]) == 0
    return run


def test_bad_sampling_options_are_one_line_errors(lm_run, capsys):
    capsys.readouterr()
    assert main(["generate", str(lm_run), "--top-p", "1.5", "--max-new-tokens", "2", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv: error: top_p must be in (0, 1]") and err.count("\n") == 1


def test_a_failure_inside_generate_keeps_its_traceback(lm_run, monkeypatch):
    def broken(self, *args, **kwargs):
        raise ValueError("a bug inside generate")

    monkeypatch.setattr(lookup("model", "gpt"), "generate", broken)
    with pytest.raises(ValueError, match="a bug inside generate"):
        main(["generate", str(lm_run), "--max-new-tokens", "2", "--threads", "1"])
