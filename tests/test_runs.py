"""qkv.runs: a run as a library object (issue 24) — settings resolved layer over layer, a run
directory created, locked, trained, resumed and evaluated through the API, the same as through
``qkv train`` / ``qkv eval``; and the command line's line between user errors and bugs."""

import json
import os
import sys

import pytest
import torch

import qkv.runs as runs
from qkv import UserError
from qkv.cli import main
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.train import TrainConfig

TINY = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "dropout": 0.0, "task.block_size": 16}
QUIET = {"train.progress": False, "train.tensorboard": False, "train.eval_batches": 1, "train.eval_max_examples": 8,
         "train.batch_size": 4, "train.warmup": 1, "train.log_every": 1, "train.save_every": 2, "train.seed": 5,
         "train.lr": 0.01, "train.schedule": "constant"}
CLI_TINY = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--set", "dropout=0.0",
            "--set", "task.block_size=16", "--threads", "1", "--progress", "false", "--tensorboard", "false",
            "--eval-batches", "1", "--eval-max-examples", "8", "--batch-size", "4", "--warmup", "1", "--log-every", "1",
            "--save-every", "2", "--seed", "5", "--lr", "0.01", "--schedule", "constant"]


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["event"] == "train"]


def test_resolve_takes_each_layer_over_the_one_below(shakespeare_cache, monkeypatch, tmp_path):
    """config defaults < the model's train defaults < preset < task < overrides."""
    monkeypatch.setattr(GPT, "train_defaults", {"lr": 0.1, "batch_size": 3, "warmup": 7})
    layers = {"n_layers": 1, "d_model": 24, "n_heads": 2, "d_ff": 32, "vocab_size": 999, "max_len": 999,
              "train": {"lr": 0.2, "batch_size": 5}, "task": {"block_size": 8}}
    monkeypatch.setattr(GPT, "presets", {**GPT.presets, "layers": layers})
    settings = runs.resolve("gpt", "shakespeare-char", preset="layers",
                            overrides={"train.lr": 0.3, "d_model": 32, "max_len": 80, "task.block_size": 16})
    vocab = settings._task.vocab.size
    assert settings.preset == "layers" and settings.task_options["block_size"] == 16  # overrides > preset (task option)
    assert settings.train["lr"] == 0.3  # overrides > preset > train defaults
    assert settings.train["batch_size"] == 5  # preset > train defaults
    assert settings.train["warmup"] == 7 != TrainConfig.warmup  # train defaults > config defaults
    assert settings.model_config["vocab_size"] == vocab != 999  # task > preset
    assert settings.model_config["max_len"] == 80  # overrides > task (max(block_size, 64))
    assert (settings.model_config["d_model"], settings.model_config["n_heads"]) == (32, 2)  # overrides, preset
    assert layers["train"] == {"lr": 0.2, "batch_size": 5}  # the preset itself is not changed
    with runs.Run.create(tmp_path / "run", settings) as run:  # the config defaults fill the rest
        assert run.model.config.dropout == GPTConfig.dropout and run.config.grad_clip == TrainConfig.grad_clip
        assert run.settings.model_config["max_len"] == 80 and run.config.warmup == 7
    # a str override is read as the command line reads it, against the field's type
    again = runs.resolve("gpt", "shakespeare-char", preset="layers", overrides={"d_model": "40", "train.lr": "1e-3",
                                                                              "attention_kwargs.radius": "3"})
    assert (again.model_config["d_model"], again.train["lr"], again.model_config["attention_kwargs"]) == (40, 1e-3, {"radius": 3})
    for bad, message in (({"d_model": "big"}, "d_model must be an int"), ({"train.stpes": 3}, "unknown train option 'stpes'"),
                         ({"task.nope": 1}, "unknown task 'shakespeare-char' option 'nope'")):
        with pytest.raises(UserError, match=message):
            runs.resolve("gpt", "shakespeare-char", overrides=bad)
    with pytest.raises(UserError, match="no preset 'huge'"):
        runs.resolve("gpt", "shakespeare-char", preset="huge")


@pytest.mark.skipif(sys.platform == "win32", reason="the run lock is flock, POSIX only")
def test_create_locks_trains_and_records_the_run(shakespeare_cache):
    import fcntl

    out = shakespeare_cache / "run"
    overrides = {**TINY, **QUIET, "train.steps": 3}
    with runs.start("gpt", "shakespeare-char", out, overrides=overrides) as run:  # the one way in from Python
        fd = os.open(out / ".lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # another writer cannot take the directory
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        recorded = json.loads((out / runs.RUN_FILE).read_text())
        assert len(recorded.pop("run_id")) == 32  # the run's id beside its settings
        assert recorded == json.loads(json.dumps(run.settings.record()))
        metrics = run.train()
    assert metrics["bpc"] > 0 and len(_losses(out)) == 3
    assert (out / "model" / "config.json").is_file() and (out / "model" / runs.VOCAB_FILE).is_file()
    fd = os.open(out / ".lock", os.O_RDWR)  # closed: released
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    # a fresh run over it is refused before anything is written; resume continues it
    with pytest.raises(UserError, match="already holds a run with checkpoints"):
        runs.start("gpt", "shakespeare-char", out, overrides=overrides)
    with pytest.raises(UserError, match="contradicts the run"):
        runs.start("gpt", "shakespeare-char", out, overrides={"train.lr": 0.5}, resume=True)
    with runs.start("gpt", "shakespeare-char", out, resume=True) as finished:
        assert finished.finished  # already at its step count: nothing to train


def test_resume_through_the_api_equals_the_cli(shakespeare_cache, capsys):
    cli, api = shakespeare_cache / "cli", shakespeare_cache / "api"
    argv = ["train", "gpt", "--task", "shakespeare-char", "--out", str(cli), *CLI_TINY]
    assert main([*argv, "--steps", "2"]) == 0
    assert main(["train", "gpt", "--task", "shakespeare-char", "--out", str(cli), "--resume", "--steps", "4"]) == 0
    with runs.start("gpt", "shakespeare-char", api, overrides={**TINY, **QUIET, "train.steps": 2}) as run:
        run.train()
    messages = []
    with runs.start("gpt", "shakespeare-char", api, overrides={"train.steps": 4}, resume=True, say=messages.append) as run:
        assert not run.finished and run.resume
        run.train()
    assert messages == ["resuming with steps=4 (the run had 2)"]
    assert _losses(api) == _losses(cli) and len(_losses(api)) == 4
    for name in ("run.json", "train_config.json"):
        a, c = (json.loads((d / name).read_text()) for d in (api, cli))
        a.pop("out_dir", None), c.pop("out_dir", None), a.pop("run_id", None), c.pop("run_id", None)  # each run its own id
        assert a == c, name
    resumed = [json.loads(line) for line in (api / "metrics.jsonl").read_text().splitlines() if '"resume"' in line]
    assert resumed and resumed[-1]["checkpoint"] == "step-00000002.safetensors"
    # evaluate returns what `qkv eval` prints
    capsys.readouterr()
    assert main(["eval", str(api), "--max-examples", "4", "--threads", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = runs.load(api).evaluate("test", max_examples=4)
    assert "bpc" in metrics and {k: round(float(v), 4) for k, v in metrics.items()} == printed
    with pytest.raises(UserError, match="takes no training options"):
        runs.load(api).evaluate("test", overrides={"train.lr": 0.1})


def test_a_bug_keeps_its_traceback_and_a_user_error_is_one_line(shakespeare_cache, monkeypatch, capsys):
    """main() turns only qkv.UserError (and missing or unreadable files) into `qkv: error:`; a
    ValueError from inside the library is a bug and propagates (Python prints its traceback)."""
    from qkv.train import Trainer

    def broken(self, resume=False):
        raise ValueError("a bug inside the trainer")

    monkeypatch.setattr(Trainer, "fit", broken)
    argv = ["train", "gpt", "--task", "shakespeare-char", "--out", str(shakespeare_cache / "run"), *CLI_TINY, "--steps", "2"]
    with pytest.raises(ValueError, match="a bug inside the trainer"):
        main(argv)
    capsys.readouterr()
    assert main([*argv, "--set", "d_model=big"]) == 2
    err = capsys.readouterr().err
    assert err.count("qkv: error:") == 1 and "d_model must be an int" in err and "Traceback" not in err


def test_load_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(UserError, match="not a qkv run directory"):
        runs.load(tmp_path)
    (tmp_path / runs.RUN_FILE).write_text("[]")
    with pytest.raises(UserError, match="corrupt: expected a JSON object"):
        runs.load(tmp_path)


def test_the_reproductions_train_through_runs(shakespeare_cache):
    """benchmarks/_repro.train_fresh: a model the script built, trained in a run directory that
    qkv.runs created, locked and recorded; repro_bert's recorded commands are valid `qkv train` lines."""
    from pathlib import Path

    from qkv.cli import build_parser
    from qkv.tasks import build_task

    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, bench)
    try:
        import _repro
        import repro_bert
    finally:
        sys.path.remove(bench)
    task = build_task("shakespeare-char", block_size=16)
    model = GPT(GPTConfig(vocab_size=task.vocab.size, n_layers=1, d_model=16, n_heads=2, d_ff=32, max_len=16))
    out = shakespeare_cache / "repro"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step-00000009.safetensors").write_bytes(b"stale")  # emptied first
    assert _repro.train_fresh(model, task, out, steps=2, batch_size=2, lr=1e-3, eval_max_examples=4, log_every=1) > 0
    info = json.loads((out / runs.RUN_FILE).read_text())
    assert (info["model"], info["task"], info["model_config"]["d_model"], info["train"]["steps"]) == ("gpt", "shakespeare-char", 16, 2)
    assert len(_losses(out)) == 2 and not (out / "model").exists()
    line = repro_bert.shown("bert", "bbc-news", out, {"task.max_vocab": 50, "train.steps": 3, "train.progress": False},
                            init=out / "pre")
    args = build_parser().parse_args(line.split()[1:])
    assert (args.model, args.task, args.init, args.steps, args.progress, args.set) == \
        ("bert", "bbc-news", str(out / "pre"), 3, False, ["task.max_vocab=50"])


def test_runs_sits_below_the_command_line():
    """qkv.runs is what the faces call: it imports neither the command line nor the benchmarks."""
    import ast

    from pathlib import Path

    parts = sorted(Path(runs.__file__).parent.glob("*.py"))
    assert len(parts) > 1  # a package: every part is read
    imported = set()
    for part in parts:
        tree = ast.parse(part.read_text(encoding="utf-8"))
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in imported if m.lstrip(".").startswith(("cli", "bench", "qkv.cli", "qkv.bench"))], imported


def test_sequences_longer_than_learned_positions_are_refused_before_anything_is_written(shakespeare_cache, capsys):
    """A task length beyond a learned positional table's max_len is the user's setting: one line
    naming both, nothing written — at train time and at evaluation time (``--set task.X``)."""
    out = shakespeare_cache / "too-long"
    settings = runs.resolve("gpt", "shakespeare-char", overrides={**TINY, **QUIET, "max_len": 8, "train.steps": 1})
    with pytest.raises(UserError, match=r"input_ids of 16 positions, beyond the model.s max_len=8 .learned positions.: give the task --set task.block_size=8"):
        runs.Run.create(out, settings)
    assert not out.exists()
    ok = shakespeare_cache / "ok"
    with runs.Run.create(ok, runs.resolve("gpt", "shakespeare-char", overrides={**TINY, **QUIET, "train.steps": 1})) as run:
        run.train()
    code = main(["eval", str(ok), "--set", "task.block_size=100", "--max-examples", "2", "--threads", "1"])
    assert code == 2 and "beyond the model's max_len" in capsys.readouterr().err


def test_a_task_sets_a_model_config_only_through_its_model_hints():
    """``Task.model_hints()`` is the one channel from a task to a model's config: an attribute
    that happens to share a config field's name (here ``n_classes``, ``d_input``) is not read, and
    only the fields the config has are taken."""
    from qkv.runs.settings import model_hints
    from qkv.tasks import Task
    from qkv.tasks.base import LanguageModelTask
    from qkv.tasks.vocab import CharVocab

    class Declared(Task):
        kind = "classification"
        n_classes, d_input = 7, 3  # attributes of the task's own

        def model_hints(self):
            return {"max_len": 5, "not_a_field": 1}

    fields = {"n_classes": int, "d_input": int, "max_len": int, "head": str}
    assert model_hints(Declared(), fields) == {"max_len": 5}
    assert Task.model_hints(Declared()) == {}  # the base class declares none
    vocab = CharVocab("abc")
    lm = LanguageModelTask(torch.arange(200) % 3 + 4, vocab, block_size=8)
    assert model_hints(lm, {**fields, "vocab_size": int, "pad_id": int}) == {
        "vocab_size": vocab.size, "pad_id": vocab.pad_id, "max_len": 64, "head": "lm"}


def test_only_rank_zero_refuses_a_directory_of_foreign_files(tmp_path, monkeypatch):
    """Under torchrun rank 0 alone writes a run; a rank that checked --out while another wrote run.json
    refused the in-flight temporary file as foreign (a race seen in
    tests/parallel/test_train_context_parallel.py: every rank wrote run.json then), so only rank 0
    checks, and only rank 0 writes run.json and the tokenizer copy (the CP test runs two ranks)."""
    from qkv.runs.directory import refuse_foreign_directory

    out = tmp_path / "run"
    out.mkdir()
    (out / ".run.json.x1y2z3.tmp").write_text("{")
    monkeypatch.setenv("RANK", "1")
    refuse_foreign_directory(out)  # rank 1: rank 0 checked before it wrote
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match="holds files that are not a qkv run"):
        refuse_foreign_directory(out)


def test_only_rank_zero_copies_the_tokenizer_into_the_run(tmp_path, monkeypatch):
    from qkv.runs.directory import TOKENIZER_FILE, keep_tokenizer

    source = tmp_path / "tok.json"
    source.write_text("{}")
    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setenv("RANK", "1")
    assert keep_tokenizer(out, {"tokenizer": str(source)}) == {"tokenizer": TOKENIZER_FILE}
    assert not (out / TOKENIZER_FILE).exists()
    monkeypatch.setenv("RANK", "0")
    assert keep_tokenizer(out, {"tokenizer": str(source)}) == {"tokenizer": TOKENIZER_FILE}
    assert (out / TOKENIZER_FILE).read_text() == "{}"


def test_a_full_disk_during_train_is_one_line_and_leaves_whole_checkpoints(shakespeare_cache, monkeypatch, capsys):
    """Issue 52 item 15: the disk fills while `qkv train` writes its third checkpoint (safetensors'
    own error for ENOSPC, raised as it was): one line, exit 2, and the checkpoints written before it
    whole, no temporary file left; --resume once there is space continues from them."""
    from safetensors import SafetensorError

    import qkv._modelfile as modelfile

    run = shakespeare_cache / "run"
    real, calls = modelfile.save_file, []

    def fills(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) < 3:
            return real(tensors, path, metadata=metadata)
        open(path, "wb").write(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modelfile, "save_file", fills)
    argv = ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), *CLI_TINY, "--save-every", "1", "--steps", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "no space left on the device" in errors[0] and "Traceback" not in err, err
    manager = runs.directory.CheckpointManager(run / "checkpoints")
    assert [p.name for p in manager.checkpoints()] == ["step-00000001.safetensors", "step-00000002.safetensors"]
    assert manager.latest_intact() == manager.path_for(2)
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp") or ".new-" in p.name]
    monkeypatch.setattr(modelfile, "save_file", real)
    assert main([*argv, "--resume"]) == 0
    assert (run / "model" / "config.json").is_file()


def test_eval_beside_a_run_saving_every_step_reads_the_latest_intact_checkpoint(shakespeare_cache):
    """Issue 52 item 16: `qkv eval` / `qkv generate` while the run trains, a checkpoint at every step
    and one kept: the one being read was removed under the reader ("does not exist", or every
    checkpoint "corrupt"). Each load now gives a model of some step, never an error."""
    import subprocess
    import time

    run = shakespeare_cache / "run"
    env = {**os.environ, "PYTHONPATH": str(runs.__file__).rsplit("/qkv/", 1)[0], "OMP_NUM_THREADS": "1"}
    argv = ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), *CLI_TINY, "--save-every", "1",
            "--keep-last", "1", "--eval-every", "100000", "--log-every", "100000", "--steps", "100000"]
    trainer = subprocess.Popen([sys.executable, "-m", "qkv", *argv], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((run / "checkpoints").glob("step-*.safetensors")) and time.monotonic() < deadline:
            assert trainer.poll() is None, trainer.stderr.read()
            time.sleep(0.1)
        loaded = 0
        started = time.monotonic()
        while time.monotonic() - started < 10 and loaded < 20:
            model = runs.load(run).model  # raised CheckpointError within a few loads
            assert isinstance(model, GPT)
            loaded += 1
        assert trainer.poll() is None  # it was training all along
    finally:
        trainer.kill()
        trainer.wait(30)
    assert loaded >= 5, loaded


def test_a_full_disk_while_train_logs_is_one_line_and_resume_drops_the_cut_record(shakespeare_cache, monkeypatch, capsys):
    """The disk fills while `qkv train` appends to metrics.jsonl: one line, exit 2 (was OSError's
    traceback); the half-written record is dropped when the run is resumed."""
    import builtins
    import errno

    import qkv.train.trainer as trainer_module

    run = shakespeare_cache / "run"
    real, calls = builtins.open, []

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:5])  # a part of the record, then the device is full
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_(path, mode="r", *args, **kwargs):
        f = real(path, mode, *args, **kwargs)
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            calls.append(path)
            if len(calls) == 3:
                return Full(f)
        return f

    monkeypatch.setattr(trainer_module, "open", open_, raising=False)
    argv = ["train", "gpt", "--task", "shakespeare-char", "--out", str(run), *CLI_TINY, "--steps", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "metrics.jsonl: no space left on the device" in errors[0] and "Traceback" not in err, err
    monkeypatch.undo()
    monkeypatch.setenv("QKV_DATA", str(shakespeare_cache / "data"))
    assert main([*argv, "--resume"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # every line whole
    assert records and records[-1]["step"] == 4
