"""Exact scaled dot-product attention (Vaswani et al. 2017, "Attention Is All You Need",
arXiv:1706.03762).

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``.

Fast path: ``F.scaled_dot_product_attention`` (fused kernels; FlashAttention on GPU) whenever the
weights are not requested. The explicit path computes the weights with ``masked_softmax``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..functional import masked_softmax, scaled_scores
from ..masks import causal_mask
from ..registry import register
from ..types import AttentionOutput, KVCache
from .base import AttentionKernel

__all__ = ["SoftmaxAttention", "append_cache"]


def append_cache(state: Optional[KVCache], k: Tensor, v: Tensor, keep: Optional[int] = None) -> tuple[Tensor, Tensor, KVCache]:
    """Concatenate cached keys/values with new ones ``(B, H, M, E)``.

    Returns ``(k_all, v_all, new_cache)``; with ``keep`` the new cache holds only the last ``keep``
    positions (a bounded cache for kernels that never look further back). Without autograd (a
    decoding loop) an unbounded cache grows into buffers of doubling capacity, written in place:
    O(M) per step instead of re-copying every cached position (``KVCache.room``).
    """
    if state is not None:
        if not isinstance(state, KVCache):
            raise TypeError(f"state must be a KVCache returned by this kernel, got {type(state).__name__}")
        if state.key.shape[:2] != k.shape[:2] or state.key.shape[-1] != k.shape[-1]:
            raise ValueError(f"state holds keys of shape {tuple(state.key.shape)}, incompatible with k {tuple(k.shape)}")
    offset = state.offset if state is not None else 0
    in_place = keep is None and not (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or (
        state is not None and (state.key.requires_grad or state.value.requires_grad))))
    if in_place:
        return _append_in_place(state, k, v, offset)
    if state is not None:
        k = torch.cat([state.key, k], dim=-2)  # (B, H, S + M, E)
        v = torch.cat([state.value, v], dim=-2)
    if keep is not None and k.shape[-2] > keep:
        trimmed = k.shape[-2] - keep
        cache = KVCache(k[..., trimmed:, :], v[..., trimmed:, :], offset + trimmed)
    else:
        cache = KVCache(k, v, offset)
    return k, v, cache


def _append_in_place(state: Optional[KVCache], k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor, KVCache]:
    """``append_cache`` without autograd: write ``k``, ``v`` after the cached positions, into the
    state's spare room when it is the state that wrote last, else into new buffers of twice the length."""
    S = state.length if state is not None else 0
    n = S + k.shape[-2]
    room = state.room if state is not None else None
    if (room is None or room[2][0] != S or n > room[0].shape[-2] or room[0].dtype != k.dtype
            or room[0].device != k.device or room[1].dtype != v.dtype):
        capacity = max(2 * n, 64)
        key = k.new_empty(*k.shape[:-2], capacity, k.shape[-1])  # (B, H, capacity, E)
        value = v.new_empty(*v.shape[:-2], capacity, v.shape[-1])
        if S:
            key[..., :S, :] = state.key
            value[..., :S, :] = state.value
        room = (key, value, [S])
    key, value, written = room
    key[..., S:n, :] = k
    value[..., S:n, :] = v
    written[0] = n
    k_all, v_all = key[..., :n, :], value[..., :n, :]  # (B, H, S + M, E) views
    return k_all, v_all, KVCache(k_all, v_all, offset, room=room)


@register("attention", "softmax", "full", "scaled_dot_product")
class SoftmaxAttention(AttentionKernel):
    """Exact softmax attention softmax(QK^T/sqrt(d))V (Vaswani et al. 2017); fused SDPA when no weights are asked.

    Cost: O(M N E) time; O(M N) memory on the explicit path, O(M + N) with fused kernels.
    Incremental decoding keeps a ``KVCache`` of every key and value seen.
    """

    supports_mask = "full"
    supports_state = True
    state_type = KVCache

    def __init__(self, *, causal: bool = False, dropout: float = 0.0, scale: Optional[float] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
            raise ValueError(f"scale must be a positive float or None (1/sqrt(head_dim)), got {scale!r}")
        self.scale = scale

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        cache = None
        if state is not None or return_state:
            k, v, cache = append_cache(state, k, v)
        M, N = q.shape[-2], k.shape[-2]
        dropout_p = self.dropout if self.training else 0.0
        if not need_weights:
            if self.causal and M == N and mask is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scale)
            elif self.causal and M == 1 and mask is None:
                # one query at the end of the keys (a decoding step) sees every key: no mask to build
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
            else:
                if self.causal:
                    # SDPA's is_causal aligns queries to the start; qkv aligns them to the end.
                    allowed = causal_mask(M, N, offset=N - M, device=q.device)  # (M, N)
                    mask = allowed if mask is None else mask & allowed
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)
                if mask is not None and q.device.type != "cpu":
                    # Not every fused backend zeroes rows with no allowed key; enforce the convention.
                    out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
            return AttentionOutput(out, None, cache)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = scaled_scores(q, k, scale)  # (B, H, M, N), float32 for half types
        if self.causal:
            allowed = causal_mask(M, N, offset=N - M, device=q.device)
            mask = allowed if mask is None else mask & allowed
        weights = masked_softmax(scores, mask).to(v.dtype)  # (B, H, M, N)
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        return AttentionOutput(dropped @ v, weights, cache)
