"""Suite-wide settings: one intra-op thread per test process. The suite runs under pytest-xdist
with one worker per core; more threads per worker only contend (tiny ops slow down 100x)."""

import bz2
import importlib.util
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def shakespeare_cache(tmp_path, monkeypatch):
    """A one-play Shakespeare data set in a temporary ``QKV_DATA`` (CLI training tests without the real
    cache); returns the temporary directory (the data under ``data/``)."""
    texts = tmp_path / "data" / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture
def train_argv():
    """``qkv train`` arguments of a short, quiet run (no progress bar, no TensorBoard, one small
    evaluation): ``train_argv(model, task, out, *extra, steps=2, batch_size=2)``; ``extra`` (``--set``
    options, other flags) comes last, so a flag given there overrides these."""

    def build(model: str, task: str, out, *extra: str, steps: int = 2, batch_size: int = 2):
        return ["train", model, "--task", task, "--out", str(out), "--steps", str(steps), "--batch-size",
                str(batch_size), "--warmup", "1", "--eval-batches", "1", "--eval-max-examples", "4",
                "--progress", "false", "--tensorboard", "false", *extra]

    return build


@pytest.fixture
def byte_data(tmp_path, monkeypatch):
    """A temporary ``QKV_DATA`` holding a small fake Wikipedia dump, 2,225 fake BBC articles and a
    one-play Shakespeare."""
    root = tmp_path / "data"
    (root / "enwiki").mkdir(parents=True)
    text = b"".join(b"<page><title>Article %d</title><text>Some words of article %d.</text></page>\n" % (i, i)
                    for i in range(400))
    from qkv.tasks.data import _ENWIKI_FILE

    (root / "enwiki" / _ENWIKI_FILE).write_bytes(bz2.compress(text))
    for i in range(2225):
        folder = root / "bbc" / ("business", "entertainment", "politics", "sport", "tech")[i % 5]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.txt").write_text(f"Headline {i}\n\n" + "news " * (5 + i % 7) + folder.name)
    texts = root / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(root))
    return tmp_path


@pytest.fixture
def benchmark_script(monkeypatch):
    """``load(NAME)``: ``benchmarks/NAME.py`` as a fresh module (each call a new one, so the
    globals a ``--quick`` run redirects start clean), with ``benchmarks/`` importable as when the
    script runs (``import claims``, ``from _repro import ...``)."""
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(root))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
