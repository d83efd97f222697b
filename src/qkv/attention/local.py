"""Image Transformer local self-attention, 1D and 2D (Parmar et al. 2018, "Image Transformer",
arXiv:1802.05751, Section 3.2 and Figure 2).

1D local: the raster-scanned sequence is cut into query blocks of ``l_q = block`` positions;
block ``t`` (positions ``[t l_q, (t + 1) l_q)``) attends to the memory block made of itself and
the ``l_m = memory`` positions before it; causal (the paper's decoder), only up to itself::

    out_i = sum_{j in A_i} softmax_j(q_i . k_j / sqrt(d)) v_j,
    A_i = {j : floor(i / l_q) l_q - l_m <= j <= i}                      (qkv.masks.local_1d)

(``causal=False``: the whole block, ``j < floor(i / l_q) l_q + l_q``, as an encoder would use it).

2D local: the image ``(H, W)`` is cut into ``(b_h, b_w)`` query rectangles; a rectangle attends to
the keys of itself extended ``top`` rows up and ``left`` / ``right`` columns sideways; causal, only
to keys earlier in generation order ("causal within the memory")         (qkv.masks.local_2d).

Cost. 1D: each query block is a dense ``(l_q, l_q + l_m)`` problem, gathered with
``Tensor.unfold`` — O(n (l_q + l_m) d) time and O(n (l_q + l_m)) memory; the fused
``F.scaled_dot_product_attention`` runs all blocks at once when no weights are asked. 2D: each
rectangle gathers its ``(top + b_h) (left + b_w + right)`` memory pixels with index tensors built
once per image size — O(n (top + b_h)(left + b_w + right) d). No ``(n, n)`` tensor is built
unless ``need_weights=True`` asks for the dense weights (for plots).

Deviations and choices:

* The paper's patterns are causal (the Image Transformer decoder), the kernels' default;
  ``causal=False`` gives the same neighbourhoods without the causal cut (not in the paper), so
  that the kernels also serve encoders (``kernel.causal`` says which).
* The paper's 2D memory is ``top`` rows above plus the query rows, ``left``/``right`` columns
  sideways; blocks at the image border are clipped to the image, not padded with pixels.
* The 2D kernel reads a key sequence of length ``N <= H * W`` as the first ``N`` pixels of its scan
  (block-raster order, see ``Local2DAttention``: a partly generated image); causal, its outputs
  equal those of the whole image at the same positions. ``N > H * W`` raises ValueError. Queries may be fewer than
  the keys (aligned to the end of the keys).
* Incremental decoding (causal): both keep a bounded ``KVCache`` of the positions later queries
  can still reach (1D: the last ``(t mod l_q) + l_m``; 2D: a band of about ``(top + b_h) W`` pixels),
  so a token costs O(window) whatever its position; feeding a sequence in pieces gives the same
  outputs as one pass.

The helpers these kernels share with ``sparse.py`` (``unfold_band``: the band of keys a query block
sees; ``to_frame``/``from_frame``: queries aligned to the end of the keys, padded into one
self-attention frame; ``gathered_attend``: the decoding path) live in ``_ops.py``. On CUDA both
kernels hand their ``qkv.masks`` predicate to FlexAttention instead (``qkv.attention.flex``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks, masks
from ..registry import register
from ..types import AttentionOutput, KVCache
from . import flex
from ._ops import (append_cache, blocked_attend, check_cache, empty_output, from_frame, gathered_attend,
                   shift_queries, to_frame, unfold_band)
from .base import AttentionKernel, clamp_knob

__all__ = ["Local1DAttention", "Local2DAttention"]


# ----------------------------------------------------------------------------- blocked helpers


# ----------------------------------------------------------------------------- 1D


@register("attention", "local-1d", "local1d", "image-local-1d")
class Local1DAttention(AttentionKernel):
    """Image Transformer 1D local attention (Parmar et al. 2018): query blocks see their block plus `memory` earlier positions; incremental decoding.

    Causal (generation): ``A_i = {j : floor(i / b) b - m <= j <= i}``; bidirectional
    (``causal=False``): the whole block, ``floor(i / b) b - m <= j < floor(i / b) b + b``
    (``qkv.masks.local_1d``); exact softmax over ``A_i``.

    Args:
        block: query block length ``l_q = b > 0``.
        memory: ``l_m = m >= 0`` positions before each block added to its keys.
        causal: generation order (the paper's decoder) or the unmasked neighbourhood.
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``;
    queries aligned to the end of the keys. Cost: O(N (b + m) E) time and O(N (b + m)) memory.
    Incremental decoding (causal) keeps a ``KVCache`` of the last ``(t mod b) + m`` positions —
    what the next queries can still reach — so a token costs O((b + m) E), whatever its position.
    """

    anchored = True  # blocks at multiples of the block length
    supports_mask = "key_padding"
    context_parallel = "halo"  # qkv.parallel: the memory keys before a shard from the neighbour
    static_length = "its query blocks and their memory are cut from the length (the count, the last block's padding)"
    supports_state = True
    state_type = KVCache

    def __init__(self, *, block: int, memory: int, causal: bool = True, dropout: float = 0.0) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.block = _checks.positive_int("block", block)
        self.memory = _checks.positive_int("memory", memory, allow_zero=True)

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """Query blocks of ``max_len / 8`` in ``[1, 128]`` positions, each with as many before it."""
        block = clamp_knob(max_len // 8, 1, 128)
        return {**super().default_knobs(max_len, n_heads, d_head), "block": block, "memory": block}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"block": (1, 2, 3, 4), "memory": (0, 1, 2, 3)}

    def extra_repr(self) -> str:
        return f"block={self.block}, memory={self.memory}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return shift_queries(masks.local_1d(self.block, self.memory, causal=self.causal), n_keys - n_queries)

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        b, m = self.block, self.memory
        cache = None
        if state is not None or return_state:
            if state is not None:
                check_cache(self.registry_name, state)
            total = (state.offset + state.length if state is not None else 0) + k.shape[-2]  # positions seen
            first = state.offset if state is not None else 0  # position of k_all[0]
            # the next query (position total) reaches back to its block's start minus the memory
            k, v, cache = append_cache(state, k, v, keep=total % b + m)
        N = k.shape[-2]
        if M == 0 or N == 0:
            return empty_output(q, v, N, need_weights)._replace(state=cache)
        dropout_p = self.dropout if self.training else 0.0
        if state is None and not return_state and M <= N and flex.usable(q, v, need_weights, dropout_p):
            # CUDA: FlexAttention visits only the key blocks of each query block and its memory
            out = flex.attend_pattern(q, k, v, self.pattern(M, N), mask, (self.registry_name, self.extra_repr()))
            return AttentionOutput(out, None, None)
        if state is not None:
            # Decoding: query i at position p = total - M + i sees positions floor(p / b) b - m .. p.
            p = torch.arange(total - M, total, device=q.device).view(M, 1)
            pos = torch.div(p, b, rounding_mode="floor") * b - m + torch.arange(b + m, device=q.device)  # (M, b + m)
            ok = (pos >= first) & (pos <= p)
            valid = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=q.device)
            out, weights = gathered_attend(q, k, v, pos - first, ok, valid, dropout_p, need_weights)
            return AttentionOutput(out, weights, cache)
        q, k, v, valid, shift = to_frame(q, k, v, mask, period=b)
        L = k.shape[-2]
        nb = -(-L // b)  # query blocks
        Wk = b + m  # keys seen by one block: positions t b - m + [0, b + m)
        q_blocks = F.pad(q, (0, 0, 0, nb * b - L)).view(B, H, nb, b, E)  # (B, H, nb, b, E)
        k_blocks = unfold_band(k, -m, b, Wk, nb)  # (B, H, nb, Wk, E)
        v_blocks = unfold_band(v, -m, b, Wk, nb)  # (B, H, nb, Wk, Ev)

        # Query qi of block t is at t b + qi, key column kj at t b - m + kj: causal is kj <= qi + m.
        qi = torch.arange(b, device=q.device).view(b, 1)
        kj = torch.arange(Wk, device=q.device).view(1, Wk)
        # (b, Wk), shared by all blocks; the bidirectional form sees its whole block
        band = kj <= qi + m if self.causal else torch.ones(b, Wk, dtype=torch.bool, device=q.device)
        key_ok = unfold_band(valid.unsqueeze(-1), -m, b, Wk, nb).squeeze(-1)  # (B|1, H|1, nb, Wk)
        allowed = band & key_ok.unsqueeze(-2)  # (B|1, H|1, nb, b, Wk)

        out, weights = blocked_attend(q_blocks, k_blocks, v_blocks, allowed, dropout_p, need_weights)
        out = out.reshape(B, H, nb * b, v.shape[-1])[:, :, :L]  # (B, H, L, Ev)
        dense = None
        if need_weights:
            # Scatter the blocks back into (B, H, L, L) for inspection and plots (O(L^2): on request only).
            cols = (torch.arange(nb, device=q.device).view(nb, 1, 1) * b - m + kj.view(1, 1, Wk)).clamp(0, L - 1)
            dense = weights.new_zeros(B, H, nb, b, L)
            dense.scatter_add_(-1, cols.expand(B, H, nb, b, Wk), weights)  # clamped columns carry weight 0
            dense = dense.view(B, H, nb * b, L)[:, :, :L]
        out, dense = from_frame(out, dense, M, shift)
        return AttentionOutput(out, dense, cache)


# ----------------------------------------------------------------------------- 2D


def _int_tuple(name: str, value, n: int, what: str) -> Tuple[int, ...]:
    """An int (repeated ``n`` times) or a sequence of ``n`` non-negative ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * n
    if not isinstance(value, (tuple, list)) or len(value) != n:
        raise ValueError(f"{name} must be {what} (or one int for all), got {value!r}")
    return tuple(int(_checks.positive_int(f"{name}[{i}]", x, allow_zero=True)) for i, x in enumerate(value))


class _Blocks2D(NamedTuple):
    """Index tables of a ``local-2d`` kernel, in block-raster sequence positions (``P = H W`` is a
    dummy slot outside the image)."""

    q_idx: Tensor  # (n_blk, Q) query positions of each block
    k_idx: Tensor  # (n_blk, K) memory positions of each block
    allowed: Tensor  # (n_blk, Q, K) the pattern inside each block's frame
    slot: Tensor  # (P,) where each position's query sits in the flattened (n_blk * Q) blocks
    block_of: Tensor  # (P,) the block of each position
    first_needed: Tensor  # (P + 1,) the earliest position any query at or after t can reach


@register("attention", "local-2d", "local2d", "image-local-2d")
class Local2DAttention(AttentionKernel):
    """Image Transformer 2D local attention (Parmar et al. 2018): rectangular query blocks see a memory rectangle extended up, left and right, in block-raster order; incremental decoding.

    The sequence is the image scanned in the paper's generation order, **block-raster**
    (``qkv.masks.block_raster_order``: query blocks in raster order, raster order inside a block).
    A query at pixel ``(r, c)`` of the block with origin ``(r0, c0)`` sees the pixels ``(r', c')`` with
    ``r0 - top <= r' < r0 + bh`` and ``c0 - left <= c' < c0 + bw + right``; causal (generation)
    keeps those generated before it in block-raster order (``qkv.masks.local_2d``); exact softmax.

    Args:
        image_size: ``(H, W)``; the key sequence is the block-raster scan of the image, length
            ``<= H * W`` (a shorter sequence is the first pixels of the scan). Longer: ValueError.
        block: ``(bh, bw)`` query rectangle (one int for a square), clipped at the image border.
        memory: ``(top, left, right)`` margins of the memory rectangle (one int for all three).
        causal: generation order (the paper's decoder) or the unmasked rectangle.
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` with ``M <= N <= H * W``
    (queries aligned to the end of the keys) -> ``(B, H, M, Ev)``. Cost: O(N (top + bh)(left + bw + right) E).
    Incremental decoding (causal) keeps a ``KVCache`` from the earliest position a later query can
    reach (about ``(top + bh) W`` pixels: a band of rows, not the image); a token costs
    O((top + bh)(left + bw + right) E).
    """

    anchored = True  # blocks at multiples of the block length
    supports_mask = "key_padding"
    supports_state = True
    state_type = KVCache

    def __init__(self, *, image_size: Tuple[int, int], block: Union[int, Tuple[int, int]] = (8, 8),
                 memory: Union[int, Tuple[int, int, int]] = (0, 0, 0), causal: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__(causal=causal, dropout=dropout)
        if not isinstance(image_size, (tuple, list)) or len(image_size) != 2:
            raise ValueError(f"image_size must be a pair (H, W), got {image_size!r}")
        self.image_size = (_checks.positive_int("image_size[0]", image_size[0]),
                           _checks.positive_int("image_size[1]", image_size[1]))
        self.block = _int_tuple("block", block, 2, "a pair (bh, bw)")
        if min(self.block) == 0:
            raise ValueError(f"block must be positive, got {self.block!r}")
        self.memory = _int_tuple("memory", memory, 3, "a triple (top, left, right)")
        self._index_cache: Dict[torch.device, _Blocks2D] = {}

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """The square image of ``max_len`` pixels (else the narrowest ``H x W >= max_len`` with
        ``W = ceil(sqrt(max_len))``), query rectangles of a quarter of its rows by half its columns,
        a memory of a quarter of the rows above and columns to either side."""
        W = math.isqrt(max_len - 1) + 1 if max_len > 1 else 1  # ceil(sqrt(max_len))
        H = -(-max_len // W)
        rows, cols = max(1, H // 4), max(1, W // 4)
        return {**super().default_knobs(max_len, n_heads, d_head), "image_size": (H, W),
                "block": (rows, max(1, W // 2)), "memory": (rows, cols, cols)}

    @classmethod
    def knobs(cls, length: int, n_heads: int, d_head: int, given: Optional[Mapping[str, Any]] = None, *,
              image_size: Optional[Tuple[int, int]] = None, with_heads: bool = False) -> Dict[str, Any]:
        """As every kernel's (:meth:`AttentionKernel.knobs`); on an image (``image_size=(H, W)``)
        query rectangles of ``H/8 x W/4`` pixels and a memory of ``H/8`` rows above and ``W/8``
        columns either side (the LRA encoder's image tasks), given knobs still winning."""
        knobs = super().knobs(length, n_heads, d_head, with_heads=with_heads)
        if image_size is not None:
            H, W = image_size
            knobs.update(image_size=(H, W), block=(max(1, H // 8), max(1, W // 4)),
                         memory=(max(1, H // 8), max(1, W // 8), max(1, W // 8)))
        return {**knobs, **(given or {})}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"image_size": tuple((h, w) for h in range(1, 4) for w in range(1, 4)),
                "block": tuple((h, w) for h in range(1, 4) for w in range(1, 4)),
                "memory": tuple((t, l, r) for t in range(3) for l in range(3) for r in range(3))}

    def extra_repr(self) -> str:
        return f"image_size={self.image_size}, block={self.block}, memory={self.memory}, {super().extra_repr()}"

    def order(self) -> Tensor:
        """``(H * W,)``: the raster index of each sequence position (``qkv.masks.block_raster_order``)."""
        return masks.block_raster_order(self.image_size, self.block)

    def pattern(self, n_queries: int, n_keys: int, device: Optional[torch.device] = None):
        return shift_queries(masks.local_2d(self.image_size, self.block, self.memory, causal=self.causal,
                                            device=device), n_keys - n_queries)

    def _indices(self, device: torch.device) -> _Blocks2D:
        """The blocks' index tables (built once per device; the image size is fixed)."""
        if device in self._index_cache:
            return self._index_cache[device]
        (Hi, Wi), (bh, bw), (top, left, right) = self.image_size, self.block, self.memory
        P = Hi * Wi
        ar = lambda n: torch.arange(n, device=device)  # noqa: E731
        seq_of = torch.empty(P + 1, dtype=torch.long, device=device)  # raster index (P: outside) -> position
        seq_of[self.order().to(device)] = ar(P)
        seq_of[P] = P
        nR, nC = -(-Hi // bh), -(-Wi // bw)
        R, C = (ar(nR) * bh).view(nR, 1, 1, 1), (ar(nC) * bw).view(1, nC, 1, 1)  # block origins
        # Query pixels: block origin + (dr, dc), dr < bh, dc < bw.
        qr, qc = R + ar(bh).view(1, 1, bh, 1), C + ar(bw).view(1, 1, 1, bw)  # (nR, nC, bh, bw)
        q_in = (qr < Hi) & (qc < Wi)
        q_idx = seq_of[torch.where(q_in, qr * Wi + qc, P)].reshape(nR * nC, bh * bw)  # (n_blk, Q)
        # Memory pixels: block origin + (kdr, kdc), -top <= kdr < bh, -left <= kdc < bw + right.
        kr = R + (ar(top + bh) - top).view(1, 1, -1, 1)
        kc = C + (ar(left + bw + right) - left).view(1, 1, 1, -1)  # (nR, nC, top + bh, left + bw + right)
        k_in = (kr >= 0) & (kr < Hi) & (kc >= 0) & (kc < Wi)
        k_idx = seq_of[torch.where(k_in, kr * Wi + kc, P)].reshape(nR * nC, -1)  # (n_blk, K)
        allowed = (k_idx < P).unsqueeze(1) & (q_idx < P).unsqueeze(2)  # (n_blk, Q, K)
        if self.causal:
            allowed = allowed & (k_idx.unsqueeze(1) <= q_idx.unsqueeze(2))  # generated before, block-raster
        flat = q_idx.reshape(-1)
        inside = flat < P
        slot = torch.empty(P, dtype=torch.long, device=device)
        slot[flat[inside]] = ar(flat.numel())[inside]  # (P,)
        block_of = torch.empty(P, dtype=torch.long, device=device)
        block_of[flat[inside]] = torch.div(ar(flat.numel()), bh * bw, rounding_mode="floor")[inside]
        # Blocks occupy consecutive positions, in block order: what block b's queries can reach
        # starts at lo[b]; a query at or after t belongs to block_of[t] or a later one.
        lo = torch.where(k_idx < P, k_idx, P).amin(-1)  # (n_blk,)
        suffix = lo.flip(0).cummin(0).values.flip(0)  # (n_blk,) min over blocks >= b
        first_needed = torch.cat([suffix[block_of], torch.tensor([P], device=device)])  # (P + 1,)
        self._index_cache[device] = _Blocks2D(q_idx, k_idx, allowed, slot, block_of, first_needed)
        return self._index_cache[device]

    def _validate(self, q, k, v, state):
        Hi, Wi = self.image_size
        P = Hi * Wi  # pixels
        first = state.offset if isinstance(state, KVCache) else 0  # position of the first key
        n_seen = first + self._state_length(state) + k.shape[-2]
        if n_seen > P:
            raise ValueError(f"local-2d attends over an image of H * W = {Hi} * {Wi} = {P} pixels "
                             f"(image_size={self.image_size}): got {n_seen} keys; the sequence length must be <= {P}")
        M = q.shape[-2]
        if M > k.shape[-2] and (not self.causal or state is not None):  # (causal, no state: leading zero rows)
            raise ValueError(f"local-2d: more queries ({M}) than keys ({k.shape[-2]}); queries are pixels of the scanned keys")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        Hi, Wi = self.image_size
        P = Hi * Wi  # pixels
        first = state.offset if isinstance(state, KVCache) else 0  # position of the first key
        n_seen = first + self._state_length(state) + k.shape[-2]  # <= P (_validate)
        t = self._indices(q.device)
        cache = None
        if state is not None or return_state:
            if state is not None:
                check_cache(self.registry_name, state)
            k, v, cache = append_cache(state, k, v, keep=n_seen - int(t.first_needed[n_seen]))
        N = k.shape[-2]
        if M == 0 or N == 0:
            return empty_output(q, v, N, need_weights)._replace(state=cache)
        dropout_p = self.dropout if self.training else 0.0
        if state is None and not return_state and M <= N and flex.usable(q, v, need_weights, dropout_p):
            # CUDA: FlexAttention visits only the key blocks of each query block's memory rectangle
            out = flex.attend_pattern(q, k, v, self.pattern(M, N, q.device), mask,
                                      (self.registry_name, self.extra_repr()))
            return AttentionOutput(out, None, None)
        valid = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=k.device)
        if state is not None:
            # Decoding: query i at position p = n_seen - M + i sees its block's memory rectangle.
            p = torch.arange(n_seen - M, n_seen, device=q.device)  # (M,)
            blk = t.block_of[p]
            pos = t.k_idx[blk]  # (M, K)
            ok = (pos < P) & (pos >= first) & (pos <= p.view(M, 1))
            out, weights = gathered_attend(q, k, v, pos - first, ok, valid, dropout_p, need_weights)
            return AttentionOutput(out, weights, cache)
        n_blk, Q = t.q_idx.shape
        K = t.k_idx.shape[1]
        # Positions N .. P-1 (not scanned yet) and the dummy slot P are padding, never keys.
        q = F.pad(q, (0, 0, N - M, P - N + 1))  # (B, H, P + 1, E): queries aligned to the end of the keys
        k, v = F.pad(k, (0, 0, 0, P - N + 1)), F.pad(v, (0, 0, 0, P - N + 1))  # (B, H, P + 1, E)
        valid = F.pad(valid, (0, P - N + 1), value=False)  # (B|1, H|1, P + 1)
        q_blocks, k_blocks, v_blocks = q[:, :, t.q_idx], k[:, :, t.k_idx], v[:, :, t.k_idx]  # (B, H, n_blk, Q|K, E)
        allowed = t.allowed & valid[:, :, t.k_idx].unsqueeze(-2)  # (B|1, H|1, n_blk, Q, K)

        out, weights = blocked_attend(q_blocks, k_blocks, v_blocks, allowed, dropout_p, need_weights)
        out = out.reshape(B, H, n_blk * Q, v.shape[-1])[:, :, t.slot[N - M:N]]  # (B, H, M, Ev)
        dense = None
        if need_weights:
            # Scatter the blocks back into (B, H, M, N) for inspection and plots (O(N^2): on request only).
            dense = weights.new_zeros(B, H, n_blk, Q, P + 1)
            dense.scatter_add_(-1, t.k_idx.view(n_blk, 1, K).expand(B, H, n_blk, Q, K), weights)
            dense = dense.view(B, H, n_blk * Q, P + 1)[:, :, t.slot[N - M:N], :N]
        return AttentionOutput(out, dense, cache)
