"""What any ``torch.nn.Module`` needs around an evaluation: its device, and eval mode without
gradients that gives the module back in the mode it came in (tasks, the trainer, the pictures and
the benchmarks all evaluate models; this is their one copy)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["evaluating", "module_device"]


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
