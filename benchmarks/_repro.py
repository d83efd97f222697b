"""What the reproduction scripts share: training a model into a fresh run directory through
``qkv.runs`` (imported as ``from _repro import train_fresh``: the scripts run as
``python benchmarks/repro_*.py``, so this folder is on ``sys.path``)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import qkv.runs


def train_fresh(model, task, out: Path, steps: int, batch_size: int, lr: float, warmup: int = 50, **config: Any) -> float:
    """Train ``model`` on ``task`` for ``steps`` with no periodic evaluation, checkpoint or progress
    bar into the run directory ``out`` (emptied first; ``qkv.runs.Run.of``: locked, ``run.json``
    written; no final ``model/`` saved); returns the wall-clock seconds. ``config``: any other
    ``TrainConfig`` field (``weight_decay``, ``seed``, ``eval_max_examples``, ``grad_clip``, ...)."""
    shutil.rmtree(out, ignore_errors=True)
    settings = dict(steps=steps, batch_size=batch_size, lr=lr, warmup=min(warmup, steps // 4), eval_every=0,
                    eval_batches=0, save_every=0, keep_last=1, progress=False, tensorboard=False)
    settings.update(config)
    start = time.time()
    with qkv.runs.Run.of(out, model, task, settings) as run:
        run.train(save=False)
    return time.time() - start


def smoke_dir(name: str) -> Path:
    """Where a ``--quick`` (smoke) run writes its page, pictures and results — a temporary folder
    with an ``img/`` inside, never docs/reproductions, so that a smoke run cannot overwrite the
    published reproduction."""
    path = Path(tempfile.gettempdir()) / f"qkv-repro-{name}"
    (path / "img").mkdir(parents=True, exist_ok=True)
    print(f"--quick: writing to {path}, not docs/reproductions")
    return path
