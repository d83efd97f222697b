"""A model directory changes as a whole (issue 37, item 1): ``kill -9`` at any moment of
``save_pretrained``, in qkv's format and in Hugging Face's, leaves the old model or the new one —
never new weights beside an old ``config.json`` — and no temporary file inside the directory.
What a killed swap leaves beside it is finished by the next load (``qkv._io.settle_directory``)."""

import json
import multiprocessing
import os
import random
import sys
import time

import pytest
import torch

from qkv._io import atomic_directory, settle_directory
from qkv._modelfile import read_layout
from qkv.models import QKVModel
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.train.checkpoint import CheckpointError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and SIGKILL are POSIX")

SMALL = dict(vocab_size=11, max_len=16, n_heads=2, dropout=0.0, attention_dropout=0.0, residual="pre-ln",
             positional="learned", activation="gelu-tanh")


def _models():
    """Two GPTs of different widths: new weights with the old config cannot load as either."""
    torch.manual_seed(0)
    old = GPT(GPTConfig(n_layers=1, d_model=8, d_ff=16, **SMALL)).eval()
    new = GPT(GPTConfig(n_layers=2, d_model=16, d_ff=32, **SMALL)).eval()
    return old, new


def _save_forever(directory, fmt):
    old, new = _models()
    while True:
        old.save_pretrained(directory, format=fmt)
        new.save_pretrained(directory, format=fmt)


def _which(model, candidates):
    """The index of the candidate whose weights ``model`` has exactly, else None."""
    mine = model.state_dict()
    for i, candidate in enumerate(candidates):
        theirs = candidate.state_dict()
        if mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine):
            return i
    return None


def _raw_is_whole(directory, fmt):
    """What a reader that knows nothing of qkv (transformers) finds: no directory (a swap of two
    renames cut between them), or a config.json whose width is that of the weights beside it."""
    if not directory.exists():
        return True
    config = json.loads((directory / "config.json").read_text())
    width = config["n_embd"] if fmt == "huggingface" else config["d_model"]
    name = "transformer.wte.weight" if fmt == "huggingface" else "stack.embed.token.weight"
    return read_layout(directory / "model.safetensors")[name][1][1] == width


@pytest.mark.parametrize("fmt", ["qkv", "huggingface"])
def test_kill_during_save_leaves_the_old_or_the_new_model(tmp_path, fmt):
    directory = tmp_path / "model"
    candidates = _models()
    rng = random.Random(37)
    fork = multiprocessing.get_context("fork")
    seen = []
    for _ in range(12):
        child = fork.Process(target=_save_forever, args=(directory, fmt), daemon=True)
        child.start()
        started = time.monotonic()
        while not (directory / "config.json").exists() and time.monotonic() - started < 20:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.03))  # a few saves in: somewhere inside one
        child.kill()
        child.join()
        assert _raw_is_whole(directory, fmt)
        loaded = QKVModel.from_pretrained(directory)
        which = _which(loaded, candidates)
        assert which is not None, "the directory holds neither the old model nor the new one"
        seen.append(which)
        assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]
    # whatever the kills left beside the directory is gone once a writer has finished
    candidates[0].save_pretrained(directory, format=fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_swap_cut_between_its_two_renames_is_finished_by_the_next_load(tmp_path):
    old, new = _models()
    directory = tmp_path / "model"
    old.save_pretrained(directory)
    new.save_pretrained(tmp_path / "staged")
    # what a writer without renameat2 leaves when killed between ``NAME -> .NAME.old-T`` and ``.NAME.new-T -> NAME``
    token = "00000000-999999999-0"
    os.rename(directory, tmp_path / f".model.old-{token}")
    os.rename(tmp_path / "staged", tmp_path / f".model.new-{token}")
    assert _which(QKVModel.from_pretrained(directory), (old, new)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_failed_save_leaves_the_directory_as_it_was(tmp_path):
    old, new = _models()
    directory = tmp_path / "model"
    old.save_pretrained(directory)
    (directory / "vocab.json").write_text("{}\n")
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_directory(directory) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("disk full")
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    # a save that succeeds keeps the files it does not write (a run's vocab.json)
    new.save_pretrained(directory)
    assert (directory / "vocab.json").read_text() == "{}\n"
    assert _which(QKVModel.from_pretrained(directory), (old, new)) == 1
    with atomic_directory(directory, keep_others=False) as tmp:  # a folder replaced by exactly what was written
        (tmp / "only.txt").write_text("x")
    assert [p.name for p in directory.iterdir()] == ["only.txt"]


def test_a_dead_writers_temporary_directory_is_removed_and_a_live_ones_kept(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    fork = multiprocessing.get_context("fork")
    dead = fork.Process(target=time.sleep, args=(0,))
    dead.start()
    dead.join()
    host = settle_directory.__globals__["owner_token"]().split("-")[0]
    (tmp_path / f".model.new-{host}-{dead.pid}-ab").mkdir()
    (tmp_path / f".model.new-{host}-{os.getpid()}-cd").mkdir()
    settle_directory(directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".model.new-{host}-{os.getpid()}-cd", "model"]


def test_a_half_written_directory_of_an_older_qkv_is_one_line(tmp_path):
    """New weights beside an old config.json (what the per-file renames of an older qkv left)."""
    old, new = _models()
    old.save_pretrained(tmp_path / "a")
    new.save_pretrained(tmp_path / "b")
    os.replace(tmp_path / "b" / "model.safetensors", tmp_path / "a" / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        QKVModel.from_pretrained(tmp_path / "a")
    message = str(e.value)
    assert "\n" not in message and "has shape" in message and "come from different models" in message


def test_saving_into_the_working_directory_keeps_the_process_in_it(tmp_path, monkeypatch):
    old, new = _models()
    directory = tmp_path / "model"
    old.save_pretrained(directory)
    monkeypatch.chdir(directory)
    new.save_pretrained(".")
    assert os.getcwd() == str(directory) and os.path.samefile(".", directory)
    assert _which(QKVModel.from_pretrained("."), (old, new)) == 1


def test_two_first_saves_into_one_new_directory_both_succeed(tmp_path, monkeypatch):
    """Issue 52 item 15: two writers both find the directory absent and rename their new one into
    place; the second rename met the first's directory (ENOTEMPTY, 1 in 100 with two processes). Here
    the other writer's whole save happens between the look and the rename: the second swaps instead."""
    old, new = _models()
    directory = tmp_path / "model"
    real, raced = os.rename, []

    def rename(src, dst):
        if str(dst) == str(directory) and not raced:
            raced.append(src)
            old.save_pretrained(directory)  # the other writer got there first
        return real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    new.save_pretrained(directory)
    assert raced and _which(QKVModel.from_pretrained(directory), (old, new)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_two_processes_saving_one_new_directory_at_once_both_succeed(tmp_path):
    """The same race between processes, left to the scheduler: 20 pairs, every save succeeds and the
    directory is one of the two models, whole."""
    ctx = multiprocessing.get_context("fork")
    old, new = _models()
    for i in range(20):
        directory = tmp_path / f"model{i}"
        writers = [ctx.Process(target=m.save_pretrained, args=(directory,)) for m in (old, new)]
        for w in writers:
            w.start()
        for w in writers:
            w.join(60)
        assert [w.exitcode for w in writers] == [0, 0], i
        assert _which(QKVModel.from_pretrained(directory), (old, new)) in (0, 1)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("fmt", ["qkv", "huggingface"])
def test_a_full_disk_during_a_save_is_one_line_and_leaves_the_old_model(tmp_path, monkeypatch, fmt):
    """Issue 52 item 15: safetensors' own error for ENOSPC (a SafetensorError) was raised as it is."""
    from safetensors import SafetensorError

    import qkv._modelfile as modelfile
    from qkv._errors import UserError

    old, new = _models()
    directory = tmp_path / "model"
    old.save_pretrained(directory, format=fmt)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}

    def full(tensors, path, metadata=None):
        open(path, "wb").write(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modelfile, "save_file", full)
    with pytest.raises(UserError) as e:
        new.save_pretrained(directory, format=fmt)
    message = str(e.value)
    assert "\n" not in message and "no space left on the device" in message and str(directory) in message, message
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
