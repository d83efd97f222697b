"""The Long Range Arena's models (Tay et al. 2020, "Long Range Arena: A Benchmark for Efficient
Transformers", arXiv:2011.04006, §3.1): one Transformer encoder-classifier whose attention kernel
is swapped by name, every other setting kept the same within a task.

    x = E[ids] + P[positions]                          (learned positions)
    h = Stack(x)                                       (pre-LN blocks, kernel = config.attention)
    u = mean_{real tokens} h_t                         (mean pooling)
    logits = W_2 gelu(W_1 u)                           (the classifier MLP)

For LRA's Retrieval task the same encoder is a **two-tower** model: both documents are encoded
by the one encoder, and the classifier reads ``[u, v, u * v, u - v]`` (Tay et al. 2020, §2.2.3).
``LRADualEncoderConfig(pair_features="abs-diff")`` reads ``[u, v, u * v, |u - v|]`` instead (InferSent's features,
Conneau et al. 2017, §3.2): a departure from LRA, for a label that is symmetric in the pair.

Image inputs (``image_size`` set: the sequence is an ``(H, W)`` image in raster order) keep their
positions tied to the pixel; for ``local-2d`` the embedded pixels are reordered into the kernel's
block-raster order before the stack (``qkv.masks.block_raster_order``) and returned weights are
put back in raster order, so a picture of them is the image.

Kernel knobs follow the length: ``kernel_knobs(name, max_len, n_heads, d_head, image_size)`` fills
``attention_kwargs`` when the config leaves them empty (local kernels see about ``2 sqrt(L)`` keys,
Linformer projects to ``L / 4`` up to 256, Performer draws ``4 d_head`` features up to 256).

Deviations from LRA: a CPU-sized default (2 layers, width 64, 2 heads; LRA used 4-6 layers, width
256-512, 4-8 heads), mean pooling everywhere (LRA's Text used a CLS token). Positions are learned
and start on the token embeddings' scale: with fixed sinusoids (amplitude 1) beside N(0, 0.02)
token embeddings, a ListOps check run of 300 updates learned nothing beyond the class prior.
Performer's features are drawn once (no redrawing); adaptive-span spans are learned from the
task's loss alone (no span penalty) and clamped to ``[0, S]`` each update.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks, masks
from ...registry import lookup, register
from ..base import ModelOutput, QKVModel
from ..losses import check_labels, float32_at_least
from .stack import StackConfig, TransformerStack, check_token_mask, init_normal

__all__ = ["LRAEncoder", "LRAEncoderConfig", "LRADualEncoder", "LRADualEncoderConfig", "PAIR_FEATURES", "kernel_knobs"]


def kernel_knobs(name: str, max_len: int, n_heads: int, d_head: int,
                 image_size: Optional[Tuple[int, int]] = None) -> Dict[str, Any]:
    """The knobs kernel ``name`` gets in an LRA encoder over ``max_len`` tokens: the kernel's own
    ``knobs(max_len, n_heads, d_head, image_size=image_size)`` (sizes that fit the length: radius,
    stride about ``sqrt(L)``, blocks, features, spans, buckets; an image kernel's sized by the task's
    image), without the head arguments, which ``MultiHeadAttention`` fills in. A kernel that reads
    images (its knobs hold an ``image_size``: ``local-2d``) is refused on a 1-D sequence."""
    cls = lookup("attention", name)
    knobs = cls.knobs(max_len, n_heads, d_head, image_size=image_size)
    if image_size is None and "image_size" in knobs:  # a kernel that reads images (local-2d)
        raise ValueError(f"attention {cls.registry_name!r} needs an image task (image_size=(H, W)); this task is a "
                         "1-D sequence")
    return knobs


#: what the two-tower head reads of the pooled vectors u and v: LRA's, or InferSent's |u - v|
PAIR_FEATURES = {"lra": "[u, v, u*v, u-v]", "abs-diff": "[u, v, u*v, |u-v|]"}


@dataclass
class LRAEncoderConfig(StackConfig):
    """A CPU-sized LRA encoder-classifier (LRA's own sizes: 4-6 layers, width 256-512)."""

    vocab_size: int = 259  # token table (the task's: bytes + padding, pixel levels, ListOps symbols)
    n_classes: int = 10  # classes of the head (the task's)
    max_len: int = 2000  # the task's sequence length (the kernels' knobs are sized for it)
    image_size: Optional[Tuple[int, int]] = None  # (H, W): the sequence is an image in raster order (image tasks)
    n_layers: int = 2  # blocks
    d_model: int = 64  # width
    n_heads: int = 2  # heads
    d_ff: int = 128  # feed-forward width
    dropout: float = 0.1  # embedding and residual dropout
    activation: str = "gelu"  # feed-forward activation
    residual: str = "pre-ln"  # x + F(LN(x)) and a final LayerNorm (stable from the first steps)
    positional: str = "learned"  # learned positions, on the scale of the token embeddings (N(0, 0.02))
    mlp_dim: int = 128  # hidden width of the classifier MLP

    def __post_init__(self) -> None:
        super().__post_init__()
        _checks.positive_int("vocab_size", self.vocab_size)
        _checks.positive_int("n_classes", self.n_classes)
        _checks.positive_int("mlp_dim", self.mlp_dim)
        if self.image_size is not None:
            if not isinstance(self.image_size, (tuple, list)) or len(self.image_size) != 2:
                raise ValueError(f"image_size must be a pair (H, W) or None, got {self.image_size!r}")
            self.image_size = tuple(_checks.positive_int(f"image_size[{i}]", s) for i, s in enumerate(self.image_size))
            if self.image_size[0] * self.image_size[1] != self.max_len:
                raise ValueError(f"image_size {self.image_size} has {self.image_size[0] * self.image_size[1]} pixels, "
                                 f"max_len is {self.max_len}; they must agree")
        knobs = kernel_knobs(self.attention, self.max_len, self.n_heads, self.d_model // self.n_heads, self.image_size)
        self.attention_kwargs = self.attention_kwargs or knobs


@dataclass
class LRADualEncoderConfig(LRAEncoderConfig):
    """The two-tower model's config: the encoder's, and what its head reads of the pair."""

    pair_features: str = "lra"  # "lra": [u, v, u*v, u-v] (Tay et al.); "abs-diff": [u, v, u*v, |u-v|] (InferSent)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.pair_features, str) or self.pair_features not in PAIR_FEATURES:
            raise ValueError(f"pair_features must be one of {sorted(PAIR_FEATURES)}, got {self.pair_features!r}")


@register("model", "lra-encoder")
class LRAEncoder(QKVModel):
    """Long Range Arena's encoder-classifier: any kernel by name, mean pooling, an MLP head (Tay et al. 2020).

    ``forward(input_ids (B, L), attention_mask=None (B, L) bool, labels=None (B,),
    need_weights=False)`` -> ``ModelOutput`` with ``logits (B, n_classes)``, ``loss`` (with labels)
    and ``weights`` (per layer ``(B, H, L, L)``, raster order for images).
    """

    config_class = LRAEncoderConfig
    task_kinds = frozenset({"classification"})
    input_key = "input_ids"  # token ids (bytes, pixels, ListOps symbols)
    context_parallel = ("it pools every position of a sequence into one vector for its classifier: each rank "
                        "would pool its own shard only")
    suggested_tasks = ("listops", "pathfinder", "bbc-bytes", "fashion-mnist-seq")
    train_defaults = {"lr": 1e-3, "steps": 500, "batch_size": 16, "warmup": 50}
    n_towers = 1  # the documents the classifier reads the pooled vectors of

    def __init__(self, config: LRAEncoderConfig) -> None:
        super().__init__(config)
        c = config
        self.stack = TransformerStack(c, vocab_size=c.vocab_size)
        self.head = nn.Sequential(nn.Linear(4 * c.d_model if self.n_towers == 2 else c.d_model, c.mlp_dim), nn.GELU(),
                                  nn.Linear(c.mlp_dim, c.n_classes))
        self.apply(init_normal)
        order = None
        kernel = self.stack.layers[0].self_attn.kernel
        if c.image_size is not None and callable(getattr(kernel, "order", None)):
            order = kernel.order()  # (P,) raster index of each sequence position: local-2d's block-raster scan
        self.register_buffer("order", order, persistent=False)

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """The trainer's hook before each update: keep learned spans in ``[0, S]`` (adaptive span)."""
        for block in self.stack.layers:
            clamp = getattr(block.self_attn.kernel, "clamp_", None)
            if callable(clamp):
                clamp()

    def encode(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, need_weights: bool = False):
        """``(pooled (B, d_model), weights, hidden (B, L, d_model))``: the mean of the final hidden
        states over real tokens, the attention weights and the final hidden states (raster order)."""
        c = self.config
        check_token_mask("attention_mask", attention_mask, input_ids)
        if input_ids.shape[1] > c.max_len:
            raise ValueError(f"input_ids has {input_ids.shape[1]} tokens, more than max_len={c.max_len}")
        x = self.stack.embed(input_ids)  # (B, L, d_model), positions of the raster order
        mask = attention_mask
        if self.order is not None:  # local-2d: attend in block-raster order
            x = x[:, self.order]
            mask = None if mask is None else mask[:, self.order]
        out = self.stack.run_layers(x, mask=mask, need_weights=need_weights)
        h = out.hidden  # (B, L, d_model)
        if mask is None:
            pooled = h.mean(1)
        else:
            keep = mask.unsqueeze(-1).to(h.dtype)  # (B, L, 1)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)  # (B, d_model)
        weights = out.weights
        if self.order is not None:  # back to raster order (weights: on both axes)
            back = torch.argsort(self.order)
            h = h[:, back]
            if weights is not None:
                weights = [w[:, :, back][..., back] for w in weights]
        return pooled, weights, h

    def _classify(self, features: Tensor, labels: Optional[Tensor], weights: Any, hidden: Tensor) -> ModelOutput:
        logits = self.head(features)  # (B, n_classes)
        loss = None
        if labels is not None:
            check_labels("labels", labels, self.config.n_classes, (features.shape[0],))
            loss = F.cross_entropy(float32_at_least(logits), labels)
        return ModelOutput(loss=loss, logits=logits, weights=weights, hidden=hidden)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        pooled, weights, hidden = self.encode(input_ids, attention_mask, need_weights)
        return self._classify(pooled, labels, weights, hidden)


@register("model", "lra-dual-encoder")
class LRADualEncoder(LRAEncoder):
    """Long Range Arena's two-tower model for Retrieval: one encoder reads both documents, an MLP reads [u, v, u*v, u-v] (Tay et al. 2020).

    ``config.pair_features="abs-diff"`` reads ``[u, v, u*v, |u-v|]`` (InferSent's) instead.

    ``forward(input_ids, attention_mask=None, input_ids_2=..., attention_mask_2=None, labels=None,
    need_weights=False)``: both ``(B, L)``; ``weights`` are the first document's.
    """

    config_class = LRADualEncoderConfig
    suggested_tasks = ("bbc-match",)
    n_towers = 2

    def __init__(self, config: LRAEncoderConfig) -> None:
        if type(config) is LRAEncoderConfig:  # an encoder's config: LRA's head
            config = LRADualEncoderConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
        super().__init__(config)

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, input_ids_2: Optional[Tensor] = None,
                attention_mask_2: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        if input_ids_2 is None:
            raise ValueError("the two-tower model needs the second document: input_ids_2 (B, L)")
        if input_ids_2.shape != input_ids.shape:
            raise ValueError(f"input_ids_2 must have the shape of input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(input_ids_2.shape)}")
        if (attention_mask is None) != (attention_mask_2 is None):
            raise ValueError("give attention_mask and attention_mask_2 together (or neither)")
        B = input_ids.shape[0]
        both = torch.cat([input_ids, input_ids_2])  # (2B, L): one pass through the shared encoder
        mask = None if attention_mask is None else torch.cat([attention_mask, attention_mask_2])
        pooled, weights, hidden = self.encode(both, mask, need_weights)
        u, v = pooled[:B], pooled[B:]  # (B, d_model) each
        diff = u - v if self.config.pair_features == "lra" else (u - v).abs()  # abs-diff: the same for (v, u)
        features = torch.cat([u, v, u * v, diff], dim=-1)  # (B, 4 d_model)
        if weights is not None:
            weights = [w[:B] for w in weights]
        return self._classify(features, labels, weights, hidden[:B])  # hidden: the first document's
