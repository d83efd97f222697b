"""Training a run: its model built from its settings (seeded), checked against its task, trained and
saved."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from .._errors import UserError, user_input
from ..train import TrainConfig, Trainer
from .directory import rank, save_vocab
from .settings import init_params


def build_model(model_cls: Any, values: Dict[str, Any], seed: int) -> Any:
    """``model_cls.from_config(values)`` after seeding every generator with ``seed``: the same seed
    gives the same initial weights. (Every kernel states its own knobs, ``Kernel.default_knobs``,
    so a model never misses one; a wrong one is the config's error, a ``UserError``.)"""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    with user_input():
        return model_cls.from_config(values)


def check_fits(model: Any, task: Any, task_name: str) -> None:
    """A model with learned positions (``config.positional == "learned"``) cannot read sequences
    longer than its ``max_len``: refused here, naming both settings, rather than by the model's
    first forward deep inside training or evaluation."""
    config = model.config
    max_len = getattr(config, "max_len", None)  # configs differ: only those with positions have one
    if not max_len or getattr(config, "positional", None) != "learned":
        return
    batch = task.get_batch("train", 1, 0)
    for key in ("input_ids", "src_ids", "tgt_ids"):
        value = batch.get(key)
        if value is not None and value.dim() >= 2 and value.shape[-1] > max_len:
            option = next((k for k in ("max_len", "block_size", "seq_len") if k in init_params(type(task))), None)
            shorter = f"--set task.{option}={max_len}" if option else "a shorter length for the task"
            raise UserError(f"task {task_name!r} gives {key} of {value.shape[-1]} positions, beyond the model's "
                            f"max_len={max_len} (learned positions): give the task {shorter} (the only way when "
                            f"--init fixes the positions), or a new model --set max_len={value.shape[-1]}")


def train(model: Any, task: Any, config: TrainConfig, directory: Path, *, resume: bool, save: bool) -> Dict[str, float]:
    """Train ``model`` on ``task`` (continuing the latest intact checkpoint when ``resume``), then
    (``save``, rank 0 only) save the final ``model/`` with the task's vocabulary; the trainer's
    last metrics."""
    metrics = Trainer(model, task, config).fit(resume=resume)
    if save and rank() == 0:  # under torchrun only rank 0 writes
        model.save_pretrained(directory / "model")
        save_vocab(task, directory / "model")
    return metrics
