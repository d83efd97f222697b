"""Performer attention with FAVOR+ positive orthogonal random features (Choromanski et al. 2020,
"Rethinking Attention with Performers", arXiv:2009.14794).

The softmax kernel is an expectation over Gaussian ``w`` (Lemma 1, positive random features):

    exp(x^T y) = E_w[ exp(w^T x - ||x||^2 / 2) exp(w^T y - ||y||^2 / 2) ],   w ~ N(0, I_d)

so with ``m`` draws ``phi(x) = exp(-||x||^2 / 2) / sqrt(m) [exp(w_1^T x), ..., exp(w_m^T x)]`` and
inputs scaled by ``d^{-1/4}``, ``phi(q) . phi(k)`` is an unbiased estimate of ``exp(q . k / sqrt(d))``.
Attention becomes ``out = D^{-1} (Q' ((K')^T V))``, ``D = diag(Q' ((K')^T 1_N))`` — linear attention
with these features; the causal form uses the same prefix sums (one shared core,
``_ops.linear_attention``, with the keys' features in log space).
``orthogonal=True`` draws the ``w`` as orthogonal blocks (QR of Gaussian ``d x d`` blocks, each row
rescaled by an independent chi(d) norm so that marginals stay Gaussian), which lowers the
estimator's variance (Theorem 2).

Cost: O(N m d) for the features plus O(N m Ev) for the sums; memory O(N m), never O(N^2).
Error vs exact softmax attention falls as ``m`` grows (``docs/approximation.md``).

Numerics: ``exp(w^T x)`` overflows for large inputs, so a maximum is subtracted inside the exp —
per query row for queries (a factor common to a row's numerator and denominator) and, for keys,
non-causal, each feature's maximum over the keys, moved into the queries (``_query_reads_keys``:
every query's largest product term is then 1, so no query's terms all underflow — with one maximum
over all keys, float32 gave rows of zeros at inputs of std 30), or, causal, the running maximum over
the keys and features up to each position (carried in the state), by which each query reads its sums —
so no later key reaches it. They cancel in ``D^{-1}(...)`` exactly, so they are detached from the
graph. One scale per position cannot keep every causal query's terms in float32's range: a call in
which some query's largest term falls below ``exp(-43)`` in that frame (``_causal_underflows``, inputs
of std ~30) runs in float64 (not while ``torch.compile``/``torch.export`` trace, which cannot branch on values). The products ``w^T x`` and ``||x||^2`` are formed on each row
divided by its largest entry and scaled back (``favor_log_features``): any finite input, up to the
dtype's maximum, gives finite outputs (``||q||^2`` overflowed float32 from |q| ~ 1e19); the
queries' own terms (``-||q||^2 / 2``, ``log m``), a factor per row, are left out. Features and
sums run in float32 under ``torch.autocast`` too. Deviations: no ``eps`` in ``D`` (the features are positive;
a row with no allowed key returns zeros); dropout must be 0 (none in the
authors' FAVOR+; ``dropout > 0`` raises); ``redraw=True``
redraws the features on every training-mode forward that does not continue a ``state`` (the
paper redraws periodically).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
from torch import Tensor

from .. import _checks
from ..registry import register
from ..types import AttentionOutput, LinearState
from ._ops import Features, accumulation_dtype, full_precision, grouped_attend, linear_attention, split_key_mask
from .base import AttentionKernel, clamp_knob

__all__ = ["PerformerAttention", "draw_projection", "favor_log_features", "favor_query_features"]


def draw_projection(nb_features: int, dim: int, orthogonal: bool = True,
                    generator: Optional[torch.Generator] = None) -> Tensor:
    """Random feature directions ``W (m, d)``, float32 on CPU.

    ``orthogonal``: rows come in blocks of ``d`` exactly orthogonal directions (Q of the QR of a
    Gaussian ``d x d`` block, signs fixed by ``diag(R)`` so that Q is Haar-distributed), each row
    rescaled by the norm of an independent ``N(0, I_d)`` vector (chi(d)-distributed) — so every
    row is marginally ``N(0, I_d)`` while rows within a block stay orthogonal. Otherwise iid
    Gaussian rows.
    """
    m = _checks.positive_int("nb_features", nb_features)
    d = _checks.positive_int("dim", dim)
    if not orthogonal:
        return torch.randn(m, d, generator=generator)
    blocks = []
    for _ in range(-(-m // d)):
        Q, R = torch.linalg.qr(torch.randn(d, d, generator=generator))  # Q: orthonormal columns
        blocks.append((Q * torch.sign(torch.diagonal(R))).T)  # (d, d): orthonormal rows
    W = torch.cat(blocks)[:m]  # (m, d)
    norms = torch.randn(m, d, generator=generator).norm(dim=1, keepdim=True)  # (m, 1) ~ chi(d)
    return W * norms


def favor_log_features(x: Tensor, projection: Tensor) -> Tensor:
    """``log phi(x)`` for ``x (..., d)`` and ``projection W (m, d)``: ``(..., m)``.

    ``phi(x) = exp(w^T x' - ||x'||^2 / 2) / sqrt(m)`` with ``x' = d^{-1/4} x``, so that
    ``E[phi(q) . phi(k)] = exp(q . k / sqrt(d))``. Returned in log space: the caller subtracts a
    maximum before exponentiating. Each row is divided by its largest entry ``s`` before the
    products and the result scaled back, ``s (w^T u - s ||u||^2 / 2)`` with ``u = x' / s``: no
    intermediate overflows, so a finite ``x`` gives a finite value or ``-inf`` (a feature of 0), never NaN.
    """
    x, s = _row_scaled(x)
    return s * (x @ projection.T - 0.5 * s * (x * x).sum(-1, keepdim=True)) - 0.5 * math.log(projection.shape[0])  # (..., m)


def favor_query_features(x: Tensor, projection: Tensor) -> Tensor:
    """``phi(x)`` of queries ``x (..., d)`` up to a factor per row: ``exp(log phi(x) - max_m log phi(x))``
    ``(..., m)``, the largest feature of each row 1. The factor cancels between a query's numerator
    and denominator, so the row's own terms (``||x'||^2 / 2``, ``log m``) are left out and only
    ``w^T x'`` is formed, on the row divided by its largest entry (as ``favor_log_features``): finite
    for every finite ``x``, however large (a row of huge queries gives a hard maximum, as softmax does)."""
    return torch.exp(_query_log_features(x, projection))


def _query_log_features(x: Tensor, projection: Tensor) -> Tensor:
    """``log phi(x)`` of queries up to a term per row, the largest of each row 0 (``w^T x'`` only, see
    ``favor_query_features``) ``(..., m)``: finite (or -inf) for every finite ``x``."""
    x, s = _row_scaled(x)
    u = x @ projection.T  # (..., m): w^T x' / s
    return s * (u - u.detach().amax(dim=-1, keepdim=True))


def _query_reads_keys(log_q: Tensor, log_k: Tensor) -> tuple[Tensor, Tensor]:
    """``phi(Q)`` for keys ``exp(log_k - c)`` taken at their per-feature maximum ``c_f = max_j log phi(K_j)_f``
    ``(B, H, 1, m)``: ``exp(log_q + c - max_f (log_q + c))`` — ``exp(c_f)`` moved from the keys to the
    queries, the same products ``phi(Q_i)_f phi(K_j)_f``. Each query's largest term ``f*`` is then 1
    against a key whose feature ``f*`` is 1, so its denominator is at least 1: no query's products all
    underflow, whatever the scale (a per-row query maximum and a global key maximum each make their
    own side <= 1, but their product can still underflow, e.g. to a row of zeros in float32 at std 30)."""
    c = log_k.detach().amax(dim=-2, keepdim=True)  # (B, H, 1, m)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # no (unmasked) key: those features are 0
    shifted = log_q + c  # (B, H, M, m)
    return torch.exp(shifted - shifted.detach().amax(dim=-1, keepdim=True)), torch.exp(log_k - c)


#: the log of the smallest float32 product term that the causal sums keep without loss, relative to each
#: query's largest: below it (log tiny / 2) a query's terms underflow in float32 and its output is wrong
_CAUSAL_RANGE = math.log(torch.finfo(torch.float32).tiny) / 2


def _causal_underflows(log_q: Tensor, log_k: Tensor, key_mask: Optional[Tensor], state: Optional[LinearState]) -> bool:
    """Whether some causal query's largest product term ``max_{j <= i, f} phi(Q_i)_f phi(K_j)_f``, in the
    core's frame (each query row by its largest feature, the keys by their running maximum over features),
    lies below ``_CAUSAL_RANGE``: then float32 sums lose that query (the core keeps one scale per position,
    not per feature). ``log_q (B, H, M, m)`` up to a row term, ``log_k (B, H, N, m)``, queries aligned to
    the end of the keys; the state's keys by their per-feature sums ``log Z_f + log_scale``. Decoding
    with grouped keys, ``log_q`` has ``R`` times the heads of ``log_k`` (a group's queries read one key head)."""
    if key_mask is not None:
        log_k = log_k.masked_fill(~key_mask.unsqueeze(-1), float("-inf"))
    if not log_q.numel() or bool(log_q.min() >= _CAUSAL_RANGE):
        # each query's largest term is at least its feature at the keys' largest: no smaller than its
        # smallest feature (log_q's row maximum is 0), so moderate inputs need no running maxima
        return False
    B, H, _, m = log_k.shape
    if isinstance(state, LinearState) and state.log_scale is not None and state.Z.shape == (B, H, m):  # else the core says why
        prior = (state.Z.to(log_k.dtype).log() + state.log_scale.to(log_k.dtype).unsqueeze(-1)).unsqueeze(-2)
        log_k = torch.cat([prior, log_k], dim=-2)
    c = torch.cummax(log_k, dim=-2).values[..., -log_q.shape[-2]:, :]  # (B, H, M, m): max_{j <= i} per feature
    c = c.repeat_interleave(log_q.shape[1] // H, dim=1) if log_q.shape[1] != H else c  # to the query heads
    top = c.amax(-1)  # (B, H, M): the running maximum over features, the keys' scale
    sees = torch.isfinite(top)  # a query before every (unmasked) key sees none
    largest = (log_q + c).amax(-1) - top  # (B, H, M): log of the largest term (log_q's row maximum is 0), <= 0
    return bool((sees & (largest < _CAUSAL_RANGE)).any())


def _row_scaled(x: Tensor) -> tuple:
    """``(x' / s, s)``: ``x' = d^{-1/4} x`` divided by ``s (..., 1)``, each row's largest absolute
    entry (1 for a zero row), detached (``s`` multiplies back what it divided: the gradient is ``x'``'s)."""
    x = x * x.shape[-1] ** -0.25  # q . k / sqrt(d) = (d^{-1/4} q) . (d^{-1/4} k)
    s = x.detach().abs().amax(dim=-1, keepdim=True)  # (..., 1)
    s = torch.where((s > 0) & torch.isfinite(s), s, torch.ones_like(s))
    return x / s, s


@register("attention", "performer", "favor")
class PerformerAttention(AttentionKernel):
    """Performer FAVOR+ attention D^-1 Q'((K')^T V) with positive orthogonal random features (Choromanski et al. 2020), O(N m).

    ``phi(x) = exp(w^T x - ||x||^2 / 2) / sqrt(m)`` on ``x = d^{-1/4} q`` (or ``k``); unbiased for
    ``exp(q . k / sqrt(d))``, so the output approximates softmax attention; the error falls with ``m``.

    Args:
        nb_features: ``m``, the number of random features.
        orthogonal: draw the features as orthogonal blocks (lower variance) rather than iid.
        redraw: draw new features on every training-mode forward (from the kernel's generator);
            otherwise they are drawn once and kept in the ``projection`` buffer (saved with the model).
        seed: seeds the kernel's own ``torch.Generator``; None uses torch's global generator.
        chunk_size: causal chunk length (see ``linear_attention``).
        d_head: the head size ``d``; given (``MultiHeadAttention`` fills it in), the features are
            drawn at construction, else at the first forward.
        causal: as every kernel. dropout: must be 0 (no weight matrix is formed; > 0 raises).
    Shapes: ``q (B, H, M, d)``, ``k (B, H, N, d)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``;
    weights ``(B, H, M, N)`` only when asked (the implied ones, O(M N)).
    Incremental decoding (causal): ``return_state=True`` returns a ``LinearState``.
    Cost: O(N m (d + Ev)) time, O(N m) memory.
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
    applies_dropout = False  # FAVOR+ in the authors' code applies none: dropout > 0 raises

    def __init__(self, *, causal: bool = False, dropout: float = 0.0, nb_features: int = 256,
                 orthogonal: bool = True, redraw: bool = False, seed: Optional[int] = None,
                 chunk_size: int = 64, d_head: Optional[int] = None) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.nb_features = _checks.positive_int("nb_features", nb_features)
        for name, flag in (("orthogonal", orthogonal), ("redraw", redraw)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self.orthogonal, self.redraw = orthogonal, redraw
        if seed is not None:
            _checks.positive_int("seed", seed, allow_zero=True)
        self.seed = seed
        self.chunk_size = _checks.positive_int("chunk_size", chunk_size)
        self._generator = torch.Generator().manual_seed(seed) if seed is not None else None
        d = None if d_head is None else _checks.positive_int("d_head", d_head)
        # W (m, d): the random feature directions, float32 (cast to the accumulation dtype when used).
        self.register_buffer("projection", None if d is None else self._draw(d))

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> dict:
        return {"d_head": d_head}

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``m = d ln d`` features (at least ``d``: Choromanski et al. 2020, Theorem 4, m = Theta(d log d)),
        causal chunks of ``max_len / 4`` in ``[1, 64]``."""
        m = max(d_head, round(d_head * math.log(d_head)))
        return {**super().default_knobs(max_len, n_heads, d_head), "nb_features": m,
                "chunk_size": clamp_knob(max_len // 4, 1, 64)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"nb_features": (1, 2, 3, 4, 5, 6), "chunk_size": (1, 2, 3, 4),
                "orthogonal": (False, True), "seed": (0, 1, 2, 3)}

    def extra_repr(self) -> str:
        return (f"nb_features={self.nb_features}, orthogonal={self.orthogonal}, redraw={self.redraw}, "
                f"seed={self.seed}, chunk_size={self.chunk_size}, {super().extra_repr()}")

    def _draw(self, d: int) -> Tensor:
        if torch.compiler.is_exporting():
            # a draw while torch.export traces is a traced (fake) tensor: kept as the buffer, it leaves
            # the kernel unusable after the export (every later call returned a FakeTensor)
            why = ("redraw=True draws new features at every training call: export in eval mode" if getattr(self, "projection", None) is not None
                   else "give d_head=... when building it, or call the model once before exporting (its features are "
                        "drawn when it is built or first called, as a transformers model builds qkv's kernels)")
            raise ValueError(f"performer: cannot draw random features while torch.export traces: {why}")
        return draw_projection(self.nb_features, d, self.orthogonal, self._generator)

    def redraw_features(self, d: Optional[int] = None, generator: Optional[torch.Generator] = None) -> None:
        """Draw new random features (for head size ``d``, default the current one), from
        ``generator`` (default: the kernel's own, seeded by ``seed``)."""
        if d is None:
            if self.projection is None:
                raise ValueError("redraw_features needs d (the head size): no features drawn yet")
            d = self.projection.shape[-1]
        W = draw_projection(self.nb_features, d, self.orthogonal, generator) if generator is not None else self._draw(d)
        self.projection = W if self.projection is None else W.to(self.projection.device)

    def _validate(self, q, k, v, state):
        if self.projection is not None and self.projection.shape[-1] != q.shape[-1] and not (self.redraw and self.training and state is None):
            raise ValueError(f"q has head size {q.shape[-1]}, but the random features were drawn for d_head="
                             f"{self.projection.shape[-1]}")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        # grouped keys (fewer heads than the queries): the queries grouped, the state per key head
        return grouped_attend(self._attend_heads, q, k, v, mask, state, need_weights, return_state, self.causal)

    def _attend_heads(self, q, k, v, mask, state, need_weights, return_state):
        d = q.shape[-1]
        if self.projection is None or (self.redraw and self.training and state is None):
            self.projection = self._draw(d).to(q.device)
        key_mask = split_key_mask(mask, state, k.shape[-2], self._state_length(state))
        acc = accumulation_dtype(q.dtype)  # features and sums in float32 for half inputs
        with full_precision(q.device):  # under autocast too: exp() of bfloat16 log-features would lose ~3% each
            W = self.projection.to(device=q.device, dtype=acc)  # (m, d)
            # A per-row constant cancels between the row's numerator and denominator.
            log_q = _query_log_features(q.to(acc), W)  # (B, H, M, m), each row's largest 0
            log_k = favor_log_features(k.to(acc), W)  # (B, H, N, m)
            if not self.causal:  # keys at their per-feature maximum, moved into the queries (_query_reads_keys)
                masked = log_k if key_mask is None else log_k.masked_fill(~key_mask.unsqueeze(-1), float("-inf"))
                features = Features(*_query_reads_keys(log_q, masked))
            elif (acc != torch.float64 and not torch.compiler.is_compiling()
                  and _causal_underflows(log_q, log_k, key_mask, state)):
                # inputs so large that float32 loses a query's terms: this call's features and sums in float64
                # (the running maximum is per position; not while tracing, which cannot branch on values)
                return self._attend_float64(q, k, v, key_mask, state, need_weights, return_state, acc)
            else:  # stabilised inside the core by the running maximum of the keys
                features = Features(torch.exp(log_q), log_k, log_keys=True)
        out, weights, new_state = linear_attention(features, v, causal=self.causal, key_mask=key_mask, state=state,
                                                   chunk_size=self.chunk_size, need_weights=need_weights)
        return AttentionOutput(out, weights, new_state if return_state else None)

    def _attend_float64(self, q, k, v, key_mask, state, need_weights, return_state, acc):
        """Causal FAVOR+ of one call in float64, the output in ``v``'s dtype and the state's sums back in
        ``acc`` (the next call continues as usual)."""
        with full_precision(q.device):
            W = self.projection.to(device=q.device, dtype=torch.float64)
            phi_q = favor_query_features(q.double(), W)  # (B, H, M, m)
            features = Features(phi_q, favor_log_features(k.double(), W), log_keys=True)
        out, weights, new_state = linear_attention(features, v.double(), causal=True, key_mask=key_mask, state=state,
                                                   chunk_size=self.chunk_size, need_weights=need_weights)
        if new_state is not None:
            new_state = dataclasses.replace(new_state, S=new_state.S.to(acc), Z=new_state.Z.to(acc),
                                            log_scale=new_state.log_scale.to(acc))
        return AttentionOutput(out.to(v.dtype), None if weights is None else weights.to(v.dtype),
                               new_state if return_state else None)
