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

The fixed map ``elu + 1`` (Katharopoulos et al. 2020) and the resolution of a ``feature_map``
knob (``resolve_feature_map``, ``apply_feature_map``) live here too, below every kernel that
takes one (``linear``, ``linear-window``).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from .. import _checks

__all__ = ["HedgehogFeatureMap", "elu_plus_one", "resolve_feature_map", "apply_feature_map"]


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


def _elu_plus_one_passes(x: Tensor) -> Tensor:
    out = torch.relu(x)
    return out.add_(x.clamp(max=0.0).exp_())


class _EluPlusOne(torch.autograd.Function):
    """``relu(x) + exp(min(x, 0))`` in four passes forward and two backward:
    ``d phi / dx = min(phi(x), 1)`` (1 for x > 0, exp(x) below)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        out = _elu_plus_one_passes(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        return out.clamp(max=1.0).mul_(grad)


def elu_plus_one(x: Tensor) -> Tensor:
    """``phi(x) = elu(x) + 1`` (Katharopoulos 2020, eq. 7): positive, so every denominator is > 0.

    Written as ``relu(x) + exp(min(x, 0))`` — ``x + 1`` (x > 0), ``exp(x)`` (x <= 0) — not
    ``(exp(x) - 1) + 1``, which cancels to exactly 0 below x = -16.6 in float32; the exp never
    overflows. No ``torch.where`` (on CPU several times slower than these passes), and the gradient
    written out (``_EluPlusOne``); without autograd (decoding) the passes alone, not the Function's call.
    """
    return _EluPlusOne.apply(x) if torch.is_grad_enabled() else _elu_plus_one_passes(x)


def resolve_feature_map(feature_map: Union[str, Callable[[Tensor], Tensor]], n_heads: Optional[int] = None,
                        d_head: Optional[int] = None, feature_dim: Optional[int] = None) -> Callable[[Tensor], Tensor]:
    """``"elu+1"``, ``"hedgehog"`` (a learned ``HedgehogFeatureMap`` of ``n_heads`` heads of ``d_head``
    features, ``feature_dim`` its width) or a callable ``(..., E) -> (..., E')`` of non-negative features."""
    if feature_dim is not None and feature_map != "hedgehog":
        raise ValueError(f"feature_dim is the width of the learned 'hedgehog' feature map; feature_map is {feature_map!r}")
    if feature_map == "hedgehog":
        if n_heads is None or d_head is None:
            raise ValueError("feature_map='hedgehog' learns a map per head: give n_heads and d_head (MultiHeadAttention "
                             "fills them in)")
        return HedgehogFeatureMap(n_heads, d_head, feature_dim)
    if isinstance(feature_map, str):
        if feature_map != "elu+1":
            raise ValueError(f"feature_map must be 'elu+1', 'hedgehog' or a callable, got unknown name {feature_map!r}")
        return elu_plus_one
    if not callable(feature_map):
        raise TypeError(f"feature_map must be 'elu+1', 'hedgehog' or a callable, got {type(feature_map).__name__}")
    return feature_map


def apply_feature_map(feature_map: Callable[[Tensor], Tensor], q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """``(phi(q), phi(k))``: a map with ``queries`` and ``keys`` methods (Hedgehog's) turns each with
    its own, any other callable both with itself."""
    if hasattr(feature_map, "queries") and hasattr(feature_map, "keys"):
        return feature_map.queries(q), feature_map.keys(k)
    return feature_map(q), feature_map(k)
