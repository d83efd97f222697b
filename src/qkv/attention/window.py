"""Restricted (windowed) self-attention: each query attends to the keys within distance ``r``
(Vaswani et al. 2017, "Attention Is All You Need", Table 1: O(r n d) per layer).

``out_i = sum_{j : |i - j| <= r} softmax_j(q_i . k_j / sqrt(d)) v_j``; causal: ``0 <= i - j <= r``.

Computed in query blocks of ``b`` positions, each against the ``b + 2r`` (causal: ``b + r``) keys
it can see, gathered with ``Tensor.unfold`` — time and memory grow as ``O(n (b + 2r))`` = O(n r),
never O(n^2). No dense mask is built; only a ``(b, b + 2r)`` band that all blocks share.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks, masks
from ..functional import masked_softmax, scaled_scores
from ..registry import register
from ..types import AttentionOutput, KVCache
from .base import AttentionKernel, clamp_knob
from .softmax import append_cache

__all__ = ["WindowAttention", "unfold_band", "band_blocks", "scatter_band"]


def unfold_band(x: Tensor, start: int, step: int, width: int, n: int) -> Tensor:
    """Overlapping windows of ``x (..., L, E)`` along dim -2 (zeros / False outside ``[0, L)``).

    Window ``t`` holds positions ``start + t * step + [0, width)``. Returns ``(..., n, width, E)``
    — a strided view of one padded copy of ``x``, not ``n`` copies.
    """
    L = x.shape[-2]
    if n == 0:
        return x.new_zeros(*x.shape[:-2], 0, width, x.shape[-1])
    lo = max(0, -start)
    hi = max(0, start + (n - 1) * step + width - L)
    x = F.pad(x, (0, 0, lo, hi), value=False if x.dtype == torch.bool else 0.0)
    return x[..., start + lo:, :].unfold(-2, width, step)[..., :n, :, :].transpose(-1, -2)  # (..., n, width, E)


def band_blocks(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], left: int, right: int, b: int):
    """Query blocks and the key band each one sees, for kernels whose keys lie within a distance
    band of the query (queries aligned to the end of the keys).

    Query ``qi`` of block ``t`` sits at key position ``o + t b + qi`` (``o = N - M``) and sees the
    ``W = b + left + right`` keys ``o + t b - left + [0, W)``. Returns ``(q_blocks (B, H, nb, b, E),
    k_blocks (B, H, nb, W, E), v_blocks (B, H, nb, W, Ev), distance (b, W)`` (signed ``i - j``),
    ``valid (.., nb, b, W)`` (in the band, inside ``[0, N)``, allowed by the key-padding ``mask``),
    ``key_pos (nb, W))``.
    """
    B, H, M, E = q.shape
    N = k.shape[-2]
    o = N - M
    nb = -(-M // b)  # number of query blocks
    W = b + left + right  # keys seen by one query block
    q_blocks = F.pad(q, (0, 0, 0, nb * b - M)).view(B, H, nb, b, E)  # (B, H, nb, b, E)
    k_blocks = unfold_band(k, o - left, b, W, nb)  # (B, H, nb, W, E): keys o + t b - left + [0, W)
    v_blocks = unfold_band(v, o - left, b, W, nb)  # (B, H, nb, W, Ev)
    # query qi of block t is at o + t b + qi; key column kj at o + t b - left + kj: d = qi - kj + left
    qi = torch.arange(b, device=q.device).view(b, 1)
    kj = torch.arange(W, device=q.device).view(1, W)
    distance = qi - kj + left  # (b, W)
    band = (distance <= left) & (distance >= -right)  # (b, W), shared by all blocks
    key_pos = torch.arange(nb, device=q.device).view(nb, 1) * b + kj + (o - left)  # (nb, W)
    valid = band & ((key_pos >= 0) & (key_pos < N)).view(nb, 1, W)  # (nb, b, W)
    if mask is not None:
        kpm = unfold_band(mask[:, :, 0, :, None], o - left, b, W, nb)[..., 0]  # (B|1, H|1, nb, W)
        valid = valid & kpm.unsqueeze(-2)  # (B|1, H|1, nb, b, W)
    return q_blocks, k_blocks, v_blocks, distance, valid, key_pos


def scatter_band(weights: Tensor, key_pos: Tensor, N: int) -> Tensor:
    """Band weights ``(B, H, nb, b, W)`` back into ``(B, H, nb b, N)`` for inspection and plots
    (O(M N): on request only); keys outside ``[0, N)`` carry weight 0, so clamping their column
    changes nothing."""
    B, H, nb, b, W = weights.shape
    cols = key_pos.clamp(0, max(N - 1, 0)).view(1, 1, nb, 1, W).expand(B, H, nb, b, W)
    return weights.new_zeros(B, H, nb, b, N).scatter_add_(-1, cols, weights).view(B, H, nb * b, N)


@register("attention", "window", "restricted", "sliding-window")
class WindowAttention(AttentionKernel):
    """Restricted self-attention over |i-j| <= radius (Vaswani et al. 2017, Table 1), O(n r) in blocks.

    Args:
        radius: ``r >= 0``; a query sees ``2r + 1`` keys (causal: ``r + 1``).
        block: query block length ``b`` (default ``max(r, 64)``): larger blocks mean fewer, larger
            matrix products at the cost of ``b`` extra key columns per block.
    Incremental decoding keeps only the last ``r`` keys (a bounded ``KVCache``).
    """

    supports_mask = "key_padding"
    supports_state = True
    state_type = KVCache

    def __init__(self, *, radius: int, causal: bool = False, dropout: float = 0.0, block: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.radius = _checks.positive_int("radius", radius, allow_zero=True)
        self.block = None if block is None else _checks.positive_int("block", block)

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``radius = max_len / 8`` in ``[1, 64]``: a local window, constant (O(n)) for long sequences."""
        return {**super().default_knobs(max_len, n_heads, d_head), "radius": clamp_knob(max_len // 8, 1, 64)}

    def extra_repr(self) -> str:
        return f"radius={self.radius}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return masks.window(self.radius, causal=self.causal, offset=n_keys - n_queries)

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        cache = None
        if state is not None or return_state:
            k, v, cache = append_cache(state, k, v, keep=self.radius)
        B, H, M, E = q.shape
        N = k.shape[-2]
        r = min(self.radius, N + M)  # no pair of positions is further apart: a wider band only wastes work
        right = 0 if self.causal else r  # keys a query may see after itself
        b = min(M, self.block or max(r, 64)) if M > 0 else 1
        nb = -(-M // b)  # number of query blocks

        q_blocks, k_blocks, v_blocks, _, valid, key_pos = band_blocks(q, k, v, mask, r, right, b)

        dropout_p = self.dropout if self.training else 0.0
        if not need_weights:
            # Each block is a small dense attention problem: the fused kernel takes them all at once.
            out = F.scaled_dot_product_attention(q_blocks, k_blocks, v_blocks, attn_mask=valid, dropout_p=dropout_p)
            if q.device.type != "cpu":
                out = out.masked_fill(~valid.any(-1, keepdim=True), 0.0)  # rows with no key: zeros on every backend
            return AttentionOutput(out.reshape(B, H, nb * b, v.shape[-1])[:, :, :M], None, cache)  # (B, H, M, Ev)

        scores = scaled_scores(q_blocks, k_blocks, 1.0 / math.sqrt(E))  # (B, H, nb, b, W), float32 for half types
        weights = masked_softmax(scores, valid).to(v.dtype)  # (B, H, nb, b, W)
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = (dropped @ v_blocks).reshape(B, H, nb * b, v.shape[-1])[:, :, :M]  # (B, H, M, Ev)

        return AttentionOutput(out, scatter_band(weights, key_pos, N)[:, :, :M], cache)
