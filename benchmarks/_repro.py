"""What the reproduction scripts share: training a model into a fresh run directory through
``qkv.runs`` (imported as ``from _repro import train_fresh``: the scripts run as
``python benchmarks/repro_*.py``, so this folder is on ``sys.path``), and running ``qkv train``
as the command line would (``train``, ``shown``, ``evaluate_test``, ``evals``)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

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


def replace_section(doc: Path, section: str, marks: Tuple[str, str], before: str) -> None:
    """Put ``section`` (which starts with ``marks[0]`` and ends with ``marks[1]``) on the page
    ``doc`` in place of the marked one, or, the first time, before the text ``before`` (at the end
    when ``before`` is not on the page)."""
    start, end = marks
    text = doc.read_text()
    if start in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    elif before in text:
        text = text.replace(before, "\n" + section + "\n" + before, 1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text)


def smoke_dir(name: str) -> Path:
    """Where a ``--quick`` (smoke) run writes its page, pictures and results — a temporary folder
    with an ``img/`` inside, never docs/reproductions, so that a smoke run cannot overwrite the
    published reproduction."""
    path = Path(tempfile.gettempdir()) / f"qkv-repro-{name}"
    (path / "img").mkdir(parents=True, exist_ok=True)
    print(f"--quick: writing to {path}, not docs/reproductions")
    return path


def train(model: str, task: str, out: Path, overrides: Dict[str, Any], init: Optional[Path] = None) -> None:
    """``qkv train MODEL --task TASK --out OUT`` with ``overrides`` (``qkv.runs.start``)."""
    with qkv.runs.start(model, task, out, overrides=overrides, init=None if init is None else str(init)) as run:
        metrics = run.train()
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}), flush=True)


def evaluate_test(run_dir: Path) -> Dict[str, float]:
    """``qkv eval RUN``: the test split's metrics, rounded as the command prints them."""
    metrics = qkv.runs.load(run_dir).evaluate("test")
    return {k: round(float(v), 4) for k, v in metrics.items()}


def evals(run_dir: Path) -> List[Dict[str, float]]:
    """The run's periodic evaluations (``metrics.jsonl`` records of event ``eval``)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "eval"]


def shown(model: str, task: str, out: Path, overrides: Dict[str, Any], init: Optional[Path] = None) -> str:
    """The ``qkv train`` command line that runs the same as ``train(...)``: ``train.X`` overrides as
    ``--X`` flags, the others as ``--set key=value``."""
    words = ["qkv", "train", model, "--task", task]
    flags: List[str] = []
    for key, value in overrides.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key.startswith("train."):
            flags += ["--" + key[len("train."):].replace("_", "-"), text]
        else:
            words += ["--set", f"{key}={text}"]
    words += [*(["--init", str(init)] if init is not None else []), "--out", str(out), *flags, "--threads", "1"]
    return " ".join(w if " " not in w else repr(w) for w in words)
