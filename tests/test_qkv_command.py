"""The qkv command end to end, as a user runs it: train, resume, eval, generate, translate, viz,
and clear errors for bad input. Tiny models; real code paths."""

import json
import typing
from pathlib import Path

import pytest

from qkv.cli import CLIError, main, parse_value

TINY = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--set", "dropout=0.0"]
TRAIN = ["--batch-size", "8", "--warmup", "2", "--log-every", "1", "--eval-batches", "1", "--eval-max-examples", "8",
         "--progress", "false", "--tensorboard", "false"]


@pytest.fixture
def shakespeare_cache(tmp_path, monkeypatch):
    texts = tmp_path / "data" / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    return tmp_path


def test_parse_value_types():
    assert parse_value(int, "3", "x") == 3
    assert parse_value(float, "1e-3", "x") == 1e-3
    assert parse_value(bool, "false", "x") is False
    assert parse_value(typing.Optional[int], "none", "x") is None
    assert parse_value(typing.Tuple[float, float], "0.9,0.98", "x") == (0.9, 0.98)
    assert parse_value(typing.Tuple[int, ...], "[1, 2, 3]", "x") == (1, 2, 3)
    assert parse_value(typing.Dict[str, typing.Any], '{"radius": 4}', "x") == {"radius": 4}
    assert parse_value(typing.Literal["a", "b"], "b", "x") == "b"
    for annotation, text, match in ((int, "1.5", "x must be an int"), (bool, "maybe", "bool"),
                                    (typing.Literal["a"], "c", "one of"), (typing.Tuple[int, int], "1", "2 comma")):
        with pytest.raises(CLIError, match=match):
            parse_value(annotation, text, "x")


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("softmax", "window", "gpt", "transformer", "bert", "shakespeare-char", "reverse"):
        assert name in out


@pytest.mark.parametrize("argv,message", [
    (["train", "gtp", "--task", "reverse"], "unknown model 'gtp'.*Did you mean 'gpt'"),
    (["train", "gpt", "--task", "shakspeare-char"], "unknown task"),
    (["train", "gpt", "--task", "reverse"], "trains on \\['lm'\\] tasks"),
    (["train", "transformer", "--task", "reverse", "--set", "d_modle=8"], "unknown model 'transformer' option 'd_modle'.*did you mean d_model"),
    (["train", "transformer", "--task", "reverse", "--set", "d_model=big"], "d_model must be an int"),
    (["train", "transformer", "--task", "reverse", "--set", "task.max_len=x"], "max_len must be an int"),
    (["train", "transformer", "--task", "reverse", "--set", "nokey"], "key=value"),
    (["train", "transformer", "--task", "reverse", "--set", "train.stpes=3"], "unknown train option 'stpes'"),
    (["train", "transformer", "--task", "reverse", "--attention", "nope"], "unknown attention 'nope'"),
    (["eval", "/nonexistent/run"], "not a qkv run directory"),
])
def test_bad_input_is_a_clear_error(argv, message, capsys, tmp_path):
    if argv[0] == "train":
        argv = argv + ["--out", str(tmp_path / "run"), "--steps", "1"]
    assert main(argv) == 2
    import re

    assert re.search(message, capsys.readouterr().err), message


def test_bad_flag_type_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit):
        main(["train", "gpt", "--task", "shakespeare-char", "--steps", "many"])
    assert "steps must be an int" in capsys.readouterr().err


def test_corrupt_run_directory(tmp_path, capsys):
    (tmp_path / "run.json").write_text("{not json")
    assert main(["eval", str(tmp_path)]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_gpt_train_resume_eval_generate_viz(shakespeare_cache, capsys):
    run = shakespeare_cache / "run"
    base = ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), *TINY, "--set", "task.block_size=16", *TRAIN]
    assert main([*base, "--steps", "4", "--save-every", "2"]) == 0
    assert (run / "model" / "model.safetensors").is_file() and (run / "run.json").is_file()
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["bpc"] > 0
    # continuing a finished run for more steps resumes from its last checkpoint
    assert main([*base, "--steps", "6", "--save-every", "2", "--resume"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert any(r["event"] == "resume" for r in records)
    capsys.readouterr()
    assert main(["eval", str(run), "--max-examples", "4"]) == 0
    assert "bpc" in json.loads(capsys.readouterr().out)
    assert main(["generate", str(run), "--prompt", "To be", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("To be")
    assert main(["viz", str(run), "--text", "To be, or"]) == 0
    assert (run / "attention.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["translate", str(run), "hello"]) == 2
    # a fresh run into a directory that holds one is refused rather than overwritten
    assert main([*base, "--steps", "2"]) == 2


def test_transformer_on_reverse_translate_and_viz(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "transformer", "--task", "reverse", "--out", str(run), *TINY, "--set", "n_decoder_layers=1",
            "--set", "task.max_len=5", "--set", "task.eval_size=16", "--steps", "3", *TRAIN]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["translate", str(run), "12345", "--beam", "2", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("12345\t")
    out = tmp_path / "att.png"
    assert main(["viz", str(run), "--text", "1234", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert main(["generate", str(run)]) == 2
