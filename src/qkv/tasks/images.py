"""Image generation on real grey-scale images: MNIST digits and Fashion-MNIST clothes (28x28).

Each pixel's intensity ``x in [0, 255]`` is quantised to ``levels`` values,
``v = floor(x levels / 256)`` (``levels=256`` keeps the 8-bit intensities). Batches:
``images (B, 28, 28)`` long levels and ``classes (B,)`` long (the label; used by class-conditional
models, ignored by unconditional ones). The metric is the negative log-likelihood in **bits per
dimension** (per pixel, the Image Transformer's measure), summed over every held-out pixel.

``mnist`` uses the 5,000 MNIST digits of :func:`qkv.tasks.data.load_mnist` split 80/10/10 at
random with a fixed seed; ``fashion-mnist`` the 60,000 training images (the last 5,000 held out
as the valid split) and the 10,000 test images of :func:`qkv.tasks.data.load_fashion_mnist`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import Tensor

from qkv._nn import evaluating
from qkv._plot import pyplot, save_figure
from qkv.registry import register
from qkv.tasks.base import SPLITS, check_positive_int, check_split
from qkv.tasks.classify import TensorTask, split_indices
from qkv.tasks.data import load_fashion_mnist, load_mnist

__all__ = ["ImageGenerationTask", "MnistImages", "FashionMnistImages", "quantise"]


def quantise(images: Tensor, levels: int) -> Tensor:
    """``uint8 (..., H, W)`` intensities -> ``long`` levels ``floor(x levels / 256)`` in ``[0, levels)``."""
    check_positive_int("levels", levels)
    if levels > 256:
        raise ValueError(f"levels must be <= 256 (8-bit intensities), got {levels}")
    return torch.div(images.long() * levels, 256, rounding_mode="floor")


class ImageGenerationTask(TensorTask):
    """Base of the image-generation tasks (see the module docstring)."""

    kind = "image"

    def __init__(self, splits: Dict[str, Dict[str, Tensor]], levels: int) -> None:
        self.levels = levels
        self._splits = splits
        self._check_splits()
        self.image_size = tuple(splits["train"]["images"].shape[1:])

    def size(self, split: str) -> int:
        check_split(split)
        return len(self._splits[split]["images"])

    def model_hints(self) -> Dict[str, Any]:
        """Config fields the data determines: the levels, image size and number of classes."""
        return {"n_levels": self.levels, "image_size": self.image_size, "n_classes": 10}

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Where a few pixels of the first held-out image look, per layer and head (``qkv viz``)."""
        from .views import image_view

        return image_view(model, self._take("test", torch.arange(1)))

    eval_batch_size = 50

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Any]:
        pixels = batch["images"][0].numel() * len(batch["images"])
        return {"nll": model(**batch).loss.item() * pixels, "pixels": pixels}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``bits_per_dim = sum NLL / (ln 2 * pixels)`` over the held-out images."""
        nll, pixels = totals.get("nll", 0.0), totals.get("pixels", 0)
        return {"bits_per_dim": nll / pixels / math.log(2), "nll_nats": nll / pixels,
                "examples": float(pixels // (self.image_size[0] * self.image_size[1]))}

    def examples(self, n: int = 5):
        check_positive_int("n", n)
        batch = self._take("train", torch.arange(min(n, self.size("train"))))
        return [{"class": str(int(c)), "images": str(tuple(im.shape))} for im, c in zip(batch["images"], batch["classes"])]

    def write_samples(self, model: torch.nn.Module, path: Path, n: int = 16, seed: int = 0,
                      options: Optional[Dict[str, Any]] = None) -> Path:
        """Sample ``n`` images with ``model.generate`` (incremental decoding) and write a PNG grid.

        ``options``: ``class`` (one class for every sample; default: 0, 1, 2, ... for a
        class-conditional model), ``temperature`` (default 1).
        """
        options = dict(options or {})
        temperature = float(options.pop("temperature", 1.0))
        klass = options.pop("class", None)
        if options:
            raise ValueError(f"unknown sample option(s) {sorted(options)}; known: class, temperature")
        check_positive_int("n", n)
        conditional = getattr(model.config, "n_classes", 0) > 0
        if klass is not None:
            klass = int(klass)
            if not 0 <= klass < 10:
                raise ValueError(f"class must be in [0, 10), got {klass}")
        classes = None
        if conditional:
            classes = torch.full((n,), klass) if klass is not None else torch.arange(n) % 10
        elif klass is not None:
            raise ValueError("class given, but the model is unconditional (n_classes=0)")
        with evaluating(model):
            images = model.generate(n, classes=classes, temperature=temperature,
                                    generator=torch.Generator().manual_seed(seed))  # (n, H, W)
        plt = pyplot()
        cols = min(n, 8)
        rows = -(-n // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(1.2 * cols, 1.3 * rows), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.axis("off")
            if i < n:
                ax.imshow(images[i].cpu().numpy(), cmap="gray", vmin=0, vmax=self.levels - 1, interpolation="nearest")
                if classes is not None:
                    ax.set_title(str(int(classes[i])), fontsize=7)
        return save_figure(fig, path, dpi=110)


@register("task", "mnist")
class MnistImages(ImageGenerationTask):
    """MNIST digit generation (5,000 real 28x28 digits, intensities quantised to `levels`; bits/dim).

    Args:
        levels: intensity levels (default 8: 3 bits per pixel; 256 keeps the 8-bit values).
        cache_dir: MNIST cache (``qkv data fetch mnist``).
        images, digits: ``(N, H, W)`` uint8 and ``(N,)`` to use instead of MNIST (tests).
    """

    def __init__(self, *, levels: int = 8, cache_dir: Optional[str] = None, images: Optional[Tensor] = None,
                 digits: Optional[Tensor] = None) -> None:
        if (images is None) != (digits is None):
            raise ValueError("images and digits must be given together (or neither, to load MNIST)")
        if images is None:
            images, digits = load_mnist(cache_dir)
        x = quantise(images, levels)
        parts = split_indices(len(digits), key="digits")
        super().__init__({s: {"images": x[parts[s]], "classes": digits[parts[s]].long()} for s in SPLITS}, levels)


@register("task", "fashion-mnist")
class FashionMnistImages(ImageGenerationTask):
    """Fashion-MNIST generation (70,000 real 28x28 clothing images, quantised to `levels`; bits/dim).

    Args:
        levels: intensity levels (default 8).
        cache_dir: cache (``qkv data fetch fashion-mnist``).
    """

    def __init__(self, *, levels: int = 8, cache_dir: Optional[str] = None) -> None:
        train_x, train_y = load_fashion_mnist(cache_dir, "train")
        test_x, test_y = load_fashion_mnist(cache_dir, "test")
        train_x, test_x = quantise(train_x, levels), quantise(test_x, levels)
        cut = len(train_y) - 5000
        super().__init__({
            "train": {"images": train_x[:cut], "classes": train_y[:cut]},
            "valid": {"images": train_x[cut:], "classes": train_y[cut:]},
            "test": {"images": test_x, "classes": test_y},
        }, levels)
