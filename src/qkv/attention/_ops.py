"""Helpers that several attention kernels share, in one place below them all: kernels import
from here (downwards), never a helper from a sibling kernel's module (tests/test_import_graph.py).

- precision: ``accumulation_dtype`` (float32 sums for half inputs);
- key/value caches: ``append_cache`` (the ``KVCache`` of incremental decoding, bounded or not),
  ``check_cache``;
- bands of keys: ``unfold_band`` (the keys each query block sees, a strided view), ``band_blocks``,
  ``scatter_band`` (window, adaptive span, local, sparse);
- frames and gathered keys: ``to_frame``/``from_frame`` (queries aligned to the end of the keys,
  padded into one self-attention frame), ``shift_queries``, ``fused_blocks`` (SDPA over blocks),
  ``blocked_attend``,
  ``gathered_attend`` (every query its own list of keys: the decoding path of the sparse kernels),
  ``empty_output``;
- the linear-attention core (Katharopoulos et al. 2020, eq. 5–6 and 16–20, see ``linear.py``):
  ``linear_attention``, its state ``LinearState`` and ``split_key_mask``, shared by ``linear`` and
  ``performer``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks, masks
from ..functional import masked_softmax, scaled_scores
from ..types import AttentionOutput, KVCache

__all__ = ["accumulation_dtype", "append_cache", "check_cache", "unfold_band", "band_blocks", "scatter_band",
           "to_frame", "from_frame", "shift_queries", "empty_output", "fused_blocks", "blocked_attend", "gathered_attend",
           "LinearState", "linear_attention", "split_key_mask", "finite_or_zero", "full_precision"]


# ----------------------------------------------------------------------------- precision


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types, else ``dtype``: the running sums add up to N terms, which float16
    overflows (max 65504) and bfloat16 rounds away (8 mantissa bits) — float64 stays float64."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def full_precision(device: torch.device):
    """A context in which autocast is off on ``device``'s type (a null context when it is off
    already): for sums the kernel keeps in float32 on purpose (``accumulation_dtype``), which
    autocast would otherwise round back to bfloat16/float16 inside every product — and then a
    custom backward would meet float32 gradients against half saved tensors."""
    kind = device.type if isinstance(device, torch.device) else str(device)
    if torch.is_autocast_enabled(kind):
        return torch.autocast(device_type=kind, enabled=False)
    return contextlib.nullcontext()


def matmul_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16, else ``dtype``: for work that is matrix products (whose sums run in
    float32 inside the product on the CPU and on CUDA, only the result being rounded), bfloat16
    keeps its own type — it has float32's range and runs on the tensor cores — while float16's
    results can pass 65504."""
    return torch.float32 if dtype == torch.float16 else dtype


# ----------------------------------------------------------------------------- key/value caches


def append_cache(state: Optional[KVCache], k: Tensor, v: Tensor, keep: Optional[int] = None) -> tuple[Tensor, Tensor, KVCache]:
    """Concatenate cached keys/values with new ones ``(B, H, M, E)``.

    Returns ``(k_all, v_all, new_cache)``; with ``keep`` the new cache holds only the last ``keep``
    positions (a bounded cache for kernels that never look further back). Without autograd (a
    decoding loop) an unbounded cache grows into buffers of doubling capacity, written in place:
    O(M) per step instead of re-copying every cached position (``KVCache.room``).
    """
    if state is not None:
        if not isinstance(state, KVCache):
            raise TypeError(f"state must be a KVCache returned by this kernel, got {type(state).__name__}")
        if state.key.shape[:2] != k.shape[:2] or state.key.shape[-1] != k.shape[-1]:
            raise ValueError(f"state holds keys of shape {tuple(state.key.shape)}, incompatible with k {tuple(k.shape)}")
    offset = state.offset if state is not None else 0
    in_place = keep is None and not (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or (
        state is not None and (state.key.requires_grad or state.value.requires_grad))))
    if in_place:
        return _append_in_place(state, k, v, offset)
    if state is not None:
        k = torch.cat([state.key, k], dim=-2)  # (B, H, S + M, E)
        v = torch.cat([state.value, v], dim=-2)
    if keep is not None and k.shape[-2] > keep:
        trimmed = k.shape[-2] - keep
        cache = KVCache(k[..., trimmed:, :], v[..., trimmed:, :], offset + trimmed)
    else:
        cache = KVCache(k, v, offset)
    return k, v, cache


def _append_in_place(state: Optional[KVCache], k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor, KVCache]:
    """``append_cache`` without autograd: write ``k``, ``v`` after the cached positions, into the
    state's spare room when it is the state that wrote last, else into new buffers of twice the length."""
    S = state.length if state is not None else 0
    n = S + k.shape[-2]
    room = state.room if state is not None else None
    if (room is None or room[2][0] != S or n > room[0].shape[-2] or room[0].dtype != k.dtype
            or room[0].device != k.device or room[1].dtype != v.dtype):
        capacity = max(2 * n, 64)
        key = k.new_empty(*k.shape[:-2], capacity, k.shape[-1])  # (B, H, capacity, E)
        value = v.new_empty(*v.shape[:-2], capacity, v.shape[-1])
        if S:
            key[..., :S, :] = state.key
            value[..., :S, :] = state.value
        room = (key, value, [S])
    key, value, written = room
    key.narrow(-2, S, n - S).copy_(k)
    value.narrow(-2, S, n - S).copy_(v)
    written[0] = n
    k_all, v_all = key.narrow(-2, 0, n), value.narrow(-2, 0, n)  # (B, H, S + M, E) views
    return k_all, v_all, KVCache(k_all, v_all, offset, room=room)


def check_cache(name: str, state) -> None:
    """A state passed to ``name`` must be the ``KVCache`` it returned."""
    if not isinstance(state, KVCache):
        raise TypeError(f"state must be the KVCache attention {name!r} returned, got {type(state).__name__}")


# ----------------------------------------------------------------------------- bands of keys


def unfold_band(x: Tensor, start: int, step: int, width: int, n: int) -> Tensor:
    """Overlapping windows of ``x (..., L, E)`` along dim -2 (zeros / False outside ``[0, L)``).

    Window ``t`` holds positions ``start + t * step + [0, width)``. Returns ``(..., n, width, E)``
    — a strided view of one padded copy of ``x``, not ``n`` copies.
    """
    L = x.shape[-2]
    if n == 0:
        return x.new_zeros(*x.shape[:-2], 0, width, x.shape[-1])
    lo = max(0, -start)
    hi = max(0, start + (n - 1) * step + width - L)
    x = F.pad(x, (0, 0, lo, hi), value=False if x.dtype == torch.bool else 0.0)
    return x[..., start + lo:, :].unfold(-2, width, step)[..., :n, :, :].transpose(-1, -2)  # (..., n, width, E)


def band_blocks(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], left: int, right: int, b: int):
    """Query blocks and the key band each one sees, for kernels whose keys lie within a distance
    band of the query (queries aligned to the end of the keys).

    Query ``qi`` of block ``t`` sits at key position ``o + t b + qi`` (``o = N - M``) and sees the
    ``W = b + left + right`` keys ``o + t b - left + [0, W)``. Returns ``(q_blocks (B, H, nb, b, E),
    k_blocks (B, H, nb, W, E), v_blocks (B, H, nb, W, Ev), distance (b, W)`` (signed ``i - j``),
    ``valid (.., nb, b, W)`` (in the band, inside ``[0, N)``, allowed by the key-padding ``mask``),
    ``key_pos (nb, W))``.
    """
    B, H, M, E = q.shape
    N = k.shape[-2]
    o = N - M
    nb = -(-M // b)  # number of query blocks
    W = b + left + right  # keys seen by one query block
    q_blocks = F.pad(q, (0, 0, 0, nb * b - M)).view(B, H, nb, b, E)  # (B, H, nb, b, E)
    k_blocks = unfold_band(k, o - left, b, W, nb)  # (B, H, nb, W, E): keys o + t b - left + [0, W)
    v_blocks = unfold_band(v, o - left, b, W, nb)  # (B, H, nb, W, Ev)
    # query qi of block t is at o + t b + qi; key column kj at o + t b - left + kj: d = qi - kj + left
    qi = torch.arange(b, device=q.device).view(b, 1)
    kj = torch.arange(W, device=q.device).view(1, W)
    distance = qi - kj + left  # (b, W)
    band = (distance <= left) & (distance >= -right)  # (b, W), shared by all blocks
    key_pos = torch.arange(nb, device=q.device).view(nb, 1) * b + kj + (o - left)  # (nb, W)
    valid = band & ((key_pos >= 0) & (key_pos < N)).view(nb, 1, W)  # (nb, b, W)
    if mask is not None:
        kpm = unfold_band(mask[:, :, 0, :, None], o - left, b, W, nb)[..., 0]  # (B|1, H|1, nb, W)
        valid = valid & kpm.unsqueeze(-2)  # (B|1, H|1, nb, b, W)
    return q_blocks, k_blocks, v_blocks, distance, valid, key_pos


def scatter_band(weights: Tensor, key_pos: Tensor, N: int) -> Tensor:
    """Band weights ``(B, H, nb, b, W)`` back into ``(B, H, nb b, N)`` for inspection and plots
    (O(M N): on request only); keys outside ``[0, N)`` carry weight 0, so clamping their column
    changes nothing."""
    B, H, nb, b, W = weights.shape
    cols = key_pos.clamp(0, max(N - 1, 0)).view(1, 1, nb, 1, W).expand(B, H, nb, b, W)
    return weights.new_zeros(B, H, nb, b, N).scatter_add_(-1, cols, weights).view(B, H, nb * b, N)


# ----------------------------------------------------------------------------- frames and gathered keys


def to_frame(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], period: int):
    """Put queries aligned to the end of the keys into one self-attention frame of length ``L``.

    Query ``i`` of ``M`` sits at key position ``N - M + i``. The queries are padded at the front
    to the frame length; when ``M > N`` the keys are padded at the front too, by a multiple of
    ``period`` (the patterns here are invariant under such shifts), with invalid keys.

    Returns ``(q, k, v, valid, shift)``: frame tensors ``(B, H, L, E)``, key validity
    ``(B|1, H|1, L)`` bool (padding mask and frame padding) and the number of keys added in front.
    """
    M, N = q.shape[-2], k.shape[-2]
    shift = 0 if M <= N else -(-(M - N) // period) * period
    valid = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=k.device)
    if shift:
        k, v = F.pad(k, (0, 0, shift, 0)), F.pad(v, (0, 0, shift, 0))
        valid = F.pad(valid, (shift, 0), value=False)
    L = N + shift
    q = F.pad(q, (0, 0, L - M, 0))  # (B, H, L, E)
    return q, k, v, valid, shift


def from_frame(out: Tensor, weights: Optional[Tensor], M: int, shift: int) -> Tuple[Tensor, Optional[Tensor]]:
    """Undo ``to_frame``: the last ``M`` query rows, and the original key columns of the weights."""
    L = out.shape[-2]
    out = out[:, :, L - M:]
    if weights is not None:
        weights = weights[:, :, L - M:, shift:]
    return out, weights


def shift_queries(mod: masks.MaskMod, offset: int) -> masks.MaskMod:
    """``mod`` with query ``q_idx`` read at key position ``q_idx + offset`` (queries aligned to the end)."""
    if offset == 0:
        return mod

    def shifted(b, h, q_idx, kv_idx):
        return mod(b, h, q_idx + offset, kv_idx)

    return shifted


def empty_output(q: Tensor, v: Tensor, N: int, need_weights: bool) -> AttentionOutput:
    """Zero outputs ``(B, H, M, Ev)`` (and zero weights ``(B, H, M, N)`` when asked) for queries with no key to see."""
    B, H, M, _ = q.shape
    out = q.new_zeros(B, H, M, v.shape[-1])
    return AttentionOutput(out, q.new_zeros(B, H, M, N) if need_weights else None, None)


def fused_blocks(qb: Tensor, kb: Tensor, vb: Tensor, attn_mask: Tensor, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` of query blocks ``qb (..., n, b, E)`` to their keys
    ``kb (..., n, W, E)``, ``vb (..., n, W, Ev)`` -> ``(..., n, b, Ev)``; ``attn_mask`` (bool, True =
    may attend, or a float score bias) broadcastable to ``(..., n, b, W)``. With a bool mask, rows
    with no allowed key are zeros on every backend (design.md §2; the CPU kernels give them).

    SDPA's fused CPU kernel takes 4-D inputs with a 4-D mask only: a 5-D block layout, or a mask of
    fewer dimensions, goes to its unfused path, which keeps every block's weights for the backward
    pass (1.6x the time of the fused kernel over 16K positions in blocks of 128 against 384 keys).
    So the leading dimensions are folded into one, and the mask's only where it has them (a mask
    shared by every batch row and head stays one copy; a key-padding mask ``(B, 1, ...)``, shared by
    the heads, goes with the blocks into SDPA's batch and the heads into its head dimension)."""
    lead, (n, b, E), W, Ev = qb.shape[:-3], qb.shape[-3:], kb.shape[-2], vb.shape[-1]
    mask = attn_mask.reshape((1,) * max(0, qb.dim() - attn_mask.dim()) + tuple(attn_mask.shape))  # qb's dims
    if len(lead) == 2 and mask.shape[0] > 1 and mask.shape[1] == 1 and lead[1] > 1:
        B, H = lead
        q4, k4, v4 = (x.transpose(1, 2).reshape(B * n, H, *x.shape[-2:]) for x in (qb, kb, vb))
        mask = mask.transpose(1, 2).expand(B, n, 1, *mask.shape[-2:]).reshape(B * n, 1, *mask.shape[-2:])

        def unfold(out: Tensor) -> Tensor:
            return out.view(B, n, H, b, Ev).transpose(1, 2)
    else:
        rows = math.prod(lead)
        q4, k4, v4 = (x.reshape(rows, n, *x.shape[-2:]) for x in (qb, kb, vb))
        if all(d == 1 for d in mask.shape[:-3]):
            mask = mask.reshape(1, *mask.shape[-3:])  # (1, n|1, b|1, W|1)
        else:
            mask = mask.expand(*lead, *mask.shape[-3:]).reshape(rows, *mask.shape[-3:])

        def unfold(out: Tensor) -> Tensor:
            return out.view(*lead, n, b, Ev)
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, dropout_p=dropout_p)
    if mask.dtype == torch.bool and out.device.type != "cpu":
        out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # not every fused backend zeroes them
    return unfold(out)


def blocked_attend(qb: Tensor, kb: Tensor, vb: Tensor, allowed: Tensor, dropout_p: float, need_weights: bool):
    """Dense attention inside each block: ``qb (..., b, E)``, ``kb, vb (..., W, E)``, ``allowed``
    bool broadcastable to ``(..., b, W)``. Returns ``(out (..., b, Ev), weights (..., b, W) or None)``."""
    if not need_weights:
        # Every block is a small dense problem: the fused kernel takes them all at once.
        return fused_blocks(qb, kb, vb, allowed, dropout_p), None  # rows with no allowed key: zeros
    scores = scaled_scores(qb, kb, 1.0 / math.sqrt(qb.shape[-1]))  # (..., b, W), float32 for half types
    weights = masked_softmax(scores, allowed).to(vb.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ vb, weights


def gathered_attend(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, ok: Tensor, valid: Tensor, dropout_p: float,
                    need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """Every query its own list of keys — the incremental-decoding path of the sparse kernels.

    ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)``; ``idx (M, W)`` key indices
    (anything where ``ok`` is False), ``ok (M, W)`` bool; ``valid (B|1, H|1, N)`` key validity.
    A key must appear at most once in a row among the ``ok`` entries. Cost O(M W E): the pattern's
    size, not the sequence length. Returns ``(out (B, H, M, Ev), weights (B, H, M, N) or None)``.
    """
    B, H, M, _ = q.shape
    N = k.shape[-2]
    idx = idx.clamp(0, max(N - 1, 0))
    allowed = ok & valid[:, :, idx]  # (B|1, H|1, M, W)
    out, w = blocked_attend(q.unsqueeze(-2), k[:, :, idx], v[:, :, idx], allowed.unsqueeze(-2),
                             dropout_p, need_weights)  # (B, H, M, 1, Ev), (B, H, M, 1, W)
    out = out.squeeze(-2)
    if not need_weights:
        return out, None
    w = w.squeeze(-2)  # (B, H, M, W)
    return out, w.new_zeros(B, H, M, N).scatter_add_(-1, idx.expand(B, H, M, idx.shape[-1]), w)


# ----------------------------------------------------------------------------- the linear-attention core


@dataclass(frozen=True)
class LinearState:
    """The running sums of causal linear attention (an RNN state).

    S: ``(B, H, E', Ev)`` = ``sum_j phi(K_j) V_j^T`` over the ``length`` keys seen.
    Z: ``(B, H, E')`` = ``sum_j phi(K_j)``.
    length: number of key positions summed (masks passed later cover these plus the new keys).
    log_scale: ``(B, H)`` or None. When the key features are given in log space (Performer),
        ``S`` and ``Z`` are stored divided by ``exp(log_scale)`` (the running maximum of the key
        log-features) so that they never overflow; the factor cancels in ``S / Z``.
    summed: ``(B|1, H|1, length)`` bool or None: which of the keys were summed (a key masked when
        it was fed was not); None when every key was. A mask given later over the cached keys must
        say the same (``split_key_mask``): the sums cannot forget a key or take one back.
    S and Z are float32 for half-precision inputs (see ``accumulation_dtype``).
    """

    S: Tensor
    Z: Tensor
    length: int = 0
    log_scale: Optional[Tensor] = None
    summed: Optional[Tensor] = None


class _NonCausalLinear(torch.autograd.Function):
    """``out = phi_q S / (phi_q z + eps)`` with ``S = phi_k^T v``, ``z = phi_k^T 1``, and its gradient
    written out, so that autograd's generic graph — the two paths into each of ``phi_q`` and
    ``phi_k``, the division's backward — costs no extra passes. ``[S, z]`` is one ``(F, Ev + 1)``
    matrix, so that numerator and denominator come from one product, and so do their gradients:

        [num, den] = phi_q [S, z],   G = [g / den, -sum_e(g * out) / den],
        d phi_q = G [S, z]^T,        [dS, dz] = phi_q^T G,
        d phi_k = v dS^T + 1 dz^T,   dv = phi_k dS.

    ``eps``: ``(B|1, H|1, M, 1)`` tensor or float >= 0, added to the denominator; a row whose
    denominator is 0 (no key with a non-zero feature product: its numerator is 0 too) gives 0. A
    tensor ``eps`` gets its gradient too, ``d eps = G[..., Ev:]`` (``d out / d den = -out / den``)."""

    @staticmethod
    def forward(ctx, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps) -> Tensor:
        Ev = v.shape[-1]
        Sz = torch.cat([phi_k.transpose(-1, -2) @ v, phi_k.sum(dim=-2).unsqueeze(-1)], dim=-1)  # (B, H, F, Ev + 1)
        nd = phi_q @ Sz  # (B, H, M, Ev + 1): [numerator, denominator]
        den = nd[..., Ev:] + eps  # (B, H, M, 1)
        den = den.masked_fill(den == 0, 1.0)
        out = nd[..., :Ev] / den  # (B, H, M, Ev)
        ctx.save_for_backward(phi_q, phi_k, v, Sz, den, out)
        ctx.eps_shape = eps.shape if isinstance(eps, Tensor) else None
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        phi_q, phi_k, v, Sz, den, out = ctx.saved_tensors
        Ev = v.shape[-1]
        G = g.new_empty(*g.shape[:-1], Ev + 1)  # (B, H, M, Ev + 1)
        torch.div(g, den, out=G[..., :Ev])
        G[..., Ev:] = (g * out).sum(-1, keepdim=True).div_(den).neg_()
        d_q = G @ Sz.transpose(-1, -2)  # (B, H, M, F)
        dSz = phi_q.transpose(-1, -2) @ G  # (B, H, F, Ev + 1)
        dS = dSz[..., :Ev]  # (B, H, F, Ev)
        d_k = (v @ dS.transpose(-1, -2)).add_(dSz[..., Ev:].transpose(-1, -2))  # (B, H, N, F)
        d_v = phi_k @ dS  # (B, H, N, Ev)
        d_eps = G[..., Ev:].sum_to_size(ctx.eps_shape) if ctx.needs_input_grad[3] else None
        return d_q, d_k, d_v, d_eps


def _key_max(x: Tensor, keep_grad: bool = False) -> Tensor:
    """``max`` of ``x (B, H, L, F)`` over positions and features, ``(B, H, 1, 1)``; -inf when there
    is no entry. Detached unless ``keep_grad``: the factor it gives cancels in ``S / Z`` when
    ``eps = 0``, not in the ``eps`` term."""
    if x.shape[-2] == 0 or x.shape[-1] == 0:
        return x.new_full((*x.shape[:-2], 1, 1), float("-inf"))
    return (x if keep_grad else x.detach()).amax(dim=(-2, -1), keepdim=True)


def finite_or_zero(m: Tensor) -> Tensor:
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
            of the keys ``<= i``). The maxima then carry gradient when ``eps > 0``: the ratio
            ``S / Z`` does not depend on them, the ``eps`` term does.
        eps_scale: ``(B|1, H|1, M, 1)`` or None: ``eps * eps_scale`` is added instead (the features'
            normalisation folded into eps, see ``direct_features``; causal: the queries' only).
        need_weights: also return the implied ``(B, H, M, N)`` weights (O(M N); not with ``state``).
    Returns:
        ``(out (B, H, M, Ev) in v's dtype, weights or None, new LinearState (causal) or None)``.
    Cost: non-causal O(N F Ev); causal O(N C F + N F Ev) in ``ceil(M / C)`` chunk steps.
    Under autocast the sums still run in the accumulation dtype (``full_precision``).
    """
    with full_precision(v.device):
        return _linear_attention(phi_q, phi_k, v, causal=causal, chunk_size=chunk_size, key_mask=key_mask,
                                 state=state, log_keys=log_keys, eps=eps, need_weights=need_weights,
                                 eps_scale=eps_scale)


def _linear_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, *, causal: bool, chunk_size: int,
                      key_mask: Optional[Tensor], state: Optional[LinearState], log_keys: bool, eps: float,
                      need_weights: bool, eps_scale: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor], Optional[LinearState]]:
    """``linear_attention`` with autocast off."""
    B, H, M, Fdim = phi_q.shape
    N, Ev = v.shape[-2], v.shape[-1]
    out_dtype = v.dtype
    acc = accumulation_dtype(v.dtype)  # see accumulation_dtype: sums of N terms in float32
    phi_q, phi_k, v = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    if key_mask is not None:
        keep = key_mask.unsqueeze(-1)  # (B|1, H|1, N, 1)
        phi_k = phi_k.masked_fill(~keep, float("-inf")) if log_keys else phi_k * keep
    eps_q = eps if eps_scale is None else eps * eps_scale  # (B|1, H|1, M, 1) or float
    through_max = eps > 0  # the eps term depends on the maxima the features are scaled by: gradient through them

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
        top = ((phi_k if through_max else phi_k.detach()).amax(-1) if Fdim
               else phi_k.new_full((B, H, N), float("-inf")))  # (B, H, N)
        m = torch.cummax(torch.cat([m0, top], dim=-1), dim=-1).values  # (B, H, 1 + N)
        phi_k = torch.exp(phi_k - finite_or_zero(m[..., 1:]).unsqueeze(-1))  # (B, H, N, F): exp(l_j - m_j) <= 1

    weights = None
    if need_weights:
        if state is not None:
            raise ValueError("need_weights=True with a state: the weights over cached keys were summed away in "
                             "the state; call without state to see them")
        fk = phi_k
        if log_keys and not causal:
            fk = torch.exp(fk - finite_or_zero(_key_max(fk, through_max)))
        a = phi_q @ fk.transpose(-1, -2)  # (B, H, M, N) unnormalised weights
        if causal:
            allowed = torch.ones(M, N, dtype=torch.bool, device=a.device).tril(N - M)
            if m is None:
                a = a * allowed
            else:  # key j was scaled by exp(-m_j); query i reads it at exp(-m_i): times exp(m_j - m_i) <= 1
                mk, mq = m[..., 1:], m[..., 1 + N - M:]  # (B, H, N), (B, H, M)
                a = a * torch.exp((mk.unsqueeze(-2) - finite_or_zero(mq).unsqueeze(-1)).masked_fill(~allowed, float("-inf")))
        den = a.sum(-1, keepdim=True)
        weights = (a / (den + eps_q) if eps > 0 else a / torch.where(den > 0, den, torch.ones_like(den))).to(out_dtype)

    if not causal:
        if state is not None:
            raise ValueError("state is only used by causal linear attention")
        if log_keys:
            phi_k = torch.exp(phi_k - finite_or_zero(_key_max(phi_k, through_max)))
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
        mk_safe = finite_or_zero(mk)
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
    summed = None
    if key_mask is not None or (state is not None and state.summed is not None):
        before = (state.summed if state is not None and state.summed is not None
                  else torch.ones(1, 1, length, dtype=torch.bool, device=v.device))
        now = key_mask if key_mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=v.device)
        lead = torch.broadcast_shapes(before.shape[:2], now.shape[:2])
        summed = torch.cat([before.expand(*lead, -1), now.expand(*lead, -1)], dim=-1)  # (B|1, H|1, length + N)
    new_state = LinearState(S=P[..., :Ev], Z=P[..., Ev], length=length + N,
                            log_scale=m[..., -1] if log_keys else None, summed=summed)
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


def split_key_mask(mask: Optional[Tensor], state: Optional[LinearState], N: int, cached: int) -> Optional[Tensor]:
    """The key-padding mask ``(B|1, H|1, N)`` of the new keys from a validated ``(B|1, H|1, 1, cached + N)``
    mask. Cached keys are already summed into the state (or left out, masked when fed: ``state.summed``),
    so the mask must say of them what it said then — a left-padded batch's mask, given again at
    every decoding step, does."""
    if mask is None:
        return None
    kpm = mask[:, :, 0, :]  # (B|1, H|1, cached + N)
    if cached and not torch.compiler.is_compiling():
        summed = state.summed if state is not None else None
        before = kpm[..., :cached]
        if not bool((before.all() if summed is None else (before == summed).all())):
            raise ValueError(f"mask changes which of the {cached} keys already summed into the state are masked; a "
                             f"linear-attention state cannot forget a key or take one back — mask each key when it "
                             f"is first fed, and the same way after")
    return kpm[..., cached:]
