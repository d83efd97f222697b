"""Linformer attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity",
arXiv:2006.04768).

Keys and values are projected along the *length* by learned ``k x n`` matrices ``E`` and ``F``
before softmax attention (eq. 7):

    head = softmax( Q (E K)^T / sqrt(d) ) (F V)          Q (M, d), K, V (n, d), E, F (k, n)

so the scores are ``(M, k)`` instead of ``(M, n)``: O(n k) time and memory for a fixed ``k``.

Sharing (§4, "Additional Efficiency Techniques"): ``headwise`` — one ``E`` and one ``F`` per
layer, shared by its heads; ``key-value`` — also ``E = F``; ``layerwise`` — one projection for
keys and values of every head of every layer (the stack hands the first layer's projection to
the others through ``AttentionKernel.share_across_layers``).

Inputs shorter than ``seq_len`` use the first ``N`` columns of ``E`` and ``F`` (as the authors'
fairseq code does); longer inputs raise. Key padding zeroes the padded keys and values *before*
the projection, so a padded position never enters ``E K`` or ``F V``. The projection mixes all
positions, so ``causal=True`` is refused. ``need_weights`` returns the implied weights on the
values, ``P F`` ``(M, n)`` (``out = P (F V) = (P F) V``) — not a distribution, since ``F`` is a
learned projection.

Dropout acts on the ``(M, k)`` attention weights ``P``, as in the authors' code.
Initialisation: ``E, F ~ U(-a, a)``, ``a = sqrt(6 / (n + k)) / sqrt(2)`` (Xavier-uniform with gain
``1/sqrt(2)``, as in the authors' fairseq code).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks
from ..registry import register
from ..types import AttentionOutput
from ._ops import matmul_dtype
from .base import AttentionKernel, clamp_knob

__all__ = ["LinformerAttention", "SHARING"]

SHARING = ("headwise", "key-value", "layerwise")


@register("attention", "linformer")
class LinformerAttention(AttentionKernel):
    """Linformer softmax(Q (E K)^T / sqrt(d)) (F V) with learned length projections E, F (k x n) (Wang et al. 2020), O(n k), not causal.

    Args:
        seq_len: ``n``, the longest input (columns of ``E`` and ``F``); shorter inputs use the
            first ``N`` columns.
        k: projected length (rows of ``E`` and ``F``).
        sharing: ``"headwise"`` (``E``, ``F`` shared by the heads), ``"key-value"`` (also
            ``E = F``) or ``"layerwise"`` (one projection for keys and values, shared by every
            layer of a stack).
        dropout: on the ``(M, k)`` attention weights.
    Shapes: ``q (B, H, M, d)``, ``k (B, H, N, d)``, ``v (B, H, N, Ev)``, ``N <= seq_len`` ->
    ``(B, H, M, Ev)``; weights ``P F (B, H, M, N)`` only when asked.
    Masks: key padding ``(B, N)`` only (applied before projecting). Cost: O(M k d + N k (d + Ev)).
    """

    supports_mask = "key_padding"
    supports_state = False
    supports_causal = False
    exact = False
    needs_seq_len = True
    context_parallel = "projection"  # qkv.parallel: E K and F V summed over the ranks' positions

    def __init__(self, *, seq_len: int, k: int = 256, sharing: str = "headwise", causal: bool = False,
                 dropout: float = 0.0) -> None:
        if causal is True:
            raise ValueError("attention 'linformer' cannot be causal (causal=True given): E K and F V mix every "
                             "position into each projected key/value, so a query would see the future "
                             "(Wang et al. 2020 is an encoder); use 'linear' or 'performer' for a causal model")
        super().__init__(causal=causal, dropout=dropout)
        self.seq_len = _checks.positive_int("seq_len", seq_len)
        self.k = _checks.positive_int("k", k)
        if sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {sharing!r}")
        self.sharing = sharing
        bound = math.sqrt(6.0 / (self.seq_len + self.k)) / math.sqrt(2.0)  # Xavier-uniform, gain 1/sqrt(2)
        self.E = nn.Parameter(torch.empty(self.k, self.seq_len).uniform_(-bound, bound))  # (k, n): keys
        # (k, n): values; key-value and layerwise sharing use E for both
        self.F = nn.Parameter(torch.empty(self.k, self.seq_len).uniform_(-bound, bound)) if sharing == "headwise" else None

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``seq_len = max_len`` and a projected length ``k = max_len / 4`` in ``[1, 256]`` (the paper: 128-256)."""
        return {**super().default_knobs(max_len, n_heads, d_head), "seq_len": max_len, "k": clamp_knob(max_len // 4, 1, 256)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"seq_len": (6, 7, 8), "k": (1, 2, 3, 4), "sharing": ("headwise", "key-value")}

    def extra_repr(self) -> str:
        return f"seq_len={self.seq_len}, k={self.k}, sharing={self.sharing!r}, {super().extra_repr()}"

    def share_across_layers(self, first: AttentionKernel) -> None:
        """Layerwise sharing: use ``first``'s projection (the stack's first layer) for keys and values."""
        if self.sharing != "layerwise":
            return
        if not isinstance(first, LinformerAttention) or first.sharing != "layerwise":
            raise ValueError("layerwise sharing needs the stack's first layer to be a layerwise linformer kernel")
        if first.E.shape != self.E.shape:
            raise ValueError(f"layerwise sharing needs equal projections, got {tuple(first.E.shape)} and {tuple(self.E.shape)}")
        self.E = first.E

    def _validate(self, q, k, v, state):
        N = k.shape[-2]
        if N > self.seq_len:
            raise ValueError(f"linformer was built for seq_len={self.seq_len} keys, got {N} (E and F are "
                             f"({self.k}, {self.seq_len}); build it with a larger seq_len)")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        N = k.shape[-2]
        # E K and F V sum N terms: bfloat16 products accumulate in float32 inside the matmul; float16
        # results could pass 65504, so float16 inputs work in float32
        dtype, acc = q.dtype, matmul_dtype(q.dtype)
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
        E = self.E[:, :N].to(acc)  # (k, N): shorter inputs use the first N columns
        Fp = E if self.F is None else self.F[:, :N].to(acc)  # (k, N)
        if mask is not None:
            keep = mask[:, :, 0, :].unsqueeze(-1)  # (B|1, H|1, N, 1)
            # padding before projecting: padded keys/values never enter E K, F V
            k = torch.where(keep, k, torch.zeros((), dtype=acc))
            v = torch.where(keep, v, torch.zeros((), dtype=acc))
        k_proj = E @ k  # (B, H, k, d): E K
        v_proj = Fp @ v  # (B, H, k, Ev): F V
        p = self.dropout if self.training else 0.0
        if not need_weights:
            out = F.scaled_dot_product_attention(q, k_proj, v_proj, dropout_p=p)  # (B, H, M, Ev)
            return AttentionOutput(out.to(dtype), None, None)
        P = torch.softmax(q @ k_proj.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)  # (B, H, M, k)
        if p > 0:
            P = F.dropout(P, p)
        out = P @ v_proj  # (B, H, M, Ev)
        weights = P @ Fp  # (B, H, M, N): out = (P F) V
        if mask is not None:
            weights = weights * mask[:, :, :1, :]  # padded values were zeroed: their weight is 0
        return AttentionOutput(out.to(dtype), weights.to(dtype), None)
