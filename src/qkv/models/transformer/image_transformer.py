"""The Image Transformer (Parmar et al. 2018, "Image Transformer", arXiv:1802.05751): an image is a
sequence of pixel intensities, generated one pixel at a time by a decoder-only Transformer with
local self-attention.

    x_t = E[v_{t-1}] + R[row(t)] + C[col(t)] (+ K[class])     (v_{-1} = a start symbol)
    h   = Stack(x)                                              (causal local-1d / local-2d blocks)
    p(v_t | v_{<t}) = softmax(h_t W)                            (one categorical over the levels)

The pixels are ordered as the attention generates them: raster order for ``local-1d`` (query
blocks of ``block`` consecutive pixels, ``memory`` earlier ones added to their keys) and dense
``softmax``; the paper's block-raster order for ``local-2d`` (query rectangles in raster order,
raster order inside one; ``qkv.masks.block_raster_order``). Position ``t`` carries the row and column
embeddings of the pixel it predicts (``qkv.positional.RowColumnEmbedding``). Class conditioning adds
a learned embedding of the class to every position. The loss is the negative log-likelihood in
nats per pixel; ``bits/dim = NLL / ln 2``.

Deviations: one channel (grey-scale images: MNIST, Fashion-MNIST) with a categorical over
``n_levels`` quantised intensities (the paper's "cat" output; no DMOL); pre-LN residuals.
Generation uses the kernels' incremental decoding, so a pixel costs the local pattern's size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks, masks
from ...positional import RowColumnEmbedding
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..sampling import sample_logits
from .stack import StackConfig, StackState, TransformerStack, init_normal

__all__ = ["ImageTransformer", "ImageTransformerConfig"]

LOCAL_1D = {"block": 28, "memory": 56}  # one row per query block, two rows of memory (84 keys)
LOCAL_2D = {"block": (4, 7), "memory": (4, 7, 7)}  # 4x7 query rectangles, memory 8 x 21 (168 keys)


@dataclass
class ImageTransformerConfig(StackConfig):
    """A CPU-sized Image Transformer for 28x28 grey-scale images."""

    image_size: Tuple[int, int] = (28, 28)  # (H, W) of the images
    n_levels: int = 256  # quantised intensity levels: the categorical's size (the task's quantisation)
    n_classes: int = 0  # 0: unconditional; C > 0: a class embedding added to every position
    n_layers: int = 4  # blocks
    d_model: int = 96  # width
    n_heads: int = 4  # heads
    d_ff: int = 384  # feed-forward width
    dropout: float = 0.1  # embedding and residual dropout
    residual: str = "pre-ln"  # x + F(LN(x)) and a final LayerNorm
    positional: str = "row-column"  # learned row + column embeddings of the predicted pixel | "none"
    attention: str = "local-1d"  # "local-1d" | "local-2d" | "softmax" (dense, for comparison)
    attention_kwargs: Dict[str, Any] = field(default_factory=dict)  # the kernel's knobs (defaults per kernel above)
    max_len: int = 0  # H * W (filled in)

    def __post_init__(self) -> None:
        if not isinstance(self.image_size, (tuple, list)) or len(self.image_size) != 2:
            raise ValueError(f"image_size must be a pair (H, W), got {self.image_size!r}")
        self.image_size = tuple(_checks.positive_int(f"image_size[{i}]", s) for i, s in enumerate(self.image_size))
        H, W = self.image_size
        if self.max_len not in (0, H * W):
            raise ValueError(f"max_len is the number of pixels H * W = {H * W}, got {self.max_len}")
        self.max_len = H * W
        if self.positional not in ("row-column", "none"):
            raise ValueError(f"positional must be 'row-column' (the paper) or 'none' (an ablation), got {self.positional!r}")
        if self.attention not in ("local-1d", "local-2d", "softmax"):
            raise ValueError(f"attention must be 'local-1d', 'local-2d' or 'softmax', got {self.attention!r}")
        if not isinstance(self.attention_kwargs, dict):
            raise TypeError(f"attention_kwargs must be a dict, got {type(self.attention_kwargs).__name__}")
        defaults = {"local-1d": LOCAL_1D, "local-2d": LOCAL_2D, "softmax": {}}[self.attention]
        self.attention_kwargs = {**defaults, **self.attention_kwargs}
        if self.attention == "local-2d":
            given = tuple(self.attention_kwargs.setdefault("image_size", self.image_size))
            if given != self.image_size:
                raise ValueError(f"attention_kwargs image_size {given} differs from image_size {self.image_size}")
        super().__post_init__()
        _checks.positive_int("n_levels", self.n_levels)
        _checks.positive_int("n_classes", self.n_classes, allow_zero=True)


@register("model", "image-transformer")
class ImageTransformer(QKVModel):
    """Image Transformer (Parmar et al. 2018): pixels generated one at a time with causal local-1d/local-2d self-attention, optional class conditioning.

    ``forward(images (B, H, W) long levels, classes=None (B,))`` -> ``ModelOutput(loss = NLL in
    nats per pixel, logits (B, H W, n_levels) in generation order, aux {"bits_per_dim"})``.
    ``generate(n, classes=None)`` -> ``(n, H, W)`` levels, sampled pixel by pixel with the
    kernels' incremental state.
    """

    config_class = ImageTransformerConfig
    context_parallel = ("it reads images (pixels and their channels, not a token sequence the trainer cuts) and "
                        "lays its attention blocks over the image's rows")
    suggested_tasks = ("mnist", "fashion-mnist")  # `qkv list model`
    task_kinds = frozenset({"image"})
    train_defaults = {"lr": 2e-3, "steps": 600, "batch_size": 16, "warmup": 50, "eval_max_examples": 100}

    def __init__(self, config: ImageTransformerConfig) -> None:
        super().__init__(config)
        c = config
        self.start_id = c.n_levels  # the start symbol before the first pixel
        # The stack adds no positions itself: the row-column embedding needs the image's shape and the
        # pixels' sequence order, which is the attention's generation order.
        self.stack = TransformerStack(dataclasses.replace(c, positional="none"), vocab_size=c.n_levels + 1, causal=True)
        order = self.generation_order(c)
        if c.positional == "row-column":
            self.stack.embed.positional = RowColumnEmbedding(c.d_model, image_size=c.image_size, order=order)
        self.class_embedding = nn.Embedding(c.n_classes, c.d_model) if c.n_classes else None
        self.head = nn.Linear(c.d_model, c.n_levels)
        self.apply(init_normal)
        self.register_buffer("order", order, persistent=False)  # (P,) raster index of sequence position t

    @staticmethod
    def generation_order(config: ImageTransformerConfig) -> Tensor:
        """``(H * W,)``: the raster index of the pixel generated at step ``t``."""
        H, W = config.image_size
        if config.attention == "local-2d":
            block = config.attention_kwargs["block"]
            block = (block, block) if isinstance(block, int) else tuple(block)
            return masks.block_raster_order(config.image_size, block)
        return torch.arange(H * W)

    def to_sequence(self, images: Tensor) -> Tensor:
        """``(B, H, W)`` -> ``(B, H W)`` pixels in generation order."""
        return images.reshape(images.shape[0], -1)[:, self.order]

    def to_images(self, seq: Tensor) -> Tensor:
        """``(B, H W)`` pixels in generation order -> ``(B, H, W)``."""
        out = torch.empty_like(seq)
        out[:, self.order] = seq
        return out.view(seq.shape[0], *self.config.image_size)

    def _check(self, images: Tensor, classes: Optional[Tensor]) -> None:
        c = self.config
        _checks.tensor("images", images, ndim=3)
        if images.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"images must hold integer intensity levels (torch.long), got dtype {images.dtype}")
        if tuple(images.shape[1:]) != c.image_size:
            raise ValueError(f"images must be (B, {c.image_size[0]}, {c.image_size[1]}), got {tuple(images.shape)}")
        if images.numel() and (int(images.min()) < 0 or int(images.max()) >= c.n_levels):
            raise ValueError(f"images must lie in [0, n_levels={c.n_levels}), got min {int(images.min())}, max {int(images.max())}")
        self._check_classes(classes, images.shape[0])

    def _check_classes(self, classes: Optional[Tensor], batch: int) -> None:
        c = self.config
        if classes is None:
            return
        _checks.tensor("classes", classes, ndim=1)
        _checks.same("classes", classes.shape[0], "images", batch, "the batch size")
        if c.n_classes == 0:
            return  # an unconditional model ignores the classes a task provides
        if classes.dtype not in (torch.int64, torch.int32) or (classes.numel() and (
                int(classes.min()) < 0 or int(classes.max()) >= c.n_classes)):
            raise ValueError(f"classes must be integers in [0, n_classes={c.n_classes})")

    def decode(self, ids: Tensor, classes: Optional[Tensor] = None, state: Optional[StackState] = None,
               need_weights: bool = False, return_state: bool = False):
        """Logits of the pixels at the positions of ``ids (B, L)`` (start symbol, then pixels in
        generation order), continuing ``state``; returns the stack's output and ``logits (B, L, n_levels)``."""
        offset = state.position if state is not None else 0
        x = self.stack.embed(ids, offset=offset)  # (B, L, d_model): E[v_{t-1}] + R[row] + C[col]
        if self.class_embedding is not None:
            if classes is None:
                raise ValueError(f"this model is class-conditional (n_classes={self.config.n_classes}): give classes (B,)")
            x = x + self.class_embedding(classes).unsqueeze(1)  # (B, 1, d_model) on every position
        out = self.stack.run_layers(x, state=state, need_weights=need_weights, return_state=return_state)
        return out, self.head(out.hidden)

    def forward(self, images: Tensor, classes: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        """``loss = -mean_t log p(v_t | v_{<t}, class)`` (nats per pixel) over ``images (B, H, W)``."""
        self._check(images, classes)
        seq = self.to_sequence(images)  # (B, P)
        start = torch.full_like(seq[:, :1], self.start_id)
        out, logits = self.decode(torch.cat([start, seq[:, :-1]], dim=1), classes, need_weights=need_weights)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), seq.reshape(-1))
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, hidden=out.hidden,
                           aux={"bits_per_dim": loss.detach() / math.log(2)})

    @torch.no_grad()
    def generate(self, n: int, classes: Optional[Tensor] = None, temperature: float = 1.0,
                 generator: Optional[torch.Generator] = None, use_cache: bool = True) -> Tensor:
        """Sample ``n`` images -> ``(n, H, W)`` levels, pixel by pixel in generation order.

        ``use_cache=True`` feeds one pixel per step with the kernels' incremental state (cost per
        pixel: the local pattern); ``use_cache=False`` re-reads the whole prefix each step (same
        pixels, slower). Runs in the module's current mode: call ``eval()`` first.
        """
        c = self.config
        _checks.positive_int("n", n, allow_zero=True)
        device = self.head.weight.device
        if classes is not None:
            classes = torch.as_tensor(classes, device=device).long().expand(n) if torch.as_tensor(classes).dim() == 0 \
                else torch.as_tensor(classes, device=device).long()
        self._check_classes(classes, n)
        P = c.image_size[0] * c.image_size[1]
        ids = torch.full((n, 1), self.start_id, dtype=torch.long, device=device)
        state = None
        for _ in range(P):
            if use_cache:
                out, logits = self.decode(ids[:, -1:], classes, state=state, return_state=True)
                state = out.state
            else:
                _, logits = self.decode(ids, classes)
            nxt = sample_logits(logits[:, -1], temperature, generator=generator)  # (n,)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
        return self.to_images(ids[:, 1:])
