"""Exact scaled dot-product attention (Vaswani et al. 2017, "Attention Is All You Need",
arXiv:1706.03762).

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``.

Fast path: ``F.scaled_dot_product_attention`` (fused kernels; FlashAttention on GPU) whenever the
weights are not requested. The explicit path computes the weights with ``masked_softmax``.

Grouped-query attention (Ainslie et al. 2023): keys and values may have ``G`` heads dividing the
queries' ``H`` — query head ``h`` reads key head ``floor(h G / H)``, SDPA's ``enable_gqa`` — and
the ``KVCache`` holds ``G`` heads.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..functional import scaled_scores
from ..masks import causal_mask
from ..registry import register
from ..types import AttentionOutput, KVCache
from . import _score_mods
from ._ops import append_cache
from .base import AttentionKernel, same_document

__all__ = ["SoftmaxAttention"]


@register("attention", "softmax", "full", "scaled_dot_product")
class SoftmaxAttention(AttentionKernel):
    """Exact softmax attention softmax(QK^T/sqrt(d))V (Vaswani et al. 2017); fused SDPA when no weights are asked.

    Cost: O(M N E) time; O(M N) memory on the explicit path, O(M + N) with fused kernels.
    Incremental decoding keeps a ``KVCache`` of every key and value seen. Knobs ``alibi``,
    ``softcap``, ``sinks`` (``n_heads``: filled in by ``MultiHeadAttention``): see the module.
    """

    supports_mask = "full"
    supports_state = True
    state_type = KVCache
    grouped_kv = True  # k, v (B, G, N, E) with G | H: the cache holds G heads
    context_parallel = "ring"  # qkv.parallel: key/value blocks around the group, merged by log-sum-exp
    packs_documents = True  # position_ids: a block-diagonal mask of same-document pairs

    def __init__(self, *, causal: bool = False, dropout: float = 0.0, scale: Optional[float] = None,
                 alibi: bool = False, softcap: Optional[float] = None, sinks: bool = False,
                 n_heads: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
            raise ValueError(f"scale must be a positive float or None (1/sqrt(head_dim)), got {scale!r}")
        self.scale = scale
        _score_mods.setup(self, alibi=alibi, softcap=softcap, sinks=sinks, n_heads=n_heads)

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> dict:
        return {"n_heads": n_heads}  # the sinks' count

    @classmethod
    def knob_choices(cls) -> dict:
        return {"scale": (None, 0.1, 1.0), "alibi": (False, True), "softcap": (None, 0.5, 5.0), "sinks": (False, True)}

    def _attend(self, q, k, v, mask, state, need_weights, return_state, documents=None):
        cache = None
        if state is not None or return_state:
            k, v, cache = append_cache(state, k, v)
        M, N = q.shape[-2], k.shape[-2]
        if documents is not None:  # packed documents: pairs of one document only
            mask = same_document(documents, M) if mask is None else mask & same_document(documents, M)
        dropout_p = self.dropout if self.training else 0.0
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}  # query head h reads key head floor(h G / H)
        distance = None
        if self.alibi:  # i - j of query i (at key position N - M + i) and key j
            distance = (torch.arange(M, device=q.device) + (N - M)).view(M, 1) - torch.arange(N, device=q.device)
        if not need_weights and self.alibi and _score_mods.fusable(self):
            allowed = causal_mask(M, N, offset=N - M, device=q.device) if self.causal else None
            allowed = mask if allowed is None else allowed if mask is None else mask & allowed
            bias = _score_mods.sdpa_bias(_score_mods.bias(self, q.shape[1], distance, q.dtype), allowed, q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=self.scale, **gqa)
            if allowed is not None:
                out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
            return AttentionOutput(out, None, cache)
        if not need_weights and _score_mods.fusable(self):
            if self.causal and M == N and mask is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scale, **gqa)
            elif self.causal and M == 1 and mask is None:
                # one query at the end of the keys (a decoding step) sees every key: no mask to build
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale, **gqa)
            else:
                if self.causal:
                    # SDPA's is_causal aligns queries to the start; qkv aligns them to the end.
                    allowed = causal_mask(M, N, offset=N - M, device=q.device)  # (M, N)
                    mask = allowed if mask is None else mask & allowed
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale,
                                                     **gqa)
                if mask is not None and q.device.type != "cpu":
                    # Not every fused backend zeroes rows with no allowed key; enforce the convention.
                    out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
            return AttentionOutput(out, None, cache)
        if gqa:  # the weights are (B, H, M, N) anyway: keys and values repeated to the query heads
            G = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, H, N, E)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = scaled_scores(q, k, scale)  # (B, H, M, N), float32 for half types
        if self.alibi or not _score_mods.fusable(self):
            scores = _score_mods.transform(self, scores, _score_mods.bias(self, q.shape[1], distance, scores.dtype))
        if self.causal:
            allowed = causal_mask(M, N, offset=N - M, device=q.device)
            mask = allowed if mask is None else mask & allowed
        weights = _score_mods.softmax(self, scores, mask).to(v.dtype)  # (B, H, M, N)
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = dropped @ v
        return AttentionOutput(out, weights if need_weights else None, cache)
