"""Relative positional attention of Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive
Language Models Beyond a Fixed-Length Context", arXiv:1901.02860, §3.3).

The score of query ``i`` and key ``j`` splits into a content and a position part:

    A_ij = q_i^T k_j + q_i^T W_{k,R} R_{i-j} + u^T k_j + v^T W_{k,R} R_{i-j}
         = (q_i + u)^T k_j  +  (q_i + v)^T W_{k,R} R_{i-j}
           `---- (a)+(c) ---'    `-------- (b)+(d) --------'

``R`` is the sinusoid table of the *distance* ``i - j`` (``qkv.positional.sinusoid_table``),
``W_{k,R}`` a learned projection of it and ``u``, ``v`` learned per-head biases. The position part
is computed once for every distance, ``(q_i + v)^T W_{k,R} R_d`` for ``d = N-1 .. d_min`` (an
``(M, K)`` matrix), and moved into place by the *relative shift* (pad, reshape, slice) — never an
``(M, N, d)`` tensor of embeddings.

Deviations: the authors' ``u``/``v`` are shared by all layers; a standalone kernel owns its own,
and a model shares one pair between its layers with ``share_biases`` (``qkv.models.TransformerXL``).
The segment memory of the paper (hidden states of the previous segment, stop-gradient) lives in
the model, which projects it with the current weights; the kernel's own state for incremental
decoding is a detached ``KVCache`` bounded to ``mem_len`` positions.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks
from ..functional import masked_softmax
from ..positional import sinusoid_table
from ..registry import register
from ..types import AttentionOutput, KVCache
from ._ops import accumulation_dtype, append_cache
from .base import AttentionKernel

__all__ = ["RelativeAttention", "relative_shift", "relative_distances"]


def relative_distances(n_queries: int, n_keys: int, causal: bool, clamp_len: Optional[int] = None,
                       device=None) -> Tensor:
    """The distances ``d = i - j`` the position term needs, largest first: ``N-1 .. 0`` (causal)
    or ``N-1 .. -(M-1)``, clipped to ``[-clamp_len, clamp_len]``. Shape ``(K,)``, K = N or N+M-1."""
    lowest = 0 if causal else -(n_queries - 1)
    d = torch.arange(n_keys - 1, lowest - 1, -1, device=device)  # (K,)
    return d if clamp_len is None else d.clamp(-clamp_len, clamp_len)


def relative_shift(x: Tensor, n_keys: int) -> Tensor:
    """Move per-distance scores into per-key columns (Dai et al. 2019, appendix B).

    ``x (..., M, K)`` holds in column ``r`` the score for distance ``N - 1 - r``; query ``i`` sits
    at key position ``N - M + i`` (queries aligned to the end of the keys), so key ``j`` is at
    distance ``N - M + i - j``, column ``M - 1 - i + j``. Returns ``(..., M, N)`` with
    ``out[..., i, j] = x[..., i, M - 1 - i + j]``, by padding one zero column, viewing the
    flattened rows with a stride one shorter, and slicing; ``O(M K)`` work, no gather. Entries
    whose column falls outside ``x`` (keys after a causal query) hold other rows' values: mask them.
    """
    *lead, M, K = x.shape
    if M == 0 or n_keys == 0:
        return x.new_zeros(*lead, M, n_keys)
    padded = F.pad(x, (0, 1))  # (..., M, K + 1)
    flat = padded.reshape(*lead, M * (K + 1))  # row i starts at i (K + 1)
    # element [i, j] of the view is flat[M - 1 + i K + j] = padded[i, M - 1 - i + j]
    shifted = flat[..., M - 1: M - 1 + M * K].reshape(*lead, M, K)  # (..., M, K)
    return shifted[..., :n_keys]  # (..., M, N)


@register("attention", "relative", "transformer-xl", "rel")
class RelativeAttention(AttentionKernel):
    """Transformer-XL relative attention (Dai et al. 2019): scores (q_i + u)·k_j + (q_i + v)·W_R R_{i-j}.

    ``A_ij = ((q_i + u)^T k_j + (q_i + v)^T W_{k,R} R_{i-j}) / sqrt(E)``, softmax over the
    allowed keys, times ``V``. Queries are aligned to the end of the keys (the first ``N - M``
    keys are memory), so the same kernel serves one segment, a segment after its memory and one
    token at a time.

    Args:
        n_heads: H, heads of ``q``/``k``/``v`` (``u``, ``v`` are ``(H, E)``).
        head_dim: E, the head size; ``R`` has ``H E`` features and ``W_{k,R}`` is ``(H E, H E)``.
        mem_len: incremental decoding keeps the last ``mem_len`` keys/values (detached: memory
            gets no gradient); None keeps all.
        clamp_len: distances beyond ``clamp_len`` use ``R_{clamp_len}`` (None: no clipping).
        causal, dropout: as every kernel (dropout on the attention weights).

    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``.
    Cost: ``O(M N E)`` for the content term and ``O(M K E)`` for the position term (K = N causal,
    N + M - 1 otherwise), plus ``O(K (H E)^2)`` to project the sinusoids.
    """

    supports_mask = "full"
    context_parallel = "ulysses-batch"  # qkv.parallel: per-head biases, so whole batch rows per rank
    supports_state = True
    state_type = KVCache
    exact = False  # softmax attention plus a learned position term: see tests/attention/test_relative.py

    def __init__(self, *, n_heads: int, head_dim: int, causal: bool = False, dropout: float = 0.0,
                 mem_len: Optional[int] = None, clamp_len: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.n_heads = _checks.positive_int("n_heads", n_heads)
        self.head_dim = _checks.positive_int("head_dim", head_dim)
        self.mem_len = None if mem_len is None else _checks.positive_int("mem_len", mem_len, allow_zero=True)
        self.clamp_len = None if clamp_len is None else _checks.positive_int("clamp_len", clamp_len, allow_zero=True)
        d = n_heads * head_dim
        self.w_r = nn.Linear(d, d, bias=False)  # W_{k,R}: sinusoid of a distance -> per-head position keys
        self.u = nn.Parameter(torch.zeros(n_heads, head_dim))  # content bias u (the authors' r_w_bias)
        self.v = nn.Parameter(torch.zeros(n_heads, head_dim))  # position bias v (the authors' r_r_bias)
        nn.init.normal_(self.u, std=0.02)
        nn.init.normal_(self.v, std=0.02)

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> dict:
        return {"n_heads": n_heads, "head_dim": d_head}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"mem_len": (None, 0, 1, 2, 3, 4), "clamp_len": (None, 0, 1, 2, 3)}

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"mem_len={self.mem_len}, clamp_len={self.clamp_len}")

    def share_biases(self, u: nn.Parameter, v: nn.Parameter) -> None:
        """Use ``u``, ``v`` (``(H, E)`` parameters owned by the model) instead of this kernel's own:
        Transformer-XL shares one pair across all layers."""
        for name, p in (("u", u), ("v", v)):
            if not isinstance(p, nn.Parameter):
                raise TypeError(f"{name} must be an nn.Parameter, got {type(p).__name__}")
            _checks.same(name, tuple(p.shape), "(n_heads, head_dim)", (self.n_heads, self.head_dim), "the shape")
        self.u, self.v = u, v

    def position_keys(self, n_queries: int, n_keys: int, dtype: torch.dtype, device) -> Tensor:
        """``W_{k,R} R_d`` for every distance the scores need -> ``(H, K, E)``."""
        d = relative_distances(n_queries, n_keys, self.causal, self.clamp_len, device=device)  # (K,)
        R = sinusoid_table(d, self.n_heads * self.head_dim, dtype)  # (K, H E): float64 for float64, else float32
        r = self.w_r(R.to(self.w_r.weight.dtype))  # (K, H E)
        return r.view(-1, self.n_heads, self.head_dim).transpose(0, 1).to(dtype)  # (H, K, E)

    def _validate(self, q, k, v, state):
        H, E = q.shape[1], q.shape[-1]
        if (H, E) != (self.n_heads, self.head_dim):
            raise ValueError(f"q has {H} heads of size {E}; this kernel was built for n_heads={self.n_heads}, "
                             f"head_dim={self.head_dim}")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        cache = None
        if state is not None or return_state:
            k, v, cache = append_cache(state, k, v, keep=self.mem_len)
            # the memory is a stop-gradient SG(.) (Dai et al. 2019, eq. in §3.2)
            cache = KVCache(cache.key.detach(), cache.value.detach(), cache.offset)
        N = k.shape[-2]
        if M == 0 or N == 0:
            return AttentionOutput(q.new_zeros(B, H, M, v.shape[-1]), q.new_zeros(B, H, M, N) if need_weights else None, cache)
        acc = accumulation_dtype(q.dtype)  # scores in float32 for half types: q . k overflows float16
        u = self.u.to(acc)[None, :, None, :]  # (1, H, 1, E)
        w = self.v.to(acc)[None, :, None, :]
        r = self.position_keys(M, N, acc, q.device)  # (H, K, E)
        qs = q.to(acc) / math.sqrt(E)  # scaled before the products
        # (a) + (c): (q_i + u)^T k_j
        content = (qs + u / math.sqrt(E)) @ k.to(acc).transpose(-1, -2)  # (B, H, M, N)
        # (b) + (d): (q_i + v)^T W_{k,R} R_{i-j}, for every distance at once, then shifted into place
        position = relative_shift((qs + w / math.sqrt(E)) @ r.transpose(-1, -2), N)  # (B, H, M, K) -> (B, H, M, N)
        scores = content + position
        if self.causal:
            # j <= i + N - M (queries aligned to the end of the keys); a tril, not masks.causal_mask, whose
            # int checks refuse the symbolic length of a dynamic torch.export
            allowed = torch.ones(M, N, dtype=torch.bool, device=q.device).tril(N - M)  # (M, N)
            mask = allowed if mask is None else mask & allowed
        weights = masked_softmax(scores, mask).to(v.dtype)  # (B, H, M, N)
        dropout_p = self.dropout if self.training else 0.0
        dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        return AttentionOutput(dropped @ v, weights if need_weights else None, cache)
