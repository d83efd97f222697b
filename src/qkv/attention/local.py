"""Image Transformer local self-attention, 1D and 2D (Parmar et al. 2018, "Image Transformer",
arXiv:1802.05751, Section 3.2 and Figure 2).

1D local: the raster-scanned sequence is cut into query blocks of ``l_q = block`` positions;
block ``t`` (positions ``[t l_q, (t + 1) l_q)``) attends to the memory block made of itself and
the ``l_m = memory`` positions before it, causally::

    out_i = sum_{j in A_i} softmax_j(q_i . k_j / sqrt(d)) v_j,
    A_i = {j : floor(i / l_q) l_q - l_m <= j <= i}                      (qkv.masks.local_1d)

2D local: the image ``(H, W)`` is cut into ``(b_h, b_w)`` query rectangles; a rectangle attends to
the keys of itself extended ``top`` rows up and ``left`` / ``right`` columns sideways, and only
to keys earlier in raster order ("causal within the memory")            (qkv.masks.local_2d).

Cost. 1D: each query block is a dense ``(l_q, l_q + l_m)`` problem, gathered with
``Tensor.unfold`` — O(n (l_q + l_m) d) time and O(n (l_q + l_m)) memory; the fused
``F.scaled_dot_product_attention`` runs all blocks at once when no weights are asked. 2D: each
rectangle gathers its ``(top + b_h) (left + b_w + right)`` memory pixels with index tensors built
once per image size — O(n (top + b_h)(left + b_w + right) d). No ``(n, n)`` tensor is built
unless ``need_weights=True`` asks for the dense weights (for plots).

Deviations and choices:

* Both patterns are causal by definition (the Image Transformer decoder). ``causal=False`` is
  accepted so that the kernels fit wherever a kernel is built with the registry's default, but
  the attention stays causal: ``kernel.causal`` is always True.
* The paper's 2D memory is ``top`` rows above plus the query rows, ``left``/``right`` columns
  sideways; blocks at the image border are clipped to the image, not padded with pixels.
* The 2D kernel reads a key sequence of length ``N <= H * W`` as the first ``N`` pixels of the
  raster scan (a partly generated image); since the pattern is causal, its outputs equal those of
  the whole image at the same positions. ``N > H * W`` raises ValueError. Queries may be fewer than
  the keys (aligned to the end of the keys).
* No incremental decoding (``supports_state = False``).

This module also holds helpers shared with ``sparse.py`` (the band of keys a query block sees,
``window.unfold_band``, is shared with all three) and ``to_frame``/``from_frame`` (queries aligned to the end of
the keys, handled by padding into one self-attention frame).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks, masks
from ..functional import masked_softmax
from ..registry import register
from ..types import AttentionOutput
from .base import AttentionKernel
from .window import unfold_band

__all__ = ["Local1DAttention", "Local2DAttention", "to_frame", "from_frame", "shift_queries"]


# ----------------------------------------------------------------------------- blocked helpers


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


def _empty(q: Tensor, v: Tensor, N: int, need_weights: bool) -> AttentionOutput:
    B, H, M, _ = q.shape
    out = q.new_zeros(B, H, M, v.shape[-1])
    return AttentionOutput(out, q.new_zeros(B, H, M, N) if need_weights else None, None)


def _blocked_attend(qb: Tensor, kb: Tensor, vb: Tensor, allowed: Tensor, dropout_p: float, need_weights: bool):
    """Dense attention inside each block: ``qb (..., b, E)``, ``kb, vb (..., W, E)``, ``allowed``
    bool broadcastable to ``(..., b, W)``. Returns ``(out (..., b, Ev), weights (..., b, W) or None)``."""
    if not need_weights:
        # Every block is a small dense problem: the fused kernel takes them all at once.
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed, dropout_p=dropout_p)
        # Rows with no allowed key: zeros on every backend (design.md §2).
        return out.masked_fill(~allowed.any(-1, keepdim=True), 0.0), None
    scores = (qb @ kb.transpose(-1, -2)) / math.sqrt(qb.shape[-1])  # (..., b, W)
    weights = masked_softmax(scores, allowed)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ vb, weights


# ----------------------------------------------------------------------------- 1D


@register("attention", "local-1d", "local1d", "image-local-1d")
class Local1DAttention(AttentionKernel):
    """Image Transformer 1D local attention (Parmar et al. 2018): query blocks see themselves causally plus `memory` earlier positions.

    ``A_i = {j : floor(i / block) * block - memory <= j <= i}`` (``qkv.masks.local_1d``), exact
    softmax over ``A_i``.

    Args:
        block: query block length ``l_q > 0``.
        memory: ``l_m >= 0`` positions before each block added to its keys.
        causal: accepted for interface compatibility; the pattern is causal by definition and
            ``kernel.causal`` is always True.
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``;
    queries aligned to the end of the keys. Cost: O(N (block + memory) E) time, O(N (block + memory))
    memory.
    """

    supports_mask = "key_padding"
    supports_state = False

    def __init__(self, *, block: int, memory: int, causal: bool = False, dropout: float = 0.0) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.causal = True  # the Image Transformer's local attention is causal by definition
        self.block = _checks.positive_int("block", block)
        self.memory = _checks.positive_int("memory", memory, allow_zero=True)

    def extra_repr(self) -> str:
        return f"block={self.block}, memory={self.memory}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return shift_queries(masks.local_1d(self.block, self.memory), n_keys - n_queries)

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        N = k.shape[-2]
        if M == 0 or N == 0:
            return _empty(q, v, N, need_weights)
        b, m = self.block, self.memory
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
        band = kj <= qi + m  # (b, Wk), shared by all blocks
        key_ok = unfold_band(valid.unsqueeze(-1), -m, b, Wk, nb).squeeze(-1)  # (B|1, H|1, nb, Wk)
        allowed = band & key_ok.unsqueeze(-2)  # (B|1, H|1, nb, b, Wk)

        dropout_p = self.dropout if self.training else 0.0
        out, weights = _blocked_attend(q_blocks, k_blocks, v_blocks, allowed, dropout_p, need_weights)
        out = out.reshape(B, H, nb * b, -1)[:, :, :L]  # (B, H, L, Ev)
        dense = None
        if need_weights:
            # Scatter the blocks back into (B, H, L, L) for inspection and plots (O(L^2): on request only).
            cols = (torch.arange(nb, device=q.device).view(nb, 1, 1) * b - m + kj.view(1, 1, Wk)).clamp(0, L - 1)
            dense = weights.new_zeros(B, H, nb, b, L)
            dense.scatter_add_(-1, cols.expand(B, H, nb, b, Wk), weights)  # clamped columns carry weight 0
            dense = dense.view(B, H, nb * b, L)[:, :, :L]
        out, dense = from_frame(out, dense, M, shift)
        return AttentionOutput(out, dense, None)


# ----------------------------------------------------------------------------- 2D


def _int_tuple(name: str, value, n: int, what: str) -> Tuple[int, ...]:
    """An int (repeated ``n`` times) or a sequence of ``n`` non-negative ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * n
    if not isinstance(value, (tuple, list)) or len(value) != n:
        raise ValueError(f"{name} must be {what} (or one int for all), got {value!r}")
    return tuple(int(_checks.positive_int(f"{name}[{i}]", x, allow_zero=True)) for i, x in enumerate(value))


@register("attention", "local-2d", "local2d", "image-local-2d")
class Local2DAttention(AttentionKernel):
    """Image Transformer 2D local attention (Parmar et al. 2018): rectangular query blocks see a memory rectangle extended up, left and right, causally in raster order.

    A query at pixel ``(r, c)`` of block ``(r0, c0)`` sees the keys ``(r', c')`` with
    ``r0 - top <= r' < r0 + bh``, ``c0 - left <= c' < c0 + bw + right`` and raster index
    ``r' W + c' <= r W + c`` (``qkv.masks.local_2d``), exact softmax over them.

    Args:
        image_size: ``(H, W)``; the key sequence is the raster scan of the image, length ``H * W``
            (a shorter sequence is the first pixels of the scan: causal, so the outputs agree).
            Longer sequences raise ValueError.
        block: ``(bh, bw)`` query rectangle (one int for a square), clipped at the image border.
        memory: ``(top, left, right)`` margins of the memory rectangle (one int for all three).
        causal: accepted for interface compatibility; the pattern is causal by definition and
            ``kernel.causal`` is always True.
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` with ``M <= N <= H * W``
    (queries aligned to the end of the keys) -> ``(B, H, M, Ev)``. Cost: O(N (top + bh)(left + bw + right) E).
    """

    supports_mask = "key_padding"
    supports_state = False

    def __init__(self, *, image_size: Tuple[int, int], block: Union[int, Tuple[int, int]] = (8, 8),
                 memory: Union[int, Tuple[int, int, int]] = (0, 0, 0), causal: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.causal = True  # the Image Transformer's local attention is causal by definition
        if not isinstance(image_size, (tuple, list)) or len(image_size) != 2:
            raise ValueError(f"image_size must be a pair (H, W), got {image_size!r}")
        self.image_size = (_checks.positive_int("image_size[0]", image_size[0]),
                           _checks.positive_int("image_size[1]", image_size[1]))
        self.block = _int_tuple("block", block, 2, "a pair (bh, bw)")
        if min(self.block) == 0:
            raise ValueError(f"block must be positive, got {self.block!r}")
        self.memory = _int_tuple("memory", memory, 3, "a triple (top, left, right)")
        self._index_cache: Dict[torch.device, Tuple[Tensor, ...]] = {}

    def extra_repr(self) -> str:
        return f"image_size={self.image_size}, block={self.block}, memory={self.memory}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return shift_queries(masks.local_2d(self.image_size, self.block, self.memory), n_keys - n_queries)

    def _indices(self, device: torch.device) -> Tuple[Tensor, ...]:
        """Index tensors of the blocks (built once per device; the image size is fixed).

        Returns ``q_idx (n_blk, Q)`` and ``k_idx (n_blk, K)`` raster positions of each block's
        query and memory pixels (``N`` = a dummy slot outside the image), the shared causal mask
        ``(Q, K)`` and ``slot (N,)``: where each pixel's query sits in the flattened blocks.
        (``N = H * W`` here.)
        """
        if device in self._index_cache:
            return self._index_cache[device]
        (Hi, Wi), (bh, bw), (top, left, right) = self.image_size, self.block, self.memory
        N = Hi * Wi
        ar = lambda n: torch.arange(n, device=device)  # noqa: E731
        nR, nC = -(-Hi // bh), -(-Wi // bw)
        R, C = (ar(nR) * bh).view(nR, 1, 1, 1), (ar(nC) * bw).view(1, nC, 1, 1)  # block origins
        # Query pixels: block origin + (dr, dc), dr < bh, dc < bw.
        dr, dc = ar(bh).view(1, 1, bh, 1), ar(bw).view(1, 1, 1, bw)
        qr, qc = R + dr, C + dc  # (nR, nC, bh, bw)
        q_in = (qr < Hi) & (qc < Wi)
        q_idx = torch.where(q_in, qr * Wi + qc, N).reshape(nR * nC, bh * bw)  # (n_blk, Q)
        # Memory pixels: block origin + (kdr, kdc), -top <= kdr < bh, -left <= kdc < bw + right.
        kdr, kdc = (ar(top + bh) - top).view(1, 1, -1, 1), (ar(left + bw + right) - left).view(1, 1, 1, -1)
        kr, kc = R + kdr, C + kdc  # (nR, nC, top + bh, left + bw + right)
        k_in = (kr >= 0) & (kr < Hi) & (kc >= 0) & (kc < Wi)
        k_idx = torch.where(k_in, kr * Wi + kc, N).reshape(nR * nC, -1)  # (n_blk, K)
        # Raster order inside one block's frame: key (kdr, kdc) precedes query (dr, dc) when it is
        # on an earlier row, or on the same row and not to the right (columns lie in [0, W)).
        qdr, qdc = dr.reshape(-1, 1).expand(bh, bw).reshape(-1, 1), dc.reshape(1, -1).expand(bh, bw).reshape(-1, 1)
        kr_rel = kdr.reshape(-1, 1).expand(top + bh, left + bw + right).reshape(1, -1)
        kc_rel = kdc.reshape(1, -1).expand(top + bh, left + bw + right).reshape(1, -1)
        causal = (kr_rel < qdr) | ((kr_rel == qdr) & (kc_rel <= qdc))  # (Q, K)
        slot = torch.empty(N, dtype=torch.long, device=device)
        flat_in = q_in.reshape(-1)
        slot[q_idx.reshape(-1)[flat_in]] = ar(flat_in.numel())[flat_in]  # (N,)
        self._index_cache[device] = (q_idx, k_idx, causal, slot)
        return self._index_cache[device]

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        N = k.shape[-2]
        Hi, Wi = self.image_size
        P = Hi * Wi  # pixels
        if N > P:
            raise ValueError(f"local-2d attends over a raster-scanned image of H * W = {Hi} * {Wi} = {P} pixels "
                             f"(image_size={self.image_size}): got {N} keys; the sequence length must be <= {P}")
        if M > N:
            raise ValueError(f"local-2d: more queries ({M}) than keys ({N}); queries are pixels of the scanned keys")
        q_idx, k_idx, causal, slot = self._indices(q.device)
        n_blk, Q = q_idx.shape
        K = k_idx.shape[1]
        # Pixels N .. P-1 (not scanned yet) and the dummy slot P are padding, never keys.
        q = F.pad(q, (0, 0, N - M, P - N + 1))  # (B, H, P + 1, E): queries aligned to the end of the keys
        k, v = F.pad(k, (0, 0, 0, P - N + 1)), F.pad(v, (0, 0, 0, P - N + 1))  # (B, H, P + 1, E)
        valid = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=k.device)
        valid = F.pad(valid, (0, P - N + 1), value=False)  # (B|1, H|1, P + 1)
        q_blocks, k_blocks, v_blocks = q[:, :, q_idx], k[:, :, k_idx], v[:, :, k_idx]  # (B, H, n_blk, Q|K, E)
        allowed = causal & valid[:, :, k_idx].unsqueeze(-2)  # (B|1, H|1, n_blk, Q, K)

        dropout_p = self.dropout if self.training else 0.0
        out, weights = _blocked_attend(q_blocks, k_blocks, v_blocks, allowed, dropout_p, need_weights)
        out = out.reshape(B, H, n_blk * Q, -1)[:, :, slot[N - M:N]]  # (B, H, M, Ev)
        dense = None
        if need_weights:
            # Scatter the blocks back into (B, H, M, N) for inspection and plots (O(N^2): on request only).
            dense = weights.new_zeros(B, H, n_blk, Q, P + 1)
            dense.scatter_add_(-1, k_idx.view(n_blk, 1, K).expand(B, H, n_blk, Q, K), weights)
            dense = dense.view(B, H, n_blk * Q, P + 1)[:, :, slot[N - M:N], :N]
        return AttentionOutput(out, dense, None)
