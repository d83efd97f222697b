"""Squeeze-and-excitation — Hu, Shen, Sun, "Squeeze-and-Excitation Networks", CVPR 2018,
arXiv:1709.01507.

Channel attention: a feature map ``U (C, H, W)`` is squeezed to one descriptor per channel and
excited into per-channel gates that rescale it::

    z_c = (1 / HW) sum_{i,j} u_c(i, j)            squeeze (global average pooling)
    s   = sigma(W2 relu(W1 z))                     excitation, W1: C -> C/r, W2: C/r -> C
    x~_c = s_c u_c                                 scale

:class:`SqueezeExcitation` is the block (drop it after any convolution); :class:`SECNN` is a
small CNN classifier with one SE block per convolutional stage (registered as
``"squeeze-excitation"``; ``use_se=False`` gives the plain CNN baseline).

Deviations: the paper puts the block inside residual units of ResNets/Inceptions; here it follows
each conv-BN-ReLU stage of a plain CNN. ``W1``/``W2`` have biases (as the paper's FC layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...registry import register
from ...types import AttentionOutput
from ..base import ModelOutput, QKVModel

__all__ = ["SqueezeExcitation", "SECNNConfig", "SECNN"]


class SqueezeExcitation(nn.Module):
    """Squeeze-and-excitation block ``x~_c = sigma(W2 relu(W1 GAP(U)))_c u_c`` (Hu et al. 2018).

    Args:
        channels: ``C``; reduction: ``r``, the bottleneck is ``max(1, C // r)`` units.
    Call ``se(u (B, C, H, W))`` -> ``AttentionOutput(x~ (B, C, H, W), s (B, C), None)``. Cost ``O(B C HW + B C^2 / r)``.
    """

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        _checks.positive_int("channels", channels)
        _checks.positive_int("reduction", reduction)
        hidden = max(1, channels // reduction)
        self.W1 = nn.Linear(channels, hidden)
        self.W2 = nn.Linear(hidden, channels)

    def forward(self, u: Tensor) -> AttentionOutput:
        _checks.tensor("u", u, ndim=4, floating=True)
        if u.shape[1] != self.W2.out_features:
            raise ValueError(f"u must have channels={self.W2.out_features} (dim 1), got shape {tuple(u.shape)}")
        # z = GAP(U)
        z = u.mean((2, 3))  # (B, C)
        # s = sigma(W2 relu(W1 z))
        s = torch.sigmoid(self.W2(F.relu(self.W1(z))))  # (B, C)
        # x~_c = s_c u_c
        return AttentionOutput(u * s[:, :, None, None], s, None)


@dataclass
class SECNNConfig:
    in_channels: int = 1  # image channels
    channels: Tuple[int, ...] = (16, 32, 64)  # output channels of each conv stage (3x3 conv, BN, ReLU, [SE], 2x2 max-pool)
    reduction: int = 4  # SE bottleneck ratio r (Hu et al.: 16 for wide ResNets)
    use_se: bool = True  # add an SE block after each stage (False: the plain CNN baseline)
    n_classes: int = 10  # output classes
    dropout: float = 0.1  # dropout before the classifier


@register("model", "squeeze-excitation", "se-cnn")
class SECNN(QKVModel):
    """A small CNN classifier with a squeeze-and-excitation block per stage (Hu et al. 2018).

    ``forward(images (B, in_channels, H, W), labels (B,) or None, need_weights=False)`` ->
    ``ModelOutput(loss, logits (B, n_classes), weights [s per stage, each (B, C_stage)] or None)``.
    """

    config_class = SECNNConfig
    suggested_tasks = ('digits',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 400, "batch_size": 64, "lr": 1e-2, "warmup": 20, "weight_decay": 0.0}

    def __init__(self, config: SECNNConfig) -> None:
        super().__init__(config)
        _checks.positive_int("in_channels", config.in_channels)
        _checks.positive_int("n_classes", config.n_classes)
        if not config.channels:
            raise ValueError("channels must list at least one stage")
        stages, se = [], []
        c_in = config.in_channels
        for c in config.channels:
            _checks.positive_int("channels[i]", c)
            stages.append(nn.Sequential(nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()))
            se.append(SqueezeExcitation(c, config.reduction) if config.use_se else nn.Identity())
            c_in = c
        self.stages, self.se = nn.ModuleList(stages), nn.ModuleList(se)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(c_in, config.n_classes)

    def forward(self, images: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        _checks.tensor("images", images, ndim=4, floating=True)
        if images.shape[1] != self.config.in_channels:
            raise ValueError(f"images must be (B, in_channels={self.config.in_channels}, H, W), got {tuple(images.shape)}")
        x = images
        gates: List[Tensor] = []
        for stage, se in zip(self.stages, self.se):
            x = stage(x)  # (B, C, H, W)
            if isinstance(se, SqueezeExcitation):
                x, s, _ = se(x)
                gates.append(s)  # (B, C)
            x = F.max_pool2d(x, 2)  # (B, C, H/2, W/2)
        logits = self.classifier(self.dropout(x.mean((2, 3))))  # global average pool -> (B, n_classes)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return ModelOutput(loss=loss, logits=logits, weights=gates if need_weights else None)
