"""Absolute positional schemes (Vaswani et al. 2017, §3.5).

``PE(pos, 2i) = sin(pos / 10000^(2i / d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i / d))``.
Relative (Transformer-XL) and timestep (Universal Transformer) encodings build on
``sinusoid_table``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from . import _checks
from .registry import register

__all__ = ["sinusoid_table", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "NoPositionalEncoding",
           "TimestepEncoding"]


def sinusoid_table(positions: Tensor, d_model: int) -> Tensor:
    """Sinusoids of ``positions`` (any float/int tensor ``(...)``) -> ``(..., d_model)``;
    even features are sines, odd features cosines (an odd ``d_model`` drops the last cosine)."""
    _checks.positive_int("d_model", d_model)
    i = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)  # (ceil(d/2),)
    inv_freq = torch.exp(-math.log(10000.0) * i / d_model)  # 1 / 10000^(2i/d)
    angles = positions.float().unsqueeze(-1) * inv_freq  # (..., ceil(d/2))
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (..., 2 ceil(d/2)) interleaved
    return table[..., :d_model]


@register("positional", "sinusoidal", "sinusoid")
class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encoding added to ``x (B, L, d_model)`` (Vaswani et al. 2017).

    ``offset`` shifts positions (incremental decoding: the position of the first new token).
    Works for any length (no ``max_len`` table limit); a buffer caches the first ``max_len`` rows.
    """

    def __init__(self, d_model: int, max_len: int = 4096, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model)
        self.max_len = _checks.positive_int("max_len", max_len)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))
        self.register_buffer("table", sinusoid_table(torch.arange(max_len), d_model), persistent=False)

    def encoding(self, length: int, offset: int = 0, device=None) -> Tensor:
        """``(length, d_model)`` encodings of positions ``offset .. offset + length - 1``."""
        if offset + length <= self.max_len:
            return self.table[offset:offset + length]
        return sinusoid_table(torch.arange(offset, offset + length, device=device or self.table.device), self.d_model)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _checks.tensor("x", x, ndim=3, floating=True)
        _checks.same("x", x.shape[-1], "d_model", self.d_model, "the feature size")
        return self.dropout(x + self.encoding(x.shape[1], offset, x.device).to(x.dtype))


@register("positional", "learned", "absolute")
class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute position embeddings (Gehring et al. 2017; BERT, GPT) added to ``x``."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model)
        self.max_len = _checks.positive_int("max_len", max_len)
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _checks.tensor("x", x, ndim=3, floating=True)
        _checks.same("x", x.shape[-1], "d_model", self.d_model, "the feature size")
        L = x.shape[1]
        if offset + L > self.max_len:
            raise ValueError(f"positions up to {offset + L} exceed max_len={self.max_len} of the learned embedding")
        pos = torch.arange(offset, offset + L, device=x.device)
        return self.dropout(x + self.embedding(pos).to(x.dtype))


@register("positional", "none")
class NoPositionalEncoding(nn.Module):
    """No absolute positions: for kernels that see positions themselves (relative, Transformer-XL)."""

    def __init__(self, d_model: int, max_len: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return self.dropout(x)


@register("positional", "timestep", "coordinate")
class TimestepEncoding(SinusoidalPositionalEncoding):
    """Universal Transformer coordinate embedding (Dehghani et al. 2019, §2.1): the sinusoid of the
    position ``i`` plus the sinusoid of the recurrent step ``t`` (the same formula),

        P^t_{i,2j} = sin(i / 10000^{2j/d}) + sin(t / 10000^{2j/d}),   P^t_{i,2j+1}: cos likewise,

    added to the state before every step. ``forward(x, offset, step=0)``; as a plain positional
    scheme (``step = 0``) it adds the position sinusoid and the constant ``P^0``.
    """

    def forward(self, x: Tensor, offset: int = 0, step: int = 0) -> Tensor:
        _checks.positive_int("step", step, allow_zero=True)
        t = sinusoid_table(torch.tensor(float(step), device=x.device), self.d_model).to(x.dtype)  # (d_model,)
        return super().forward(x + t, offset)
