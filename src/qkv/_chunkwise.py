"""The chunkwise engine of linear attention and its descendants: one recurrence, its literal form and
its chunkwise-parallel form, shared by the kernels of ``qkv/attention/gated_linear.py`` (retention,
GLA, DeltaNet, Gated DeltaNet), by ``qkv.functional``'s drop-ins for fla's gated delta rule, and by
the causal core of ``linear`` and ``performer`` (``attention/_ops.py``: the additive rule with values
``[v, 1]`` — numerator and normaliser — and, for key features kept in log space, the decay
``g_j = m_{j-1} - m_j`` that rescales the sums to the keys' running maximum ``m``; none otherwise).

The recurrence (the papers' layout: the state ``S_t`` is ``d_v x d_k``, ``o_t = S_t q_t``; fla and
transformers store its transpose ``d_k x d_v`` — the callers convert at their boundary)::

    additive:  S_t = S_{t-1} Diag(a_t) + beta_t v_t k_t^T                       (RetNet, GLA)
    delta:     S_t = S_{t-1} Diag(a_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T  (DeltaNet, Gated DeltaNet, KDA)

with ``a_t = exp(g_t)``: ``g`` is the log of the decay, one per head ``(B, H, N)`` (RetNet's fixed
``gamma``, Gated DeltaNet's ``alpha_t``) or one per key channel ``(B, H, N, E)`` (GLA, Kimi's KDA);
no ``g``: no decay (DeltaNet, linear attention). No ``beta``: ``beta_t = 1``. ``resets (B, N)`` bool: True where a
document starts (packed sequences): the state is zeroed before that position's update.

Three forms, equal to rounding (tests/attention/test_gated_linear.py):

- ``recurrent``: the recurrence above, one token at a time (decoding — callers with a state and at
  most ``DECODE_KEYS`` new keys take it; the literal reference);
- ``chunkwise``: chunks of ``C`` positions (Yang et al. 2023 for the decay, Yang et al. 2024 for
  the delta rule's WY/UT form). Inside a chunk, with ``b_t = sum_{s<=t} g_s`` (from the chunk's
  start), ``Gamma_t = exp(b_t)`` and the pairwise decays ``D_tj = exp(b_t - b_j)`` (``j <= t``,
  same document), the delta rule's written values ``u_t = beta_t (v_t - S_{t-1} Diag(a_t) k_t)``
  solve one unit lower-triangular system, ``(I + L) U = diag(beta) V - diag(beta) (K o Gamma) S0^T``
  with ``L_tj = beta_t (k_t . k_j)_D`` (``j < t``) — the UT transform ``T = (I + L)^{-1}``, formed
  explicitly (``C^3`` per chunk). Every chunk's ``T``, ``U' = T diag(beta) V``, ``W = T diag(beta)
  (K o Gamma)`` and ``A_tj = (q_t . k_j)_D`` (``j <= t``) are batched over all chunks at once; only
  the scan over chunks is a loop — ``U = U' - W S_start^T``, ``O = A U + (Q o Gamma) S_start^T``,
  ``S_end = S_start Diag(gamma_C) + U^T (K o Gamma_end)`` (the additive rule's ``U = diag(beta) V``
  is known before the scan: its loop carries only the state, and with neither decay nor reset it is
  a cumulative sum, ``scan``). Grouped value heads (fewer query/key heads
  than value heads) share ``Q K^T``, ``K K^T``, ``W``'s product and, with a scalar decay, the scan's
  reads and writes of the state. Every exponent is ``<= 0`` (``g <= 0``): nothing overflows,
  whatever the chunk length;
- ``parallel``: the chunkwise form with one chunk, which for the additive rule is RetNet's parallel
  form ``O = (Q K^T o D)(beta V) + (Q o Gamma) S0^T`` (Sun et al. 2023, eq. 5).

All functions take ``q, k (B, H, N, E)``, ``v (B, H, N, Ev)`` (one query per key: position ``t``
reads ``S_t``; ``chunkwise`` and ``parallel`` also ``q, k`` of ``H / G`` heads, each serving ``G``
consecutive heads of ``v``, ``g`` and ``beta``) in the dtype they compute in (callers pick float32
for half inputs) and return ``(o (B, H, N, Ev), S_N (B, H, Ev, E))``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DECODE_KEYS", "recurrent", "chunkwise", "parallel", "scan", "multiscale_log_decay", "l2_normalize", "check_gates",
           "resets_from_position_ids", "resets_from_cu_seqlens"]


# ----------------------------------------------------------------------------- inputs


def multiscale_log_decay(n_heads: int, device=None, dtype=torch.float32) -> Tensor:
    """``log gamma_h`` for RetNet's multi-scale retention, ``gamma_h = 1 - 2^{-5-h}``, ``h = 0 .. H-1`` -> ``(H,)``."""
    h = torch.arange(n_heads, device=device, dtype=torch.float64)
    return torch.log1p(-torch.exp2(-5.0 - h)).to(dtype)


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum x^2 + eps)`` over the last dim (fla's and transformers' ``l2norm``: a zero
    vector stays zero, a padded key writes nothing)."""
    return x * torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() + eps)  # no x * x temporary


def check_gates(g: Optional[Tensor], beta: Optional[Tensor], g_shapes: Tuple[tuple, ...],
                beta_shape: tuple, g_name: str = "g", beta_name: str = "beta") -> None:
    """One ValueError/TypeError naming the argument: ``g`` (log decays) of one of ``g_shapes``, finite
    and ``<= 0`` (a decay in ``(0, 1]``); ``beta`` of ``beta_shape``, finite, in ``[0, 1]``. The
    values are read only outside a traced graph (``torch.compile``/``torch.export``)."""
    reading = not torch.compiler.is_compiling()
    if g is not None:
        if not isinstance(g, Tensor) or not g.is_floating_point():
            raise TypeError(f"{g_name} must be a floating-point tensor (log decays), got "
                            f"{type(g).__name__ if not isinstance(g, Tensor) else g.dtype}")
        if tuple(g.shape) not in g_shapes:
            raise ValueError(f"{g_name} must have shape {' or '.join(str(s) for s in g_shapes)}, got {tuple(g.shape)}")
        if reading and g.numel():
            if not bool(torch.isfinite(g).all()):
                raise ValueError(f"{g_name} (log decays) must be finite, got non-finite entries")
            if bool((g > 0).any()):
                raise ValueError(f"{g_name} is the log of a decay in (0, 1] and must be <= 0, got a maximum of "
                                 f"{float(g.max()):.4g}")
    if beta is not None:
        if not isinstance(beta, Tensor) or not beta.is_floating_point():
            raise TypeError(f"{beta_name} must be a floating-point tensor, got "
                            f"{type(beta).__name__ if not isinstance(beta, Tensor) else beta.dtype}")
        if tuple(beta.shape) != tuple(beta_shape):
            raise ValueError(f"{beta_name} must have shape {tuple(beta_shape)}, got {tuple(beta.shape)}")
        if reading and beta.numel() and not bool(((beta >= 0) & (beta <= 1)).all()):  # NaN fails both
            raise ValueError(f"{beta_name} (the writing strength) must be finite and in [0, 1], got values in "
                             f"[{float(beta.min()):.4g}, {float(beta.max()):.4g}]")


def resets_from_position_ids(position_ids: Tensor) -> Tensor:
    """``(B, N)`` True where a document starts: transformers' packing convention
    (``DataCollatorWithFlattening``: ``position_ids`` restart at 0 at each document)."""
    return position_ids == 0


def resets_from_cu_seqlens(cu_seqlens: Tensor, n: int) -> Tensor:
    """``(1, n)`` True at each document's first position: fla's ``cu_seqlens`` ``[0, n_1, n_1 + n_2, ..., n]``."""
    starts = cu_seqlens[:-1].long()
    return torch.zeros(1, n, dtype=torch.bool, device=cu_seqlens.device).index_fill_(1, starts[starts < n], True)


# ----------------------------------------------------------------------------- the literal recurrence


#: the most new keys of a call with a state that its callers run in the recurrent form rather than
#: chunkwise (decoding: a few products per token against the chunked form's fixed cost of padding,
#: pairwise decays and a scan, some hundred operations for one token); the forms agree to rounding
DECODE_KEYS = 8


def recurrent(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None, *,
              delta: bool = False, state: Optional[Tensor] = None,
              resets: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The recurrence, token by token (the module docstring): ``(o (B, Hq, N, Ev), S_N (B, H, Ev, E))``.

    ``q`` may have ``Hq = R H`` heads (grouped queries: query heads ``h R .. h R + R - 1`` read the
    state of head ``h``, which is kept once, not repeated)."""
    B, H, N, E = k.shape
    Ev = v.shape[-1]
    Hq = q.shape[1]
    S = v.new_zeros(B, H, Ev, E) if state is None else state
    outs = []

    def read(x: Tensor) -> Tensor:
        """``S x`` for ``x (B, Hx, E)``, ``Hx`` a multiple of ``H`` (each state's rows stacked): ``(B, Hx, Ev)``."""
        rows = torch.bmm(x.reshape(B * H, x.shape[1] // max(H, 1), E), S.reshape(B * H, Ev, E).transpose(1, 2))
        return rows.view(B, x.shape[1], Ev)

    for t in range(N):
        if resets is not None:
            S = S * (~resets[:, t]).to(S.dtype).view(-1, 1, 1, 1)  # a new document: S_{t-1} = 0
        if g is not None:
            a = g[:, :, t].exp()  # (B, H) or (B, H, E)
            S = S * (a[..., None, None] if g.dim() == 3 else a.unsqueeze(-2))  # S_{t-1} Diag(a_t)
        k_t, v_t = k[:, :, t], v[:, :, t]  # (B, H, E), (B, H, Ev)
        if delta:
            v_t = v_t - read(k_t)  # v_t - S' k_t: what k_t reads now is replaced
        if beta is not None:
            v_t = beta[:, :, t, None] * v_t
        S = S + v_t.unsqueeze(-1) * k_t.unsqueeze(-2)  # + beta_t (v_t - ...) k_t^T
        outs.append(read(q[:, :, t]))  # o_t = S_t q_t (grouped: a group's R queries as rows against its one state)
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, Hq, 0, Ev)
    return o, S


# ----------------------------------------------------------------------------- the chunkwise form


def _decays(g: Optional[Tensor], resets: Optional[Tensor], B: int, H: int, T: int, C: int, pad: int,
            like: Tensor):
    """The decays inside each chunk: ``(D, Gamma, Gamma_end, gamma_C, channel)``.

    ``D (B, H, T, C, C[, E])``: ``exp(b_t - b_j)`` for ``j <= t`` in one document, else 0;
    ``Gamma (B, H, T, C, 1|E)``: ``exp(b_t)``, 0 after a reset in the chunk (the chunk-start state is gone);
    ``Gamma_end (B, H, T, C, 1|E)``: ``exp(b_C - b_j)``, 0 before a reset later in the chunk;
    ``gamma_C (B, H, T[, E])``: the chunk's whole decay ``exp(b_C)``, 0 when the chunk holds a reset."""
    channel = g is not None and g.dim() == 4
    if g is None:
        b = like.new_zeros(B, H, T, C)
    elif channel:
        b = F.pad(g, (0, 0, 0, pad)).view(B, H, T, C, -1).cumsum(3)  # (B, H, T, C, E): b_t = sum_{s<=t} g_s
    else:
        b = F.pad(g, (0, pad)).view(B, H, T, C).cumsum(3)  # (B, H, T, C)
    pair = torch.ones(C, C, dtype=torch.bool, device=like.device).tril()  # j <= t
    if resets is not None:
        doc = F.pad(resets, (0, pad)).view(-1, 1, T, C).long().cumsum(-1)  # (B, 1, T, C): resets so far in the chunk
        pair = pair & (doc.unsqueeze(-1) == doc.unsqueeze(-2))  # (B, 1, T, C, C): one document
        from_start = (doc == 0).unsqueeze(-1)  # (B, 1, T, C, 1): still reads the chunk-start state
        to_end = (doc == doc[..., -1:]).unsqueeze(-1)  # (B, 1, T, C, 1): reaches the chunk-end state
        whole = doc[..., -1] == 0  # (B, 1, T): no reset in the chunk
    bl = b.unsqueeze(-1) if not channel else b  # (B, H, T, C, 1|E)
    if channel:
        diff = b.unsqueeze(4) - b.unsqueeze(3)  # (B, H, T, C_t, C_j, E): b_t - b_j
        D = diff.masked_fill_(~pair.unsqueeze(-1), float("-inf")).exp_()
    else:
        D = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill_(~pair, float("-inf")).exp_()  # (B, H, T, C, C)
    Gamma = bl.exp()
    Gamma_end = (bl[..., -1:, :] - bl).exp()
    gamma_C = bl[..., -1, :].exp()  # (B, H, T, 1|E)
    if resets is not None:
        Gamma, Gamma_end = Gamma * from_start, Gamma_end * to_end
        gamma_C = gamma_C * whole.unsqueeze(-1)
    return D, Gamma, Gamma_end, (gamma_C if channel else gamma_C[..., 0]), channel


def chunkwise(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None, *,
              delta: bool = False, state: Optional[Tensor] = None, resets: Optional[Tensor] = None,
              chunk_size: int = 64) -> Tuple[Tensor, Tensor]:
    """The recurrence in chunks of ``chunk_size`` positions (the module docstring):
    ``(o (B, H, N, Ev), S_N (B, H, Ev, E))``. Cost: ``O(N C (E + Ev))`` batched products (GLA's
    per-channel decays: ``O(N C E)`` memory for the pairwise decays), ``N / C`` steps of the scan.

    ``q`` and ``k`` may have fewer heads than ``v``, ``g`` and ``beta`` (``Hk`` dividing ``H``: each
    query/key head serves ``H / Hk`` consecutive heads, transformers' grouped value heads): their
    products ``Q K^T``, ``K K^T`` and the UT transform's ``W`` are then computed once per key head.
    Inside, every tensor is chunk-major ``(B, T, H, C, *)``: the scan reads one contiguous block per
    chunk, and ``o`` comes back as a view of ``(B, N, H, Ev)`` (fla's layout, no copy to get there)."""
    B, Hk, N, E = k.shape
    H, Ev = v.shape[1], v.shape[-1]
    G = H // Hk  # value heads per query/key head
    S = v.new_zeros(B, H, Ev, E) if state is None else state
    if N == 0:
        return v.new_zeros(B, H, 0, Ev), S
    C = max(1, min(chunk_size, N))
    T, pad = -(-N // C), -N % C  # chunks, padding of the last one (zero keys, no decay: no step)

    def chunked(x: Tensor) -> Tensor:
        """``(B, h, N, d)`` -> chunk-major ``(B, T, h, C, d)``, contiguous (one copy)."""
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        return x.view(B, x.shape[1], T, C, x.shape[-1]).transpose(1, 2).contiguous()

    def major(x: Tensor) -> Tensor:
        return x.transpose(1, 2)  # (B, T, H, ...) <-> (B, H, T, ...) (scan's layout), a view

    qc, kc, vc = chunked(q), chunked(k), chunked(v)
    # the decays chunk-major: _decays of B T sequences of one chunk each
    g_rows = None if g is None else chunked(g.unsqueeze(-1) if g.dim() == 3 else g).flatten(0, 1)  # (B T, H, C, 1|E)
    g_rows = g_rows[..., 0] if g is not None and g.dim() == 3 else g_rows
    r_rows = None if resets is None else F.pad(resets, (0, pad)).view(B * T, C)
    *decays, channel = _decays(g_rows, r_rows, B * T, H, 1, C, 0, v)
    D, Gamma, Gamma_end, gamma_C = (x.view(B, T, H, *x.shape[3:]) for x in decays)  # (B, T, H, ...)
    bc = None if beta is None else chunked(beta.unsqueeze(-1))  # (B, T, H, C, 1)

    def grouped(x: Tensor) -> Tensor:
        return x.view(B, T, Hk, G, *x.shape[3:])  # (B, T, H, ...) -> (B, T, Hk, G, ...)

    def decayed(x: Tensor, y: Tensor) -> Tensor:
        """``(x_t . y_j)_D = sum_c x_tc y_jc D_tj(c)`` for key-head ``x, y`` -> ``(B, T, H, C, C)``."""
        if channel:  # elementwise and summed: einsum runs this as C^2 one-by-one dot products, 2-3x slower on CPUs
            x, y = (z.repeat_interleave(G, dim=2) if G > 1 else z for z in (x, y))
            return (x.unsqueeze(-2) * y.unsqueeze(-3) * D).sum(-1)
        return (grouped(D) * (x @ y.transpose(-1, -2)).unsqueeze(3)).view(B, T, H, C, C)  # one product per key head

    def per_head(x: Tensor, scale: Tensor) -> Tensor:
        """``x (B, T, Hk, C, d)`` scaled per value head by ``scale (B, T, H, C, 1|d)`` -> ``(B, T, H, C, d)``."""
        return (x.unsqueeze(3) * grouped(scale)).view(B, T, H, C, x.shape[-1])

    A = decayed(qc, kc)  # (B, T, H, C, C): A_tj = (q_t . k_j)_D, j <= t
    decay = gamma_C.unsqueeze(-2) if channel else gamma_C[..., None, None]  # S Diag(gamma_C): (B, T, H, 1|1, 1|E)
    if not delta:
        U = vc if bc is None else vc * bc  # what each key writes, known before the scan
        # S_end = S_start Diag(gamma_C) + U^T K_end, K_end = k_j o exp(b_C - b_j); no decay, no reset: a sum
        steady = g is None and resets is None
        S_start, S = scan(S, None if steady else major(decay), major(U.transpose(-1, -2) @ per_head(kc, Gamma_end)))
        o = (A @ U + per_head(qc, Gamma) @ major(S_start).transpose(-1, -2)).transpose(2, 3)  # (B, T, C, H, Ev)
        return o.reshape(B, T * C, H, Ev)[:, :N].transpose(1, 2), S
    # the UT transform T = (I + L)^{-1}, L_tj = beta_t (k_t . k_j)_D for j < t, explicitly (C^3 per chunk):
    # U' = T diag(beta) V and W = T diag(beta) (K o Gamma) are then plain products, W's one per key head
    L = decayed(kc, kc)
    L = L if bc is None else L.mul_(bc)  # its diagonal and upper part are not read: I + L, unit lower triangular
    eye = torch.eye(C, dtype=L.dtype, device=L.device).expand_as(L)
    Tm = torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True)
    Tb = Tm if bc is None else Tm * bc.transpose(-1, -2)  # T diag(beta)
    U1 = Tb @ vc  # (B, T, H, C, Ev)
    if channel:
        W = Tb @ per_head(kc, Gamma)
    else:  # T diag(beta Gamma) K: the group's C-row blocks stacked against one key block
        W = (Tb * Gamma.transpose(-1, -2)).reshape(B, T, Hk, G * C, C) @ kc
    W = W.view(B, T, H, C, E)
    # the scan, chunk by chunk: U = U' - W S^T (the state before the chunk), o = A U + (Q o Gamma) S^T,
    # S_end = S Diag(gamma_C) + U^T (K o Gamma_end): 3 C E Ev per chunk and head. A scalar decay factors
    # out of the products, (Q o Gamma) S^T = Gamma o (Q S^T) and U^T (K o Gamma_end) = (Gamma_end o U)^T K:
    # the group's states side by side, (B Hk, G Ev, E), meet one query/key block each
    Qg = per_head(qc, Gamma) if channel else None  # per-channel decays: q_t o exp(b_t) per head
    K_end = per_head(kc, Gamma_end) if channel else None
    by_key = lambda x: x.reshape(B * Hk, *x.shape[-2:])  # noqa: E731  (B, Hk, r, c) -> (B Hk, r, c)

    def to_out(x: Tensor) -> Tensor:  # (B H, C, d) -> (B, C, Hk, G, d): one chunk in fla's layout
        return x.view(B, Hk, G, C, x.shape[-1]).permute(0, 3, 1, 2, 4)

    S, outs = S.reshape(B * Hk, G * Ev, E), []
    per_chunk = (U1, W, A, decay, qc, kc, Gamma, Gamma_end, Qg, K_end)  # unbound once: one stack each in backward
    for U1_c, W_c, A_c, decay_c, q_c, k_c, Gamma_c, Gamma_end_c, Qg_c, K_end_c in zip(
            *(x.unbind(1) if x is not None else [None] * T for x in per_chunk)):
        Sh = S.view(B * H, Ev, E)
        U_c = torch.baddbmm(U1_c.reshape(B * H, C, Ev), W_c.reshape(B * H, C, E), Sh.transpose(-1, -2),
                            alpha=-1)  # (B H, C, Ev)
        within = to_out(torch.bmm(A_c.reshape(B * H, C, C), U_c))  # A U: (B, C, Hk, G, Ev)
        decayed_S = (Sh.view(B, H, Ev, E) * decay_c).view(B * Hk, G * Ev, E)
        if channel:
            outs.append(within + to_out(torch.bmm(Qg_c.reshape(B * H, C, E), Sh.transpose(-1, -2))))
            S = torch.baddbmm(decayed_S.view(B * H, Ev, E), U_c.transpose(-1, -2),
                              K_end_c.reshape(B * H, C, E)).view(B * Hk, G * Ev, E)
        else:
            read = (by_key(q_c) @ S.transpose(-1, -2)).view(B, Hk, C, G, Ev).transpose(1, 2)  # Q S^T
            outs.append(torch.addcmul(within, read, to_out(Gamma_c)))
            Ue = (U_c.view(B, Hk, G, C, Ev) * Gamma_end_c.view(B, Hk, G, C, 1)).transpose(2, 3)
            S = torch.baddbmm(decayed_S, Ue.reshape(B * Hk, C, G * Ev).transpose(-1, -2), by_key(k_c))
    S = S.view(B, H, Ev, E)
    o = torch.stack(outs, dim=1)  # (B, T, C, Hk, G, Ev): fla's layout
    return o.reshape(B, T * C, H, Ev)[:, :N].transpose(1, 2), S


def scan(S: Tensor, M: Optional[Tensor], R: Tensor) -> Tuple[Tensor, Tensor]:
    """The scan over chunks of a diagonal transition, ``S_{c+1} = S_c M_c + R_c`` (``M_c`` factors
    broadcast against ``S``): ``S (B, H, X, Y)``, ``M``, ``R`` stacked over the ``T`` chunks at dim 2.
    Returns ``(S before each chunk (B, H, T, X, Y), S after the last)``. ``M`` None (no decay):
    ``S_c = S_0 + sum_{c' < c} R_c'``, a cumulative sum; else a loop over the chunks (a product of
    decays over many chunks would underflow, its inverse overflow). The additive rule's scan; the
    delta rule's, whose update reads the state, is written in ``chunkwise``."""
    if R.shape[2] == 0:
        return R.new_zeros(*S.shape[:2], 0, *S.shape[2:]), S
    if M is None:
        ends = S.unsqueeze(2) + R.cumsum(2)  # (B, H, T, X, Y): S after each chunk
        return torch.cat([S.unsqueeze(2), ends[:, :, :-1]], dim=2), ends[:, :, -1]
    starts = []
    for M_c, R_c in zip(M.unbind(2), R.unbind(2)):  # unbind: one stack in backward
        starts.append(S)
        S = S * M_c + R_c
    return torch.stack(starts, dim=2), S


def parallel(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None, *,
             delta: bool = False, state: Optional[Tensor] = None,
             resets: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The parallel form: ``chunkwise`` with one chunk of the whole sequence — for the additive rule
    RetNet's ``O = (Q K^T o D)(beta V) + (Q o Gamma) S0^T``, ``D_nm = exp(b_n - b_m)`` (``gamma^{n-m}``
    for a fixed decay) for ``n >= m``, else 0. ``O(N^2)`` memory."""
    return chunkwise(q, k, v, g, beta, delta=delta, state=state, resets=resets, chunk_size=max(1, k.shape[-2]))
