"""What a new user reads from the qkv command (issue 20 item 7): parameter counts with their
digits, translations that stop at the task's longest target, threads that suit a busy machine."""

import pytest

from qkv.cli import default_threads, main, parameter_count
from qkv.registry import lookup
from qkv.tasks.base import PairsSeq2SeqTask
from qkv.tasks.vocab import CharVocab


@pytest.mark.parametrize("n,text", [
    (0, "0 parameters"), (1, "1 parameter"), (12_345, "12,345 parameters"), (999_999, "999,999 parameters"),
    (1_234_567, "1.23 M parameters"), (85_000_000, "85 M parameters"), (2_500_000_000, "2.5 B parameters"),
])
def test_parameter_count_keeps_its_digits(n, text):
    assert parameter_count(n) == text


def test_train_prints_a_tiny_model_parameter_count(train_argv, tmp_path, capsys):
    assert main(train_argv("transformer", "reverse", tmp_path / "run", "--set", "d_model=8", "--set", "n_heads=2",
                           "--set", "d_ff=8", "--set", "n_layers=1", "--set", "task.max_len=3", "--set", "task.eval_size=4",
                           "--threads", "1", steps=1)) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("qkv: training"))
    assert "0.00 M" not in line and " parameters" in line
    count = int(line.split("(")[1].split(" parameters")[0].replace(",", ""))
    assert 0 < count < 1_000_000


def test_translate_stops_at_the_task_longest_target(train_argv, tmp_path, capsys, monkeypatch):
    """An under-trained dates model that never says <eos> printed 128 characters; it now stops at
    ``max_target_len + 1`` = 11 tokens, and --max-new-tokens still overrides."""
    run = tmp_path / "run"
    assert main(train_argv("transformer", "dates", run, "--set", "d_model=8", "--set", "n_heads=2", "--set", "d_ff=8",
                           "--set", "n_layers=1", "--set", "task.eval_size=4", "--threads", "1", steps=1)) == 0
    asked = []
    cls = lookup("model", "transformer")
    generate = cls.generate

    def spy(self, *args, **kwargs):
        asked.append(kwargs["max_new_tokens"])
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(cls, "generate", spy)
    capsys.readouterr()
    assert main(["translate", str(run), "March 3, 1999", "--threads", "1"]) == 0
    source, output = capsys.readouterr().out.rstrip("\n").split("\t")
    assert asked == [11] and len(output) <= 11
    assert main(["translate", str(run), "March 3, 1999", "--threads", "1", "--max-new-tokens", "3"]) == 0
    assert asked == [11, 3]


class _Pairs(PairsSeq2SeqTask):
    def __init__(self):
        pairs = {"train": [("a", "xxxxxxx")], "valid": [("b", "xx")], "test": [("c", "xxxx")]}
        self.vocab = CharVocab("abcx")
        super().__init__(pairs)


def test_a_pairs_task_bounds_targets_by_its_longest():
    assert _Pairs().max_target_len == 7


# ----------------------------------------------------------------------------- threads on a busy machine


@pytest.mark.parametrize("cores,load,threads", [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 7.0, 1), (16, 3.2, 13), (16, 40.0, 1), (1, 0.0, 1),
])
def test_default_threads_leave_the_busy_cores_alone(cores, load, threads):
    assert default_threads(cores, load) == threads


def test_default_threads_needs_a_core():
    with pytest.raises(ValueError, match="cores must be >= 1"):
        default_threads(0, 0.0)


@pytest.fixture
def machine(monkeypatch):
    """A 2-core machine whose load average the test sets; torch's thread count recorded, not set."""
    import os

    import torch

    from qkv import _machine

    state = {"load": 0.0, "set": []}
    monkeypatch.setattr(os, "getloadavg", lambda: (state["load"],) * 3)
    monkeypatch.setattr(_machine, "physical_cores", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", state["set"].append)
    return state


def test_a_loaded_machine_trains_with_one_thread_and_says_why(machine, capsys):
    from qkv._machine import set_threads

    machine["load"] = 7.0
    assert set_threads(None, warn_load=True) == 1 and machine["set"] == [1]
    assert "load average is 7.0 on 2 cores: training with 1 thread(s)" in capsys.readouterr().err
    assert set_threads(2, warn_load=True) == 2  # --threads wins, silently
    machine["load"] = 0.1
    assert set_threads(None, warn_load=True) == 2 and machine["set"] == [1, 2, 2]
    assert capsys.readouterr().err == ""


def test_train_picks_its_threads_from_the_load(machine, train_argv, tmp_path, capsys):
    """What `make run` (no --threads) does on the shared machine of issue 20."""
    machine["load"] = 7.0
    assert main(train_argv("transformer", "reverse", tmp_path / "run", "--set", "d_model=8", "--set", "n_heads=2",
                           "--set", "d_ff=8", "--set", "n_layers=1", "--set", "task.max_len=3", "--set", "task.eval_size=4",
                           steps=1)) == 0
    assert "1 thread(s)]" in capsys.readouterr().out


def test_text_outside_the_vocabulary_and_bad_outputs_are_named_errors(train_argv, tmp_path, capsys):
    """CLI audit: characters a character-level model cannot read used to become <unk> silently;
    viz of a model without attention, and outputs of an unwritable kind or place, were tracebacks;
    an output without a suffix was reported under a name matplotlib did not write."""
    run = tmp_path / "run"
    small = ("--set", "d_model=8", "--set", "n_heads=2", "--set", "d_ff=8", "--set", "n_layers=1",
             "--set", "task.max_len=3", "--set", "task.eval_size=4", "--threads", "1")
    assert main(train_argv("transformer", "reverse", run, *small, steps=1)) == 0
    capsys.readouterr()
    assert main(["translate", str(run), "12", "a1b"]) == 2
    err = capsys.readouterr().err
    assert "'ab'" in err and "'0123456789'" in err and "Traceback" not in err
    assert main(["translate", str(run), ""]) == 2 and "empty" in capsys.readouterr().err
    assert main(["viz", str(run), "--text", "x1", "--out", str(tmp_path / "a.png")]) == 2
    assert "'x'" in capsys.readouterr().err and not (tmp_path / "a.png").exists()
    (tmp_path / "file").write_text("")
    for out, says in ((tmp_path / "a.txt", "'.txt'"), (tmp_path / "file" / "a.png", "is a file, not a folder"),
                      (tmp_path, "is a directory")):
        assert main(["viz", str(run), "--out", str(out)]) == 2
        assert says in capsys.readouterr().err
    assert main(["viz", str(run), "--html", str(tmp_path)]) == 2 and "is a directory" in capsys.readouterr().err
    assert not list(tmp_path.parent.glob("*.tmp"))
    assert main(["viz", str(run), "--out", str(tmp_path / "noext")]) == 0
    assert f"wrote {tmp_path / 'noext.png'}" in capsys.readouterr().out and (tmp_path / "noext.png").exists()
    assert main(["viz", "--pattern", "strided", "--length", "0"]) == 2 and "--length" in capsys.readouterr().err

    bare = tmp_path / "bare"
    assert main(train_argv("seq2seq", "reverse", bare, "--attention", "none", "--set", "task.max_len=3",
                           "--set", "task.eval_size=4", "--threads", "1", steps=1)) == 0
    capsys.readouterr()
    assert main(["viz", str(bare), "--out", str(tmp_path / "b.png")]) == 2
    assert "no attention weights" in capsys.readouterr().err


def test_library_warnings_print_as_one_qkv_line(monkeypatch):
    import warnings

    import qkv.cli as cli

    assert cli._one_line_warning(UserWarning("checksum mismatch"), UserWarning, "/x/trainer.py", 311) == \
        "qkv: warning: checksum mismatch\n"
    before, seen = warnings.formatwarning, []
    monkeypatch.setattr(cli, "_cmd_list", lambda args: seen.append(warnings.formatwarning) or 0)
    assert main(["list"]) == 0
    assert seen == [cli._one_line_warning] and warnings.formatwarning is before  # during the command only


def test_a_new_run_is_not_written_into_a_folder_of_other_files(train_argv, tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "data.txt").write_text("mine")
    args = ("--set", "task.n_train=4", "--set", "task.n_test=4", "--threads", "1")
    assert main(train_argv("nadaraya-watson", "nw-regression", folder, *args, steps=1)) == 2
    assert "not a qkv run (data.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["data.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(train_argv("nadaraya-watson", "nw-regression", empty, *args, steps=1)) == 0


def test_data_list_refuses_names_it_would_ignore(capsys):
    assert main(["data", "list", "extra"]) == 2 and "takes no names" in capsys.readouterr().err


def test_bench_refuses_a_file_as_its_out_folder_before_measuring(tmp_path, capsys, monkeypatch):
    from qkv import bench

    (tmp_path / "file").write_text("")
    ran = []
    monkeypatch.setattr(bench.kernels, "run", lambda args: ran.append(args))
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(SystemExit) as exit_:
            bench.main(["kernels", "--quick", "--threads", "1", "--out", str(out)])
        assert exit_.value.code == 2 and "is a file" in capsys.readouterr().err
    assert ran == []
    bench.main(["kernels", "--quick", "--threads", "1", "--out", str(tmp_path / "new" / "dir")])
    assert len(ran) == 1
