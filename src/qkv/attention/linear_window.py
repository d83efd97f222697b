"""LoLCATs' hybrid attention: a sliding window of exact softmax beside linear attention (Zhang et al.
2024, "LoLCATs: On Low-Rank Linearizing of Large Language Models", arXiv:2410.10254, §3.2).

Causal query ``i`` reads its last ``W`` keys (``i - W < j <= i``) through softmax's own scores and
every earlier key (``j <= i - W``) through a feature map ``phi`` (Hedgehog's learned map by default,
``feature_maps.py``), both in one normalisation:

    y_i = [ sum_{window} gamma_h exp(q_i . k_j / sqrt(d) - c_i) v_j + sum_{j <= i-W} phi(q_i) . phi(k_j) v_j ]
          / [ sum_{window} gamma_h exp(q_i . k_j / sqrt(d) - c_i)     + sum_{j <= i-W} phi(q_i) . phi(k_j) ]

``c_i`` the largest score in the row's window (as the authors' code: the linear terms are *not*
rescaled by it, so ``c_i`` is part of the function, gradient included), ``gamma_h = sigmoid(a_h)`` a
learned factor per head on the softmax (window) terms — the authors' ``window_factors``, with the
linear terms' factor 1 (their default, ``affine_attention_factors=False``); ``a_h`` starts at
``logit(0.1) = -2.197``, as in their released configurations (``window_factor`` sets it). With
``W >= L`` the linear sum is empty and ``gamma_h`` cancels: the kernel *is* causal softmax attention.

Fast form (training, prefill), O(L (b + W) (d + F) + L F Ev): queries in blocks of ``b`` (default
``W``), each against the band of ``b + W - 1`` keys it may read through the window
(``_ops.band_blocks``): window keys by their scores, the band's keys with ``j <= i - W`` by their
features; the keys before the band, linear for the whole block, as one running sum of
``phi(k) [v, 1]^T`` per block (``_chunkwise.scan``, a cumulative sum). No ``(L, L)`` matrix is formed.

Decoding: ``return_state=True`` returns ``LinearWindowState(sums, cache)`` — the sums ``(S, Z)`` of
the keys that left the window (a ``LinearState``) and the last ``W - 1`` keys and values (a bounded
``KVCache``): constant memory and time per token. The reference ``linear_window_reference`` (the
equation with a loop over queries) is what the tests compare both forms with.

Deviations: none in the equation; a row whose keys are all masked gives 0 (design.md §2); ``c_i``
of a window whose keys are all masked is taken as 0. Causal only (the authors' is a decoder's
mechanism): ``causal=False`` raises. Key-padding masks only; no dropout (the authors apply none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks, _chunkwise
from ..functional import scaled_scores
from ..registry import register
from ..types import AttentionOutput, KVCache, LinearState
from ._ops import (accumulation_dtype, append_cache, band_blocks, finite_or_zero, full_precision,
                   scatter_band, unfold_band)
from .base import AttentionKernel, clamp_knob
from .feature_maps import HedgehogFeatureMap, apply_feature_map, resolve_feature_map

__all__ = ["LinearWindowAttention", "LinearWindowState", "linear_window_reference"]


@dataclass(frozen=True)
class LinearWindowState:
    """What causal ``linear-window`` attention needs to continue a sequence.

    sums: ``LinearState(S (B, H, F, Ev), Z (B, H, F))`` of the keys that left the window
        (``length`` of them: every position before the cache).
    cache: ``KVCache`` of the last ``W - 1`` keys ``(B, H, <= W - 1, E)`` and values (``offset``
        = ``sums.length``).
    ``length`` (the cached positions, which a later mask covers) and ``offset`` (the positions
    before them) are the cache's, as for any bounded ``KVCache``.
    """

    sums: LinearState
    cache: KVCache

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def offset(self) -> int:
        return self.cache.offset


def linear_window_reference(q: Tensor, k: Tensor, v: Tensor, phi_q: Tensor, phi_k: Tensor, gamma: Tensor,
                            window: int, key_mask: Optional[Tensor] = None) -> Tensor:
    """The module's equation, one causal query at a time (queries aligned to the end of the keys):
    ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)``, ``phi_q (B, H, M, F)``, ``phi_k
    (B, H, N, F)``, ``gamma (H,)`` the factors (after the sigmoid), ``key_mask (B|1, H|1, N)`` bool.
    Returns ``(B, H, M, Ev)``. O(M N): for tests."""
    B, H, M, E = q.shape
    N = k.shape[-2]
    ok = torch.ones(1, 1, N, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
    rows = []
    for m in range(M):
        i = N - M + m  # the query's key position
        j = torch.arange(N, device=q.device)
        in_window = ((j <= i) & (j > i - window) & ok).expand(B, H, N)  # (B, H, N)
        linear = ((j <= i - window) & ok).expand(B, H, N)
        s = (k @ q[:, :, m, :, None])[..., 0] / math.sqrt(E)  # (B, H, N): q_i . k_j / sqrt(d)
        c = finite_or_zero(s.masked_fill(~in_window, float("-inf")).amax(-1, keepdim=True))  # (B, H, 1)
        a = torch.where(in_window, gamma.view(1, H, 1) * torch.exp(s - c), 0.0)  # gamma_h exp(s - c_i)
        a = a + torch.where(linear, (phi_k @ phi_q[:, :, m, :, None])[..., 0], 0.0)  # + phi(q_i) . phi(k_j)
        den = a.sum(-1, keepdim=True)  # (B, H, 1)
        rows.append((a.unsqueeze(-2) @ v)[..., 0, :] / torch.where(den > 0, den, torch.ones_like(den)))
    return torch.stack(rows, dim=2) if rows else v.new_zeros(B, H, 0, v.shape[-1])


@register("attention", "linear-window", "lolcats")
class LinearWindowAttention(AttentionKernel):
    """LoLCATs' sliding window of softmax beside linear attention (Zhang et al. 2024), causal, O(L W).

    ``y_i = [sum_{i-W<j<=i} gamma_h e^{s_ij - c_i} v_j + sum_{j<=i-W} phi(q_i).phi(k_j) v_j] / [same with 1]``,
    ``s_ij = q_i . k_j / sqrt(d)``, ``c_i = max_{window} s_ij``, ``gamma_h = sigmoid(a_h)`` learned per head.

    Args:
        window: ``W >= 1`` keys read by softmax (the query's own and the ``W - 1`` before it).
        feature_map: ``"hedgehog"`` (default: Hedgehog's learned map per head, queries and keys
            each their own), ``"elu+1"`` or a callable (as ``linear``'s).
        window_factor: ``gamma_h``'s starting value in ``(0, 1)`` (default 0.1, the authors'
            released configurations); ``a_h = logit`` of it is the parameter ``window_logit (H,)``.
        n_heads, d_head: the heads' shape (``MultiHeadAttention`` fills them in); feature_dim: the
            hedgehog map's width ``F`` (default ``d_head``; ``2F`` features).
        chunk_size: the query block ``b`` of the fast form (default ``W``; a speed knob).
        causal: must be True. dropout: must be 0.
    Shapes: ``q (B, H, M, E)``, ``k, v (B, H, N, E | Ev)`` -> ``(B, H, M, Ev)``; weights ``(B, H, M, N)``
    only when asked (O(M N)). Incremental decoding: ``LinearWindowState`` (sums and the last ``W - 1`` keys).
    """

    supports_mask = "key_padding"
    supports_state = True
    state_type = LinearWindowState
    causal_only = True
    exact = False
    exact_kwargs = {"window": 1 << 20}  # no linear term within any test's length: causal softmax
    applies_dropout = False  # the authors' code applies none: dropout > 0 raises
    keys_per_query_head = True  # gamma per query head (and Hedgehog's map): grouped keys repeated, state per query head
    context_parallel = "ulysses-batch"  # per-head parameters: whole batch rows per rank
    static_length = "its queries are cut into blocks and each block's band of keys unfolded, in numbers of the length"

    def __init__(self, *, window: int, causal: bool = False, dropout: float = 0.0,
                 feature_map: Union[str, Callable[[Tensor], Tensor]] = "hedgehog", window_factor: float = 0.1,
                 n_heads: Optional[int] = None, d_head: Optional[int] = None, feature_dim: Optional[int] = None,
                 chunk_size: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.window = _checks.positive_int("window", window)
        if n_heads is None:
            raise ValueError("attention 'linear-window' learns a window factor per head: give n_heads "
                             "(MultiHeadAttention fills it in)")
        _checks.positive_int("n_heads", n_heads)
        if isinstance(window_factor, bool) or not isinstance(window_factor, (int, float)) or not 0 < window_factor < 1:
            raise ValueError(f"window_factor must be a float in (0, 1) (gamma's starting value), got {window_factor!r}")
        self.feature_map = resolve_feature_map(feature_map, n_heads, d_head, feature_dim)
        self.chunk_size = None if chunk_size is None else _checks.positive_int("chunk_size", chunk_size)
        # a_h, gamma_h = sigmoid(a_h): the authors' window_factors, one per head
        self.window_logit = nn.Parameter(torch.full((n_heads,), math.log(window_factor / (1 - window_factor))))

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> dict:
        return {"n_heads": n_heads, "d_head": d_head}  # gamma per head, a learned feature map's shape

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``window = max_len / 8`` in ``[1, 64]`` (the authors use 64), causal-only: no other knob needed."""
        return {**super().default_knobs(max_len, n_heads, d_head), "window": clamp_knob(max_len // 8, 1, 64)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"window": (1, 2, 3, 4, 8), "chunk_size": (None, 1, 2, 3), "feature_map": ("hedgehog", "elu+1"),
                "window_factor": (0.1, 0.9)}

    def extra_repr(self) -> str:
        name = "hedgehog" if isinstance(self.feature_map, HedgehogFeatureMap) else getattr(
            self.feature_map, "__name__", type(self.feature_map).__name__)
        return f"window={self.window}, feature_map={name}, chunk_size={self.chunk_size}, {super().extra_repr()}"

    @property
    def gamma(self) -> Tensor:
        """``gamma_h = sigmoid(a_h)`` ``(H,)``: the window's factor per head."""
        return torch.sigmoid(self.window_logit)

    def _validate(self, q, k, v, state):
        if q.shape[1] != self.window_logit.shape[0]:
            raise ValueError(f"attention 'linear-window' was built for n_heads={self.window_logit.shape[0]}, got q "
                             f"with {q.shape[1]} heads")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        M = q.shape[-2]
        if state is not None and M > k.shape[-2]:
            raise ValueError(f"linear-window attention aligns queries to the end of the keys: got {M} queries for "
                             f"{k.shape[-2]} new keys after a state; a query may not precede the new keys (the keys "
                             f"before them are partly summed away in the state)")
        if state is not None and need_weights:
            raise ValueError("need_weights=True with a state: the weights over keys that left the window were summed "
                             "away in the state; call without state to see them")
        out_dtype, acc = v.dtype, accumulation_dtype(v.dtype)
        with full_precision(v.device):
            cache = None
            if state is not None or return_state:  # the cached window before the new keys
                k, v, cache = append_cache(None if state is None else state.cache, k, v, keep=self.window - 1)
            q, k, v = q.to(acc), k.to(acc), v.to(acc)
            N = k.shape[-2]
            key_ok = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=q.device)
            if state is not None and M == 1 and return_state and not need_weights and N <= self.window:
                out, new_state = self._step(q, k, v, key_ok, state, cache)  # decoding: every cached key in the window
                return AttentionOutput(out.to(out_dtype), None, new_state)
            phi_q, phi_k = apply_feature_map(self.feature_map, q, k)  # (B, H, M, F), (B, H, N, F)
            if phi_q.shape[:-1] != q.shape[:-1] or phi_k.shape[:-1] != k.shape[:-1] or phi_q.shape[-1] != phi_k.shape[-1]:
                raise ValueError(f"feature_map must map (B, H, L, E) to (B, H, L, F); got {tuple(phi_q.shape)} for q "
                                 f"{tuple(q.shape)} and {tuple(phi_k.shape)} for k {tuple(k.shape)}")
            phi_k = torch.where(key_ok.unsqueeze(-1), phi_k, 0.0)  # masked keys: no linear term
            v1 = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)  # [V, 1]: numerator and denominator at once
            P = self._state_sums(state, phi_k, v1)  # (B, H, F, Ev + 1): [S, Z] of the keys summed before
            # weights: one block seeing every key (left = N); else blocks of b with the band the window needs
            b = max(M, 1) if need_weights else min(self.chunk_size or self.window, max(M, 1))
            left = N if need_weights else min(self.window - 1, N)
            nd, weights = self._blocks(q, k, v1, phi_q, phi_k, mask, key_ok, P, b, left, need_weights)
            den = nd[..., -1:]
            out = nd[..., :-1] / torch.where(den > 0, den, torch.ones_like(den))  # no key at all: 0
            new_state = None
            if return_state:
                gone = N - cache.length  # keys that left the window: into the sums
                P = P + phi_k[:, :, :gone].transpose(-1, -2) @ v1[:, :, :gone]  # (B, H, F, Ev + 1)
                new_state = LinearWindowState(LinearState(P[..., :-1], P[..., -1], cache.offset), cache)
        return AttentionOutput(out.to(out_dtype), None if weights is None else weights.to(out_dtype), new_state)

    def _step(self, q: Tensor, k: Tensor, v: Tensor, key_ok: Tensor, state: LinearWindowState,
              cache: KVCache) -> tuple:
        """One decoding query against ``N <= W`` keys (the cached window and the new key), all inside
        its window: ``[gamma sum_j exp(s_j - c) v_j + phi(q) S] / [gamma sum_j exp(s_j - c) + phi(q) Z]``
        — the scores of at most ``W`` keys and the sums, no feature of a cached key; only the key that
        leaves the window (the cache holds ``W - 1``) is turned into features, into the new sums."""
        E = q.shape[-1]
        s = scaled_scores(q, k, 1.0 / math.sqrt(E)).masked_fill(~key_ok.unsqueeze(-2), float("-inf"))  # (B, H, 1, N)
        c = finite_or_zero(s.amax(-1, keepdim=True))
        a = self.gamma.to(q.dtype).view(1, -1, 1, 1) * torch.exp(s - c)  # (B, H, 1, N)
        fm = self.feature_map
        phi_q = fm.queries(q) if hasattr(fm, "queries") and hasattr(fm, "keys") else fm(q)  # (B, H, 1, F)
        v1 = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)  # [V, 1]: numerator and denominator at once
        P = self._state_sums(state, phi_q, v1)  # (B, H, F, Ev + 1)
        nd = a @ v1 + phi_q @ P  # (B, H, 1, Ev + 1)
        den = nd[..., -1:]
        out = nd[..., :-1] / torch.where(den > 0, den, torch.ones_like(den))
        gone = k.shape[-2] - cache.length  # keys that left the window: into the sums
        if gone:
            leaving = k[:, :, :gone]
            phi_k = fm.keys(leaving) if hasattr(fm, "queries") and hasattr(fm, "keys") else fm(leaving)
            phi_k = torch.where(key_ok[..., :gone].unsqueeze(-1), phi_k, 0.0)
            P = P + phi_k.transpose(-1, -2) @ v1[:, :, :gone]
        return out, LinearWindowState(LinearState(P[..., :-1], P[..., -1], cache.offset), cache)

    @staticmethod
    def _state_sums(state: Optional[LinearWindowState], phi_k: Tensor, v1: Tensor) -> Tensor:
        """``[S, Z] (B, H, F, Ev + 1)`` of the state's summed keys (zero without a state)."""
        B, H, _, Fdim = phi_k.shape
        Ev = v1.shape[-1] - 1
        if state is None:
            return v1.new_zeros(B, H, Fdim, Ev + 1)
        S, Z = state.sums.S, state.sums.Z
        if S.shape != (B, H, Fdim, Ev) or Z.shape != (B, H, Fdim):
            raise ValueError(f"state holds S {tuple(S.shape)} and Z {tuple(Z.shape)}, incompatible with "
                             f"(B, H, features, Ev) = {(B, H, Fdim, Ev)}")
        return torch.cat([S, Z.unsqueeze(-1)], dim=-1).to(v1.dtype)

    def _blocks(self, q, k, v1, phi_q, phi_k, mask, key_ok, P, b, left, need_weights):
        """``[num, den] (B, H, M, Ev + 1)`` of every query (and its weights when asked), in query
        blocks of ``b``, each with the band of ``b + left`` keys before and at it. ``left >= W - 1``
        (or every key): the keys before a block's band are linear for the whole block."""
        B, H, M, E = q.shape
        N, W = k.shape[-2], self.window
        if M == 0:  # keys only (a state's first call): no query to answer
            return v1.new_zeros(B, H, 0, v1.shape[-1]), v1.new_zeros(B, H, 0, N) if need_weights else None
        o, nb = N - M, -(-M // b)  # query m sits at key position o + m; blocks of b queries
        # the window's part: band keys o + t b - left + [0, b + left) of block t, their scores
        qb, kb, vb, distance, in_window, key_pos = band_blocks(q, k, v1, mask, left, 0, b)  # distance: i - j (b, b + left)
        band_ok = unfold_band(key_ok.unsqueeze(-1), o - left, b, b + left, nb)[..., 0].unsqueeze(-2)  # (B|1, H|1, nb, 1, b + left)
        in_window = in_window & (distance < W)  # i - W < j <= i, unmasked
        linear = band_ok & (distance >= W)  # j <= i - W, inside the band
        s = scaled_scores(qb, kb, 1.0 / math.sqrt(E)).masked_fill(~in_window, float("-inf"))  # (B, H, nb, b, b + left)
        c = finite_or_zero(s.amax(-1, keepdim=True))  # c_i: the largest window score
        gamma = self.gamma.to(q.dtype).view(1, H, 1, 1, 1)
        a = gamma * torch.exp(s - c)  # gamma_h exp(q_i . k_j / sqrt(d) - c_i), 0 outside the window
        fqb = F.pad(phi_q, (0, 0, 0, nb * b - M)).view(B, H, nb, b, phi_q.shape[-1])  # (B, H, nb, b, F)
        fkb = unfold_band(phi_k, o - left, b, b + left, nb)  # (B, H, nb, b + left, F)
        a = a + torch.where(linear, fqb @ fkb.transpose(-1, -2), 0.0)  # + phi(q_i) . phi(k_j), j <= i - W
        # the keys before each band (j < o + t b - left), linear for the whole block: a running sum
        own = unfold_band(phi_k, o - left - b, b, b, nb).transpose(-1, -2) @ unfold_band(v1, o - left - b, b, b, nb)
        lead = max(0, o - left - b)  # keys before the first chunk: in P from the start
        P = P + phi_k[:, :, :lead].transpose(-1, -2) @ v1[:, :, :lead]  # (B, H, F, Ev + 1)
        before, _ = _chunkwise.scan(P, None, own)  # (B, H, nb, F, Ev + 1): P + chunks before t of own
        nd = a @ vb + fqb @ (before + own)  # (B, H, nb, b, Ev + 1)
        nd = nd.reshape(B, H, nb * b, v1.shape[-1])[:, :, :M]
        if not need_weights:
            return nd, None
        den = nd[..., -1:].view(B, H, 1, M, 1)
        weights = a / torch.where(den > 0, den, torch.ones_like(den))  # (B, H, 1, M, b + left)
        return nd, scatter_band(weights, key_pos, N)[:, :, :M]
