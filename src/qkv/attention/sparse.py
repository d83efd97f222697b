"""Sparse Transformer factorized attention, strided and fixed (Child et al. 2019, "Generating Long
Sequences with Sparse Transformers", arXiv:1904.10509, Section 4.2 and Figure 3).

With stride ``l`` (``~ sqrt(n)``) and causal ``j <= i``:

* strided: ``A1_i = {j : i - l <= j <= i}`` (a band), ``A2_i = {j : (i - j) mod l = 0}`` (every
  ``l``-th earlier position: one column of the sequence viewed as an ``(n / l, l)`` grid);
* fixed: ``A1_i = {j : floor(j / l) = floor(i / l)}`` (block diagonal), ``A2_i = {j : j mod l in
  {l - c, ..., l - 1}}`` (the last ``c`` "summary" positions of every block).

Bidirectional (``causal=False``) forms drop ``j <= i``; strided A1 becomes ``|i - j| <= l``. A head
attends to ``A_i = A1_i``, ``A2_i`` or their union (``subsets``), with exact softmax over ``A_i``
(the paper's "merged head", eq. 2 with ``A = A1 ∪ A2``)::

    out_i = sum_{j in A_i} softmax_j(q_i . k_j / sqrt(d)) v_j       (qkv.masks.strided / fixed)

Computed structurally, never with an ``(n, n)`` mask. The scores of the two parts are computed
separately — the band with ``Tensor.unfold`` over query blocks of ``l`` (``_ops.unfold_band``), the
strided columns as ``l`` independent ``(n/l, n/l)`` problems on the ``(n/l, l)`` grid, the fixed
blocks as ``(l, l)`` blocks and the summaries as ``c n / l`` keys shared by every query — then
concatenated and normalised by ONE softmax; a key in both parts is masked in the second one, so it
counts once. Cost per query: strided ``3l + n/l`` keys (causal ``2l + n/l``), fixed
``l + c n / l``: O(n (l + n / l) d) = O(n sqrt(n) d) time and O(n sqrt(n)) memory for
``l ~ sqrt(n)`` (fixed: ``c`` times more for the summary part).

Incremental decoding (causal) keeps only what later queries can still reach — strided: every key
when A2 is used (each residue class stays reachable; ``KVCache``), the last ``l`` otherwise; fixed:
the ``c`` summaries of every finished block plus the current block (``FixedState``) — and gathers a
new query's ``|A_i|`` keys from it (``_ops.gathered_attend``): a token costs O((l + n / l) E)
(fixed: O((l + c n / l) E)), not O(n E).

On CUDA (no weights asked, no dropout) fused block-sparse FlexAttention kernels take over — the
counterpart of the paper's block-sparse GPU kernels (``qkv.attention.flex``): one per part where
its keys are contiguous (the band / own block; the strided columns on the transposed grid; the
summaries gathered), with block masks from the same predicates, merged by log-sum-exp into the one
softmax over the union; elsewhere the gathered blocks above are used.

Deviations: one head computes the chosen union (interleaving A1/A2 over layers, or splitting them
across heads, is done by building kernels with ``subsets=(1,)`` and ``(2,)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .. import _checks, masks
from ..registry import register
from ..types import AttentionOutput, KVCache
from . import flex
from ._ops import (accumulation_dtype, append_cache, check_cache, empty_output, from_frame, gathered_attend,
                   shift_queries, to_frame, unfold_band)
from .base import AttentionKernel, clamp_knob

__all__ = ["StridedAttention", "FixedAttention", "FixedState"]


def _check_subsets(subsets: Sequence[int]) -> Tuple[int, ...]:
    if isinstance(subsets, int) and not isinstance(subsets, bool):
        subsets = (subsets,)
    if not isinstance(subsets, (tuple, list, set, frozenset)):
        raise TypeError(f"subsets must be a sequence of 1 and/or 2, got {type(subsets).__name__} {subsets!r}")
    s = set(subsets)
    if not s or not s <= {1, 2} or any(isinstance(x, bool) for x in s):
        raise ValueError(f"subsets must be a non-empty subset of (1, 2) (A1, A2 or their union), got {subsets!r}")
    return tuple(sorted(s))


# Scores per inference chunk (``_Factorized._attend``): 2^21 float32 = 8 MiB, with their mask and
# weights about the size of a core's share of the last-level cache.
CHUNK_SCORES = 1 << 21


def _grid(x: Tensor, n_rows: int, l: int) -> Tensor:
    """``x (..., L, E)`` padded to ``n_rows * l`` and viewed as the grid ``(..., n_rows, l, E)`` (a
    view, no copy, when ``x`` is contiguous and already that long)."""
    if n_rows * l != x.shape[-2]:
        x = F.pad(x, (0, 0, 0, n_rows * l - x.shape[-2]), value=False if x.dtype == torch.bool else 0.0)
    return x.reshape(*x.shape[:-2], n_rows, l, x.shape[-1])


def _columns(x: Tensor, l: int) -> Tensor:
    """``(B, H, L, E)`` -> ``(B, H l, nr, E)``: column ``c`` of the ``(nr, l)`` grid of head ``h`` as
    head ``h l + c`` (strided's A2 on the transposed grid: every column's keys contiguous)."""
    nr = -(-x.shape[-2] // l)
    return _grid(x, nr, l).transpose(2, 3).reshape(x.shape[0], x.shape[1] * l, nr, x.shape[-1])


def _softmax_over_parts(parts: list, dropout_p: float, need_weights: bool):
    """ONE softmax over the concatenated scores of the parts ``[(scores (..., b, W_p), allowed), ...]``.

    Empties ``parts`` (so that the separate scores are freed early). Returns the weights of each
    part, dropout applied; the undropped weights (None unless ``need_weights``); and ``row_ok``
    ``(..., b, 1)``, False for rows with no allowed key — the caller zeroes their output.
    """
    shape = torch.broadcast_shapes(*(s.shape[:-1] for s, _ in parts))
    widths = [s.shape[-1] for s, _ in parts]
    scores = torch.cat([s.expand(*shape, s.shape[-1]) for s, _ in parts], dim=-1)  # (..., b, sum W_p)
    allowed = torch.cat([a.expand(*shape, s.shape[-1]) for s, a in parts], dim=-1)
    parts.clear()
    # float32 accumulation for half types (exp of large logits overflows float16).
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    # In place: cat's backward does not need its output. finfo.min rather than -inf keeps a row
    # with no allowed key finite (uniform); its output is zeroed by the caller, its weights here.
    work.masked_fill_(~allowed, torch.finfo(work.dtype).min)
    weights = torch.softmax(work, dim=-1)
    row_ok = allowed.any(-1, keepdim=True)
    if need_weights:
        weights = weights * allowed
    weights = weights.to(scores.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped.split(widths, dim=-1), (weights.split(widths, dim=-1) if need_weights else None), row_ok


@dataclass(frozen=True)
class FixedState:
    """Incremental-decoding state of ``fixed`` attention: what later queries can still reach.

    ``key``/``value`` ``(B, H, S, E)``: the ``c`` summary keys of each of the ``position // l``
    finished blocks (in block order; none without A2), then the keys of the current block
    (positions ``(position // l) l .. position - 1``). ``position``: positions seen so far.
    """

    key: Tensor
    value: Tensor
    position: int

    @property
    def length(self) -> int:
        """Number of cached keys (masks given with this state cover them, then the new keys)."""
        return self.key.shape[-2]


class _Factorized(AttentionKernel):
    """Shared frame handling of the two Sparse Transformer patterns."""

    supports_mask = "key_padding"
    supports_state = True
    static_length = "its pattern is laid out in blocks of the stride, in numbers of the length"

    def __init__(self, *, stride: int, subsets: Sequence[int], causal: bool, dropout: float, recompute: int) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.stride = _checks.positive_int("stride", stride)
        self.subsets = _check_subsets(subsets)
        self.recompute = _checks.positive_int("recompute", recompute, allow_zero=True)

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        dropout_p = self.dropout if self.training else 0.0
        if state is not None:
            return self._decode(q, k, v, mask, state, dropout_p, need_weights)
        M, N = q.shape[-2], k.shape[-2]
        new_state = self._initial_state(k, v) if return_state else None
        if M == 0 or N == 0:
            return empty_output(q, v, N, need_weights)._replace(state=new_state)
        if flex.usable(q, v, need_weights, dropout_p):
            # CUDA: FlexAttention's fused block-sparse kernel, block masks built from the same predicates.
            if M != N:  # queries aligned to the end of the keys: one block mask of the shifted pattern
                out = flex.attend_pattern(q, k, v, self.pattern(M, N), mask, (self.registry_name, self.extra_repr()))
                return AttentionOutput(out, None, new_state)
            # each part where its keys are contiguous, merged by log-sum-exp: one compiled graph
            tensors, static = self._flex_inputs(q, None if mask is None else mask[:, :, 0, :])
            out = flex.run(type(self)._flex_program, q, k, v, *tensors, **static)
            flex.count()
            return AttentionOutput(out, None, new_state)
        dtype = v.dtype
        acc = accumulation_dtype(dtype)  # half inputs: scores overflow float16, so the parts work in float32
        q, k, v, valid, shift = to_frame(q.to(acc), k.to(acc), v.to(acc), mask, period=self.stride)
        rows = -(-q.shape[-2] // self.stride)  # query blocks of the frame
        grads = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        chunk_train = grads and not need_weights and self.recompute > 1 and rows >= 2 * self.recompute
        chunk_infer = not grads and not need_weights and rows > 1 and self.chunk_inference
        if chunk_train or chunk_infer:
            # Chunks below read the keys as a grid of blocks: pad them once (invalid keys) to whole
            # blocks, contiguous, so that each chunk's grid is a view and not a copy of all keys.
            extra = rows * self.stride - k.shape[-2]
            k, v = F.pad(k, (0, 0, 0, extra)).contiguous(), F.pad(v, (0, 0, 0, extra)).contiguous()
            valid = F.pad(valid, (0, extra), value=False)
        if chunk_train:
            # Training: query blocks in `recompute` chunks, each recomputed in backward, so that only
            # one chunk's scores and weights are alive at a time (peak memory ~ 1 / recompute of them).
            step = -(-rows // self.recompute) * self.stride
            out = torch.cat([checkpoint(self._chunk_out, q[:, :, a:a + step], k, v, valid, dropout_p, a // self.stride,
                                        use_reentrant=False) for a in range(0, q.shape[-2], step)], dim=2)
            weights = None
        elif chunk_infer:
            # Inference: query blocks in chunks of about CHUNK_SCORES scores, so that a chunk's scores,
            # mask and weights stay in cache instead of streaming (B, H, L, W) tensors through memory.
            width = self._keys_per_query(k.shape[-2])
            per_row = q.shape[0] * q.shape[1] * self.stride * width
            step = max(1, min(rows, CHUNK_SCORES // max(1, per_row))) * self.stride
            out = torch.cat([self._chunk_out(q[:, :, a:a + step], k, v, valid, dropout_p, a // self.stride)
                             for a in range(0, q.shape[-2], step)], dim=2)
            weights = None
        else:
            out, weights = self._frame_attend(q, k, v, valid, dropout_p, need_weights)
        out, weights = from_frame(out, weights, M, shift)
        return AttentionOutput(out.to(dtype), None if weights is None else weights.to(dtype), new_state)

    def _decode(self, q, k, v, mask, state, dropout_p, need_weights) -> AttentionOutput:
        """Continue a sequence from ``state``: each new query gathers its pattern from the state."""
        raise NotImplementedError  # abstract: each pattern implements it

    def _initial_state(self, k, v):
        """The state after the keys ``k``, ``v`` of a sequence's start."""
        raise NotImplementedError  # abstract: each pattern implements it

    def _flex_inputs(self, q, valid):
        """Self-attention (``M = N``) on CUDA: ``(tensors, static)`` for ``_flex_program`` — the parts'
        block masks (and any index tensor), and the Python constants the graph is specialised on;
        ``valid (B|1, H|1, N)`` bool or None."""
        raise NotImplementedError  # abstract: each pattern implements it

    @staticmethod
    def _flex_program(q, k, v, *tensors, **static):
        """The disjoint parts of the pattern as FlexAttention calls (``flex.lse_attend``), merged by
        their log-sum-exp (``flex.merge``): traced and compiled as one graph by ``flex.run``."""
        raise NotImplementedError  # abstract: each pattern implements it

    # Inference in chunks of query blocks: worth it where a chunk reads the keys as views (fixed);
    # strided's column part transposes all keys per chunk, so it attends in one piece.
    chunk_inference = False

    def _keys_per_query(self, n_keys: int) -> int:
        """Scores one query computes in ``_frame_attend`` against ``n_keys`` frame keys."""
        raise NotImplementedError  # abstract: each pattern implements it

    def _chunk_out(self, q, k, v, valid, dropout_p, row0):
        return self._frame_attend(q, k, v, valid, dropout_p, False, row0)[0]

    def _frame_attend(self, q, k, v, valid, dropout_p, need_weights, row0=0):
        """The queries ``q`` of grid rows ``row0 ..`` (the whole frame unless chunked) against the
        frame's keys: ``(out (B, H, M_q, Ev), dense weights or None)``."""
        raise NotImplementedError  # abstract: each pattern implements it


@register("attention", "strided", "sparse-strided")
class StridedAttention(_Factorized):
    """Sparse Transformer strided attention (Child et al. 2019): a band of `stride` plus every stride-th position, one softmax, O(n sqrt n).

    ``A1_i = {j : i - l <= j <= i}`` (bidirectional ``|i - j| <= l``), ``A2_i = {j : (i - j) mod l = 0}``;
    the head attends to the union of the chosen ``subsets`` (``qkv.masks.strided``), causal adds ``j <= i``.

    Args:
        stride: ``l > 0``, about ``sqrt(n)``.
        subsets: ``(1,)``, ``(2,)`` or ``(1, 2)`` (the union, default).
        recompute: when gradients are needed, the query blocks are processed in this many chunks,
            each recomputed in backward (``torch.utils.checkpoint``): only one chunk's scores are
            alive at a time. 0 or 1 keeps them all (faster, ``recompute`` times more memory).
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``; queries
    aligned to the end of the keys; key-padding masks only. Cost: O(N (3l + N/l) E) time,
    O(N (3l + N/l)) memory (causal: ``2l`` instead of ``3l``).
    """

    state_type = KVCache

    def __init__(self, *, stride: int, subsets: Sequence[int] = (1, 2), causal: bool = False,
                 dropout: float = 0.0, recompute: int = 8) -> None:
        super().__init__(stride=stride, subsets=subsets, causal=causal, dropout=dropout, recompute=recompute)

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``stride = sqrt(max_len)`` (Child et al. 2019: l ~ sqrt(n), O(n sqrt n))."""
        return {**super().default_knobs(max_len, n_heads, d_head), "stride": max(1, math.isqrt(max_len))}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"stride": (1, 2, 3, 4), "subsets": ((1,), (2,), (1, 2))}

    def extra_repr(self) -> str:
        return f"stride={self.stride}, subsets={self.subsets}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return shift_queries(masks.strided(self.stride, self.subsets, causal=self.causal), n_keys - n_queries)

    def _keep(self):
        # A2 reaches every earlier position of the query's residue class: all keys stay reachable.
        return None if 2 in self.subsets else self.stride

    def _initial_state(self, k, v):
        return append_cache(None, k, v, keep=self._keep())[2]

    def _decode(self, q, k, v, mask, state, dropout_p, need_weights):
        check_cache(self.registry_name, state)
        first = state.offset  # position of the first cached key
        k, v, cache = append_cache(state, k, v, keep=self._keep())
        M, N = q.shape[-2], k.shape[-2]
        if M == 0:
            return empty_output(q, v, N, need_weights)._replace(state=cache)
        l, dev, total = self.stride, q.device, first + N
        p = torch.arange(total - M, total, device=dev).view(M, 1)  # query positions
        parts = []
        if 1 in self.subsets:
            parts.append(p - l + torch.arange(l + 1, device=dev))  # A1: i - l .. i
        if 2 in self.subsets:
            near = 2 if 1 in self.subsets else 0  # i - j in {0, l} lies in the band: counted there
            parts.append(p - l * torch.arange(near, max(near, total // l + 1), device=dev))  # A2: i - m l
        pos = torch.cat(parts, dim=1)  # (M, |A|)
        valid = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=dev)
        out, weights = gathered_attend(q, k, v, pos - first, pos >= first, valid, dropout_p, need_weights)
        return AttentionOutput(out, weights, cache)

    def _flex_inputs(self, q, valid):
        B, H, L, _ = q.shape
        l, causal = self.stride, self.causal
        band = cols = None
        if 1 in self.subsets:  # A1, the band: contiguous keys
            band = flex.part_mask(masks.window(l, causal=causal), valid, B, H, L, L, q.device, ("band", l, causal))
        if 2 in self.subsets:
            # A2 on the transposed grid: position a l + c is row a of column c; column c of head h is
            # "head" h l + c of an (nr, nr) problem in which query row a sees key rows a' with
            # a - a' >= near (|a - a'| >= near), near = 2 when the band has the rows a' = a, a - 1;
            # key row a' of column c exists when a' l + c < L (the grid's padding otherwise).
            nr = -(-L // l)
            near = 2 if 1 in self.subsets else 0

            def rows(b, h, q_idx, kv_idx):
                d = q_idx - kv_idx
                return ((d >= near) if causal else (d.abs() >= near)) & (kv_idx * l + torch.remainder(h, l) < L)

            col_valid = None
            if valid is not None:
                col_valid = _columns(valid.expand(valid.shape[0], H, L).unsqueeze(-1), l).squeeze(-1)  # (B|1, H l, nr)
            cols = flex.part_mask(rows, col_valid, B, H * l, nr, nr, q.device, ("columns", l, L, near, causal),
                                  per_head=L % l != 0)
        return (band, cols), {"l": l}

    @staticmethod
    def _flex_program(q, k, v, band, cols, *, l):
        B, H, L, _ = q.shape
        parts = [] if band is None else [flex.lse_attend(q, k, v, band)]
        if cols is not None:
            nr = -(-L // l)
            out, lse = flex.lse_attend(_columns(q, l), _columns(k, l), _columns(v, l), cols)
            out = out.view(B, H, l, nr, -1).transpose(2, 3).reshape(B, H, nr * l, -1)[:, :, :L]
            lse = lse.view(B, H, l, nr).transpose(2, 3).reshape(B, H, nr * l)[:, :, :L]
            parts.append((out, lse))
        return flex.merge(parts)

    def _keys_per_query(self, n_keys: int) -> int:
        l = self.stride
        return ((2 * l + (0 if self.causal else l)) if 1 in self.subsets else 0) + (
            -(-n_keys // l) if 2 in self.subsets else 0)

    def _frame_attend(self, q, k, v, valid, dropout_p, need_weights, row0=0):
        B, H, Lq, E = q.shape
        L = k.shape[-2]
        l, dev = self.stride, q.device
        nr = -(-L // l)  # rows of the (nr, l) grid; query block a = row a
        nq = -(-Lq // l)  # query rows row0 .. row0 + nq - 1
        q_grid = _grid(q / math.sqrt(E), nq, l)  # (B, H, nq, l, E): query i = a l + c at (a, c), scaled
        parts, values = [], []
        if 1 in self.subsets:
            # A1, the band: query block a sees keys a l - l + [0, W).
            W = 2 * l + (0 if self.causal else l)
            k_band = unfold_band(k, row0 * l - l, l, W, nq)  # (B, H, nq, W, E)
            v_band = unfold_band(v, row0 * l - l, l, W, nq)  # (B, H, nq, W, Ev)
            s1 = q_grid @ k_band.transpose(-1, -2)  # (B, H, nq, l, W)
            # d = i - j = c - kj + l for query column c and key column kj of the same block.
            d = torch.arange(l, device=dev).view(l, 1) - torch.arange(W, device=dev).view(1, W) + l
            band = (d <= l) & (d >= (0 if self.causal else -l))  # (l, W), shared by all blocks
            key_ok = unfold_band(valid.unsqueeze(-1), row0 * l - l, l, W, nq).squeeze(-1)  # (B|1, H|1, nq, W)
            parts.append((s1, band & key_ok.unsqueeze(-2)))  # allowed (B|1, H|1, nq, l, W)
            values.append(v_band)
        if 2 in self.subsets:
            # A2, the strided columns: query (a, c) sees keys (a', c) of the same grid column c.
            q_cols = q_grid.transpose(2, 3)  # (B, H, l, nq, E)
            k_cols = _grid(k, nr, l).transpose(2, 3)  # (B, H, l, nr, E)
            s2 = (q_cols @ k_cols.transpose(-1, -2)).transpose(2, 3)  # (B, H, nq(a), l(c), nr(a'))
            da = torch.arange(row0, row0 + nq, device=dev).view(nq, 1, 1) - torch.arange(nr, device=dev).view(1, 1, nr)  # a - a'
            # i - j = (a - a') l: |a - a'| <= 1 lies in the band already — counted once, there.
            near = 2 if 1 in self.subsets else 0
            rows = (da >= near) if self.causal else (da.abs() >= near)  # (nq, 1, nr)
            key_ok = _grid(valid.unsqueeze(-1), nr, l).squeeze(-1).transpose(-1, -2)  # (B|1, H|1, l(c), nr(a'))
            parts.append((s2, rows & key_ok.unsqueeze(-3)))  # allowed (B|1, H|1, nq, l, nr)
            values.append(_grid(v, nr, l).transpose(2, 3))  # (B, H, l, nr, Ev)

        dropped, weights, row_ok = _softmax_over_parts(parts, dropout_p, need_weights)
        out = 0
        if 1 in self.subsets:
            out = dropped[0] @ values[0]  # (B, H, nq, l, Ev)
        if 2 in self.subsets:
            w2 = dropped[-1].transpose(2, 3)  # (B, H, l(c), nq(a), nr(a'))
            out = out + (w2 @ values[-1]).transpose(2, 3)  # (B, H, nq, l, Ev)
        out = out.masked_fill(~row_ok, 0.0).reshape(B, H, nq * l, v.shape[-1])[:, :, :Lq]  # (B, H, Lq, Ev)
        if not need_weights:
            return out, None

        # Dense (B, H, L, L) weights for inspection and plots (O(L^2): on request only).
        dense = q.new_zeros(B, H, nr, l, L)
        if 1 in self.subsets:
            cols = (torch.arange(nr, device=dev).view(nr, 1, 1) * l - l + torch.arange(W, device=dev).view(1, 1, W))
            dense.scatter_add_(-1, cols.clamp(0, L - 1).expand(B, H, nr, l, W), weights[0])  # clamped: weight 0
        if 2 in self.subsets:
            cols = torch.arange(nr, device=dev).view(1, 1, nr) * l + torch.arange(l, device=dev).view(1, l, 1)
            dense.scatter_add_(-1, cols.clamp(max=L - 1).expand(B, H, nr, l, nr), weights[-1])
        return out, dense.view(B, H, nr * l, L)[:, :, :L]


@register("attention", "fixed", "sparse-fixed")
class FixedAttention(_Factorized):
    """Sparse Transformer fixed attention (Child et al. 2019): the own block of `stride` plus the last `c` positions of every block, one softmax.

    ``A1_i = {j : floor(j / l) = floor(i / l)}``, ``A2_i = {j : j mod l >= l - c}``; the head attends
    to the union of the chosen ``subsets`` (``qkv.masks.fixed``), causal adds ``j <= i``.

    Args:
        stride: block length ``l > 0``.
        c: summary positions per block, ``1 <= c <= l`` (the paper uses 8–32 with ``l`` 128).
        subsets: ``(1,)``, ``(2,)`` or ``(1, 2)`` (the union, default).
        recompute: chunks of query blocks recomputed in backward (see ``strided``).
    Shapes: ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)`` -> ``(B, H, M, Ev)``; queries
    aligned to the end of the keys; key-padding masks only. Cost: O(N (l + c N / l) E) time,
    O(N (l + c N / l)) memory.
    """

    anchored = True  # blocks at multiples of the block length
    state_type = FixedState
    chunk_inference = True
    context_parallel = "summary"  # qkv.parallel: the own block in the shard, the summary columns all-gathered

    def __init__(self, *, stride: int, c: int, subsets: Sequence[int] = (1, 2), causal: bool = False,
                 dropout: float = 0.0, recompute: int = 8) -> None:
        super().__init__(stride=stride, subsets=subsets, causal=causal, dropout=dropout, recompute=recompute)
        self.c = _checks.positive_int("c", c)
        if self.c > self.stride:
            raise ValueError(f"c must be <= stride ({self.stride}): a block has only stride positions; got c={c}")

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """``stride = sqrt(max_len)`` and ``c = stride / 4`` in ``[1, 8]`` summary positions per block
        (Child et al. 2019 use c in {8, 16, 32} with l = 128)."""
        stride = max(1, math.isqrt(max_len))
        return {**super().default_knobs(max_len, n_heads, d_head), "stride": stride, "c": clamp_knob(stride // 4, 1, 8)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"stride": (1, 2, 3, 4), "c": (1, 2, 3, 4), "subsets": ((1,), (2,), (1, 2))}

    def extra_repr(self) -> str:
        return f"stride={self.stride}, c={self.c}, subsets={self.subsets}, {super().extra_repr()}"

    def pattern(self, n_queries: int, n_keys: int):
        return shift_queries(masks.fixed(self.stride, self.c, self.subsets, causal=self.causal), n_keys - n_queries)

    def _compact(self, k, v, n_summaries: int, start: int, total: int) -> FixedState:
        """``FixedState`` from keys laid out as [``n_summaries`` summary keys | positions ``start .. total - 1``]."""
        l, c = self.stride, self.c
        done = total // l - start // l  # blocks finished among the contiguous positions
        keep = [torch.arange(n_summaries, device=k.device)]
        if 2 in self.subsets:  # their summaries: the last c positions of each
            rows = (torch.arange(done, device=k.device).view(done, 1) * l + (l - c) + torch.arange(c, device=k.device))
            keep.append(n_summaries + rows.reshape(-1))
        keep.append(torch.arange(n_summaries + done * l, k.shape[-2], device=k.device))  # the current block
        keep = torch.cat(keep)
        return FixedState(k[:, :, keep], v[:, :, keep], total)

    def _initial_state(self, k, v):
        return self._compact(k, v, 0, 0, k.shape[-2])

    def _decode(self, q, k, v, mask, state, dropout_p, need_weights):
        if not isinstance(state, FixedState):
            raise TypeError(f"state must be the FixedState attention {self.registry_name!r} returned, "
                            f"got {type(state).__name__}")
        l, c, dev = self.stride, self.c, q.device
        nb = state.position // l  # finished blocks before this call
        n_sum = nb * c if 2 in self.subsets else 0  # their summaries come first in the state
        k = torch.cat([state.key, k], dim=-2)  # (B, H, n_sum + total - nb l, E)
        v = torch.cat([state.value, v], dim=-2)
        total = state.position + k.shape[-2] - state.length
        M, N = q.shape[-2], k.shape[-2]
        new_state = self._compact(k, v, n_sum, nb * l, total)
        if M == 0:
            return empty_output(q, v, N, need_weights)._replace(state=new_state)
        p = torch.arange(total - M, total, device=dev).view(M, 1)  # query positions
        bp = torch.div(p, l, rounding_mode="floor")  # their blocks
        slot, ok = [], []
        if 1 in self.subsets:  # A1: the own block, j <= i
            pos1 = bp * l + torch.arange(l, device=dev)  # (M, l)
            slot.append(n_sum + pos1 - nb * l)
            ok.append(pos1 <= p)
        if 2 in self.subsets:  # A2: the summaries of every block, j <= i (the own block's once, in A1)
            blocks = torch.arange(-(-total // l), device=dev).view(-1, 1)
            pos2 = (blocks * l + (l - c) + torch.arange(c, device=dev)).view(1, -1)  # (1, blocks c)
            b2 = torch.div(pos2, l, rounding_mode="floor")
            finished = b2 < nb
            slot.append(torch.where(finished, b2 * c + (pos2 - b2 * l - (l - c)), n_sum + pos2 - nb * l).expand(M, -1))
            keep2 = pos2 <= p
            ok.append(keep2 & (b2 != bp) if 1 in self.subsets else keep2)
        valid = mask[:, :, 0, :] if mask is not None else torch.ones(1, 1, N, dtype=torch.bool, device=dev)
        out, weights = gathered_attend(q, k, v, torch.cat(slot, 1), torch.cat(ok, 1), valid, dropout_p, need_weights)
        return AttentionOutput(out, weights, new_state)

    def _flex_inputs(self, q, valid):
        B, H, L, _ = q.shape
        l, c, causal = self.stride, self.c, self.causal
        own = summaries = pos = None
        if 1 in self.subsets:  # A1, the own block: contiguous keys
            own = flex.part_mask(masks.fixed(l, c, subsets=(1,), causal=causal), valid, B, H, L, L, q.device,
                                 ("blocks", l, causal))
        if 2 in self.subsets:  # A2, the summaries gathered: n c / l contiguous keys
            pos = torch.arange(L, device=q.device)
            pos = pos[torch.remainder(pos, l) >= l - c]  # (S,) their positions
            skip_own = 1 in self.subsets

            def allowed(b, h, q_idx, kv_idx):
                p = pos[kv_idx]
                ok = (p <= q_idx) if causal else (p >= 0)
                if skip_own:  # the query's own block is counted once, in A1
                    ok = ok & (torch.div(p, l, rounding_mode="floor") != torch.div(q_idx, l, rounding_mode="floor"))
                return ok

            summaries = flex.part_mask(allowed, None if valid is None else valid[..., pos], B, H, L, pos.numel(),
                                       q.device, ("summaries", l, c, L, skip_own, causal))
        return (own, summaries, pos), {}

    @staticmethod
    def _flex_program(q, k, v, own, summaries, pos):
        parts = [] if own is None else [flex.lse_attend(q, k, v, own)]
        if summaries is not None:
            parts.append(flex.lse_attend(q, k[:, :, pos], v[:, :, pos], summaries))
        return flex.merge(parts)

    def _keys_per_query(self, n_keys: int) -> int:
        l = self.stride
        return (l if 1 in self.subsets else 0) + (-(-n_keys // l) * self.c if 2 in self.subsets else 0)

    def _frame_attend(self, q, k, v, valid, dropout_p, need_weights, row0=0):
        B, H, Lq, E = q.shape
        L = k.shape[-2]
        l, c, dev = self.stride, self.c, q.device
        nr = -(-L // l)  # blocks
        nq = -(-Lq // l)  # query blocks row0 .. row0 + nq - 1
        own = slice(row0, row0 + nq)
        q_grid = _grid(q / math.sqrt(E), nq, l)  # (B, H, nq, l, E), scaled
        k_grid, v_grid = _grid(k, nr, l), _grid(v, nr, l)  # (B, H, nr, l, E)
        key_ok = _grid(valid.unsqueeze(-1), nr, l).squeeze(-1)  # (B|1, H|1, nr, l)
        pos = torch.arange(nr * l, device=dev).view(nr, l)  # position of grid cell (a, c')
        parts, values = [], []
        if 1 in self.subsets:
            # A1, the own block: (l, l) scores per block.
            s1 = q_grid @ k_grid[:, :, own].transpose(-1, -2)  # (B, H, nq, l, l)
            within = torch.ones(l, l, dtype=torch.bool, device=dev)
            if self.causal:
                within = within.tril()
            parts.append((s1, within & key_ok[..., own, :].unsqueeze(-2)))  # allowed (B|1, H|1, nq, l, l)
            values.append(v_grid[:, :, own])
        if 2 in self.subsets:
            # A2, the summaries: the last c positions of every block, ns c keys shared by all queries
            # (causal: only the blocks up to the chunk's last query block, ns of them; else all nr).
            ns = min(nr, row0 + nq) if self.causal else nr
            k_sum = k_grid[:, :, :ns, l - c:].reshape(B, H, ns * c, E)  # (B, H, ns c, E)
            v_sum = v_grid[:, :, :ns, l - c:].reshape(B, H, ns * c, v.shape[-1])  # (B, H, ns c, Ev)
            s2 = (q_grid.reshape(B, H, nq * l, E) @ k_sum.transpose(-1, -2)).view(B, H, nq, l, ns * c)
            k_pos = pos[:ns, l - c:].reshape(1, 1, ns * c)
            q_pos = pos[own].view(nq, l, 1)
            ok = torch.ones(nq, l, ns * c, dtype=torch.bool, device=dev)
            if 1 in self.subsets:  # summaries of the query's own block lie in A1 — counted once, there.
                ok = ok & (torch.div(k_pos, l, rounding_mode="floor") != torch.arange(row0, row0 + nq, device=dev).view(nq, 1, 1))
            if self.causal:
                ok = ok & (k_pos <= q_pos)
            sum_ok = key_ok[..., :ns, l - c:].reshape(*key_ok.shape[:-2], 1, 1, ns * c)  # (B|1, H|1, 1, 1, ns c)
            parts.append((s2, ok & sum_ok))  # allowed (B|1, H|1, nq, l, ns c)
            values.append(v_sum)  # (B, H, ns c, Ev), shared by every query block

        dropped, weights, row_ok = _softmax_over_parts(parts, dropout_p, need_weights)
        out = 0
        if 1 in self.subsets:
            out = dropped[0] @ values[0]  # (B, H, nq, l, Ev)
        if 2 in self.subsets:  # one (nq l, ns c) @ (ns c, Ev) product, no copy of v_sum per block
            w2 = dropped[-1].reshape(B, H, nq * l, ns * c)
            out = out + (w2 @ values[-1]).view(B, H, nq, l, v.shape[-1])
        out = out.masked_fill(~row_ok, 0.0).reshape(B, H, nq * l, v.shape[-1])[:, :, :Lq]  # (B, H, Lq, Ev)
        if not need_weights:
            return out, None

        # Dense (B, H, L, L) weights for inspection and plots (O(L^2): on request only).
        dense = q.new_zeros(B, H, nr, l, nr * l)
        if 1 in self.subsets:
            cols = pos.view(nr, 1, l).expand(B, H, nr, l, l)
            dense.scatter_add_(-1, cols, weights[0])
        if 2 in self.subsets:
            cols = pos[:ns, l - c:].reshape(1, 1, 1, 1, ns * c).expand(B, H, nr, l, ns * c)
            dense.scatter_add_(-1, cols, weights[-1])
        return out, dense.view(B, H, nr * l, nr * l)[:, :, :L, :L]
