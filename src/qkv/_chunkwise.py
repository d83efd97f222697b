"""The chunkwise engine of linear attention's descendants: one recurrence, its literal form and its
chunkwise-parallel form, shared by the kernels of ``qkv/attention/gated_linear.py`` (retention, GLA,
DeltaNet, Gated DeltaNet) and by ``qkv.functional``'s drop-ins for fla's gated delta rule.

The recurrence (the papers' layout: the state ``S_t`` is ``d_v x d_k``, ``o_t = S_t q_t``; fla and
transformers store its transpose ``d_k x d_v`` — the callers convert at their boundary)::

    additive:  S_t = S_{t-1} Diag(a_t) + beta_t v_t k_t^T                       (RetNet, GLA)
    delta:     S_t = S_{t-1} Diag(a_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T  (DeltaNet, Gated DeltaNet, KDA)

with ``a_t = exp(g_t)``: ``g`` is the log of the decay, one per head ``(B, H, N)`` (RetNet's fixed
``gamma``, Gated DeltaNet's ``alpha_t``) or one per key channel ``(B, H, N, E)`` (GLA, Kimi's KDA);
no ``g``: no decay (DeltaNet). No ``beta``: ``beta_t = 1``. ``resets (B, N)`` bool: True where a
document starts (packed sequences): the state is zeroed before that position's update.

Three forms, equal to rounding (tests/attention/test_gated_linear.py):

- ``recurrent``: the recurrence above, one token at a time (decoding; the literal reference);
- ``chunkwise``: chunks of ``C`` positions (Yang et al. 2023 for the decay, Yang et al. 2024 for
  the delta rule's WY/UT form). Inside a chunk, with ``b_t = sum_{s<=t} g_s`` (from the chunk's
  start), ``Gamma_t = exp(b_t)`` and the pairwise decays ``D_tj = exp(b_t - b_j)`` (``j <= t``,
  same document), the delta rule's written values ``u_t = beta_t (v_t - S_{t-1} Diag(a_t) k_t)``
  solve one unit lower-triangular system, ``(I + L) U = diag(beta) V - diag(beta) (K o Gamma) S0^T``
  with ``L_tj = beta_t (k_t . k_j)_D`` (``j < t``) — the UT transform ``T = (I + L)^{-1}``. Every
  chunk's ``U' = T diag(beta) V``, ``W = T diag(beta) (K o Gamma)`` and the intra-chunk products
  are batched over all chunks at once; only the scan over chunks is a loop —
  ``U = U' - W S_start^T``, ``S_end = S_start Diag(gamma_C) + U^T (K o Gamma_end)``, two products —
  and the outputs ``O = A U + (Q o Gamma) S_start^T`` (``A_tj = (q_t . k_j)_D``, ``j <= t``) are
  batched again. Every exponent is ``<= 0`` (``g <= 0``): nothing overflows, whatever the chunk length;
- ``parallel``: the chunkwise form with one chunk, which for the additive rule is RetNet's parallel
  form ``O = (Q K^T o D)(beta V) + (Q o Gamma) S0^T`` (Sun et al. 2023, eq. 5).

All functions take ``q, k (B, H, N, E)``, ``v (B, H, N, Ev)`` (one query per key: position ``t``
reads ``S_t``) in the dtype they compute in (callers pick float32 for half inputs) and return
``(o (B, H, N, Ev), S_N (B, H, Ev, E))``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["recurrent", "chunkwise", "parallel", "scan", "multiscale_log_decay", "l2_normalize", "check_gates",
           "resets_from_position_ids", "resets_from_cu_seqlens"]


# ----------------------------------------------------------------------------- inputs


def multiscale_log_decay(n_heads: int, device=None, dtype=torch.float32) -> Tensor:
    """``log gamma_h`` for RetNet's multi-scale retention, ``gamma_h = 1 - 2^{-5-h}``, ``h = 0 .. H-1`` -> ``(H,)``."""
    h = torch.arange(n_heads, device=device, dtype=torch.float64)
    return torch.log1p(-torch.exp2(-5.0 - h)).to(dtype)


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum x^2 + eps)`` over the last dim (fla's and transformers' ``l2norm``: a zero
    vector stays zero, a padded key writes nothing)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


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


def recurrent(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None, *,
              delta: bool = False, state: Optional[Tensor] = None,
              resets: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The recurrence, token by token (the module docstring): ``(o (B, H, N, Ev), S_N (B, H, Ev, E))``."""
    B, H, N, E = k.shape
    Ev = v.shape[-1]
    S = v.new_zeros(B, H, Ev, E) if state is None else state
    outs = []
    for t in range(N):
        if resets is not None:
            S = S * (~resets[:, t]).to(S.dtype).view(-1, 1, 1, 1)  # a new document: S_{t-1} = 0
        if g is not None:
            a = g[:, :, t].exp()  # (B, H) or (B, H, E)
            S = S * (a[..., None, None] if g.dim() == 3 else a.unsqueeze(-2))  # S_{t-1} Diag(a_t)
        k_t, v_t = k[:, :, t], v[:, :, t]  # (B, H, E), (B, H, Ev)
        if delta:
            v_t = v_t - (S @ k_t.unsqueeze(-1)).squeeze(-1)  # v_t - S' k_t: what k_t reads now is replaced
        if beta is not None:
            v_t = beta[:, :, t, None] * v_t
        S = S + v_t.unsqueeze(-1) * k_t.unsqueeze(-2)  # + beta_t (v_t - ...) k_t^T
        outs.append((S @ q[:, :, t].unsqueeze(-1)).squeeze(-1))  # o_t = S_t q_t
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, Ev)
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
        D = diff.masked_fill(~pair.unsqueeze(-1), float("-inf")).exp()
    else:
        D = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~pair, float("-inf")).exp()  # (B, H, T, C, C)
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
    per-channel decays: ``O(N C E)`` memory for the pairwise decays), ``N / C`` steps of the scan."""
    B, H, N, E = k.shape
    Ev = v.shape[-1]
    S = v.new_zeros(B, H, Ev, E) if state is None else state
    if N == 0:
        return v.new_zeros(B, H, 0, Ev), S
    C = max(1, min(chunk_size, N))
    T, pad = -(-N // C), -N % C  # chunks, padding of the last one (zero keys, no decay: no step)

    def chunked(x: Tensor) -> Tensor:
        return F.pad(x, (0, 0, 0, pad)).view(B, H, T, C, x.shape[-1])  # (B, H, T, C, *)

    qc, kc, vc = chunked(q), chunked(k), chunked(v)
    bc = None if beta is None else chunked(beta.unsqueeze(-1))  # (B, H, T, C, 1)
    D, Gamma, Gamma_end, gamma_C, channel = _decays(g, resets, B, H, T, C, pad, v)

    def decayed(x: Tensor, y: Tensor) -> Tensor:
        """``(x_t . y_j)_D = sum_c x_tc y_jc D_tj(c)`` -> ``(B, H, T, C, C)``."""
        if channel:
            return torch.einsum("bhntc,bhnjc,bhntjc->bhntj", x, y, D)
        return (x @ y.transpose(-1, -2)) * D

    A = decayed(qc, kc)  # (B, H, T, C, C): A_tj = (q_t . k_j)_D, j <= t
    Vb = vc if bc is None else vc * bc  # diag(beta) V
    K_end = kc * Gamma_end  # (B, H, T, C, E): k_j o exp(b_C - b_j)
    decay = gamma_C.unsqueeze(-2) if channel else gamma_C[..., None, None]  # S Diag(gamma_C): (B, H, T, 1|1, 1|E)
    if delta:
        # (I + L) [U' W] = diag(beta) [V  K o Gamma],  L_tj = beta_t (k_t . k_j)_D for j < t: the UT transform
        Kb = kc if bc is None else kc * bc
        L = decayed(Kb, kc).tril(-1)
        eye = torch.eye(C, dtype=L.dtype, device=L.device)
        rhs = torch.cat([Vb, Kb * Gamma], dim=-1)  # (B, H, T, C, Ev + E)
        U1, W = torch.linalg.solve_triangular(L + eye, rhs, upper=False, unitriangular=True).split([Ev, E], dim=-1)
        # the scan: the written values U = U' - W S_start^T need the state before the chunk, then
        # S_end = S_start Diag(gamma_C) + U^T K_end (2 C E Ev per chunk and head)
        starts, written = [], []
        for U1_c, W_c, K_c, decay_c in zip(U1.unbind(2), W.unbind(2), K_end.unbind(2), decay.unbind(2)):
            starts.append(S)
            U_c = U1_c - W_c @ S.transpose(-1, -2)  # (B, H, C, Ev)
            written.append(U_c)
            S = S * decay_c + U_c.transpose(-1, -2) @ K_c
        S_start, U = torch.stack(starts, dim=2), torch.stack(written, dim=2)  # (B, H, T, Ev, E), (B, H, T, C, Ev)
    else:
        U = Vb  # what each key writes, known before the scan
        S_start, S = scan(S, decay, U.transpose(-1, -2) @ K_end)  # S_end = S_start Diag(gamma_C) + V^T K_end
    o = A @ U + (qc * Gamma) @ S_start.transpose(-1, -2)  # (B, H, T, C, Ev): within the chunk + from the state before
    return o.view(B, H, T * C, Ev)[:, :, :N], S


def scan(S: Tensor, M: Tensor, R: Tensor) -> Tuple[Tensor, Tensor]:
    """The scan over chunks of a diagonal transition, ``S_{c+1} = S_c M_c + R_c`` (``M_c`` factors
    broadcast against ``S``): ``S (B, H, X, Y)``, ``M``, ``R`` stacked over the ``T`` chunks at dim 2.
    Returns ``(S before each chunk (B, H, T, X, Y), S after the last)``. The additive rule's scan here
    and linear attention's rescaled running sums (``attention/_ops.py``); the delta rule's, whose
    update reads the state, is written in ``chunkwise``."""
    starts = []
    for M_c, R_c in zip(M.unbind(2), R.unbind(2)):  # unbind: one stack in backward
        starts.append(S)
        S = S * M_c + R_c
    if not starts:
        return R.new_zeros(*S.shape[:2], 0, *S.shape[2:]), S
    return torch.stack(starts, dim=2), S


def parallel(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None, *,
             delta: bool = False, state: Optional[Tensor] = None,
             resets: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The parallel form: ``chunkwise`` with one chunk of the whole sequence — for the additive rule
    RetNet's ``O = (Q K^T o D)(beta V) + (Q o Gamma) S0^T``, ``D_nm = exp(b_n - b_m)`` (``gamma^{n-m}``
    for a fixed decay) for ``n >= m``, else 0. ``O(N^2)`` memory."""
    return chunkwise(q, k, v, g, beta, delta=delta, state=state, resets=resets, chunk_size=max(1, k.shape[-2]))
