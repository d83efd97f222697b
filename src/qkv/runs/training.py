"""Training a run: its model built from its settings (seeded), checked against its task, trained and
saved."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from .. import parallel
from .._errors import UserError, user_input
from .._modelfile import RUN_FILE
from ..train import TrainConfig, Trainer
from ..train.distributed import refuse_unsplittable
from .directory import mark_model, rank, save_vocab
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


def check_splits(model: Any, task: Any, config: TrainConfig) -> None:
    """``--context-parallel P``: refused before anything is written when the model cannot run on
    sequence shards (its declaration, ``QKVModel.context_parallel``), ``P`` does not divide the
    processes (torchrun's ``WORLD_SIZE``), the task's sequences do not cut into ``P`` shards or a
    kernel's strategy cannot split the batch's rows (``qkv.parallel.check_batch``)."""
    P = config.context_parallel
    if P == 1:
        return
    refuse_unsplittable(model, bool(getattr(task, "stream", False) and model.carries_state))
    world = int(os.environ.get("WORLD_SIZE") or 1)
    if world % P:
        raise UserError(f"--context-parallel {P} must divide the number of processes ({world}): start them with "
                        f"torchrun --nproc_per_node {P} (or a multiple of {P}: data-parallel groups of {P})")
    main = task.get_batch("train", 1, 0).get(model.input_key)
    if main is not None and main.dim() >= 2 and main.shape[1] % P:
        raise UserError(f"--context-parallel {P}: the task's sequences of {main.shape[1]} positions do not cut into "
                        f"{P} equal shards; choose a length that is a multiple of {P} (e.g. --set task.block_size=...)")
    if main is not None and main.dim() >= 2:
        try:  # the rows a kernel's strategy hands each rank (Ulysses: batch x heads)
            parallel.check_batch(model, int(main.shape[1]), P, config.batch_size)
        except ValueError as error:
            raise UserError(f"--context-parallel {P}: {error} (--batch-size {config.batch_size})") from None


def train(model: Any, task: Any, config: TrainConfig, directory: Path, *, resume: bool, save: bool) -> Dict[str, float]:
    """Train ``model`` on ``task`` (continuing the latest intact checkpoint when ``resume``), then
    (``save``, rank 0 only) save the final ``model/`` with the task's vocabulary; the trainer's
    last metrics."""
    metrics = Trainer(model, task, config).fit(resume=resume)
    if save and rank() == 0:  # under torchrun only rank 0 writes
        model.save_pretrained(directory / "model")
        save_vocab(task, directory / "model")
        if (directory / RUN_FILE).is_file():
            mark_model(directory)
    return metrics
