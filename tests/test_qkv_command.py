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
    (["train", "gpt", "--task", "reverse"], "trains on \\['classification', 'lm'\\] tasks"),
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


# ----------------------------------------------------------------------------- issue 14: runs


def _gpt_argv(run, *extra):
    return ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), *TINY, "--set", "task.block_size=16",
            "--threads", "1", *TRAIN, *extra]


def _snapshot(directory):
    """The run's files; ``.lock`` names the latest writer to take the directory (train/lock.py), not the run."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["event"] == "train"]


def test_same_seed_same_losses(shakespeare_cache):
    base = shakespeare_cache
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        assert main(_gpt_argv(base / name, "--steps", "3", "--seed", seed, "--set", "dropout=0.1")) == 0
    assert _losses(base / "a") == _losses(base / "b")
    assert _losses(base / "a") != _losses(base / "c")


def test_refused_train_changes_nothing(shakespeare_cache, tmp_path, capsys):
    run = shakespeare_cache / "run"
    assert main(_gpt_argv(run, "--steps", "2", "--save-every", "1")) == 0
    before = _snapshot(run)
    refused = [
        ["train", "transformer", "--task", "reverse", "--out", str(run), "--steps", "1"],  # another model, no resume
        ["train", "transformer", "--task", "reverse", "--out", str(run), "--steps", "1", "--resume"],
        _gpt_argv(run, "--steps", "3"),  # a fresh run over checkpoints
        _gpt_argv(run, "--steps", "3", "--resume", "--lr", "0.5"),  # contradicts the run's lr
        _gpt_argv(run, "--steps", "3", "--resume", "--set", "d_model=64"),
        _gpt_argv(run, "--steps", "3", "--resume", "--device", "cuda:7"),
    ]
    for argv in refused:
        assert main(argv) == 2, argv
        assert _snapshot(run) == before, argv
    err = capsys.readouterr().err
    assert "contradicts" in err and "already holds a run" in err


def test_bare_resume_restores_training_settings(shakespeare_cache, capsys):
    run = shakespeare_cache / "run"
    first = ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), *TINY, "--set", "task.block_size=16",
             "--threads", "1", "--progress", "false", "--tensorboard", "false", "--eval-batches", "1",
             "--eval-max-examples", "8", "--batch-size", "4", "--seed", "5", "--lr", "0.01", "--warmup", "1",
             "--save-every", "2", "--log-every", "1", "--grad-clip", "0.5", "--schedule", "constant"]
    assert main([*first, "--steps", "2"]) == 0
    # a bare resume with only a new step count: every other setting is the run's
    assert main(["train", "gpt", "--task", "shakespeare-char", "--out", str(run), "--resume", "--steps", "4"]) == 0
    config = json.loads((run / "train_config.json").read_text())
    assert (config["steps"], config["batch_size"], config["seed"], config["lr"], config["save_every"], config["grad_clip"]) == \
        (4, 4, 5, 0.01, 2, 0.5)
    assert json.loads((run / "run.json").read_text())["model_config"]["d_model"] == 32
    assert "resuming with steps=4 (the run had 2)" in capsys.readouterr().err
    assert [r for r in _losses(run)] and len(_losses(run)) == 4
    # the same run uninterrupted gives the same losses (a constant schedule does not depend on --steps)
    assert main([*first[:5], str(run.parent / "whole"), *first[6:], "--steps", "4"]) == 0
    assert _losses(run.parent / "whole") == _losses(run)


def test_corrupt_newest_checkpoint_falls_back(shakespeare_cache, capsys):
    run = shakespeare_cache / "run"
    assert main(_gpt_argv(run, "--steps", "4", "--save-every", "2")) == 0
    newest = run / "checkpoints" / "step-00000004.safetensors"
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0xFF  # a flipped bit inside the tensors
    newest.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="checksum"):
        assert main(_gpt_argv(run, "--steps", "5", "--resume")) == 0
    resumed = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"resume"' in line]
    assert resumed[-1]["checkpoint"] == "step-00000002.safetensors"


def test_resume_with_every_checkpoint_corrupt_is_refused_and_changes_nothing(shakespeare_cache, capsys):
    run = shakespeare_cache / "run"
    assert main(_gpt_argv(run, "--steps", "4", "--save-every", "2")) == 0
    for path in (run / "checkpoints").glob("step-*.safetensors"):
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    before = _snapshot(run)
    assert main(_gpt_argv(run, "--steps", "6", "--resume")) == 2
    assert "every checkpoint" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_run_json_missing_field_is_one_line(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps({"model": "gpt", "task": "shakespeare-char"}))
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("qkv: error")]
    assert len(errors) == 1 and "incomplete" in errors[0] and "model_config" in errors[0] and "Traceback" not in err


@pytest.mark.parametrize("flags,message", [
    (["--lr", "inf"], "lr must be a finite float"),
    (["--weight-decay", "nan"], "weight_decay must be a finite float"),
    (["--grad-clip", "nan"], "grad_clip must be a finite float"),
    (["--lr", "-1"], "lr must be a finite float > 0"),
    (["--eval-max-examples", "-1"], "eval_max_examples must be > 0"),
])
def test_bad_hyperparameters_are_refused(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) if flags[1] in ("inf", "nan") else _no_exit():
        code = main(["train", "transformer", "--task", "reverse", "--out", str(tmp_path / "r"), "--steps", "1", *flags])
        assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_bad_device_out_and_counts(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        (["--device", "cuda:7"], "CUDA device"),
        (["--device", "tpu9"], "not a device name"),
        (["--out", str(blocker / "run")], "is a file, not a folder"),
        (["--out", str(blocker)], "not a folder"),
    ]
    for flags, message in cases:
        argv = ["train", "transformer", "--task", "reverse", "--steps", "1", "--out", str(tmp_path / "run"), *flags]
        assert main(argv) == 2, flags
        assert message in capsys.readouterr().err, flags
    with pytest.raises(SystemExit):
        main(["eval", str(tmp_path), "--max-examples", "-1"])
    assert ">= 1" in capsys.readouterr().err


def test_crafted_sizes_refused_before_allocation(tmp_path):
    from qkv.models import QKVModel

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt", "vocab_size": 10**13}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="memory available.*vocab_size=10000000000000"):
        QKVModel.from_pretrained(tmp_path)
    assert main(["train", "gpt", "--task", "reverse", "--set", f"vocab_size={10**13}", "--out", str(tmp_path / "r")]) == 2


# ----------------------------------------------------------------------------- issue 16: the command line


def test_presets_defaults_and_dotted_set(shakespeare_cache, capsys):
    from qkv.models.transformer.gpt import GPT

    assert GPT.preset("paper") == {} and GPT.default_preset == "cpu"
    run = shakespeare_cache / "run"
    argv = ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), "--set", "task.block_size=16", "--threads", "1",
            "--steps", "2", "--eval-batches", "1", "--eval-max-examples", "4", "--progress", "false", "--tensorboard", "false",
            "--attention", "window", "--set", "attention_kwargs.radius=3"]
    assert main(argv) == 0
    info = json.loads((run / "run.json").read_text())
    assert info["preset"] == "cpu" and info["model_config"]["n_layers"] == GPT.presets["cpu"]["n_layers"]
    assert info["model_config"]["attention_kwargs"] == {"radius": 3}
    out = capsys.readouterr()
    assert " parameters, preset cpu" in out.out and "s per update" in out.err
    # checkpoints by default: at every evaluation and at the end
    assert (run / "checkpoints" / "step-00000002.safetensors").is_file()
    # the flat, Hugging Face-style config and the vocabulary sit beside the weights
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["model_type"] == "gpt" and config["d_model"] == info["model_config"]["d_model"]
    from qkv.tasks.vocab import vocab_from_dict

    vocab = vocab_from_dict(json.loads((run / "model" / "vocab.json").read_text()))
    assert vocab.decode(vocab.encode("To be")) == "To be"
    for bad, message in ((["--preset", "huge"], "no preset 'huge'; its presets: cpu, paper"),
                         # the unknown knob and the known ones, not "a model whose size cannot be estimated" (issue 52)
                         (["--set", "attention_kwargs.radious=3"], "qkv: error: attention 'window' got unknown argument(s) "
                                                                   "['radious']; it accepts ['alibi', 'block', 'causal', 'dropout', 'n_heads', 'radius', 'sinks', 'softcap']"),
                         (["--set", "d_model.x=1"], "not a dict")):
        assert main([*argv[:-2], *bad, "--out", str(shakespeare_cache / "bad")]) == 2
        err = capsys.readouterr().err
        assert message in err and "cannot be estimated" not in err, err


def test_old_nested_model_config_still_loads(tmp_path):
    from qkv.models import QKVModel
    from qkv.models.transformer.gpt import GPT

    model = GPT.from_config({"vocab_size": 11, "n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16, "max_len": 8})
    model.save_pretrained(tmp_path)
    flat = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model": flat.pop("model_type"), "config": flat}))
    assert QKVModel.from_pretrained(tmp_path).config == model.config


def test_cli_surface(capsys):
    import qkv

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and qkv.__version__ in capsys.readouterr().out
    for command in ("list", "data", "train", "eval", "generate", "translate", "viz", "export", "bench"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0, command
        assert "usage:" in capsys.readouterr().out, command
    assert main(["list", "model"]) == 0
    out = capsys.readouterr().out
    assert "task kinds: lm; tasks: shakespeare-char" in out and "presets: cpu, paper" in out
    assert main(["list", "task"]) == 0
    assert "kind: seq2seq" in capsys.readouterr().out
    for typed, title in (("models", "models:"), ("Tasks", "tasks:"), ("kernels", "attention kernels:")):
        assert main(["list", typed]) == 0  # the plural a user types, and the kernels' other name
        out = capsys.readouterr().out
        assert out.startswith(title) and out.count(":\n") == 1, typed


def test_closed_pipe_is_quiet():
    import subprocess
    import sys

    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run(f"{sys.executable} -m qkv list | head -1", shell=True, capture_output=True, text=True, env=env)
    assert proc.stdout.strip() and "Traceback" not in proc.stderr and "Error" not in proc.stderr


def test_generate_on_a_model_that_cannot(tmp_path, capsys):
    """A run whose model has no generate (Nadaraya-Watson regression) gets one line, not a traceback."""
    run = tmp_path / "nw"
    assert main(["train", "nadaraya-watson", "--task", "nw-regression", "--out", str(run), "--steps", "1", *TRAIN]) == 0
    capsys.readouterr()
    assert main(["generate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "qkv generate" in err and "regression task" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_bench_threads_default(monkeypatch, capsys):
    import os

    from qkv import cli

    seen = {}
    monkeypatch.setattr("qkv.bench.main", lambda argv: seen.setdefault("argv", argv) and 0)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    cli._run_bench(["kernels", "--quick"])
    assert seen["argv"][:3] == ["kernels", "--threads", "1"] and "load average" in capsys.readouterr().err
    seen.clear()
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    cli._run_bench(["kernels", "--threads", "2"])
    assert seen["argv"] == ["kernels", "--threads", "2"]
    assert cli.physical_cores() >= 1


def test_vocab_files_round_trip():
    from qkv.tasks.vocab import ByteVocab, CharVocab, WordVocab, vocab_from_dict, vocab_to_dict

    for vocab, text in ((CharVocab("abc "), "a cab"), (ByteVocab(), "héllo"), (WordVocab(["to", "be"]), "to be or")):
        again = vocab_from_dict(json.loads(json.dumps(vocab_to_dict(vocab))))
        assert again.size == vocab.size and again.encode(text) == vocab.encode(text)
        assert again.decode(vocab.encode(text)) == vocab.decode(vocab.encode(text))
    custom = WordVocab(["x"], split=lambda t: list(t))
    assert vocab_from_dict(vocab_to_dict(custom)).words == custom.words
