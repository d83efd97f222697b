"""Pure tensor functions of attention: masked softmax, generic attention pooling and
Nadaraya–Watson kernel regression.

Shapes use ``...`` for any leading batch dimensions, ``M`` queries, ``N`` keys, ``D`` features.
Boolean masks follow ``F.scaled_dot_product_attention``: True means "may attend".
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _checks
from .types import AttentionOutput

__all__ = ["masked_softmax", "scaled_scores", "attend", "nadaraya_watson", "dot_score", "scaled_dot_score", "cosine_score"]

ScoreFn = Callable[[Tensor, Tensor], Tensor]


def masked_softmax(scores: Tensor, mask: Optional[Tensor] = None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` restricted to the positions where ``mask`` is True.

    ``weights_i = mask_i exp(s_i) / sum_j mask_j exp(s_j)``; a row whose positions are all masked
    returns zeros (never NaN). Computed in float32 for half types (exp of large logits overflows
    float16) and returned in the input dtype.

    Args:
        scores: ``(..., N)`` floating-point scores.
        mask: bool, broadcastable to ``scores``; None means nothing is masked.
    Returns:
        weights, same shape and dtype as ``scores``.
    """
    _checks.tensor("scores", scores, floating=True)
    if mask is None:
        return torch.softmax(scores, dim=dim, dtype=torch.float32).to(scores.dtype) if scores.dtype in (
            torch.float16, torch.bfloat16) else torch.softmax(scores, dim=dim)
    _checks.mask("mask", mask, scores.shape)
    # Accumulate in float32 for half types; float64 stays float64 (gradcheck).
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    # finfo.min rather than -inf: a fully masked row stays finite (uniform), and the final
    # multiplication by the mask turns it into zeros instead of NaN.
    filled = work.masked_fill(~mask, torch.finfo(work.dtype).min)
    weights = torch.softmax(filled, dim=dim) * mask
    return weights.to(scores.dtype)


def scaled_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``(q * scale) k^T``: ``(..., M, E)``, ``(..., N, E)`` -> ``(..., M, N)``.

    Scaled before the product, and in float32 for half types: ``q . k`` overflows float16 long
    before ``q . k / sqrt(d)`` does (``masked_softmax`` works in float32 for them anyway).
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k = q.float(), k.float()
    return (q * scale) @ k.transpose(-1, -2)


def dot_score(query: Tensor, key: Tensor) -> Tensor:
    """``s^T h`` (Luong et al. 2015): ``(..., M, D)``, ``(..., N, D)`` -> ``(..., M, N)``."""
    return query @ key.transpose(-1, -2)


def scaled_dot_score(query: Tensor, key: Tensor) -> Tensor:
    """``s^T h / sqrt(d_k)`` (Vaswani et al. 2017): ``(..., M, D)``, ``(..., N, D)`` -> ``(..., M, N)``."""
    return (query @ key.transpose(-1, -2)) / math.sqrt(key.shape[-1])


def cosine_score(query: Tensor, key: Tensor, eps: float = 1e-8) -> Tensor:
    """``cos(s, h)`` (Graves et al. 2014, content addressing); a zero vector scores 0."""
    return F.normalize(query, dim=-1, eps=eps) @ F.normalize(key, dim=-1, eps=eps).transpose(-1, -2)


_SCORES = {"dot": dot_score, "scaled_dot": scaled_dot_score, "cosine": cosine_score}


def _score(name: str) -> ScoreFn:
    if name not in _SCORES:
        raise ValueError(f"score must be one of {sorted(_SCORES)} or a callable, got {name!r}")
    return _SCORES[name]


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    score: Union[str, ScoreFn] = "scaled_dot",
    need_weights: bool = False,
) -> AttentionOutput:
    """Attention pooling ``out_i = sum_j softmax_j(score(q_i, k_j)) v_j``.

    Args:
        query: ``(..., M, D)``; key: ``(..., N, D)``; value: ``(..., N, Dv)``.
        mask: bool broadcastable to ``(..., M, N)``, True = may attend.
        score: ``"dot"``, ``"scaled_dot"`` (``q.k / sqrt(D)``, the default), ``"cosine"``, or a
            callable ``(query, key) -> (..., M, N)`` (e.g. a module from ``qkv.scores``).
        need_weights: also return the ``(..., M, N)`` weights.
    Returns:
        ``AttentionOutput(output (..., M, Dv), weights or None, None)``.
    """
    _checks.tensor("query", query, floating=True)
    _checks.tensor("key", key, floating=True)
    _checks.tensor("value", value, floating=True)
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            f"query, key and value must be at least 2-D (..., length, features), got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    _checks.same("key", key.shape[-2], "value", value.shape[-2], "the number of positions (dim -2)")
    fn = _score(score) if isinstance(score, str) else score
    if not callable(fn):
        raise TypeError(f"score must be a str or callable, got {type(score).__name__}")
    if isinstance(score, str):
        _checks.same("query", query.shape[-1], "key", key.shape[-1], "the feature size (dim -1)")
    scores = fn(query, key)  # (..., M, N)
    expected = (*torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]), query.shape[-2], key.shape[-2])
    if tuple(scores.shape) != expected:
        raise ValueError(f"score returned shape {tuple(scores.shape)}, expected {expected}")
    weights = masked_softmax(scores, _checks.mask("mask", mask, scores.shape))
    output = weights @ value  # (..., M, Dv)
    return AttentionOutput(output, weights if need_weights else None, None)


def nadaraya_watson(
    x_query: Tensor, x_keys: Tensor, y_values: Tensor, width: Union[float, Tensor] = 1.0, mask: Optional[Tensor] = None
) -> AttentionOutput:
    """Nadaraya–Watson kernel regression (Nadaraya 1964; Watson 1964) as attention pooling.

    ``f(x) = sum_i softmax_i(-(||x - x_i|| w)^2 / 2) y_i`` — a Gaussian kernel of bandwidth
    ``1/w`` normalised over the training points; ``w`` may be a learnable tensor.

    Args:
        x_query: ``(..., M, D)`` inputs; 1-D ``(M,)`` means ``M`` scalars.
        x_keys: ``(..., N, D)`` training inputs; 1-D ``(N,)`` means ``N`` scalars.
        y_values: ``(..., N)`` scalar targets or ``(..., N, Dv)``.
        width: ``w``, a float or a tensor broadcastable to the ``(..., M, N)`` scores.
        mask: optional bool broadcastable to ``(..., M, N)``, True = may attend.
    Returns:
        ``AttentionOutput(output (..., M) or (..., M, Dv), weights (..., M, N), None)``.
    """
    _checks.tensor("x_query", x_query, floating=True)
    _checks.tensor("x_keys", x_keys, floating=True)
    _checks.tensor("y_values", y_values, floating=True)
    if x_query.dim() == 1:
        x_query = x_query.unsqueeze(-1)  # (M, 1)
    if x_keys.dim() == 1:
        x_keys = x_keys.unsqueeze(-1)  # (N, 1)
    _checks.same("x_query", x_query.shape[-1], "x_keys", x_keys.shape[-1], "the feature size (dim -1)")
    scalar_targets = y_values.dim() == x_keys.dim() - 1
    n_targets = y_values.shape[-1] if scalar_targets else y_values.shape[-2] if y_values.dim() >= 2 else -1
    _checks.same("x_keys", x_keys.shape[-2], "y_values", n_targets, "the number of points")
    # squared distance ||x - x_i||^2
    diff2 = (x_query.unsqueeze(-2) - x_keys.unsqueeze(-3)).pow(2).sum(-1)  # (..., M, N)
    w2 = width.pow(2) if isinstance(width, Tensor) else float(width) ** 2
    scores = -diff2 * w2 / 2
    weights = masked_softmax(scores, _checks.mask("mask", mask, scores.shape))
    if scalar_targets:
        output = (weights @ y_values.unsqueeze(-1)).squeeze(-1)  # (..., M)
    else:
        output = weights @ y_values  # (..., M, Dv)
    return AttentionOutput(output, weights, None)
