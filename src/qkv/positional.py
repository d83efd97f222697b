"""Absolute positional schemes (Vaswani et al. 2017, §3.5).

``PE(pos, 2i) = sin(pos / 10000^(2i / d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i / d))``.
Relative (Transformer-XL) and timestep (Universal Transformer) encodings build on
``sinusoid_table``.

A scheme whose class sets ``fixed = True`` adds a fixed signal of unit amplitude (RMS ~0.7 per
feature, whatever the width): the Transformer stack then puts the token embeddings on the same
scale, ``E[ids] * sqrt(d_model)`` with ``E ~ N(0, 1 / d_model)`` (Vaswani et al. 2017, §3.4), so
that positions do not drown the tokens (``qkv.models.transformer.stack.token_scale``).
"""

from __future__ import annotations

import math
from typing import ClassVar, Optional

import torch
from torch import Tensor, nn

from . import _checks
from .registry import register

__all__ = ["sinusoid_table", "table_dtype", "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "NoPositionalEncoding",
           "RotaryPositions", "TimestepEncoding", "RowColumnEmbedding"]


def table_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a positional table is computed in for inputs of ``dtype``: float64 for float64,
    float32 for everything else (half types included) — never less than float32, so that the
    table does not depend on how a CPU rounds a half-precision ``sin``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def sinusoid_table(positions: Tensor, d_model: int, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Sinusoids of ``positions`` (any float/int tensor ``(...)``) -> ``(..., d_model)``;
    even features are sines, odd features cosines (an odd ``d_model`` drops the last cosine).

    Computed in ``table_dtype(dtype)`` (``dtype`` defaults to float64 positions' own dtype, else
    float32): float64 inputs get a float64 table, all others a float32 one (cast by the caller).
    """
    _checks.positive_int("d_model", d_model)
    if dtype is None:
        dtype = positions.dtype if positions.is_floating_point() else torch.float32
    dtype = table_dtype(dtype)
    i = torch.arange(0, d_model, 2, device=positions.device, dtype=dtype)  # (ceil(d/2),)
    inv_freq = torch.exp(-math.log(10000.0) * i / d_model)  # 1 / 10000^(2i/d)
    angles = positions.to(dtype).unsqueeze(-1) * inv_freq  # (..., ceil(d/2))
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (..., 2 ceil(d/2)) interleaved
    return table[..., :d_model]


def _checked_positions(positions: object, x: Tensor, max_len: Optional[int]) -> Tensor:
    """``positions``: integer ids ``(B, L)`` of ``x (B, L, d)``'s positions, in ``[0, max_len)`` when
    the scheme has a table (its values are read eagerly, not while a graph is traced)."""
    _checks.tensor("position_ids", positions, ndim=2)
    _checks.same("position_ids", tuple(positions.shape), "(batch, length)", tuple(x.shape[:2]), "the shape")
    if positions.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"position_ids must be an integer (torch.long) tensor, got dtype {positions.dtype}")
    if max_len is not None:
        return _checks.token_ids("position_ids", positions, max_len)
    if positions.numel() and not torch.compiler.is_compiling() and int(positions.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got min {int(positions.min())}")
    return positions


@register("positional", "sinusoidal", "sinusoid")
class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encoding added to ``x (B, L, d_model)`` (Vaswani et al. 2017).

    ``offset`` shifts positions (incremental decoding: the position of the first new token).
    Works for any length (no ``max_len`` table limit); a buffer caches the first ``max_len`` rows.
    """

    fixed: ClassVar[bool] = True  # a fixed unit-amplitude signal: the stack scales the tokens to match

    def __init__(self, d_model: int, max_len: int = 4096, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model)
        self.max_len = _checks.positive_int("max_len", max_len)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))
        # float32 rows rounded from float64 (the same on every CPU: no float32 sin); float64 inputs get float64 rows
        table = sinusoid_table(torch.arange(max_len, dtype=torch.float64), d_model).float()
        self.register_buffer("table", table, persistent=False)

    def encoding(self, length: int, offset: int = 0, device=None, dtype: torch.dtype = torch.float32) -> Tensor:
        """``(length, d_model)`` encodings of positions ``offset .. offset + length - 1`` in ``dtype``:
        the cached rows for every dtype but float64; rows beyond them computed as the cache is."""
        if offset + length <= self.max_len and table_dtype(dtype) == torch.float32:
            return self.table[offset:offset + length].to(dtype)
        positions = torch.arange(offset, offset + length, device=device or self.table.device)
        return sinusoid_table(positions, self.d_model, torch.float64).to(dtype)

    def forward(self, x: Tensor, offset: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        """``x`` plus the encoding of positions ``offset ..``, or of ``positions (B, L)`` (ids, e.g.
        counted from each row's first real token of a left-padded batch) when given."""
        _checks.tensor("x", x, ndim=3, floating=True)
        _checks.same("x", x.shape[-1], "d_model", self.d_model, "the feature size")
        if positions is not None:
            positions = _checked_positions(positions, x, None)
            return self.dropout(x + sinusoid_table(positions, self.d_model, torch.float64).to(x.dtype))
        return self.dropout(x + self.encoding(x.shape[1], offset, x.device, x.dtype))


@register("positional", "learned", "absolute")
class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute position embeddings (Gehring et al. 2017; BERT, GPT) added to ``x``."""

    fixed: ClassVar[bool] = False  # learned: on the tokens' scale from the start (both N(0, 0.02))

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model)
        self.max_len = _checks.positive_int("max_len", max_len)
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def forward(self, x: Tensor, offset: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        """``x`` plus the embeddings of positions ``offset ..``, or of ``positions (B, L)`` when given."""
        _checks.tensor("x", x, ndim=3, floating=True)
        _checks.same("x", x.shape[-1], "d_model", self.d_model, "the feature size")
        if positions is not None:
            return self.dropout(x + self.embedding(_checked_positions(positions, x, self.max_len)).to(x.dtype))
        L = x.shape[1]
        if offset + L > self.max_len:
            raise ValueError(f"positions up to {offset + L} exceed max_len={self.max_len} of the learned embedding")
        pos = torch.arange(offset, offset + L, device=x.device)
        return self.dropout(x + self.embedding(pos).to(x.dtype))


@register("positional", "none")
class NoPositionalEncoding(nn.Module):
    """No absolute positions: for kernels that see positions themselves (relative, Transformer-XL)."""

    fixed: ClassVar[bool] = False

    def __init__(self, d_model: int, max_len: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return self.dropout(x)


@register("positional", "rotary", "rope")
class RotaryPositions(NoPositionalEncoding):
    """Rotary positions (Su et al. 2021): nothing is added to the embeddings; the stack gives each
    self-attention a ``qkv.rotary.RotaryEmbedding`` that turns queries and keys by their positions
    (``StackConfig.rope_theta``, ``rope_scaling``)."""

    rotary: ClassVar[bool] = True  # the stack builds a RotaryEmbedding for its attention

    def forward(self, x: Tensor, offset: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        return self.dropout(x)  # the positions reach the attention through the stack


@register("positional", "timestep", "coordinate")
class TimestepEncoding(SinusoidalPositionalEncoding):
    """Universal Transformer coordinate embedding (Dehghani et al. 2019, §2.1): the sinusoid of the
    position ``i`` plus the sinusoid of the recurrent step ``t`` (the same formula),

        P^t_{i,2j} = sin(i / 10000^{2j/d}) + sin(t / 10000^{2j/d}),   P^t_{i,2j+1}: cos likewise,

    added to the state before every step. ``forward(x, offset, step=0)``; as a plain positional
    scheme (``step = 0``) it adds the position sinusoid and the constant ``P^0``.
    """

    def forward(self, x: Tensor, offset: int = 0, step: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        _checks.positive_int("step", step, allow_zero=True)
        t = sinusoid_table(torch.tensor(float(step), device=x.device), self.d_model, x.dtype).to(x.dtype)  # (d_model,)
        return super().forward(x + t, offset, positions=positions)


@register("positional", "row-column", "image")
class RowColumnEmbedding(nn.Module):
    """Learned row and column embeddings of an image's pixels added to ``x`` (Parmar et al. 2018,
    the Image Transformer: each pixel's position is the sum of a row and a column embedding).

    ``x_t += R[row(order[t])] + C[col(order[t])]`` for sequence position ``t``, where ``order``
    maps the sequence to raster indices ``r W + c`` (the identity for a raster scan;
    ``qkv.masks.block_raster_order`` for ``local-2d``).

    Args:
        d_model: feature size.
        max_len: ``H * W``; without ``image_size`` the image is square (``max_len`` a perfect square).
        image_size: ``(H, W)``.
        order: ``(H * W,)`` long, the raster index of each sequence position (default raster order).
    """

    fixed: ClassVar[bool] = False  # learned

    def __init__(self, d_model: int, max_len: int = 784, dropout: float = 0.0, image_size=None, order: Tensor = None) -> None:
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model)
        if image_size is None:
            side = math.isqrt(_checks.positive_int("max_len", max_len))
            if side * side != max_len:
                raise ValueError(f"row-column positions need image_size=(H, W) or a square max_len, got max_len={max_len}")
            image_size = (side, side)
        if not isinstance(image_size, (tuple, list)) or len(image_size) != 2:
            raise ValueError(f"image_size must be a pair (H, W), got {image_size!r}")
        H, W = (_checks.positive_int(f"image_size[{i}]", s) for i, s in enumerate(image_size))
        self.image_size = (H, W)
        order = torch.arange(H * W) if order is None else torch.as_tensor(order, dtype=torch.long)
        # (on the meta device, where qkv sizes a model before building it, the values are not there to check)
        if order.shape != (H * W,) or (not order.is_meta and not torch.equal(order.sort().values, torch.arange(H * W))):
            raise ValueError(f"order must be a permutation of range(H * W = {H * W}), got shape {tuple(order.shape)}")
        self.register_buffer("order", order, persistent=False)
        self.row = nn.Embedding(H, d_model)
        self.col = nn.Embedding(W, d_model)
        nn.init.normal_(self.row.weight, std=0.02)
        nn.init.normal_(self.col.weight, std=0.02)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _checks.tensor("x", x, ndim=3, floating=True)
        _checks.same("x", x.shape[-1], "d_model", self.d_model, "the feature size")
        H, W = self.image_size
        L = x.shape[1]
        if offset + L > H * W:
            raise ValueError(f"positions up to {offset + L} exceed the image's H * W = {H * W} pixels")
        pixel = self.order[offset:offset + L]  # (L,) raster indices
        pos = self.row(torch.div(pixel, W, rounding_mode="floor")) + self.col(pixel % W)  # (L, d_model)
        return self.dropout(x + pos.to(x.dtype))
