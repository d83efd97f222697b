"""Training: the ``Trainer`` loop, learning-rate schedules, safetensors checkpoints and
``torchrun`` distributed set-up (design.md §5, docs/contracts.md)."""

from . import checkpoint, distributed, schedules
from .checkpoint import (
    CheckpointError,
    CheckpointManager,
    load_checkpoint,
    load_model_state,
    read_checkpoint_meta,
    save_checkpoint,
    save_model,
)
from .lock import RunLock, RunLockError
from .trainer import TrainConfig, Trainer

__all__ = [
    "Trainer",
    "TrainConfig",
    "CheckpointError",
    "RunLock",
    "RunLockError",
    "CheckpointManager",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_meta",
    "save_model",
    "load_model_state",
    "checkpoint",
    "distributed",
    "schedules",
]
