"""Nadaraya–Watson kernel regression as attention pooling — Nadaraya 1964, "On Estimating
Regression"; Watson 1964, "Smooth Regression Analysis"; read as attention by Zhang, Lipton, Li,
Smola, "Dive into Deep Learning" §11.2 (and the ICML 2019 tutorial, "Attention in Deep Learning").

    f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i

The query ``x`` attends over the keys ``x_i`` (training inputs) and pools the values ``y_i``
(training targets). ``kernel="fixed"`` keeps ``w = 1 / bandwidth`` (non-parametric);
``kernel="learned"`` learns ``w`` (parametric attention pooling, d2l's ``NWKernelRegression``).
The equation lives in :func:`qkv.functional.nadaraya_watson`; this module only owns ``w``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...functional import nadaraya_watson
from ...registry import register
from ..base import ModelOutput, QKVModel

__all__ = ["NadarayaWatsonConfig", "NadarayaWatson"]


@dataclass
class NadarayaWatsonConfig:
    kernel: str = "learned"  # "fixed" (w = 1 / bandwidth) or "learned" (w is a parameter)
    bandwidth: float = 1.0  # initial (or fixed) Gaussian bandwidth sigma; w = 1 / sigma


@register("model", "nadaraya-watson")
class NadarayaWatson(QKVModel):
    """Nadaraya–Watson kernel regression ``f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i``.

    ``forward(x (B,) or (B, D), keys (B, N) or (B, N, D), values (B, N), mask (B, N) or None,
    labels (B,) or None, need_weights=False)`` -> ``ModelOutput(loss (MSE), logits (B,) predictions,
    weights (B, N))``. Cost ``O(B N D)``.
    """

    config_class = NadarayaWatsonConfig
    suggested_tasks = ('nw-regression',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 200, "batch_size": 50, "lr": 0.5, "warmup": 0, "schedule": "constant", "weight_decay": 0.0}

    def __init__(self, config: NadarayaWatsonConfig) -> None:
        super().__init__(config)
        if config.kernel not in ("fixed", "learned"):
            raise ValueError(f"kernel must be 'fixed' or 'learned', got {config.kernel!r}")
        if not config.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0, got {config.bandwidth!r}")
        w = torch.tensor(1.0 / config.bandwidth)
        if config.kernel == "learned":
            self.w = nn.Parameter(w)
        else:
            self.register_buffer("w", w)

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, mask: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        _checks.tensor("x", x, ndim=(1, 2), floating=True)
        _checks.tensor("keys", keys, ndim=x.dim() + 1, floating=True)
        _checks.tensor("values", values, ndim=2, floating=True)
        _checks.same("x", x.shape[0], "keys", keys.shape[0], "the batch size (dim 0)")
        query = x.view(x.shape[0], 1, -1)  # (B, 1, D)
        keys = keys.view(keys.shape[0], keys.shape[1], -1)  # (B, N, D)
        m = None if mask is None else _checks.mask("mask", mask, values.shape).unsqueeze(1)  # (B, 1, N)
        # f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i
        out, weights, _ = nadaraya_watson(query, keys, values, width=self.w, mask=m)  # (B, 1), (B, 1, N)
        pred = out.squeeze(1)  # (B,)
        loss = None if labels is None else F.mse_loss(pred, labels.to(pred.dtype))
        return ModelOutput(loss=loss, logits=pred, weights=weights.squeeze(1) if need_weights else None)
