"""Restricted (windowed) self-attention: each query attends to the keys within distance ``r``
(Vaswani et al. 2017, "Attention Is All You Need", Table 1: O(r n d) per layer).

``out_i = sum_{j : |i - j| <= r} softmax_j(q_i . k_j / sqrt(d)) v_j``; causal: ``0 <= i - j <= r``.

Computed in query blocks of ``b`` positions, each against the ``b + 2r`` (causal: ``b + r``) keys
it can see, gathered with ``Tensor.unfold`` — time and memory grow as ``O(n (b + 2r))`` = O(n r),
never O(n^2). No dense mask is built; only a ``(b, b + 2r)`` band that all blocks share. On CUDA
(``qkv.attention.flex``) FlexAttention runs the same ``qkv.masks.window`` predicate block-sparsely.
"""

from __future__ import annotations

import math
from typing import Optional

import torch.nn.functional as F

from .. import _checks, masks
from ..functional import masked_softmax, scaled_scores
from ..registry import register
from ..types import AttentionOutput, KVCache
from . import flex
from ._ops import append_cache, band_blocks, fused_blocks, scatter_band
from .base import AttentionKernel, clamp_knob

__all__ = ["WindowAttention"]


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
    context_parallel = "halo"  # qkv.parallel: the radius keys beyond a shard's ends from the neighbours
    static_length = "its queries are cut into blocks and each block's band of keys unfolded, in numbers of the length"

    def __init__(self, *, radius: int, causal: bool = False, dropout: float = 0.0, block: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.radius = _checks.positive_int("radius", radius, allow_zero=True)
        self.block = None if block is None else _checks.positive_int("block", block)

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``radius = max_len / 8`` in ``[1, 64]``: a local window, constant (O(n)) for long sequences."""
        return {**super().default_knobs(max_len, n_heads, d_head), "radius": clamp_knob(max_len // 8, 1, 64)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"radius": (0, 1, 2, 3, 4), "block": (None, 1, 2, 3, 4)}

    def extra_repr(self) -> str:
        return f"radius={self.radius}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return masks.window(self.radius, causal=self.causal, offset=n_keys - n_queries)

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        dropout_p = self.dropout if self.training else 0.0
        if (state is None and not return_state and 0 < q.shape[-2] <= k.shape[-2]
                and flex.usable(q, v, need_weights, dropout_p)):
            # CUDA: FlexAttention visits only the key blocks of the band
            out = flex.attend_pattern(q, k, v, self.pattern(q.shape[-2], k.shape[-2]), mask,
                                      (self.registry_name, self.extra_repr()))
            return AttentionOutput(out, None, None)
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

        if not need_weights:
            # Each block is a small dense attention problem: the fused kernel takes them all at once.
            out = fused_blocks(q_blocks, k_blocks, v_blocks, valid, dropout_p)  # (B, H, nb, b, Ev); rows with no key: 0
            return AttentionOutput(out.reshape(B, H, nb * b, v.shape[-1])[:, :, :M], None, cache)  # (B, H, M, Ev)

        scores = scaled_scores(q_blocks, k_blocks, 1.0 / math.sqrt(E))  # (B, H, nb, b, W), float32 for half types
        weights = masked_softmax(scores, valid).to(v.dtype)  # (B, H, nb, b, W)
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = (dropped @ v_blocks).reshape(B, H, nb * b, v.shape[-1])[:, :, :M]  # (B, H, M, Ev)

        return AttentionOutput(out, scatter_band(weights, key_pos, N)[:, :, :M], cache)
