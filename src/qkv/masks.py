"""Masks and sparsity patterns.

Two kinds of object live here:

* **dense boolean masks** for callers: ``padding_mask(lengths, n)`` ``(B, n)`` and
  ``causal_mask(m, n, offset)`` ``(m, n)``;
* **patterns as predicates** ``mask_mod(b, h, q_idx, kv_idx) -> bool`` — FlexAttention's
  signature and convention (True = may attend). They are written with tensor operations only, so
  the same function evaluates on broadcast index grids (``materialize``), inside
  ``torch.nn.attention.flex_attention.create_block_mask`` and per block inside the sparse kernels.
  Combine them with ``and_masks`` / ``or_masks``.

Kernels never need ``materialize``: it exists for tests and plots.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _checks

__all__ = [
    "MaskMod", "padding_mask", "causal_mask", "causal", "window", "strided", "fixed", "local_1d",
    "local_2d", "block_raster_order", "and_masks", "or_masks", "materialize",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


# ----------------------------------------------------------------------------- dense masks


def padding_mask(lengths: Tensor, n: int) -> Tensor:
    """Key-padding mask ``(B, n)``: position ``j`` of sequence ``b`` is True when ``j < lengths[b]``."""
    _checks.tensor("lengths", lengths, ndim=1)
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
    _checks.positive_int("n", n, allow_zero=True)
    if (lengths < 0).any() or (lengths > n).any():
        raise ValueError(f"lengths must lie in [0, n={n}], got min {int(lengths.min())}, max {int(lengths.max())}")
    return torch.arange(n, device=lengths.device) < lengths.unsqueeze(-1)  # (B, n)


def causal_mask(m: int, n: int, offset: int = 0, device: torch.device | str | None = None) -> Tensor:
    """``(m, n)`` mask where query ``i`` may attend to key ``j`` when ``j <= i + offset``.

    ``offset = n - m`` aligns the queries to the end of the keys, as with a KV cache.
    """
    _checks.positive_int("m", m, allow_zero=True)
    _checks.positive_int("n", n, allow_zero=True)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    return materialize(causal(offset), m, n, device=device)


# ----------------------------------------------------------------------------- predicates


def causal(offset: int = 0) -> MaskMod:
    """``kv_idx <= q_idx + offset``."""

    def mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return mod


def window(radius: int, causal: bool = False, offset: int = 0) -> MaskMod:
    """Restricted self-attention (Vaswani et al. 2017, Table 1): ``|i - j| <= r``; causal:
    ``0 <= i - j <= r``. ``offset`` shifts query positions (``i = q_idx + offset``)."""
    _checks.positive_int("radius", radius, allow_zero=True)

    def mod(b, h, q_idx, kv_idx):
        d = q_idx + offset - kv_idx
        near = d.abs() <= radius
        return near & (d >= 0) if causal else near

    return mod


def strided(stride: int, subsets: Sequence[int] = (1, 2), causal: bool = True) -> MaskMod:
    """Sparse Transformer strided pattern (Child et al. 2019).

    ``A1_i = {j : i - l <= j <= i}`` (bidirectional: ``|i - j| <= l``),
    ``A2_i = {j : (i - j) mod l = 0}``; ``subsets`` picks A1, A2 or their union; causal adds ``j <= i``.
    """
    _checks.positive_int("stride", stride)
    subsets = _subsets(subsets)

    def mod(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        allowed = torch.zeros_like(d, dtype=torch.bool)
        if 1 in subsets:
            allowed = allowed | (d.abs() <= stride)
        if 2 in subsets:
            allowed = allowed | (torch.remainder(d, stride) == 0)
        return allowed & (d >= 0) if causal else allowed

    return mod


def fixed(stride: int, c: int = 1, subsets: Sequence[int] = (1, 2), causal: bool = True) -> MaskMod:
    """Sparse Transformer fixed pattern (Child et al. 2019).

    ``A1_i = {j : floor(j / l) = floor(i / l)}``, ``A2_i = {j : j mod l in {l - c, ..., l - 1}}``;
    causal adds ``j <= i``.
    """
    _checks.positive_int("stride", stride)
    _checks.positive_int("c", c)
    if c > stride:
        raise ValueError(f"c must be <= stride ({stride}), got {c}")
    subsets = _subsets(subsets)

    def mod(b, h, q_idx, kv_idx):
        allowed = torch.zeros_like(q_idx - kv_idx, dtype=torch.bool)
        if 1 in subsets:
            allowed = allowed | (torch.div(q_idx, stride, rounding_mode="floor") == torch.div(kv_idx, stride, rounding_mode="floor"))
        if 2 in subsets:
            allowed = allowed | (torch.remainder(kv_idx, stride) >= stride - c)
        return allowed & (kv_idx <= q_idx) if causal else allowed

    return mod


def local_1d(block: int, memory: int = 0, causal: bool = True) -> MaskMod:
    """Image Transformer 1D local attention (Parmar et al. 2018): raster-order query blocks of
    ``block`` positions attend to their block and to the ``memory`` positions before it; causal
    (generation) adds ``j <= i``, the bidirectional form sees the whole block."""
    _checks.positive_int("block", block)
    _checks.positive_int("memory", memory, allow_zero=True)

    def mod(b, h, q_idx, kv_idx):
        start = torch.div(q_idx, block, rounding_mode="floor") * block
        near = kv_idx >= start - memory
        return near & (kv_idx <= q_idx) if causal else near & (kv_idx < start + block)

    return mod


def block_raster_order(image_size: Tuple[int, int], block: Tuple[int, int]) -> Tensor:
    """The Image Transformer's generation order (Parmar et al. 2018, Fig. 2): query blocks of
    ``block=(bh, bw)`` pixels in raster order, raster order inside a block (blocks at the right and
    bottom border are clipped to the image).

    Returns ``order (H * W,)`` long: ``order[t]`` is the raster index ``r * W + c`` of the ``t``-th
    pixel generated; ``image.flatten()[order]`` is the sequence ``local-2d`` attends over and
    ``argsort(order)`` maps raster indices back to sequence positions.
    """
    H, W = _pair("image_size", image_size)
    bh, bw = _pair("block", block)
    r = torch.arange(H).view(H, 1)
    c = torch.arange(W).view(1, W)
    n_cols = -(-W // bw)
    blk = torch.div(r, bh, rounding_mode="floor") * n_cols + torch.div(c, bw, rounding_mode="floor")  # (H, W)
    # Sort key: block first, then the raster index (raster order inside the block).
    key = blk * (H * W) + r * W + c  # (H, W), distinct
    return torch.argsort(key.reshape(-1))


def local_2d(image_size: Tuple[int, int], block: Tuple[int, int], memory: Tuple[int, int, int] = (0, 0, 0),
             causal: bool = True, device: Optional[torch.device] = None) -> MaskMod:
    """Image Transformer 2D local attention (Parmar et al. 2018) on an image scanned in block-raster
    order (``block_raster_order``: sequence position ``t`` is pixel ``order[t]``).

    Queries are grouped in ``block=(bh, bw)`` rectangles; a query attends to the keys inside its
    block extended ``memory=(top, left, right)`` pixels up, left and right; causal (generation)
    adds ``kv_idx <= q_idx``: only pixels generated before it in block-raster order (the whole
    block to the left, none of the block to the right). Positions ``>= H * W`` see nothing. ``device``:
    where the scan-order table lives (that of the indices it is called with, for FlexAttention's
    compiled kernel; otherwise it is copied there at each call).
    """
    H, W = _pair("image_size", image_size)
    bh, bw = _pair("block", block)
    if not isinstance(memory, (tuple, list)) or len(memory) != 3:
        raise ValueError(f"memory must be (top, left, right), got {memory!r}")
    top, left, right = (_checks.positive_int(f"memory[{i}]", v, allow_zero=True) for i, v in enumerate(memory))
    order = block_raster_order((H, W), (bh, bw)).to(device or "cpu")
    P = H * W

    def mod(b, h, q_idx, kv_idx):
        table = order if order.device == q_idx.device else order.to(q_idx.device)
        qp, kp = table[q_idx.clamp(0, P - 1)], table[kv_idx.clamp(0, P - 1)]  # raster indices
        qr, qc = torch.div(qp, W, rounding_mode="floor"), torch.remainder(qp, W)
        kr, kc = torch.div(kp, W, rounding_mode="floor"), torch.remainder(kp, W)
        r0 = torch.div(qr, bh, rounding_mode="floor") * bh  # query block's first row
        c0 = torch.div(qc, bw, rounding_mode="floor") * bw  # query block's first column
        inside = (kr >= r0 - top) & (kr < r0 + bh) & (kc >= c0 - left) & (kc < c0 + bw + right)
        inside = inside & (q_idx < P) & (kv_idx < P) & (q_idx >= 0) & (kv_idx >= 0)
        return inside & (kv_idx <= q_idx) if causal else inside

    return mod


def and_masks(*mods: MaskMod) -> MaskMod:
    """Intersection of patterns."""
    if not mods:
        raise ValueError("and_masks needs at least one mask_mod")

    def mod(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out & m(b, h, q_idx, kv_idx)
        return out

    return mod


def or_masks(*mods: MaskMod) -> MaskMod:
    """Union of patterns."""
    if not mods:
        raise ValueError("or_masks needs at least one mask_mod")

    def mod(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out | m(b, h, q_idx, kv_idx)
        return out

    return mod


def materialize(mod: MaskMod, m: int, n: int, b: int = 0, h: int = 0, device: torch.device | str | None = None) -> Tensor:
    """Evaluate ``mod`` on the full ``(m, n)`` grid of query/key indices: a bool matrix for tests
    and plots (kernels compute only the blocks a pattern needs)."""
    if not callable(mod):
        raise TypeError(f"mod must be a mask_mod callable, got {type(mod).__name__}")
    q_idx = torch.arange(m, device=device).unsqueeze(-1)  # (m, 1)
    kv_idx = torch.arange(n, device=device).unsqueeze(0)  # (1, n)
    bt = torch.tensor(b, device=device)
    ht = torch.tensor(h, device=device)
    out = mod(bt, ht, q_idx, kv_idx)
    return torch.broadcast_to(torch.as_tensor(out, device=device), (m, n)).to(torch.bool)


def _subsets(subsets: Sequence[int]) -> frozenset:
    s = frozenset(subsets)
    if not s or not s <= {1, 2}:
        raise ValueError(f"subsets must be a non-empty subset of (1, 2), got {tuple(subsets)!r}")
    return s


def _pair(name: str, value) -> Tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name} must be a pair (rows, columns), got {value!r}")
    return _checks.positive_int(f"{name}[0]", value[0]), _checks.positive_int(f"{name}[1]", value[1])
