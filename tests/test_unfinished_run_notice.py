"""A run without its final ``model/`` (killed, or still training) is read from its latest
checkpoint by ``qkv eval``, ``generate``, ``viz`` and ``export``: each says so on stderr, with the
step, instead of presenting an early checkpoint as the trained model (found by the hqa audit:
``qkv export`` of a run killed at step 27 of 300 printed only "wrote OUT")."""

import shutil

import pytest

from qkv.cli import main

TINY = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
        "--set", "task.block_size=16", "--threads", "1", "--save-every", "2"]


@pytest.fixture
def unfinished(shakespeare_cache, tmp_path, train_argv, capsys):
    run = tmp_path / "run"
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY, steps=4)) == 0, capsys.readouterr().err
    shutil.rmtree(run / "model")  # as a kill before the end leaves it: checkpoints only
    for late in sorted((run / "checkpoints").glob("step-*.safetensors"))[1:]:
        late.unlink()  # the latest left: step 2 of 4
    capsys.readouterr()
    return run


@pytest.mark.parametrize("argv", [["eval", "{run}"], ["generate", "{run}", "--prompt", "To", "--max-new-tokens", "2"],
                                  ["export", "{run}", "{tmp}/out", "--format", "qkv"]])
def test_reading_an_unfinished_run_says_which_checkpoint(unfinished, tmp_path, capsys, argv):
    assert main([a.format(run=unfinished, tmp=tmp_path) for a in argv]) == 0
    err = capsys.readouterr().err
    assert "no final model/" in err and "step 2 of 4" in err, err


def test_a_finished_run_says_nothing_of_checkpoints(shakespeare_cache, tmp_path, train_argv, capsys):
    run = tmp_path / "run"
    assert main(train_argv("gpt", "shakespeare-char", run, *TINY, steps=2)) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "checkpoint" not in capsys.readouterr().err
