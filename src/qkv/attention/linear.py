"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention", arXiv:2006.16236), and the linear-attention core that the
Performer kernel (``performer.py``) shares.

Replacing ``exp(q . k / sqrt(d))`` by a feature-map dot product ``phi(q) . phi(k)`` lets the sums
over keys be taken once (eq. 5–6):

    V'_i = phi(Q_i)^T S / (phi(Q_i)^T Z + eps),   S = sum_j phi(K_j) V_j^T,   Z = sum_j phi(K_j)

with ``phi(x) = elu(x) + 1``. Causal: ``S_i = sum_{j<=i} phi(K_j) V_j^T``, ``Z_i = sum_{j<=i} phi(K_j)``;
as an RNN ``s_i = s_{i-1} + phi(k_i) v_i^T``, ``z_i = z_{i-1} + phi(k_i)`` (eq. 16–20) — the
incremental-decoding state ``LinearState(S, Z)``.

Cost: O(N E' Ev) time and O(E' Ev) extra memory (non-causal); causal is computed in chunks of
``C`` positions — a masked ``(C, C)`` quadratic form inside a chunk, the running ``(S, Z)`` sums
across chunks — O(N C E' + N E' Ev) time; no ``(N, N)`` matrix is ever formed.

Deviations: ``eps`` is added to the denominator (as in the authors' code) — with ``elu+1`` after
each query row's features and the keys' features are divided by their largest (the factors
cancel in the ratio, so eps guards a zero denominator without shrinking rows of small features;
folded into eps while the largest inputs are above -20, in log space below, so that features below
float range still rank the keys). For a causal row ``i`` "the keys' largest" is that of the keys
``j <= i`` (a running maximum, per position): eps then relates to what row ``i`` may see, so no
later key reaches it and one token at a time gives the parallel pass's numbers. Written out,

    V'_i = phi(Q_i)^T S_i / (phi(Q_i)^T Z_i + eps phi(max Q_i) phi(max_{j <= i} K_j)).

Dropout must be 0 (no
attention matrix exists to drop from, and the authors' code applies none; ``dropout > 0`` raises
rather than being silently ignored); only key-padding
masks are supported (a mask is a matrix, which the factorisation avoids).
Linear attention is a *different* attention, not an approximation of softmax: no knob makes it
converge to softmax (see ``docs/approximation.md`` for how far from softmax it lands).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks
from ..registry import register
from ..types import AttentionOutput
from .base import AttentionKernel, clamp_knob

__all__ = ["LinearAttention", "LinearState", "linear_attention", "accumulation_dtype", "elu_plus_one", "log_elu_plus_one",
           "resolve_feature_map", "split_key_mask"]


@dataclass(frozen=True)
class LinearState:
    """The running sums of causal linear attention (an RNN state).

    S: ``(B, H, E', Ev)`` = ``sum_j phi(K_j) V_j^T`` over the ``length`` keys seen.
    Z: ``(B, H, E')`` = ``sum_j phi(K_j)``.
    length: number of key positions summed (masks passed later cover these plus the new keys).
    log_scale: ``(B, H)`` or None. When the key features are given in log space (Performer),
        ``S`` and ``Z`` are stored divided by ``exp(log_scale)`` (the running maximum of the key
        log-features) so that they never overflow; the factor cancels in ``S / Z``.
    S and Z are float32 for half-precision inputs (see ``accumulation_dtype``).
    """

    S: Tensor
    Z: Tensor
    length: int = 0
    log_scale: Optional[Tensor] = None


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types, else ``dtype``: the running sums add up to N terms, which float16
    overflows (max 65504) and bfloat16 rounds away (8 mantissa bits) — float64 stays float64."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _EluPlusOne(torch.autograd.Function):
    """``relu(x) + exp(min(x, 0))`` in four passes forward and two backward:
    ``d phi / dx = min(phi(x), 1)`` (1 for x > 0, exp(x) below)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        out = torch.relu(x)
        out.add_(x.clamp(max=0.0).exp_())
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        return grad * out.clamp(max=1.0)


def elu_plus_one(x: Tensor) -> Tensor:
    """``phi(x) = elu(x) + 1`` (Katharopoulos 2020, eq. 7): positive, so every denominator is > 0.

    Written as ``relu(x) + exp(min(x, 0))`` — ``x + 1`` (x > 0), ``exp(x)`` (x <= 0) — not
    ``(exp(x) - 1) + 1``, which cancels to exactly 0 below x = -16.6 in float32; the exp never
    overflows. No ``torch.where`` (on CPU several times slower than these passes), and the gradient
    written out (``_EluPlusOne``).
    """
    return _EluPlusOne.apply(x)


def log_elu_plus_one(x: Tensor) -> Tensor:
    """``log phi(x)`` for ``phi = elu + 1``: ``log(1 + x)`` (x > 0) or ``x`` — finite where
    ``phi(x)`` underflows to 0, so the features can be scaled by their maximum before the exp."""
    return torch.log1p(torch.relu(x)) + x.clamp(max=0.0)


#: Direct (not log-space) features are used while the largest input of every query row and of the
#: keys is above this: features that underflow (x < -87 in float32) are then below e^-67 of the largest.
DIRECT_MIN = -20.0


def direct_features(x: Tensor, dims) -> Optional[tuple]:
    """``(phi(x), phi(max x))`` with ``phi = elu + 1`` and the maximum over ``dims`` (kept): dividing
    the features by their largest would scale ``eps`` by ``phi(max x)`` — ``eps * phi(max x)`` on
    the unscaled features is the same function, without the division — or None when a maximum is
    below ``DIRECT_MIN`` (then the caller works in log space). ``-inf`` entries (masked keys) get 0."""
    top = _finite_or_zero(x.detach().amax(dim=dims, keepdim=True))  # -inf: no valid entry
    if top.numel() and bool(top.min() < DIRECT_MIN):
        return None
    return elu_plus_one(x), elu_plus_one(top)


class _NonCausalLinear(torch.autograd.Function):
    """``out = phi_q S / (phi_q z + eps)`` with ``S = phi_k^T v``, ``z = phi_k^T 1``, and its gradient
    written out (four products each way, no (N, N) term), so that autograd's generic graph — the
    two paths into each of ``phi_q`` and ``phi_k``, the division's backward — costs no extra passes:

        g_num = g / den,  g_den = -sum_e(g * out) / den,
        d phi_q = g_num S^T + g_den z^T,   dS = phi_q^T g_num,   dz = phi_q^T g_den,
        d phi_k = v dS^T + 1 dz^T,         dv = phi_k dS.

    ``eps``: ``(B|1, H|1, M, 1)`` tensor or float >= 0, added to the denominator; a row whose
    denominator is 0 (no key with a non-zero feature product: its numerator is 0 too) gives 0."""

    @staticmethod
    def forward(ctx, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps) -> Tensor:
        S = phi_k.transpose(-1, -2) @ v  # (B, H, F, Ev)
        z = phi_k.sum(dim=-2, keepdim=True)  # (B, H, 1, F)
        den = (phi_q * z).sum(-1, keepdim=True) + eps  # (B, H, M, 1); a matrix-vector bmm is ~4x slower on CPU
        den = den.masked_fill(den == 0, 1.0)
        out = (phi_q @ S).div_(den)
        ctx.save_for_backward(phi_q, phi_k, v, S, z, den, out)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        phi_q, phi_k, v, S, z, den, out = ctx.saved_tensors
        g_num = g / den  # (B, H, M, Ev)
        g_den = (g * out).sum(-1, keepdim=True).div_(den).neg_()  # (B, H, M, 1)
        d_q = (g_num @ S.transpose(-1, -2)).add_(g_den * z)  # (B, H, M, F)
        dS = phi_q.transpose(-1, -2) @ g_num  # (B, H, F, Ev)
        dz = (phi_q * g_den).sum(-2, keepdim=True)  # (B, H, 1, F)
        d_k = (v @ dS.transpose(-1, -2)).add_(dz)  # (B, H, N, F)
        d_v = phi_k @ dS  # (B, H, N, Ev)
        return d_q, d_k, d_v, None


def _key_max(x: Tensor) -> Tensor:
    """``max`` of ``x (B, H, L, F)`` over positions and features, ``(B, H, 1, 1)``, detached (the
    factor it gives cancels in ``S / Z``); -inf when there is no entry."""
    if x.shape[-2] == 0 or x.shape[-1] == 0:
        return x.new_full((*x.shape[:-2], 1, 1), float("-inf"))
    return x.detach().amax(dim=(-2, -1), keepdim=True)


def _finite_or_zero(m: Tensor) -> Tensor:
    # A max over no (unmasked) key is -inf; any finite stand-in works since those features are 0.
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    chunk_size: int = 64,
    key_mask: Optional[Tensor] = None,
    state: Optional[LinearState] = None,
    log_keys: bool = False,
    eps: float = 0.0,
    need_weights: bool = False,
    eps_scale: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor], Optional[LinearState]]:
    """The linear-attention core shared by ``linear`` and ``performer``.

    ``out_i = phi_q_i^T S / (phi_q_i^T Z + eps)`` with ``S = sum_j phi_k_j v_j^T``, ``Z = sum_j phi_k_j``
    over all keys, or (``causal``) over the keys ``j <= N - M + i`` (queries aligned to the end of
    the keys, after the ``state.length`` keys already summed in ``state``).

    Args:
        phi_q: ``(B, H, M, F)`` non-negative query features.
        phi_k: ``(B, H, N, F)`` non-negative key features, or their logarithms when ``log_keys``:
            then they are exponentiated here after subtracting a maximum — over all keys
            (non-causal), or (causal) at each key position ``j`` the running maximum ``m_j`` of
            the keys ``<= j`` (the state's keys included, carried in ``state.log_scale``). A causal
            query ``i`` reads its sums at the scale ``exp(-m_i)``, so its output, ``eps`` term
            included, depends on the keys ``<= i`` only: no later key reaches it, not even through
            rounding, and decoding one token at a time computes the same numbers.
        v: ``(B, H, N, Ev)``.
        key_mask: bool ``(B|1, H|1, N)``, True = may attend (masked keys get zero features).
        state: sums of earlier keys (causal only); None starts from zero.
        eps: added to the denominator; ``0`` divides exactly (a zero denominator gives zero).
            With ``log_keys`` it is relative to the largest key feature (of all keys, or causal:
            of the keys ``<= i``).
        eps_scale: ``(B|1, H|1, M, 1)`` or None: ``eps * eps_scale`` is added instead (the features'
            normalisation folded into eps, see ``direct_features``; causal: the queries' only).
        need_weights: also return the implied ``(B, H, M, N)`` weights (O(M N); not with ``state``).
    Returns:
        ``(out (B, H, M, Ev) in v's dtype, weights or None, new LinearState (causal) or None)``.
    Cost: non-causal O(N F Ev); causal O(N C F + N F Ev) in ``ceil(M / C)`` chunk steps.
    """
    B, H, M, Fdim = phi_q.shape
    N, Ev = v.shape[-2], v.shape[-1]
    out_dtype = v.dtype
    acc = accumulation_dtype(v.dtype)  # see accumulation_dtype: sums of N terms in float32
    phi_q, phi_k, v = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    if key_mask is not None:
        keep = key_mask.unsqueeze(-1)  # (B|1, H|1, N, 1)
        phi_k = phi_k.masked_fill(~keep, float("-inf")) if log_keys else phi_k * keep
    eps_q = eps if eps_scale is None else eps * eps_scale  # (B|1, H|1, M, 1) or float

    def divide(nd: Tensor) -> Tensor:
        num, den = nd[..., :Ev], nd[..., Ev:]  # (B, H, M, Ev), (B, H, M, 1)
        if eps > 0:
            return num / (den + eps_q)
        # den = 0 only where every feature product is 0, and then num = 0 too: 0 / tiny = 0.
        return num / den.clamp(min=torch.finfo(den.dtype).tiny)

    if causal:
        if state is not None and not isinstance(state, LinearState):
            raise TypeError(f"state must be a LinearState returned by this kernel, got {type(state).__name__}")
        if state is not None and (state.log_scale is not None) != log_keys:
            raise ValueError("state was produced by a kernel with a different feature map (log_scale mismatch)")
    m = None  # causal log mode: (B, H, 1 + N) running maxima, m[..., 0] the state's, m[..., 1 + j] after key j
    if causal and log_keys:
        m0 = (state.log_scale.to(acc).view(B, H, 1) if state is not None
              else phi_k.new_full((B, H, 1), float("-inf")))
        top = phi_k.detach().amax(-1) if Fdim else phi_k.new_full((B, H, N), float("-inf"))  # (B, H, N)
        m = torch.cummax(torch.cat([m0, top], dim=-1), dim=-1).values  # (B, H, 1 + N)
        phi_k = torch.exp(phi_k - _finite_or_zero(m[..., 1:]).unsqueeze(-1))  # (B, H, N, F): exp(l_j - m_j) <= 1

    weights = None
    if need_weights:
        if state is not None:
            raise ValueError("need_weights=True with a state: the weights over cached keys were summed away in "
                             "the state; call without state to see them")
        fk = phi_k
        if log_keys and not causal:
            fk = torch.exp(fk - _finite_or_zero(_key_max(fk)))
        a = phi_q @ fk.transpose(-1, -2)  # (B, H, M, N) unnormalised weights
        if causal:
            allowed = torch.ones(M, N, dtype=torch.bool, device=a.device).tril(N - M)
            if m is None:
                a = a * allowed
            else:  # key j was scaled by exp(-m_j); query i reads it at exp(-m_i): times exp(m_j - m_i) <= 1
                mk, mq = m[..., 1:], m[..., 1 + N - M:]  # (B, H, N), (B, H, M)
                a = a * torch.exp((mk.unsqueeze(-2) - _finite_or_zero(mq).unsqueeze(-1)).masked_fill(~allowed, float("-inf")))
        den = a.sum(-1, keepdim=True)
        weights = (a / (den + eps_q) if eps > 0 else a / torch.where(den > 0, den, torch.ones_like(den))).to(out_dtype)

    if not causal:
        if state is not None:
            raise ValueError("state is only used by causal linear attention")
        if log_keys:
            phi_k = torch.exp(phi_k - _finite_or_zero(_key_max(phi_k)))
        out = _NonCausalLinear.apply(phi_q, phi_k, v, eps_q)
        return out.to(out_dtype), weights, None  # (B, H, M, Ev)

    if M > N:
        # Without a state the kernel's caller returns zero rows for queries before the first key; with
        # one, such a query would need part of the keys already summed away in the state.
        raise ValueError(f"causal linear attention aligns queries to the end of the keys: got {M} queries for {N} new "
                         f"keys after a state of {state.length if state is not None else 0}; a query may not "
                         f"precede the new keys (its keys are summed away in the state)")
    _checks.positive_int("chunk_size", chunk_size)
    # [V, 1]: one product gives both the numerator S and the normaliser Z (its last column).
    v1 = torch.cat([v, v.new_ones(B, H, N, 1)], dim=-1)  # (B, H, N, Ev + 1)
    # P = [S, Z] of the keys summed so far; in log mode stored divided by exp(m_cur).
    if state is None:
        P = v1.new_zeros(B, H, Fdim, Ev + 1)  # (B, H, F, Ev + 1)
        length = 0
    else:
        if state.S.shape != (B, H, Fdim, Ev) or state.Z.shape != (B, H, Fdim):
            raise ValueError(f"state holds S {tuple(state.S.shape)} and Z {tuple(state.Z.shape)}, incompatible with "
                             f"(B, H, features, Ev) = {(B, H, Fdim, Ev)}")
        P = torch.cat([state.S, state.Z.unsqueeze(-1)], dim=-1).to(acc)
        length = state.length
    off = N - M  # keys before the first query's position: seen by every query
    mk = mk_safe = None
    if m is not None:
        # Scales (causal log mode; every factor <= 1). Key j was exponentiated at its running max
        # m_j; query i reads everything at its own m_i; [S, Z] is kept at the m of its last key.
        mk = m[..., 1:]  # (B, H, N): m_j
        mk_safe = _finite_or_zero(mk)
    if off > 0:
        # S += sum_j phi(K_j) V_j^T, Z += sum_j phi(K_j) over the leading keys
        lead = phi_k[:, :, :off]
        if m is not None:
            lead = lead * torch.exp(mk[..., :off] - mk_safe[..., off - 1:off]).unsqueeze(-1)
            P = P * torch.exp(m[..., :1] - mk_safe[..., off - 1:off]).unsqueeze(-1)
        P = P + lead.transpose(-1, -2) @ v1[:, :, :off]  # (B, H, F, Ev + 1)
    if M == 0:
        nd = v1.new_zeros(B, H, 0, Ev + 1)
    else:
        nd, P = _causal_chunks(phi_q, phi_k[:, :, off:], v1[:, :, off:], P, min(chunk_size, M),
                               None if m is None else (m[..., off:], mk_safe[..., off:]))
    new_state = LinearState(S=P[..., :Ev], Z=P[..., Ev], length=length + N,
                            log_scale=m[..., -1] if log_keys else None)
    return divide(nd).to(out_dtype), weights, new_state


def _causal_chunks(phi_q: Tensor, phi_k: Tensor, v1: Tensor, P: Tensor, C: int,
                   scales: Optional[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The causal sums of ``M`` queries and their ``M`` keys in chunks of ``C`` (the core's inner part).

    ``phi_q, phi_k (B, H, M, F)``, ``v1 = [V, 1] (B, H, M, Ev + 1)``, ``P = [S, Z] (B, H, F, Ev + 1)``
    of the keys before. Returns ``(sum_{j <= i} (phi_q_i . phi_k_j) [v_j, 1] (B, H, M, Ev + 1), P after)``.
    ``scales``: None, or (log mode) ``(m (B, H, 1 + M), m_safe (B, H, M))`` — the running maxima
    before the first key (``m[..., 0]``, P's scale) and after each key, at which ``phi_k`` was taken.

    All chunks at once: the within-chunk quadratic forms as one batched product, every chunk's
    ``[S, Z]`` likewise; only the running sum over chunks is a loop (or a cumulative sum).
    """
    B, H, M, Fdim = phi_q.shape
    T, pad = -(-M // C), -M % C  # chunks, padding of the last one
    chunked = lambda x: F.pad(x, (0, 0, 0, pad)).view(B, H, T, C, x.shape[-1])
    qs, ks, vs = chunked(phi_q), chunked(phi_k), chunked(v1)  # (B, H, T, C, F | Ev + 1)
    tri = torch.ones(C, C, dtype=torch.bool, device=v1.device).tril()  # j <= i inside a chunk
    if scales is None:
        ends, mask, to_query = ks, tri, None
    else:
        m, m_safe = scales
        mc = F.pad(m[..., 1:], (0, pad), value=float("-inf")).view(B, H, T, C)  # m_j (padding: no key)
        mq = F.pad(m_safe, (0, pad), value=float("inf")).view(B, H, T, C)  # m_i (padding: a query that reads nothing)
        last = m_safe[..., (torch.arange(1, T + 1, device=m.device) * C - 1).clamp(max=M - 1)]  # (B, H, T): m of each chunk's last key
        before = m[..., ::C][..., :T]  # (B, H, T): the running max before each chunk, P's scale there
        # key j read at query i's scale: exp(m_j - m_i), j <= i (never computed above the diagonal)
        mask = torch.exp((mc.unsqueeze(-2) - mq.unsqueeze(-1)).masked_fill(~tri, float("-inf")))  # (B, H, T, C, C)
        ends = ks * torch.exp(mc - last.unsqueeze(-1)).unsqueeze(-1)  # key j at its chunk's last scale
        chunk_of = torch.arange(M, device=m.device) // C
        to_query = F.pad(torch.exp(before[..., chunk_of] - m_safe), (0, pad)).view(B, H, T, C, 1)  # P's scale -> m_i
        step = torch.exp(before - last)  # (B, H, T): P's scale -> the chunk's last
    # within a chunk: sum_{j<=i} (phi_q_i . phi_k_j) [v_j, 1] — the masked quadratic form
    local = ((qs @ ks.transpose(-1, -2)) * mask) @ vs  # (B, H, T, C, Ev + 1)
    # each chunk's own [S, Z] = sum_j phi(K_j) [V_j, 1]^T
    own = ends.transpose(-1, -2) @ vs  # (B, H, T, F, Ev + 1)
    # [S, Z] of every earlier chunk: a running sum (rescaled chunk to chunk in log mode)
    if scales is None:
        before_P = P.unsqueeze(2) + F.pad(own.cumsum(2)[:, :, :-1], (0, 0, 0, 0, 1, 0))  # (B, H, T, F, Ev + 1)
        P = before_P[:, :, -1] + own[:, :, -1]
    else:
        running = []
        for own_t, step_t in zip(own.unbind(2), step.unbind(-1)):  # unbind: one stack in backward
            running.append(P)
            P = P * step_t[..., None, None] + own_t
        before_P = torch.stack(running, dim=2)  # (B, H, T, F, Ev + 1)
    across = qs @ before_P  # (B, H, T, C, Ev + 1): phi_q_i^T [S, Z] of the earlier chunks
    if to_query is not None:
        across = across * to_query
    return (across + local).view(B, H, T * C, vs.shape[-1])[:, :, :M], P


def resolve_feature_map(feature_map: Union[str, Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    """``"elu+1"`` or a callable ``(..., E) -> (..., E')`` of non-negative features."""
    if isinstance(feature_map, str):
        if feature_map != "elu+1":
            raise ValueError(f"feature_map must be 'elu+1' or a callable, got unknown name {feature_map!r}")
        return elu_plus_one
    if not callable(feature_map):
        raise TypeError(f"feature_map must be 'elu+1' or a callable, got {type(feature_map).__name__}")
    return feature_map


@register("attention", "linear", "linear-transformer")
class LinearAttention(AttentionKernel):
    """Linear attention phi(Q)(phi(K)^T V) / phi(Q) phi(K)^T 1, phi = elu + 1 (Katharopoulos et al. 2020), O(N).

    ``V'_i = phi(Q_i)^T S / (phi(Q_i)^T Z + eps)``, ``S = sum_j phi(K_j) V_j^T``, ``Z = sum_j phi(K_j)``
    (causal: sums over ``j <= i``).

    Args:
        feature_map: ``"elu+1"`` or a callable mapping ``(B, H, L, E)`` to non-negative
            ``(B, H, L, E')`` features.
        eps: added to the denominator (> 0 keeps a row with tiny features finite).
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
    applies_dropout = False  # the authors' code (fast-transformers) applies none: dropout > 0 raises

    def __init__(self, *, causal: bool = False, dropout: float = 0.0,
                 feature_map: Union[str, Callable[[Tensor], Tensor]] = "elu+1", eps: float = 1e-6,
                 chunk_size: int = 64) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.feature_map = resolve_feature_map(feature_map)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"eps must be a float >= 0, got {eps!r}")
        self.eps = float(eps)
        self.chunk_size = _checks.positive_int("chunk_size", chunk_size)

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """Causal chunks of ``max_len / 4`` in ``[1, 64]`` (a speed knob: the result is the same)."""
        return {**super().default_knobs(max_len, n_heads, d_head), "chunk_size": clamp_knob(max_len // 4, 1, 64)}

    def extra_repr(self) -> str:
        name = getattr(self.feature_map, "__name__", repr(self.feature_map))
        return f"feature_map={name}, eps={self.eps}, chunk_size={self.chunk_size}, {super().extra_repr()}"

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        key_mask = split_key_mask(mask, state, k.shape[-2], self._state_length(state))
        acc = accumulation_dtype(q.dtype)
        log_keys = self.feature_map is elu_plus_one
        eps_scale = None
        if log_keys:
            # Each query row is divided by its largest feature, the keys by theirs; both factors cancel
            # between numerator and denominator (eps then guards a relative 0). Directly while the
            # largest inputs are moderate, else in log space, so that features that underflow
            # (x < -87 in float32) still rank the keys (the causal keys always: their maximum is a
            # running one, inside the core, so that no key reaches an earlier output).
            direct_q = direct_features(q.to(acc), -1)  # (phi_q, (B, H, M, 1)) or None
            direct_k = None
            if direct_q is not None and not self.causal:
                k_in = k.to(acc) if key_mask is None else k.to(acc).masked_fill(~key_mask.unsqueeze(-1), float("-inf"))
                direct_k = direct_features(k_in, (-2, -1))  # (phi_k, (B, H, 1, 1)) or None
            if direct_q is not None:
                phi_q, eps_scale = direct_q
            else:
                log_q = log_elu_plus_one(q.to(acc))  # (B, H, M, E)
                phi_q = torch.exp(log_q - log_q.detach().amax(dim=-1, keepdim=True))
            if direct_k is not None:
                phi_k, k_scale = direct_k
                eps_scale = eps_scale * k_scale
                log_keys = False
            else:
                phi_k = log_elu_plus_one(k.to(acc))  # (B, H, N, E)
        else:
            phi_q, phi_k = self.feature_map(q.to(acc)), self.feature_map(k.to(acc))  # (B, H, L, E')
        if phi_q.shape[:-1] != q.shape[:-1] or phi_k.shape[:-1] != k.shape[:-1] or phi_q.shape[-1] != phi_k.shape[-1]:
            raise ValueError(f"feature_map must map (B, H, L, E) to (B, H, L, E'); got {tuple(phi_q.shape)} for q "
                             f"{tuple(q.shape)} and {tuple(phi_k.shape)} for k {tuple(k.shape)}")
        out, weights, new_state = linear_attention(
            phi_q, phi_k, v, causal=self.causal, chunk_size=self.chunk_size, key_mask=key_mask, state=state,
            log_keys=log_keys, eps=self.eps, need_weights=need_weights, eps_scale=eps_scale)
        return AttentionOutput(out, weights, new_state if return_state else None)


def split_key_mask(mask: Optional[Tensor], state: Optional[LinearState], N: int, cached: int) -> Optional[Tensor]:
    """The key-padding mask ``(B|1, H|1, N)`` of the new keys from a validated ``(B|1, H|1, 1, cached + N)``
    mask. Cached keys are already summed into the state, so the mask must allow all of them."""
    if mask is None:
        return None
    kpm = mask[:, :, 0, :]  # (B|1, H|1, cached + N)
    if cached and not bool(kpm[..., :cached].all()):
        raise ValueError(f"mask masks some of the {cached} keys already summed into the state; a linear-attention "
                         f"state cannot forget keys — mask them when they are first fed")
    return kpm[..., cached:]
