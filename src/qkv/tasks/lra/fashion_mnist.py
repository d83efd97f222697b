"""Stand-in for LRA Image on Fashion-MNIST: the ``fashion-mnist-seq`` task (pixels read one by one)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import SPLITS, check_positive_int
from qkv.tasks.lra.base import LRATask, epoch_positions, int_option, pixel_view

__all__ = ["FashionMnistSequence"]


@register("task", "fashion-mnist-seq", "lra-image")
class FashionMnistSequence(LRATask):
    """Stand-in for LRA Image: Fashion-MNIST classes (10) from the pixels read one by one as a sequence.

    LRA's Image task classifies CIFAR-10 images turned grey and read as 1,024 8-bit pixel tokens;
    CIFAR-10 is not in the package registries, so this stand-in reads Fashion-MNIST (Debian's
    ``dataset-fashion-mnist``, ``qkv data fetch fashion-mnist``) the same way, each 28x28 image
    centred on a black ``size x size`` canvas (default 32: LRA's 1,024 tokens).

    Args:
        size: canvas side >= 28 (the sequence has ``size**2`` pixels, raster order).
        cache_dir: the data cache; images, labels: ``(N, 28, 28)`` uint8 and ``(N,)`` instead of
            Fashion-MNIST (tests; split 80/10/10).

    Splits: the 60,000 training images less the last 5,000 (valid) and the 10,000 test images.
    """

    n_classes = 10

    def __init__(self, *, size: int = 32, cache_dir: Optional[str] = None, images: Optional[Tensor] = None,
                 labels: Optional[Tensor] = None) -> None:
        from ..classify import split_indices
        from ..data import load_fashion_mnist

        self.size = int_option("size", size, 28)
        self.max_len = self.size * self.size
        self.image_size = (self.size, self.size)
        if (images is None) != (labels is None):
            raise ValueError("images and labels must be given together (or neither, to load Fashion-MNIST)")
        if images is None:
            train_x, train_y = load_fashion_mnist(cache_dir, "train")
            test_x, test_y = load_fashion_mnist(cache_dir, "test")
            cut = len(train_y) - 5000
            parts = {"train": (train_x[:cut], train_y[:cut]), "valid": (train_x[cut:], train_y[cut:]),
                     "test": (test_x, test_y)}
        else:
            if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28) or images.dtype != torch.uint8:
                raise ValueError(f"images must be (N, 28, 28) uint8, got {tuple(images.shape)} {images.dtype}")
            index = split_indices(len(images), key="fashion-mnist-seq")
            parts = {s: (images[index[s]], labels[index[s]]) for s in SPLITS}
        margin = (self.size - 28) // 2
        self._splits: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for split, (x, y) in parts.items():
            canvas = np.zeros((len(x), self.size, self.size), dtype=np.uint8)
            canvas[:, margin:margin + 28, margin:margin + 28] = x.numpy()
            self._splits[split] = (canvas, y.long().numpy())

    @property
    def vocab_size(self) -> int:
        return 256  # pixel intensities

    def _draw(self, split, n, seed, step, rank, world_size):
        images, labels = self._splits[split]
        return [(images[i], int(labels[i])) for i in epoch_positions(len(labels), (self.registry_name, seed, split), n,
                                                                      step, rank, world_size)]

    def _held_out(self, split, n):
        images, labels = self._splits[split]
        return [(images[i], int(labels[i])) for i in range(n)]

    def _held_out_size(self, split):
        return len(self._splits[split][1])

    def collate(self, examples):
        images = np.stack([image for image, _ in examples]).reshape(len(examples), -1)  # (B, size**2), raster order
        return {"input_ids": torch.from_numpy(images.astype(np.int64)), "labels": torch.tensor([y for _, y in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training images (their shape) with their classes."""
        check_positive_int("n", n)
        return [{"input": f"{self.size}x{self.size} pixels", "label": int(y)} for _, y in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Where a few pixels of a held-out image look: per layer and head, a ``size x size`` map."""
        names = ("T-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")
        return pixel_view(model, self, *self._held_out("test", 1)[0], names=names)
