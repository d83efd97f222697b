"""Handwritten digit classification on the 5,000 real MNIST digits of
:func:`qkv.tasks.data.load_mnist` (28x28, 500 per class; scikit-learn's 8x8 ``load_digits`` is
not a dependency of qkv), split 80/10/10 at random with a fixed seed.

Batches: ``images (B, 1, 28, 28)`` float (pixels / 255), ``labels (B,)`` long. Metrics:
``accuracy`` and ``loss`` (cross-entropy).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import SPLITS
from qkv.tasks.classify import TensorTask, split_indices
from qkv.tasks.data import load_mnist

__all__ = ["Digits"]


@register("task", "digits")
class Digits(TensorTask):
    """MNIST digit classification (5,000 images, 10 classes).

    Args:
        cache_dir: MNIST cache directory (``qkv data fetch mnist``).
        images, digits: ``(N, 28, 28)`` uint8 images and ``(N,)`` labels to use instead of MNIST
            (tests use small fixtures).
    """

    def __init__(self, *, cache_dir: Optional[str] = None, images: Optional[Tensor] = None,
                 digits: Optional[Tensor] = None) -> None:
        if (images is None) != (digits is None):
            raise ValueError("images and digits must be given together (or neither, to load MNIST)")
        if images is None:
            images, digits = load_mnist(cache_dir)
        if images.dim() != 3 or digits.shape != images.shape[:1]:
            raise ValueError(f"images must be (N, H, W) with digits (N,), got {tuple(images.shape)} and {tuple(digits.shape)}")
        parts = split_indices(len(digits), key="digits")
        x = images.float().div(255).unsqueeze(1)  # (N, 1, H, W)
        self._splits = {s: {"images": x[parts[s]], "labels": digits[parts[s]].long()} for s in SPLITS}
        self._check_splits()

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Channel gates of every stage for the first held-out image of each digit (``qkv viz``)."""
        from .views import gates_view

        part = self._splits["test"]
        picks = [int(torch.nonzero(part["labels"] == d)[0]) for d in range(10) if bool((part["labels"] == d).any())]
        return gates_view(model, part["images"][picks], [int(part["labels"][i]) for i in picks])
