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
- grouped keys (grouped-query attention): ``grouped_attend`` (a kernel's call on keys of fewer
  heads than its queries), ``state_heads`` (a state between key heads and query heads);
- decoding: ``decoding`` (whether a causal call is a step of a few tokens on a state, which the
  recurrent kernels run token by token);
- the linear-attention core (Katharopoulos et al. 2020, eq. 5–6 and 16–20, see ``linear.py``):
  ``linear_attention`` of ``Features``, and ``split_key_mask``, shared by ``linear`` and
  ``performer``; its state ``LinearState`` lives with the other states in ``qkv/types.py``. The
  causal sums run on the chunkwise engine of the gated kernels (``qkv/_chunkwise.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks, _chunkwise, masks
from ..functional import masked_softmax, scaled_scores
from ..types import AttentionOutput, KVCache, LinearState  # LinearState: still importable from here
from . import _score_mods

__all__ = ["accumulation_dtype", "append_cache", "check_cache", "unfold_band", "band_blocks", "scatter_band",
           "to_frame", "from_frame", "shift_queries", "empty_output", "fused_blocks", "blocked_attend", "gathered_attend",
           "Features", "LinearState", "linear_attention", "split_key_mask", "finite_or_zero", "full_precision",
           "grouped_attend", "state_heads", "decoding"]


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


# ----------------------------------------------------------------------------- grouped keys


def state_heads(state: Any, R: int, H: int, grouped: bool = False) -> Any:
    """A ``KVCache`` or ``LinearState`` between key/value heads and query heads (groups of ``R``
    query heads, ``H`` in all): ``grouped`` keeps every ``R``-th head of each head-indexed tensor
    (``(B, H, ...)`` -> ``(B, H / R, ...)``: the heads of a group hold equal copies, as the keys were
    repeated), else repeats each ``R`` times (``(B, H / R, ...)`` -> ``(B, H, ...)``). Any other
    state is returned as it is (it is kept per query head)."""
    if R == 1 or not isinstance(state, (KVCache, LinearState)):
        return state
    changes = {}
    for f in dataclasses.fields(state):
        x = getattr(state, f.name)
        if not isinstance(x, Tensor) or x.dim() < 2 or f.name == "room":
            continue
        if grouped and x.shape[1] == H:
            changes[f.name] = x[:, ::R].contiguous()  # a copy: the stored state is an R-th of the repeated one
        elif not grouped and x.shape[1] == H // R:
            changes[f.name] = x.repeat_interleave(R, dim=1)
    if isinstance(state, KVCache):
        changes["room"] = None  # the spare room belongs to the repeated buffers
    return dataclasses.replace(state, **changes)


def decoding(state: Any, n_keys: int, need_weights: bool = False) -> bool:
    """Whether a causal call is a decoding step: it continues a ``state`` with at most
    ``_chunkwise.DECODE_KEYS`` new keys and asks for no weights — then the recurrent kernels run their
    recurrence token by token on the state (``_chunkwise.recurrent``) instead of the chunked form."""
    return state is not None and n_keys <= _chunkwise.DECODE_KEYS and not need_weights


def grouped_attend(attend: Callable[..., AttentionOutput], q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                   state: Any, need_weights: bool, return_state: bool, causal: bool) -> AttentionOutput:
    """``attend(q, k, v, mask, state, need_weights, return_state)`` — a kernel's own ``_attend`` on
    equal heads, whose query rows are independent given the keys — with ``k, v (B, G, N, E)`` of
    fewer heads than ``q (B, H, M, E)`` (grouped-query attention; query head ``h`` reads key head
    ``floor(h G / H)``).

    Not causal, with one key-padding row: the ``R = H / G`` query heads of a group are stacked as
    the rows of their key head, ``(B, G, R M, E)`` — keys and values are read once per key head.
    Decoding (causal, a state, at most ``_chunkwise.DECODE_KEYS`` new keys, no weights, no per-head
    mask): ``attend`` takes the queries of ``H`` heads against keys, values and state of ``G`` (the
    kernel's core reads each key head's state with its group of queries, ``linear_attention``).
    Otherwise causal (each row sees its own prefix) or a per-head mask: keys and values repeated to
    ``H`` heads, the state repeated in and kept per key head out (``state_heads``)."""
    B, H, M, E = q.shape
    G = k.shape[1]
    if G == H or (causal and decoding(state, k.shape[-2], need_weights) and (mask is None or mask.shape[1] == 1)):
        return attend(q, k, v, mask, state, need_weights, return_state)
    R = H // G
    if not causal and (mask is None or (mask.shape[1] == 1 and mask.shape[-2] == 1)):
        rows = q.unflatten(1, (G, R)).flatten(2, 3)  # (B, G, R M, E): a group's queries, head after head
        out = attend(rows, k, v, mask, None, need_weights, False)
        output = out.output.unflatten(2, (R, M)).flatten(1, 2)  # (B, H, M, Ev)
        weights = None if out.weights is None else out.weights.unflatten(2, (R, M)).flatten(1, 2)  # (B, H, M, N)
        return AttentionOutput(output, weights, None)
    k, v = k.repeat_interleave(R, dim=1), v.repeat_interleave(R, dim=1)  # (B, H, N, E)
    out = attend(q, k, v, mask, state_heads(state, R, H), need_weights, return_state)
    return out._replace(state=state_heads(out.state, R, H, grouped=True))


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


def blocked_attend(qb: Tensor, kb: Tensor, vb: Tensor, allowed: Tensor, dropout_p: float, need_weights: bool,
                   mods: Optional[nn.Module] = None, distance: Optional[Tensor] = None):
    """Dense attention inside each block: ``qb (B, H, ..., b, E)``, ``kb, vb (B, H, ..., W, E)``,
    ``allowed`` bool broadcastable to ``(B, H, ..., b, W)``. ``mods``: the kernel whose score knobs
    apply (``_score_mods``), ``distance`` the signed ``i - j`` broadcastable to ``(..., b, W)`` (ALiBi).
    Returns ``(out (..., b, Ev), weights (..., b, W) or None)``."""
    bias = None if mods is None else _score_mods.bias(mods, qb.shape[1], distance, qb.dtype, dims=qb.dim() - 2)
    if not need_weights and _score_mods.fusable(mods):
        # Every block is a small dense problem: the fused kernel takes them all at once.
        if bias is None:
            return fused_blocks(qb, kb, vb, allowed, dropout_p), None  # rows with no allowed key: zeros
        out = fused_blocks(qb, kb, vb, _score_mods.sdpa_bias(bias, allowed, qb.dtype), dropout_p)
        return out.masked_fill(~allowed.any(-1, keepdim=True), 0.0), None
    scores = scaled_scores(qb, kb, 1.0 / math.sqrt(qb.shape[-1]))  # (..., b, W), float32 for half types
    if mods is None:
        weights = masked_softmax(scores, allowed).to(vb.dtype)
    else:
        weights = _score_mods.softmax(mods, _score_mods.transform(mods, scores, bias), allowed).to(vb.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ vb, weights if need_weights else None


def gathered_attend(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, ok: Tensor, valid: Tensor, dropout_p: float,
                    need_weights: bool, mods: Optional[nn.Module] = None,
                    distance: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Every query its own list of keys — the incremental-decoding path of the sparse kernels.

    ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)``; ``idx (M, W)`` key indices
    (anything where ``ok`` is False), ``ok (M, W)`` bool; ``valid (B|1, H|1, N)`` key validity.
    A key must appear at most once in a row among the ``ok`` entries. Cost O(M W E): the pattern's
    size, not the sequence length. ``mods``, ``distance (M, W)``: as ``blocked_attend``.
    Returns ``(out (B, H, M, Ev), weights (B, H, M, N) or None)``.
    """
    B, H, M, _ = q.shape
    N = k.shape[-2]
    idx = idx.clamp(0, max(N - 1, 0))
    allowed = ok & valid[:, :, idx]  # (B|1, H|1, M, W)
    out, w = blocked_attend(q.unsqueeze(-2), k[:, :, idx], v[:, :, idx], allowed.unsqueeze(-2), dropout_p,
                            need_weights, mods, None if distance is None else distance.unsqueeze(-2))  # (B, H, M, 1, Ev), (B, H, M, 1, W)
    out = out.squeeze(-2)
    if not need_weights:
        return out, None
    w = w.squeeze(-2)  # (B, H, M, W)
    return out, w.new_zeros(B, H, M, N).scatter_add_(-1, idx.expand(B, H, M, idx.shape[-1]), w)


# ----------------------------------------------------------------------------- the linear-attention core


@dataclass(frozen=True)
class Features:
    """``phi(Q)`` and ``phi(K)`` as the linear-attention core takes them.

    q: ``(B, H, M, F)`` non-negative query features.
    k: ``(B, H, N, F)`` non-negative key features, or their logarithms when ``log_keys``: then the
        core exponentiates them after subtracting a maximum — over all keys (non-causal), or
        (causal) at each key position ``j`` the running maximum ``m_j`` of the keys ``<= j`` (the
        state's keys included, carried in ``LinearState.log_scale``). A causal query ``i`` reads
        its sums at the scale ``exp(-m_i)``, so its output, ``eps`` term included, depends on the
        keys ``<= i`` only: no later key reaches it, not even through rounding, and decoding one
        token at a time computes the same numbers.
    eps_scale: ``(B|1, H|1, M, 1)`` or None: ``eps * eps_scale`` is added to the denominator
        instead of ``eps`` (the features' normalisation folded into eps, see
        ``linear.direct_features``; causal: the queries' only).
    """

    q: Tensor
    k: Tensor
    log_keys: bool = False
    eps_scale: Optional[Tensor] = None


class _NonCausalLinear(torch.autograd.Function):
    """Eq. 5–6 over all keys, ``out = phi_q S / (phi_q Z + eps)``, and its gradient written out,
    so that autograd's generic graph — the two paths into each of ``phi_q`` and ``phi_k``, the
    division's backward — costs no extra passes. ``[S, Z]`` is one ``(F, Ev + 1)`` matrix, so that
    numerator and denominator come from one product, and so do their gradients:

        [num, den] = phi_q [S, Z],   G = [g / den, -sum_e(g * out) / den],
        d phi_q = G [S, Z]^T,        [dS, dZ] = phi_q^T G,
        d phi_k = v dS^T + 1 dZ^T,   dv = phi_k dS.

    ``eps``: ``(B|1, H|1, M, 1)`` tensor or float >= 0, added to the denominator; a row whose
    denominator is 0 (no key with a non-zero feature product: its numerator is 0 too) gives 0. A
    tensor ``eps`` gets its gradient too, ``d eps = G[..., Ev:]`` (``d out / d den = -out / den``)."""

    @staticmethod
    def forward(ctx, phi_q: Tensor, phi_k: Tensor, v: Tensor, eps) -> Tensor:
        Ev = v.shape[-1]
        S = phi_k.transpose(-1, -2) @ v  # (B, H, F, Ev): S = sum_j phi(K_j) V_j^T
        Z = phi_k.sum(dim=-2)  # (B, H, F): Z = sum_j phi(K_j)
        SZ = torch.cat([S, Z.unsqueeze(-1)], dim=-1)  # (B, H, F, Ev + 1)
        nd = phi_q @ SZ  # (B, H, M, Ev + 1): [phi(Q_i)^T S, phi(Q_i)^T Z]
        den = nd[..., Ev:] + eps  # (B, H, M, 1)
        den = den.masked_fill(den == 0, 1.0)
        out = nd[..., :Ev] / den  # (B, H, M, Ev): V'_i
        ctx.save_for_backward(phi_q, phi_k, v, SZ, den, out)
        ctx.eps_shape = eps.shape if isinstance(eps, Tensor) else None
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        phi_q, phi_k, v, SZ, den, out = ctx.saved_tensors
        Ev = v.shape[-1]
        G = g.new_empty(*g.shape[:-1], Ev + 1)  # (B, H, M, Ev + 1)
        torch.div(g, den, out=G[..., :Ev])
        G[..., Ev:] = (g * out).sum(-1, keepdim=True).div_(den).neg_()
        d_q = G @ SZ.transpose(-1, -2)  # (B, H, M, F)
        dSZ = phi_q.transpose(-1, -2) @ G  # (B, H, F, Ev + 1)
        dS = dSZ[..., :Ev]  # (B, H, F, Ev)
        d_k = (v @ dS.transpose(-1, -2)).add_(dSZ[..., Ev:].transpose(-1, -2))  # (B, H, N, F)
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
    return m.nan_to_num(0.0, 0.0, 0.0)  # one operation (decoding calls it a few times per layer and token)


def linear_attention(features: Features, v: Tensor, *, causal: bool, eps: float = 0.0,
                     key_mask: Optional[Tensor] = None, state: Optional[LinearState] = None,
                     chunk_size: int = 64, need_weights: bool = False
                     ) -> tuple[Tensor, Optional[Tensor], Optional[LinearState]]:
    """The linear-attention core shared by ``linear`` and ``performer`` (Katharopoulos et al.
    2020, eq. 5–6; causal, eq. 16–20):

        V'_i = phi(Q_i)^T S / (phi(Q_i)^T Z + eps),   S = sum_j phi(K_j) V_j^T,   Z = sum_j phi(K_j)

    over all keys, or (``causal``) over the keys ``j <= N - M + i`` (queries aligned to the end of
    the keys, after the ``state.length`` keys already summed in ``state``).

    Args:
        features: ``phi(Q) (B, H, M, F)`` and ``phi(K) (B, H, N, F)`` (``Features``: the keys
            possibly in log space, an ``eps_scale``). Decoding (``decoding``: causal, a state, a few
            new keys), ``phi(K)``, ``v`` and the state may have ``G`` heads dividing ``H``: the
            ``H / G`` consecutive query heads of a group read their key head's sums (grouped queries).
        v: ``(B, H, N, Ev)``.
        eps: added to the denominator; ``0`` divides exactly (a zero denominator gives zero).
            With log-space keys it is relative to the largest key feature (of all keys, or causal:
            of the keys ``<= i``). The maxima then carry gradient when ``eps > 0``: the ratio
            ``S / Z`` does not depend on them, the ``eps`` term does.
        key_mask: bool ``(B|1, H|1, N)``, True = may attend (masked keys get zero features).
        state: sums of earlier keys (causal only); None starts from zero.
        chunk_size: causal chunk length ``C``.
        need_weights: also return the implied ``(B, H, M, N)`` weights (O(M N); not with ``state``).
    Returns:
        ``(out (B, H, M, Ev) in v's dtype, weights or None, new LinearState (causal) or None)``.
    Cost: non-causal O(N F Ev); causal O(N C F + N F Ev), batched over all ``ceil(N / C)`` chunks
    but for the scan of chunk states (``_chunkwise.chunkwise``, the engine of the gated kernels);
    decoding, the recurrence token by token on the state (``_chunkwise.recurrent``), O(N F Ev).
    The numerical care is around the equation, not in it: sums in float32 for half inputs
    (``accumulation_dtype``), under autocast too (``full_precision``); log-space key features
    scaled by their (running) maximum — causal, the maximum's growth is the engine's decay (``_causal``).
    """
    _check_call(features, causal, state, need_weights)
    out_dtype, acc = v.dtype, accumulation_dtype(v.dtype)  # see accumulation_dtype: sums of N terms in float32
    with full_precision(v.device):
        phi_q, phi_k, v = features.q.to(acc), _masked_keys(features, key_mask, acc), v.to(acc)
        eps_q = eps if features.eps_scale is None or eps == 0 else eps * features.eps_scale  # (B|1, H|1, M, 1) or float
        if not causal:
            if features.log_keys:  # phi(K_j) / max_j phi(K_j) = exp(l_j - max l) <= 1
                phi_k = torch.exp(phi_k - finite_or_zero(_key_max(phi_k, eps > 0)))
            weights = _implied_weights(phi_q, phi_k, eps, eps_q) if need_weights else None
            out = _NonCausalLinear.apply(phi_q, phi_k, v, eps_q)  # V'_i over all keys (eq. 5–6)
            new_state = None
        else:
            out, weights, new_state = _causal(phi_q, phi_k, v, features.log_keys, eps, eps_q, key_mask, state,
                                              chunk_size, need_weights)
        return out.to(out_dtype), None if weights is None else weights.to(out_dtype), new_state


def _check_call(features: Features, causal: bool, state: Optional[LinearState], need_weights: bool) -> None:
    """The state a call may continue: a ``LinearState`` of the same kind of features, causal only,
    and no weights with it."""
    if causal and state is not None:
        if not isinstance(state, LinearState):
            raise TypeError(f"state must be a LinearState returned by this kernel, got {type(state).__name__}")
        if (state.log_scale is not None) != features.log_keys:
            raise ValueError("state was produced by a kernel with a different feature map (log_scale mismatch)")
    if need_weights and state is not None:
        raise ValueError("need_weights=True with a state: the weights over cached keys were summed away in "
                         "the state; call without state to see them")
    if not causal and state is not None:
        raise ValueError("state is only used by causal linear attention")
    H, G = features.q.shape[1], features.k.shape[1]
    if G != H and (not causal or not decoding(state, features.k.shape[-2], need_weights) or G == 0 or H % G):
        raise ValueError(f"phi(Q) of {H} heads against phi(K) of {G}: grouped queries are read only while decoding "
                         f"(causal, a state, at most {_chunkwise.DECODE_KEYS} new keys, no weights), with G dividing H")


def _masked_keys(features: Features, key_mask: Optional[Tensor], acc: torch.dtype) -> Tensor:
    """``phi(K)`` in ``acc`` with the masked keys' features 0 (their logarithms -inf)."""
    phi_k = features.k.to(acc)
    if key_mask is None:
        return phi_k
    keep = key_mask.unsqueeze(-1)  # (B|1, H|1, N, 1)
    return phi_k.masked_fill(~keep, float("-inf")) if features.log_keys else phi_k * keep


def _divide(nd: Tensor, eps: float, eps_q) -> Tensor:
    """``num / (den + eps)`` of ``nd = [num, den] (B, H, M, Ev + 1)``; with ``eps = 0`` a zero
    denominator gives 0 (it is 0 only where every feature product is 0 — a query that sees no key,
    a left-padded row's first ones — and then so is num) with a zero gradient: the division is by 1
    there, not by a clamped ``tiny``, whose ``1 / tiny`` in backward overflowed to inf and met the
    zero factors of the masked keys as NaN."""
    num, den = nd[..., :-1], nd[..., -1:]  # (B, H, M, Ev), (B, H, M, 1)
    if eps > 0:
        return num / (den + eps_q)
    return num / den.masked_fill(~(den > 0), 1.0)


def _implied_weights(phi_q: Tensor, phi_k: Tensor, eps: float, eps_q, scale: Optional[Tensor] = None) -> Tensor:
    """The weights ``(B, H, M, N)`` the output implies, ``phi(Q_i) . phi(K_j) / den_i``; ``scale``
    (causal): ``(…, M, N)`` factors by which query ``i`` reads key ``j`` (0 above the diagonal)."""
    a = phi_q @ phi_k.transpose(-1, -2)  # (B, H, M, N) unnormalised weights
    if scale is not None:
        a = a * scale
    den = a.sum(-1, keepdim=True)
    return a / (den + eps_q) if eps > 0 else a / torch.where(den > 0, den, torch.ones_like(den))


def _running_max(log_k: Tensor, state: Optional[LinearState], keep_grad: bool) -> Tensor:
    """``m (B, H, 1 + N)``: the running maximum of the key log-features, ``m[..., 0]`` the state's
    (-inf without one), ``m[..., 1 + j]`` after key ``j``. Detached unless ``keep_grad`` (``eps > 0``)."""
    B, H, N, Fdim = log_k.shape
    m0 = (state.log_scale.to(log_k.dtype).view(B, H, 1) if state is not None
          else log_k.new_full((B, H, 1), float("-inf")))
    top = ((log_k if keep_grad else log_k.detach()).amax(-1) if Fdim
           else log_k.new_full((B, H, N), float("-inf")))  # (B, H, N)
    return torch.cummax(torch.cat([m0, top], dim=-1), dim=-1).values


def _causal(phi_q: Tensor, phi_k: Tensor, v: Tensor, log_keys: bool, eps: float, eps_q,
            key_mask: Optional[Tensor], state: Optional[LinearState], chunk_size: int, need_weights: bool):
    """``linear_attention`` for causal queries: ``(out, weights, new state)`` in the accumulation dtype.

    The recurrence ``[S, Z]_j = [S, Z]_{j-1} + phi(K_j) [V_j, 1]^T`` is the chunkwise engine's
    additive rule (``_chunkwise.chunkwise``: masked products inside a chunk, one scan of chunk
    states) with the values ``[V, 1]``, so that one product gives numerator and normaliser. In log
    mode (``m`` not None) key ``j`` is exponentiated at its running maximum ``m_j`` and ``[S, Z]_j``
    is kept at that scale: ``[S, Z]_j = exp(m_{j-1} - m_j) [S, Z]_{j-1} + exp(l_j - m_j) [V_j, 1]^T``,
    the engine's decay ``g_j = m_{j-1} - m_j <= 0`` (``_scale_steps``) — query ``i`` reads everything
    at its own ``m_i``, every factor ``exp(m_j - m_i) <= 1``. Decoding (``decoding``) the recurrence
    runs token by token on the state (``_chunkwise.recurrent``), the state kept per key head ``G``
    and read by each group of ``H / G`` query heads."""
    B, M, Fdim = phi_q.shape[0], phi_q.shape[-2], phi_q.shape[-1]
    H, N, Ev = phi_k.shape[1], v.shape[-2], v.shape[-1]  # the key heads (the state's)
    m = _running_max(phi_k, state, eps > 0) if log_keys else None  # (B, H, 1 + N)
    if m is not None:
        phi_k = torch.exp(phi_k - finite_or_zero(m[..., 1:]).unsqueeze(-1))  # (B, H, N, F): exp(l_j - m_j) <= 1
    weights = _implied_weights(phi_q, phi_k, eps, eps_q, _causal_scale(m, M, N, phi_q.device)) if need_weights else None
    if M > N:
        # Without a state the kernel's caller returns zero rows for queries before the first key; with
        # one, such a query would need part of the keys already summed away in the state.
        raise ValueError(f"causal linear attention aligns queries to the end of the keys: got {M} queries for {N} new "
                         f"keys after a state of {state.length if state is not None else 0}; a query may not "
                         f"precede the new keys (its keys are summed away in the state)")
    _checks.positive_int("chunk_size", chunk_size)
    # [V, 1]: one product gives both the numerator S and the normaliser Z (its last column).
    v1 = torch.cat([v, v.new_ones(B, H, N, 1)], dim=-1)  # (B, H, N, Ev + 1)
    P = _state_sums(state, B, H, Fdim, Ev, v1)  # (B, H, F, Ev + 1): [S, Z] of the keys summed before
    # queries aligned to the end of the keys: zero queries at the N - M keys before the first, outputs dropped
    q_at_keys = F.pad(phi_q, (0, 0, N - M, 0)) if N > M else phi_q  # (B, H, N, F)
    g = None if m is None else _scale_steps(m)  # (B, H, N): the rescaling of [S, Z] from key to key
    # [phi(Q_i)^T S_i, phi(Q_i)^T Z_i] and [S, Z] after the last key; the engine's state is d_v x d_k: P^T
    if decoding(state, N, need_weights):  # a step of a few tokens: no chunks, the group's queries as rows
        nd, P_end = _chunkwise.recurrent(q_at_keys, phi_k, v1, g, state=P.transpose(-1, -2))
    else:
        nd, P_end = _chunkwise.chunkwise(q_at_keys, phi_k, v1, g, state=P.transpose(-1, -2), chunk_size=chunk_size)
    P = P_end.transpose(-1, -2)  # (B, H, F, Ev + 1)
    length = state.length if state is not None else 0
    new_state = LinearState(S=P[..., :Ev], Z=P[..., Ev], length=length + N,
                            log_scale=m[..., -1] if log_keys else None, summed=_summed(state, key_mask, N, v.device))
    return _divide(nd[:, :, N - M:], eps, eps_q), weights, new_state


def _scale_steps(m: Tensor) -> Tensor:
    """``g (B, H, N)``, ``g_j = m_{j-1} - m_j <= 0``: the log of the factor that takes ``[S, Z]`` from
    key ``j - 1``'s scale to key ``j``'s, for the running maxima ``m (B, H, 1 + N)`` (``m[..., 0]``
    the state's). The maxima are ``-inf`` until the first unmasked key; the sums are 0 there (so is
    every feature), so any finite step will do until the first finite maximum, and after it: 0 — the
    difference is then ``-inf`` or NaN, made 0 (every step finite and ``<= 0``; four operations, as
    decoding runs this once per layer and token)."""
    return finite_or_zero(m[..., :-1] - m[..., 1:])


def _causal_scale(m: Optional[Tensor], M: int, N: int, device: torch.device) -> Tensor:
    """The factor by which causal query ``i`` reads key ``j``: 1 for ``j <= N - M + i``, else 0;
    in log mode key ``j`` was scaled by ``exp(-m_j)`` and query ``i`` reads it at ``exp(-m_i)``:
    times ``exp(m_j - m_i) <= 1``."""
    allowed = torch.ones(M, N, dtype=torch.bool, device=device).tril(N - M)
    if m is None:
        return allowed
    mk, mq = m[..., 1:], m[..., 1 + N - M:]  # (B, H, N), (B, H, M)
    return torch.exp((mk.unsqueeze(-2) - finite_or_zero(mq).unsqueeze(-1)).masked_fill(~allowed, float("-inf")))


def _state_sums(state: Optional[LinearState], B: int, H: int, Fdim: int, Ev: int, v1: Tensor) -> Tensor:
    """``P = [S, Z] (B, H, F, Ev + 1)`` of the state (zero without one), in ``v1``'s dtype."""
    if state is None:
        return v1.new_zeros(B, H, Fdim, Ev + 1)
    if state.S.shape != (B, H, Fdim, Ev) or state.Z.shape != (B, H, Fdim):
        raise ValueError(f"state holds S {tuple(state.S.shape)} and Z {tuple(state.Z.shape)}, incompatible with "
                         f"(B, H, features, Ev) = {(B, H, Fdim, Ev)}")
    return torch.cat([state.S, state.Z.unsqueeze(-1)], dim=-1).to(v1.dtype)


def _summed(state: Optional[LinearState], key_mask: Optional[Tensor], N: int, device: torch.device) -> Optional[Tensor]:
    """``LinearState.summed`` after ``N`` new keys: which keys the sums hold (None: all)."""
    if key_mask is None and (state is None or state.summed is None):
        return None
    length = state.length if state is not None else 0
    before = (state.summed if state is not None and state.summed is not None
              else torch.ones(1, 1, length, dtype=torch.bool, device=device))
    now = key_mask if key_mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=device)
    lead = torch.broadcast_shapes(before.shape[:2], now.shape[:2])
    return torch.cat([before.expand(*lead, -1), now.expand(*lead, -1)], dim=-1)  # (B|1, H|1, length + N)


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
