"""What any ``torch.nn.Module`` needs around an evaluation: its device, and eval mode without
gradients that gives the module back in the mode it came in (tasks, the trainer, the pictures and
the benchmarks all evaluate models; this is their one copy); and :class:`Trainable`, the hooks the
trainer calls on a model (docs/contracts.md)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["evaluating", "module_device", "Trainable"]


@runtime_checkable
class Trainable(Protocol):
    """What ``qkv.train.Trainer`` calls on the module it trains, beside ``forward(**batch)`` with a
    scalar ``.loss`` (docs/contracts.md). ``qkv.models.QKVModel`` declares every hook with a
    default that does nothing; any ``torch.nn.Module`` that has them trains as well."""

    #: ``forward(..., state=, return_state=True)`` continues the previous batch (on a stream task)
    carries_state: bool

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """Before each update: the step about to be taken and the run's length."""

    def on_evaluate(self, metrics: Dict[str, float]) -> None:
        """After each evaluation: the validation metrics."""

    def export_state(self, state: Any) -> Dict[str, Tensor]:
        """The carried state as named tensors, for a checkpoint."""

    def import_state(self, tensors: Dict[str, Tensor]) -> Any:
        """The carried state back from a checkpoint's tensors."""


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter; the CPU for a module without parameters."""
    try:
        return next(module.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``with evaluating(model):`` runs its block with ``model`` in eval mode and without
    gradients, and puts ``model`` back in training mode afterwards if it was (also when the block
    raises)."""
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)
