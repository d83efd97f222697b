"""Efficient attention (Shen et al. 2018, "Efficient Attention: Attention with Linear
Complexities", arXiv:1812.01243).

    E(Q, K, V) = rho_q(Q) (rho_k(K)^T V)                                          (eq. 4)

with ``rho_q`` a softmax over each row of ``Q`` (over the ``d`` features) and ``rho_k`` a softmax
over each column of ``K`` (over the ``N`` positions); no ``1/sqrt(d)`` scale. ``rho_k(K)^T V`` is
``d`` global context vectors — each a softmax-weighted average of the values — and each query
mixes them with its feature distribution. The implied weights ``rho_q(Q) rho_k(K)^T`` are a
distribution over keys (rows sum to 1), so this is softmax attention's sibling, not an
approximation with a knob that converges to it (``docs/approximation.md`` gives the distance).

Cost: O(N d Ev) time, O(d Ev) extra memory. Not causal: the softmax over positions normalises over
every key (``causal=True`` raises). Key padding removes keys from that softmax.
Dropout must be 0: no weight matrix is formed and the authors' code applies none (``dropout > 0``
raises rather than being silently ignored).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional import masked_softmax
from ..registry import register
from ..types import AttentionOutput
from ._ops import accumulation_dtype
from .base import AttentionKernel

__all__ = ["EfficientAttention"]


@register("attention", "efficient", "efficient-attention")
class EfficientAttention(AttentionKernel):
    """Efficient attention softmax_features(Q) (softmax_positions(K)^T V) (Shen et al. 2018), O(N), not causal.

    Args:
        dropout: must be 0 (no weight matrix is formed; > 0 raises).
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``;
    weights ``rho_q(Q) rho_k(K)^T (B, H, M, N)`` only when asked (O(M N)).
    Masks: key padding ``(B, N)`` only. Cost: O(N E Ev).
    """

    supports_mask = "key_padding"
    supports_state = False
    supports_causal = False
    exact = False
    applies_dropout = False  # the authors' code applies none: dropout > 0 raises

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        # rho_q: softmax over each query's features (float32 inside for half types)
        acc = accumulation_dtype(q.dtype)  # sums over N positions in float32 for half types
        rho_q = masked_softmax(q.to(acc), None, dim=-1)  # (B, H, M, E)
        # rho_k: softmax over positions, masked keys excluded; all-masked columns give zeros
        key_mask = None if mask is None else mask[:, :, 0, :].unsqueeze(-2)  # (B|1, H|1, 1, N)
        rho_k = masked_softmax(k.to(acc).transpose(-1, -2), key_mask, dim=-1)  # (B, H, E, N)
        context = rho_k @ v.to(acc)  # (B, H, E, Ev): E global context vectors
        out = (rho_q @ context).to(v.dtype)  # (B, H, M, Ev)
        weights = (rho_q @ rho_k).to(v.dtype) if need_weights else None  # (B, H, M, N)
        return AttentionOutput(out, weights, None)
