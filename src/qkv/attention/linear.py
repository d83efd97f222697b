"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention", arXiv:2006.16236). The equations below are computed by
``_ops.linear_attention``, shared with the Performer kernel (``performer.py``).

Replacing ``exp(q . k / sqrt(d))`` by a feature-map dot product ``phi(q) . phi(k)`` lets the sums
over keys be taken once (eq. 5–6):

    V'_i = phi(Q_i)^T S / (phi(Q_i)^T Z + eps),   S = sum_j phi(K_j) V_j^T,   Z = sum_j phi(K_j)

with ``phi(x) = elu(x) + 1``. Causal: ``S_i = sum_{j<=i} phi(K_j) V_j^T``, ``Z_i = sum_{j<=i} phi(K_j)``;
as an RNN ``s_i = s_{i-1} + phi(k_i) v_i^T``, ``z_i = z_{i-1} + phi(k_i)`` (eq. 16–20) — the
incremental-decoding state ``LinearState(S, Z)``.

Cost: O(N E' Ev) time and O(E' Ev) extra memory (non-causal); causal is computed in chunks of
``C`` positions — a masked ``(C, C)`` quadratic form inside a chunk, one scan of the ``(S, Z)``
sums across chunks: the chunkwise engine of the gated kernels (``qkv/_chunkwise.py``) with decay 1,
or the rescaling to the keys' running maximum below — O(N C E' + N E' Ev) time; no ``(N, N)``
matrix is ever formed.

Deviations: ``eps`` (default 0: the paper's equation) is added to the denominator (the authors'
code adds 1e-6). With ``elu+1``, each query row's features and the keys' features are first
divided by their largest (``elu_features``; the factors cancel in the ratio, so eps guards a zero
denominator without shrinking rows of small features; folded into eps while the largest inputs
are above -20, in log space below, so that features below float range still rank the keys). For a causal row ``i`` "the keys' largest" is that of the keys
``j <= i`` (a running maximum, per position): eps then relates to what row ``i`` may see, so no
later key reaches it and one token at a time gives the parallel pass's numbers. Written out,

    V'_i = phi(Q_i)^T S_i / (phi(Q_i)^T Z_i + eps phi(max Q_i) phi(max_{j <= i} K_j)).

Gradients are those of this function: with ``eps > 0`` they reach the maxima too (with ``eps = 0``
the maxima cancel and are detached).

Dropout must be 0 (no attention matrix exists to drop from, and the authors' code applies none;
``dropout > 0`` raises rather than being silently ignored); only key-padding masks are supported
(a mask is a matrix, which the factorisation avoids).
Grouped-query attention (``k, v`` with ``G`` heads dividing the queries' ``H``): without causality
the ``H / G`` query heads of a group are read as more rows of their key head (``S``, ``Z`` formed
once per key head); causal, keys and values are repeated and ``LinearState`` is kept per key head
(``_ops.grouped_attend``). The performer kernel does the same.
Linear attention is a *different* attention, not an approximation of softmax: no knob makes it
converge to softmax (see ``docs/approximation.md`` for how far from softmax it lands).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from .. import _checks
from ..registry import register
from ..types import AttentionOutput, LinearState
from ._ops import Features, accumulation_dtype, finite_or_zero, grouped_attend, linear_attention, split_key_mask
from .base import AttentionKernel, clamp_knob
from .feature_maps import HedgehogFeatureMap

__all__ = ["LinearAttention", "elu_plus_one", "log_elu_plus_one", "elu_features", "resolve_feature_map"]


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


def log_elu_plus_one(x: Tensor) -> Tensor:
    """``log phi(x)`` for ``phi = elu + 1``: ``log(1 + x)`` (x > 0) or ``x`` — finite where
    ``phi(x)`` underflows to 0, so the features can be scaled by their maximum before the exp."""
    return torch.log1p(torch.relu(x)) + x.clamp(max=0.0)


#: Direct (not log-space) features are used while the largest input of every query row and of the
#: keys is above this: features that underflow (x < -87 in float32) are then below e^-67 of the largest.
DIRECT_MIN = -20.0


def direct_features(x: Tensor, dims, keep_grad: bool = False) -> Optional[tuple]:
    """``(phi(x), phi(max x))`` with ``phi = elu + 1`` and the maximum over ``dims`` (kept): dividing
    the features by their largest would scale ``eps`` by ``phi(max x)`` — ``eps * phi(max x)`` on
    the unscaled features is the same function, without the division — or None when a maximum is
    below ``DIRECT_MIN`` or a graph is being traced (``torch.compile``/``torch.export``: no branch on
    values; then the caller works in log space). ``-inf`` entries (masked keys) get 0.
    The maximum carries gradient when ``keep_grad`` (the caller's ``eps > 0``: the eps term depends on it)."""
    if torch.compiler.is_compiling():
        return None  # a traced graph cannot branch on values: the log-space path, right for every input
    top = finite_or_zero((x if keep_grad else x.detach()).amax(dim=dims, keepdim=True))  # -inf: no valid entry
    if top.numel() and bool(top.min() < DIRECT_MIN):
        return None
    return elu_plus_one(x), elu_plus_one(top)


def elu_features(q: Tensor, k: Tensor, key_mask: Optional[Tensor], causal: bool, keep_grad: bool) -> Features:
    """``phi = elu + 1`` of ``q (B, H, M, E)`` and ``k (B, H, N, E)``, each query row divided by its
    largest feature and the keys by theirs (both factors cancel between numerator and denominator;
    ``eps`` then guards a relative 0). Directly while the largest inputs are moderate
    (``direct_features``: the factors folded into ``eps_scale``), else in log space, so that
    features that underflow (x < -87 in float32) still rank the keys. Causal keys always go in log
    space: their maximum is a running one, taken inside the core, so that no key reaches an earlier
    output. ``keep_grad``: the maxima carry gradient (``eps > 0``: the eps term depends on them)."""
    direct_q = direct_features(q, -1, keep_grad)  # (phi_q, (B, H, M, 1)) or None
    direct_k = None
    if direct_q is not None and not causal:
        k_in = k if key_mask is None else k.masked_fill(~key_mask.unsqueeze(-1), float("-inf"))
        direct_k = direct_features(k_in, (-2, -1), keep_grad)  # (phi_k, (B, H, 1, 1)) or None
    if direct_q is None:
        log_q = log_elu_plus_one(q)  # (B, H, M, E)
        phi_q = torch.exp(log_q - (log_q if keep_grad else log_q.detach()).amax(dim=-1, keepdim=True))
        return Features(phi_q, log_elu_plus_one(k), log_keys=True)
    if direct_k is None:
        return Features(direct_q[0], log_elu_plus_one(k), log_keys=True, eps_scale=direct_q[1])
    return Features(direct_q[0], direct_k[0], log_keys=False, eps_scale=direct_q[1] * direct_k[1])


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


@register("attention", "linear", "linear-transformer")
class LinearAttention(AttentionKernel):
    """Linear attention phi(Q)(phi(K)^T V) / phi(Q) phi(K)^T 1, phi = elu + 1 (Katharopoulos et al. 2020), O(N).

    ``V'_i = phi(Q_i)^T S / (phi(Q_i)^T Z + eps)``, ``S = sum_j phi(K_j) V_j^T``, ``Z = sum_j phi(K_j)``
    (causal: sums over ``j <= i``).

    Args:
        feature_map: ``"elu+1"``, ``"hedgehog"`` (Hedgehog's learned map per head,
            ``qkv.attention.feature_maps``; queries and keys each their own) or a callable mapping
            ``(B, H, L, E)`` to non-negative ``(B, H, L, E')`` features (a module with ``queries``
            and ``keys`` methods maps each with its own).
        n_heads, d_head: the heads' shape, for a learned feature map (``MultiHeadAttention`` fills
            them in); feature_dim: the hedgehog map's width ``F`` (default ``d_head``; ``2F`` features).
        eps: added to the denominator, relative to the largest features (the module docstring);
            0 (the default) divides exactly — the paper's equation — and a row whose features
            all underflow gives 0. The authors' code adds 1e-6; with ``eps > 0`` the gradient also
            runs through the maxima, which costs about a quarter more time in backward.
        chunk_size: causal chunk length ``C``: a masked ``(C, C)`` product inside a chunk, running
            sums across chunks.
        causal: as every kernel. dropout: must be 0 (no weight matrix is formed; > 0 raises).
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``;
    weights ``(B, H, M, N)`` only when asked (computed densely, O(M N)).
    Incremental decoding (causal): ``return_state=True`` returns ``LinearState(S, Z)``.
    Cost: O(N E' Ev) time, O(E' Ev) state.
    """

    supports_mask = "key_padding"
    supports_state = True
    state_type = LinearState
    exact = False
    grouped_kv = True  # k, v of fewer heads: the queries grouped (_ops.grouped_attend), the state per key head
    context_parallel = "state"  # qkv.parallel: (sum phi(k) v^T, sum phi(k)) passed between ranks

    @property
    def static_length(self):  # AttentionKernel.static_length: non-causal exports at any length
        return "its causal sums run in chunks of chunk_size, in numbers of the length" if self.causal else None
    applies_dropout = False  # the authors' code (fast-transformers) applies none: dropout > 0 raises

    def __init__(self, *, causal: bool = False, dropout: float = 0.0,
                 feature_map: Union[str, Callable[[Tensor], Tensor]] = "elu+1", eps: float = 0.0,
                 chunk_size: int = 64, n_heads: Optional[int] = None, d_head: Optional[int] = None,
                 feature_dim: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.feature_map = resolve_feature_map(feature_map, n_heads, d_head, feature_dim)
        if getattr(self.feature_map, "keys_per_query_head", False):  # per-head maps: keys turned per query head
            self.grouped_kv = False
            self.keys_per_query_head = True
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"eps must be a float >= 0, got {eps!r}")
        self.eps = float(eps)
        self.chunk_size = _checks.positive_int("chunk_size", chunk_size)

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> dict:
        return {"n_heads": n_heads, "d_head": d_head}  # a learned feature map's shape

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """Causal chunks of ``max_len / 4`` in ``[1, 64]`` (a speed knob: the result is the same)."""
        return {**super().default_knobs(max_len, n_heads, d_head), "chunk_size": clamp_knob(max_len // 4, 1, 64)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"chunk_size": (1, 2, 3, 4), "eps": (0.0, 1e-6)}

    def extra_repr(self) -> str:
        name = "hedgehog" if isinstance(self.feature_map, HedgehogFeatureMap) else getattr(
            self.feature_map, "__name__", type(self.feature_map).__name__)
        return f"feature_map={name}, eps={self.eps}, chunk_size={self.chunk_size}, {super().extra_repr()}"

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        # grouped keys (fewer heads than the queries): the queries grouped, the state per key head
        return grouped_attend(self._attend_heads, q, k, v, mask, state, need_weights, return_state, self.causal)

    def _attend_heads(self, q, k, v, mask, state, need_weights, return_state):
        key_mask = split_key_mask(mask, state, k.shape[-2], self._state_length(state))
        acc = accumulation_dtype(q.dtype)
        if self.feature_map is elu_plus_one:
            features = elu_features(q.to(acc), k.to(acc), key_mask, self.causal, keep_grad=self.eps > 0)
        else:
            fm = self.feature_map
            phi_q, phi_k = (fm.queries(q.to(acc)), fm.keys(k.to(acc))) if hasattr(fm, "keys") and hasattr(fm, "queries") \
                else (fm(q.to(acc)), fm(k.to(acc)))
            features = Features(phi_q, phi_k)  # (B, H, L, E')
        phi_q, phi_k = features.q, features.k
        if phi_q.shape[:-1] != q.shape[:-1] or phi_k.shape[:-1] != k.shape[:-1] or phi_q.shape[-1] != phi_k.shape[-1]:
            raise ValueError(f"feature_map must map (B, H, L, E) to (B, H, L, E'); got {tuple(phi_q.shape)} for q "
                             f"{tuple(q.shape)} and {tuple(phi_k.shape)} for k {tuple(k.shape)}")
        out, weights, new_state = linear_attention(features, v, causal=self.causal, eps=self.eps, key_mask=key_mask,
                                                   state=state, chunk_size=self.chunk_size, need_weights=need_weights)
        return AttentionOutput(out, weights, new_state if return_state else None)
