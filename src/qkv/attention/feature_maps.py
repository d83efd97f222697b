"""Learned feature maps for linear attention: Hedgehog (Zhang et al. 2024, "The Hedgehog & the
Porcupine: Expressive Linear Attentions with Softmax Mimicry", arXiv:2402.04347).

Linear attention replaces ``exp(q . k / sqrt(d))`` by ``phi(q) . phi(k)``; a fixed ``phi`` (elu + 1,
random features) is flat where softmax is spiky. Hedgehog learns ``phi`` per head so that
``phi(q) . phi(k)`` mimics the softmax weights:

    phi_h(x) = [softmax(x W_h + b_h), softmax(-(x W_h + b_h))]        W_h (E, F), b_h (F,)

— the paper's ``[exp(W x + b), exp(-W x - b)]`` with each half normalised over its ``F`` features
(what the authors' and LoLCATs' code do: the features stay in [0, 1], and a query's scale cancels
between numerator and denominator). ``W_h`` starts at the identity (``F = E``) and ``b_h`` at 0.
Queries and keys get their own maps (LoLCATs' default; ``tie_qk=True`` shares one), per query head:
with grouped keys every query head turns its copy of the shared key head with its own map, so the
kernel keeps its state per query head (``AttentionKernel.keys_per_query_head``).

The maps are trained by attention transfer (``qkv.linearize``): each layer's linear outputs are
fitted to the same layer's softmax outputs, the rest of the model frozen.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .. import _checks

__all__ = ["HedgehogFeatureMap"]


class HedgehogFeatureMap(nn.Module):
    """``phi(x) = [softmax(x W_h + b_h), softmax(-x W_h - b_h)]`` per head ``h`` (Hedgehog): ``2 F`` features.

    Args:
        n_heads: the query heads ``H`` (one map per head).
        d_head: the head size ``E``.
        feature_dim: ``F``, the width of ``W_h`` (default ``E``; the identity start needs ``F = E``,
            otherwise ``W_h`` starts as the first ``F`` columns of it, or the identity padded by zeros).
        tie_qk: one map for queries and keys (default: one each).

    ``queries(x)`` / ``keys(x)``: ``x (B, H, L, E)`` -> ``(B, H, L, 2F)``; ``forward`` is ``queries``.
    """

    keys_per_query_head = True  # per-head parameters: grouped keys are turned once per query head

    def __init__(self, n_heads: int, d_head: int, feature_dim: Optional[int] = None, tie_qk: bool = False) -> None:
        super().__init__()
        self.n_heads = _checks.positive_int("n_heads", n_heads)
        self.d_head = _checks.positive_int("d_head", d_head)
        self.feature_dim = d_head if feature_dim is None else _checks.positive_int("feature_dim", feature_dim)
        if not isinstance(tie_qk, bool):
            raise TypeError(f"tie_qk must be a bool, got {tie_qk!r}")
        self.tie_qk = tie_qk
        eye = torch.eye(self.d_head, self.feature_dim).expand(self.n_heads, -1, -1)  # (H, E, F)
        self.query_weight = nn.Parameter(eye.clone())
        self.query_bias = nn.Parameter(torch.zeros(self.n_heads, self.feature_dim))
        if tie_qk:
            self.key_weight, self.key_bias = self.query_weight, self.query_bias
        else:
            self.key_weight = nn.Parameter(eye.clone())
            self.key_bias = nn.Parameter(torch.zeros(self.n_heads, self.feature_dim))

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}, feature_dim={self.feature_dim}, tie_qk={self.tie_qk}"

    def _features(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.n_heads or x.shape[-1] != self.d_head:
            raise ValueError(f"hedgehog features take (B, {self.n_heads}, L, {self.d_head}) heads, got {tuple(x.shape)}")
        z = x @ weight.to(x.dtype) + bias.to(x.dtype)[:, None]  # (B, H, L, F): head h's x W_h (half einsum's operations)
        return torch.cat([torch.softmax(z, dim=-1), torch.softmax(-z, dim=-1)], dim=-1)  # (B, H, L, 2F)

    def queries(self, x: Tensor) -> Tensor:
        """The query features ``(B, H, L, 2F)`` of ``x (B, H, L, E)``."""
        return self._features(x, self.query_weight, self.query_bias)

    def keys(self, x: Tensor) -> Tensor:
        """The key features ``(B, H, L, 2F)`` of ``x (B, H, L, E)`` (the queries' map when ``tie_qk``)."""
        return self._features(x, self.key_weight, self.key_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.queries(x)
