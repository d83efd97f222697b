"""Any registered kernel on sequence shards: ``qkv.parallel.attend(kernel, q, k, v, mask=..., group=...)``.

Each rank holds ``q, k, v (B, H, L/P, E)`` — its shard of a self-attention sequence of ``L``
positions in a layout (``qkv.parallel.layout``) — and gets its shard of the output; backward gives
each rank the gradients of its shard (the communication's backward is the same communication the
other way, ``qkv.parallel.comm``). Each kernel class declares how it splits
(``AttentionKernel.context_parallel``):

==============  ===================================================================================
``ring``        softmax (Liu et al. 2023, Ring Attention): the key/value shards travel around the
                group in ``P - 1`` steps; each step's block ``softmax`` partials (numerator,
                denominator, row maximum) are merged by their log-sum-exp — exact. Causal blocks
                wholly after a query piece are skipped; the zigzag layout balances them.
``halo``        window, local-1d: a shard needs only the keys within the band beyond its ends —
                ``r`` (window) or ``memory`` rounded up to whole blocks (local-1d) before it, and
                ``r`` after it (non-causal window) — fetched from the neighbours; the kernel then
                runs unchanged on the shard plus its halo (cut at the sequence's ends).
``summary``     fixed (Child et al. 2019): with shards of whole blocks of ``l`` the own block is
                local; the summaries (the last ``c`` positions of every block, ``c L / l`` keys)
                are all-gathered; the two parts merged by log-sum-exp. ``strided``'s second part
                (every ``l``-th earlier key, a different residue class for every query) needs
                every key: it runs under Ulysses.
``state``       linear, performer (Katharopoulos et al. 2020; Choromanski et al. 2020): the sums
                ``[S, Z] = sum_j phi(k_j) [v_j, 1]^T`` of each shard; non-causal one all-reduce,
                causal an exclusive scan over the ranks (each rank continues the kernel from the
                sums of the ranks before it, as incremental decoding does). Communication
                ``O(F Ev)`` per head, independent of ``L``.
``projection``  linformer (Wang et al. 2020): ``E K`` and ``F V`` are sums over positions — each
                rank projects its own columns, one all-reduce.
``ulysses``     everything else (DeepSpeed-Ulysses, Jacobs et al. 2023): an all-to-all turns
                sequence shards of all ``B H`` rows into whole sequences of ``B H / P`` rows, the
                kernel runs unchanged, a second all-to-all returns the output. ``ulysses-batch``:
                kernels with per-head parameters or draws (lsh, relative, adaptive-span) get whole
                batch rows (all heads of ``B / P`` examples), so that every head meets its own.
==============  ===================================================================================

A strategy that does not fit the call (a zigzag layout for halo, summary or causal state passing,
a shard that is not a whole number of local-1d or fixed blocks, linear attention with ``eps > 0``)
falls back to Ulysses; ``strategy_for`` says which runs. Masks: key padding ``(B, L/P)`` (this
rank's keys) under every strategy; ranks may differ in passing one or None (a shard without
padding). Dropout runs as the kernel's (halo, Ulysses, projection) or on the block weights of the
ring and of fixed's summary (equal in distribution to dropout on the whole weights; the ring then
keeps its blocks for autograd), with each rank's own draws.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..attention import AttentionKernel
from ..attention._ops import LinearState, accumulation_dtype, finite_or_zero, matmul_dtype
from ..attention.linear import elu_plus_one, log_elu_plus_one
from ..attention.performer import favor_log_features
from ..types import AttentionOutput
from .comm import Group, all_reduce_max, all_reduce_sum, exchange, send_receive
from .layout import check_length, gather, pieces, positions

__all__ = ["STRATEGIES", "attend", "strategy_for", "halo_widths", "check_rows"]

STRATEGIES = ("ring", "halo", "summary", "state", "projection", "ulysses", "ulysses-batch")


def _group(group) -> Group:
    return group if isinstance(group, Group) else Group.of(group)


def halo_widths(kernel: AttentionKernel) -> Tuple[int, int]:
    """``(left, right)``: the keys before and after a shard that a halo kernel's queries reach."""
    if hasattr(kernel, "radius"):  # window: |i - j| <= r
        return kernel.radius, 0 if kernel.causal else kernel.radius
    if hasattr(kernel, "memory") and isinstance(kernel.block, int):  # local-1d: whole blocks of memory before
        return -(-kernel.memory // kernel.block) * kernel.block, 0
    raise TypeError(f"attention {kernel.registry_name!r} declares context_parallel='halo' but has no radius or "
                    f"(block, memory) to size the halo")


def strategy_for(kernel: AttentionKernel, L: int, P: int, layout: str = "contiguous") -> str:
    """The strategy ``attend`` runs for ``kernel`` on ``L`` positions over ``P`` ranks: the kernel's
    declared one, or Ulysses where the declared one does not fit (see the module docstring)."""
    declared = getattr(type(kernel), "context_parallel", "ulysses")
    if declared not in STRATEGIES:
        raise ValueError(f"attention {kernel.registry_name!r} declares context_parallel={declared!r}; expected one of {STRATEGIES}")
    if declared == "halo":
        if layout != "contiguous":
            return "ulysses"
        block = getattr(kernel, "block", None)
        if not hasattr(kernel, "radius") and isinstance(block, int) and (L // P) % block:
            return "ulysses"  # local-1d: a shard must start at a block boundary
    if declared == "summary" and (layout != "contiguous" or (L // P) % kernel.stride):
        return "ulysses"  # the own blocks must lie inside the shards
    if declared == "state" and (getattr(kernel, "eps", 0.0) > 0 or (kernel.causal and layout != "contiguous")):
        return "ulysses"
    return declared


def attend(kernel: AttentionKernel, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
           group: Union[None, Group, dist.ProcessGroup] = None, layout: str = "contiguous",
           strategy: Optional[str] = None) -> AttentionOutput:
    """Run ``kernel`` on this rank's shard ``q, k, v (B, H, L/P, E)`` of a self-attention sequence.

    Args:
        mask: key padding of this rank's keys, bool ``(B, L/P)`` or ``(B, 1, 1, L/P)``, True = may attend.
        group: the process group the sequence is split over (default: the world).
        layout: ``"contiguous"`` or ``"zigzag"`` (``qkv.parallel.layout``): which positions each rank holds.
        strategy: force one of ``STRATEGIES`` (default ``strategy_for``; any kernel runs under Ulysses).
    Returns:
        ``AttentionOutput(out (B, H, L/P, Ev), None, None)``: this rank's shard of what ``kernel``
        computes on the whole sequence.
    """
    if not isinstance(kernel, AttentionKernel):
        raise TypeError(f"kernel must be a qkv attention kernel (AttentionKernel), got {type(kernel).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"{name} must be a floating (B, H, L/P, E) tensor, got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    B, H, n, E = q.shape
    if k.shape[:3] != (B, H, n) or v.shape[:3] != (B, H, n) or k.shape[-1] != E:
        raise ValueError(f"q, k and v must be shards of one self-attention sequence: (B, H, L/P) equal and q, k "
                         f"of one head size; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    g = _group(group)
    L = n * g.size
    check_length(L, g.size, layout, f"the sequence length (L/P = {n} positions per rank times {g.size} ranks)")
    if mask is not None:
        if mask.dim() == 4 and mask.shape[1:3] == (1, 1):
            mask = mask[:, 0, 0]
        if mask.dtype != torch.bool or mask.shape != (B, n):
            raise ValueError(f"mask must be this rank's key padding, bool (B, L/P) = {(B, n)}, got "
                             f"{mask.dtype} {tuple(mask.shape)}")
    chosen = strategy or strategy_for(kernel, L, g.size, layout)
    if chosen not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {chosen!r}")
    if g.size == 1:
        out = kernel(q, k, v, mask=mask).output
    else:
        out = _RUN[chosen](kernel, q, k, v, mask, g, L, layout)
    return AttentionOutput(out, None, None)


def _touch(out: Tensor, received: Sequence[Tensor]) -> Tensor:
    """``out`` plus zero from every received tensor: a tensor received and not otherwise used (a
    causal block wholly in a shard's future) still joins the graph, so that the ranks' backward
    exchanges meet."""
    for t in received:
        if t.is_floating_point() and t.requires_grad:
            out = out + t.reshape(-1)[:0].sum().to(out.dtype)
    return out


# ----------------------------------------------------------------------------- ring (softmax)


def _block(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], scale: float, p: float):
    """One block of softmax attention as mergeable partials: ``(num (B, H, m, Ev), den (B, H, m, 1),
    row max (B, H, m, 1))``, ``num = sum_j e_j v_j``, ``den = sum_j e_j``, ``e_j = exp(s_j - max)``;
    a row with no allowed key has ``max = -inf`` and zero sums."""
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, m, n)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    top = s.detach().amax(-1, keepdim=True)  # (B, H, m, 1): a constant that cancels in num / den
    e = torch.exp(s - finite_or_zero(top))  # masked: exp(-inf) = 0
    den = e.sum(-1, keepdim=True)
    if p > 0:
        e = F.dropout(e, p)  # dropout of the normalised weights: the common row factor commutes with it
    return e @ v, den, top


def _merge(parts: List[Tuple[Tensor, Tensor, Tensor]]) -> Tensor:
    """Merge block partials by their maxima (log-sum-exp): ``sum_b exp(m_b - M) num_b / sum_b exp(m_b - M) den_b``."""
    M = finite_or_zero(torch.stack([top for _, _, top in parts]).amax(0))  # (B, H, m, 1)
    num = sum(n * torch.exp(top - M) for n, _, top in parts)
    den = sum(d * torch.exp(top - M) for _, d, top in parts)
    return num / torch.where(den > 0, den, torch.ones_like(den))  # no allowed key: 0


def _ring_blocks(L: int, g: Group, src: int, layout: str, causal: bool, m_cur: Tensor):
    """The (query run, key run) blocks of one ring step — this rank's queries against the keys of rank
    ``src`` — as ``(query run index, query slice, key slice, key padding (B, 1, 1, kl) or None,
    diagonal)``. Runs are aligned and of one length, so a causal block is wholly before its queries
    (all keys visible), wholly after them (left out) or on the diagonal (the same positions)."""
    q_at = 0
    for i, (q_start, q_len) in enumerate(pieces(L, g.size, g.rank, layout)):
        k_at = 0
        for k_start, k_len in pieces(L, g.size, src, layout):
            kpm = m_cur[:, None, None, k_at:k_at + k_len]  # (B, 1, 1, kl)
            ks = slice(k_at, k_at + k_len)
            k_at += k_len
            if causal and k_start > q_start:
                continue  # every key after every query
            yield i, slice(q_at, q_at + q_len), ks, (None if bool(kpm.all()) else kpm), causal and k_start == q_start
        q_at += q_len


def _allowed(kpm: Optional[Tensor], diagonal: bool, m: int, device) -> Optional[Tensor]:
    """The block's mask: key padding and, on the diagonal, the causal cut."""
    if not diagonal:
        return kpm
    tri = torch.ones(m, m, dtype=torch.bool, device=device).tril()
    return tri if kpm is None else kpm & tri


def _fused(x: Tensor) -> bool:
    """Whether blocks run through PyTorch's fused CPU attention (flash, O(block) memory, with its
    log-sum-exp and its backward); elsewhere the blocks are computed as written (``_block``)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def _fuses(q: Tensor, v: Tensor) -> bool:
    """``_fused``, and values of the queries' head size (the fused kernel takes no other)."""
    return _fused(q) and v.shape[-1] == q.shape[-1]


def _block_forward(q: Tensor, k: Tensor, v: Tensor, kpm: Optional[Tensor], diagonal: bool, scale: float):
    """One block's ``(out (B, H, m, Ev), lse (B, H, m, 1))``, ``lse = -inf`` on rows with no allowed key."""
    if not _fuses(q, v):
        num, den, top = _block(q, k, v, _allowed(kpm, diagonal, q.shape[-2], q.device), scale, 0.0)
        has = den > 0
        return num / torch.where(has, den, torch.ones_like(den)), torch.where(
            has, finite_or_zero(top) + torch.log(den.clamp(min=torch.finfo(den.dtype).tiny)), float("-inf"))
    bias = None if kpm is None else torch.zeros(kpm.shape, dtype=q.dtype, device=q.device).masked_fill(~kpm, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, diagonal, attn_mask=bias, scale=scale)
    lse = lse.unsqueeze(-1)  # (B, H, m, 1)
    if kpm is not None:  # the fused kernel gives a row with no allowed key lse 0: make it -inf (it weighs nothing)
        has = kpm[..., 0, :]  # (B, 1, kl)
        has = (has.cumsum(-1) > 0) if diagonal else has.any(-1, keepdim=True)  # (B, 1, m | 1): a key at or before the row
        lse = lse.masked_fill(~has.unsqueeze(-1), float("-inf"))
    return out, lse


def _block_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, D: Tensor,
                    kpm: Optional[Tensor], diagonal: bool, scale: float):
    """One block's ``(dq, dk, dv)`` from the *global* output rows ``out`` and log-sum-exp ``lse``
    (``p = exp(s - lse)`` are then the block's entries of the whole softmax): exact block gradients."""
    lse0 = finite_or_zero(lse)  # a row with no allowed key anywhere has only -inf scores: p = 0 there
    if not _fuses(q, v):
        p = torch.exp(_scores(q, k, _allowed(kpm, diagonal, q.shape[-2], q.device), scale) - lse0)  # (B, H, m, kl)
        ds = p * (do @ v.transpose(-1, -2) - D)  # d loss / d scores
        return (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.transpose(-1, -2) @ do
    bias = None if kpm is None else torch.zeros(kpm.shape, dtype=q.dtype, device=q.device).masked_fill(~kpm, float("-inf"))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do, q, k, v, out, lse0.squeeze(-1), 0.0, diagonal, attn_mask=bias, scale=scale)


def _scores(q: Tensor, k: Tensor, allowed: Optional[Tensor], scale: float) -> Tensor:
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, m, n)
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))


def _fold(acc: Optional[Tuple[Tensor, Tensor]], out: Tensor, lse: Tensor) -> Tuple[Tensor, Tensor]:
    """A block's ``(out, lse)`` folded into the running ``acc`` (online softmax): ``(w_a out_a + w_b out_b)
    / (w_a + w_b)``, ``w = exp(lse - max)``, and ``lse = log(exp(lse_a) + exp(lse_b))`` — one block's
    output alive at a time, not ``P``."""
    if acc is None:
        return out, lse
    M = finite_or_zero(torch.maximum(acc[1], lse))  # (B, H, m, 1)
    wa, wb = torch.exp(acc[1] - M), torch.exp(lse - M)
    den = wa + wb
    merged = (wa * acc[0] + wb * out) / torch.where(den > 0, den, torch.ones_like(den))
    return merged, torch.where(den > 0, M + torch.log(den.clamp(min=torch.finfo(den.dtype).tiny)), float("-inf"))


#: the pieces a ring buffer is passed on in (``_rotate``): one piece's receive buffer is alive at a
#: time, not a second copy of the shard
ROTATE_PIECES = 8


def _rotate(g: Group, buffers: List[Tensor], phase: str) -> None:
    """Pass each contiguous tensor of ``buffers`` to the next rank and overwrite it with the previous
    rank's, in place: in ``ROTATE_PIECES`` pieces, each piece overwritten once it has been sent, so
    that the exchange needs one piece's receive buffer, not a second copy of the shards."""
    nxt, prv = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    flat = [b.view(-1) for b in buffers]
    sizes = [-(-f.numel() // ROTATE_PIECES) for f in flat]  # each buffer in its own pieces (v's size need not be k's)
    for piece in range(ROTATE_PIECES):
        mine = [f[piece * size:(piece + 1) * size] for f, size in zip(flat, sizes)]
        got = send_receive(g, {nxt: mine}, {prv: [m.shape for m in mine]}, like=buffers[0], phase=phase)[prv]
        for m, x in zip(mine, got):
            m.copy_(x)


class _Ring(torch.autograd.Function):
    """Ring attention with its backward written out (the memory-efficient form of Liu et al. 2023,
    as in ring-flash-attention): forward keeps only this rank's ``q, k, v``, the output and the rows'
    log-sum-exp; backward sends the key/value shards around again, computes each block's gradients
    from the global output and log-sum-exp, and sends each shard's key/value gradients along with
    it, home after ``P`` steps. Blocks run through PyTorch's fused CPU attention where it applies
    (``_fused``), so that per-rank memory is O(L/P), not the ``(L/P, L/P)`` scores of a block; the
    travelling shards and gradients are passed on in place (``_rotate``) and the blocks read strided
    slices (no copies)."""

    @staticmethod
    def forward(ctx, g: Group, L: int, layout: str, causal: bool, scale: float, q: Tensor, k: Tensor, v: Tensor,
                mask: Tensor):
        B, H, n, _ = q.shape
        nxt, prv = (g.rank + 1) % g.size, (g.rank - 1) % g.size
        runs = pieces(L, g.size, g.rank, layout)
        running: List[Optional[Tuple[Tensor, Tensor]]] = [None for _ in runs]  # (out, lse) of each query run
        k_cur, v_cur, m_cur = k, v, mask
        for step in range(g.size):
            src = (g.rank - step) % g.size
            for i, qs, ks, kpm, diagonal in _ring_blocks(L, g, src, layout, causal, m_cur):
                running[i] = _fold(running[i], *_block_forward(q[:, :, qs], k_cur[:, :, ks], v_cur[:, :, ks], kpm,
                                                                diagonal, scale))
            if step < g.size - 1:
                if step == 0:  # the buffers that travel (the inputs stay as they are)
                    k_cur, v_cur = (x.clone(memory_format=torch.contiguous_format) for x in (k, v))
                _rotate(g, [k_cur, v_cur], "forward")
                m_cur = send_receive(g, {nxt: [m_cur]}, {prv: [mask.shape]}, like=mask)[prv][0]
        del k_cur, v_cur
        merged = [r if r is not None else (q.new_zeros(B, H, length, v.shape[-1]), q.new_full((B, H, length, 1), float("-inf")))
                  for r, (_, length) in zip(running, runs)]
        out = torch.cat([o for o, _ in merged], dim=2)  # (B, H, n, Ev)
        lse = torch.cat([s for _, s in merged], dim=2)  # (B, H, n, 1)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.setup = (g, L, layout, causal, scale)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, mask, out, lse = ctx.saved_tensors
        g, L, layout, causal, scale = ctx.setup
        nxt, prv = (g.rank + 1) % g.size, (g.rank - 1) % g.size
        dout = dout.contiguous()
        D = (dout * out).sum(-1, keepdim=True)  # (B, H, n, 1): sum_j p_j dp_j of every row
        dq = torch.zeros_like(q)
        k_cur, v_cur, m_cur = k, v, mask
        dk_cur, dv_cur = k.new_zeros(k.shape), v.new_zeros(v.shape)  # contiguous: rotated in place
        for step in range(g.size):
            src = (g.rank - step) % g.size
            for _, qs, ks, kpm, diagonal in _ring_blocks(L, g, src, layout, causal, m_cur):
                dq_b, dk_b, dv_b = _block_backward(dout[:, :, qs], q[:, :, qs], k_cur[:, :, ks], v_cur[:, :, ks],
                                                   out[:, :, qs], lse[:, :, qs], D[:, :, qs], kpm, diagonal, scale)
                dq[:, :, qs] += dq_b
                dk_cur[:, :, ks] += dk_b
                dv_cur[:, :, ks] += dv_b
                del dq_b, dk_b, dv_b
            # pass the shard and its gradients on, in place; after the last step the gradients go home
            # (to src + 1 = next)
            if step < g.size - 1:
                if step == 0:
                    k_cur, v_cur = (x.clone(memory_format=torch.contiguous_format) for x in (k, v))
                _rotate(g, [k_cur, v_cur], "backward")
                m_cur = send_receive(g, {nxt: [m_cur]}, {prv: [mask.shape]}, like=mask, phase="backward")[prv][0]
            _rotate(g, [dk_cur, dv_cur], "backward")
        return None, None, None, None, None, dq, dk_cur, dv_cur, None


def _ring(kernel, q, k, v, mask, g: Group, L: int, layout: str) -> Tensor:
    B, H, n, E = q.shape
    acc = accumulation_dtype(q.dtype)
    scale = getattr(kernel, "scale", None) or 1.0 / math.sqrt(E)
    # the key padding always travels (all True without one): a rank whose shard has no padding and
    # passes no mask makes the same exchanges as one that does
    keep = mask if mask is not None else torch.ones(B, n, dtype=torch.bool, device=q.device)
    p = kernel.dropout if kernel.training else 0.0
    if p == 0:
        return _Ring.apply(g, L, layout, kernel.causal, scale, q.to(acc), k.to(acc), v.to(acc), keep).to(v.dtype)
    return _ring_autograd(q, k, v, keep, g, L, layout, kernel.causal, scale, p)


def _ring_autograd(q, k, v, keep, g: Group, L: int, layout: str, causal: bool, scale: float, p: float) -> Tensor:
    """Ring attention with dropout on the block weights, differentiated by autograd (the dropout masks
    are kept for backward, with every block's weights: O(L^2 / P) memory per rank)."""
    B, H, n, _ = q.shape
    acc = accumulation_dtype(q.dtype)
    runs = pieces(L, g.size, g.rank, layout)
    parts: List[List[Tuple[Tensor, Tensor, Tensor]]] = [[] for _ in runs]
    nxt, prv = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    k_cur, v_cur, m_cur = k, v, keep
    received: List[Tensor] = []
    for step in range(g.size):
        src = (g.rank - step) % g.size  # whose keys this rank holds now
        for i, qs, ks, kpm, diagonal in _ring_blocks(L, g, src, layout, causal, m_cur):
            allowed = _allowed(kpm, diagonal, qs.stop - qs.start, q.device)
            parts[i].append(_block(q[:, :, qs].to(acc), k_cur[:, :, ks].to(acc), v_cur[:, :, ks].to(acc), allowed, scale, p))
        if step < g.size - 1:  # pass the keys on: to the next rank, from the previous one
            got = exchange(g, {nxt: [k_cur, v_cur]}, {prv: [k_cur.shape, v_cur.shape]}, like=k)[prv]
            k_cur, v_cur = got
            received += got
            m_cur = exchange(g, {nxt: [m_cur]}, {prv: [m_cur.shape]}, like=m_cur)[prv][0]
    outs = [_merge(part) if part else q.new_zeros(B, H, length, v.shape[-1], dtype=acc) for part, (_, length) in zip(parts, runs)]
    return _touch(torch.cat(outs, dim=2).to(v.dtype), received)


# ----------------------------------------------------------------------------- halo (window, local-1d)


def _fetch(g: Group, xs: List[Tensor], n: int, ranges: List[Tuple[int, int]], like: Tensor) -> List[List[Tensor]]:
    """For each global range ``[a, b)`` a rank needs (the same list on every rank, shifted by its
    start), the rows of each ``x (B, H, n, *)`` inside ``[0, L)``, fetched from the ranks that hold
    them (contiguous layout). Returns, per range, one tensor per ``x``, in position order."""
    def need(rank: int) -> List[Tuple[int, int]]:
        start = rank * n
        return [(max(0, start + a), min(g.size * n, start + b)) for a, b in ranges]

    def overlap(r: Tuple[int, int], owner: int) -> Tuple[int, int]:
        return max(r[0], owner * n), min(r[1], owner * n + n)

    sends: Dict[int, List[Tensor]] = {}
    expect: Dict[int, List[torch.Size]] = {}
    for peer in range(g.size):
        if peer == g.rank:
            continue
        sends[peer], expect[peer] = [], []
        for r in need(peer):  # what peer needs from me
            a, b = overlap(r, g.rank)
            sends[peer] += [x[:, :, a - g.rank * n:a - g.rank * n + max(0, b - a)] for x in xs]
        for r in need(g.rank):  # what I need from peer
            a, b = overlap(r, peer)
            expect[peer] += [torch.Size((*x.shape[:2], max(0, b - a), *x.shape[3:])) for x in xs]
    got = exchange(g, sends, expect, like)
    out = []
    for j, r in enumerate(need(g.rank)):
        per_x = []
        for i, x in enumerate(xs):
            rows = [got[peer][j * len(xs) + i] for peer in sorted(got)]  # peers in rank order = position order
            per_x.append(torch.cat(rows, dim=2) if rows else x[:, :, :0])
        out.append(per_x)
    return out


def _halo(kernel, q, k, v, mask, g: Group, L: int, layout: str) -> Tensor:
    B, H, n, E = q.shape
    left, right = halo_widths(kernel)
    start = g.rank * n
    ranges = [(-left, 0), (n, n + right)]  # relative to the shard's start
    (kl, vl), (kr, vr) = _fetch(g, [k, v], n, ranges, like=k)
    keep = mask if mask is not None else torch.ones(B, n, dtype=torch.bool, device=q.device)
    (ml,), (mr,) = _fetch(g, [keep[:, None, :, None]], n, ranges, like=keep)
    # the halos as far as they lie inside [0, L): the first and last ranks' keys stop at the sequence's ends
    kf = torch.cat([kl, k, kr], dim=2)  # (B, H, left' + n + right', E)
    vf = torch.cat([vl, v, vr], dim=2)
    maskf = torch.cat([ml[:, 0, :, 0], keep, mr[:, 0, :, 0]], dim=1)
    # queries aligned to the end of the keys (query i at left' + i): right' rows after them, cut off again
    qf = q if kr.shape[2] == 0 else torch.cat([q, q.new_zeros(B, H, kr.shape[2], E)], dim=2)
    out = kernel(qf, kf, vf, mask=None if bool(maskf.all()) else maskf).output[:, :, :n]  # no padding: its fast path
    return _touch(out, [kl, vl, kr, vr])


# ----------------------------------------------------------------------------- state passing (linear, performer)


def _log_features(kernel, x: Tensor) -> Tuple[Tensor, bool]:
    """The kernel's features of ``x`` in log space (True) or directly (False, a callable feature map)."""
    acc = accumulation_dtype(x.dtype)
    if kernel.registry_name == "performer":  # features drawn by _state, the same on every rank
        return favor_log_features(x.to(acc), kernel.projection.to(device=x.device, dtype=acc)), True
    if _in_log_space(kernel):
        return log_elu_plus_one(x.to(acc)), True
    return kernel.feature_map(x.to(acc)), False


def _in_log_space(kernel) -> bool:
    """Whether ``_log_features`` gives ``kernel``'s features in log space."""
    return kernel.registry_name == "performer" or kernel.feature_map is elu_plus_one


def _key_terms(kernel, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, bool, Tensor]:
    """``(phi(k) (B, H, n, F), in log space?, [v, 1] (B, H, n, Ev + 1))`` of this shard, a masked key's
    feature made -inf (log space) or 0."""
    B, H, n, _ = k.shape
    lk, log = _log_features(kernel, k)  # (B, H, n, F)
    acc = lk.dtype
    v1 = torch.cat([v.to(acc), v.new_ones(B, H, n, 1, dtype=acc)], dim=-1)  # [v, 1]
    if mask is not None:
        keep = mask[:, None, :, None]
        lk = lk.masked_fill(~keep, float("-inf")) if log else lk * keep
    return lk, log, v1


def _shard_sums(kernel, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``([S, Z] (B, H, F, Ev + 1), top (B, H))``: this shard's sums ``sum_j phi(k_j) [v_j, 1]^T``,
    scaled by ``exp(-top)``, ``top`` the largest key feature in log space (0 for a direct feature map)."""
    lk, log, v1 = _key_terms(kernel, k, v, mask)
    top = lk.detach().amax((-2, -1)) if log else lk.new_zeros(k.shape[:2])  # (B, H)
    ek = torch.exp(lk - finite_or_zero(top)[..., None, None]) if log else lk
    return ek.transpose(-1, -2) @ v1, top


def _state(kernel, q, k, v, mask, g: Group, L: int, layout: str) -> Tensor:
    B, H, n, E = q.shape
    Ev = v.shape[-1]
    redraw = kernel.registry_name == "performer" and (kernel.projection is None or (kernel.redraw and kernel.training))
    if redraw:  # drawn once per call, here, and rank 0's draw broadcast: every rank sums with the same features
        kernel.redraw_features(E)
        dist.broadcast(kernel.projection, g.global_rank(0), group=g.group)
    if not kernel.causal:
        lk, log, v1 = _key_terms(kernel, k, v, mask)
        if log:
            top = all_reduce_max(g, lk.detach().amax((-2, -1)))  # (B, H): the largest key feature anywhere
            lk = torch.exp(lk - finite_or_zero(top)[..., None, None])
        SZ = all_reduce_sum(g, lk.transpose(-1, -2) @ v1)  # (B, H, F, Ev + 1): [S, Z] of every key
        lq, _ = _log_features(kernel, q)
        phi_q = torch.exp(lq - lq.detach().amax(-1, keepdim=True)) if log else lq
        nd = phi_q @ SZ  # (B, H, n, Ev + 1)
        den = nd[..., Ev:]
        # a zero denominator (no key anywhere: a sequence all padding) gives 0, as the kernel's own
        # division does; clamping it to the smallest float would send 1 / tiny into backward (0 * inf in dv)
        out = nd[..., :Ev] / den.masked_fill(den == 0, 1.0)
        return out.to(v.dtype)
    # causal: each rank's [S, Z] (at its own scale), sent to the ranks after it; rank p continues from
    # the sums of ranks 0 .. p-1 as from a decoding state. The sums are recomputed in backward
    # (checkpoint): their (B, H, n, F) features and [v, 1] are not kept
    log = _in_log_space(kernel)
    SZ, top = checkpoint(_shard_sums, kernel, k, v, mask, use_reentrant=False)  # (B, H, F, Ev + 1), (B, H)
    later, earlier = range(g.rank + 1, g.size), range(g.rank)
    empty = SZ[..., :0, :]
    sends = {p: [SZ, top] for p in later} | {p: [empty, top[..., :0]] for p in earlier}
    expect = {p: [SZ.shape, top.shape] for p in earlier} | {p: [empty.shape, top[..., :0].shape] for p in later}
    got = exchange(g, sends, expect, like=SZ)
    state = None
    if g.rank > 0:
        tops = torch.stack([got[p][1] for p in earlier])  # (p, B, H)
        M = finite_or_zero(tops.amax(0)) if log else tops[0]
        total = sum(got[p][0] * torch.exp(got[p][1] - M)[..., None, None] for p in earlier)
        state = LinearState(S=total[..., :Ev], Z=total[..., Ev], length=0,
                            log_scale=tops.amax(0) if log else None)
    if redraw and kernel.redraw:  # a performer that redraws in training must not draw again (rank 0 has no state)
        kernel.redraw = False
        try:
            out = kernel(q, k, v, mask=mask, state=state).output
        finally:
            kernel.redraw = True
    else:
        out = kernel(q, k, v, mask=mask, state=state).output
    return _touch(out, [t for p in got for t in got[p]])


# ----------------------------------------------------------------------------- summary (fixed)


def _summary(kernel, q, k, v, mask, g: Group, L: int, layout: str) -> Tensor:
    """Sparse Transformer fixed attention (Child et al. 2019) on whole blocks of ``l``: the own block
    ``A1`` lies inside the shard (``L/P`` a multiple of ``l``), the summaries ``A2`` — the last ``c``
    positions of every block — are all-gathered (``c L / l`` keys); one softmax over ``A1 ∪ A2``, its
    two parts merged by log-sum-exp, a key in both counted once (in ``A1``)."""
    B, H, n, E = q.shape
    Ev = v.shape[-1]
    l, c = kernel.stride, kernel.c
    acc = accumulation_dtype(q.dtype)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    scale = 1.0 / math.sqrt(E)
    p = kernel.dropout if kernel.training else 0.0
    keep = mask if mask is not None else torch.ones(B, n, dtype=torch.bool, device=q.device)
    start = g.rank * n
    qpos = torch.arange(start, start + n, device=q.device)
    parts: List[Tuple[Tensor, Tensor, Tensor]] = []
    received: List[Tensor] = []
    if 1 in kernel.subsets:  # A1: dense attention inside each block of l
        nb = n // l
        blocks = lambda x: x.reshape(B, H, nb, l, x.shape[-1])
        allowed = keep.view(B, 1, nb, 1, l)  # (B, 1, nb, 1, l)
        if kernel.causal:
            allowed = allowed & torch.ones(l, l, dtype=torch.bool, device=q.device).tril()
        num, den, top = _block(blocks(q), blocks(k), blocks(v), allowed, scale, p)  # (B, H, nb, l, *)
        parts.append((num.reshape(B, H, n, Ev), den.reshape(B, H, n, 1), top.reshape(B, H, n, 1)))
    if 2 in kernel.subsets:  # A2: every block's last c positions, from every rank
        cols = (torch.arange(n, device=q.device) % l) >= l - c  # this shard's summary positions
        others = [r for r in range(g.size) if r != g.rank]
        ks, vs, ms = k[:, :, cols], v[:, :, cols], keep[:, cols]
        got = exchange(g, {r: [ks, vs] for r in others}, {r: [ks.shape, vs.shape] for r in others}, like=k)
        got_mask = exchange(g, {r: [ms] for r in others}, {r: [ms.shape] for r in others}, like=ms)
        received += [t for r in others for t in got[r]]
        k_all = torch.cat([ks if r == g.rank else got[r][0] for r in range(g.size)], dim=2)  # (B, H, c L / l, E)
        v_all = torch.cat([vs if r == g.rank else got[r][1] for r in range(g.size)], dim=2)
        m_all = torch.cat([ms if r == g.rank else got_mask[r][0] for r in range(g.size)], dim=1)  # (B, c L / l)
        kpos = (torch.arange(L, device=q.device).view(-1, l)[:, l - c:]).reshape(-1)  # their global positions
        chunk = -(-n // 8)  # query rows per chunk, each recomputed in backward (as the kernel's own
        # recompute): one chunk's (rows, c L / l) scores alive at a time, none kept for backward
        chunks = []
        for at in range(0, n, chunk):
            rows = qpos[at:at + chunk].view(-1, 1)
            allowed = m_all[:, None, None, :]  # (B, 1, 1, S)
            if kernel.causal:
                allowed = allowed & (kpos.view(1, -1) <= rows)
            if 1 in kernel.subsets:  # counted in A1 already
                allowed = allowed & ((kpos.view(1, -1) // l) != (rows // l))
            chunks.append(checkpoint(_block, q[:, :, at:at + chunk], k_all, v_all, allowed, scale, p, use_reentrant=False))
        parts.append(tuple(torch.cat(x, dim=2) for x in zip(*chunks)))
    return _touch(_merge(parts).to(v.dtype), received)


# ----------------------------------------------------------------------------- projection (linformer)


def _projection(kernel, q, k, v, mask, g: Group, L: int, layout: str) -> Tensor:
    if L > kernel.seq_len:
        raise ValueError(f"linformer was built for seq_len={kernel.seq_len} keys, got a sequence of {L}")
    dtype, acc = q.dtype, matmul_dtype(q.dtype)
    pos = positions(L, layout=layout, rank=g.rank, size=g.size, device=q.device)
    E = kernel.E[:, pos].to(acc)  # (k, n): this rank's columns
    Fp = E if kernel.F is None else kernel.F[:, pos].to(acc)
    k, v = k.to(acc), v.to(acc)
    if mask is not None:
        keep = mask[:, None, :, None]
        k = torch.where(keep, k, torch.zeros((), dtype=acc))
        v = torch.where(keep, v, torch.zeros((), dtype=acc))
    kp = torch.cat([E @ k, Fp @ v], dim=-1)  # (B, H, k, E + Ev): this rank's part of [E K, F V]
    kp = all_reduce_sum(g, kp)
    p = kernel.dropout if kernel.training else 0.0
    out = F.scaled_dot_product_attention(q.to(acc), kp[..., :q.shape[-1]], kp[..., q.shape[-1]:], dropout_p=p)
    return out.to(dtype)


# ----------------------------------------------------------------------------- Ulysses


@contextmanager
def _drawn_once(kernel: AttentionKernel, g: Group, H: int, E: int, L: int, device) -> Iterator[None]:
    """Inside the block, a kernel that draws its randomness at every call — LSH's rotations
    (``hashing``) without a seed — hashes with one draw on every rank: the group's first rank's,
    drawn from its generator as one process draws it (the first rank is seeded as one process
    is), and sent to the others. Each rank drawing its own would hash its batch rows differently
    from one process. Other kernels: nothing changes."""
    if not hasattr(kernel, "hashing") or (kernel.seed if kernel.seed is not None or kernel.training
                                          else kernel.eval_seed) is not None:
        yield
        return
    drawn = kernel.hashing(H, E, L, device)
    if drawn.rotations is not None:  # None: one bucket, nothing drawn
        dist.broadcast(drawn.rotations, g.global_rank(0), group=g.group)
    kernel.hashing = lambda *args, **kwargs: drawn  # an instance attribute, found before the method
    try:
        yield
    finally:
        del kernel.hashing


def check_rows(kernel: AttentionKernel, B: int, H: int, L: int, P: int, layout: str = "contiguous",
               strategy: Optional[str] = None) -> None:
    """A ValueError when ``kernel``'s strategy (default ``strategy_for``) cannot split a batch of
    ``B`` sequences of ``L`` with ``H`` heads over ``P`` ranks: Ulysses hands each rank ``B H / P``
    whole rows, ``ulysses-batch`` ``B / P`` whole examples. (Checked before a run starts —
    ``qkv.runs`` — and by the strategy itself.)"""
    chosen = strategy or strategy_for(kernel, L, P, layout)
    if chosen == "ulysses-batch" and B % P:
        raise ValueError(f"attention {kernel.registry_name!r} splits over whole batch rows under context parallelism "
                         f"(its heads differ: per-head parameters or draws), so the batch ({B}) must be a multiple of "
                         f"the {P} ranks")
    if chosen in ("ulysses", "ulysses-batch") and (B * H) % P:
        raise ValueError(f"Ulysses context parallelism splits the batch x heads rows ({B} x {H}) over {P} ranks: "
                         f"their product must be a multiple of {P}")


def _ulysses(kernel, q, k, v, mask, g: Group, L: int, layout: str, whole_batch: bool = False) -> Tensor:
    B, H, n, E = q.shape
    Ev = v.shape[-1]
    P = g.size
    check_rows(kernel, B, H, L, P, layout, "ulysses-batch" if whole_batch else "ulysses")
    R = B * H // P  # rows per rank
    rows = lambda x: x.reshape(B * H, n, x.shape[-1])
    qr, kr, vr = rows(q), rows(k), rows(v)
    own = lambda x, r: x[r * R:(r + 1) * R]
    others = [r for r in range(P) if r != g.rank]
    got = exchange(g, {r: [own(qr, r), own(kr, r), own(vr, r)] for r in others},
                   {r: [torch.Size((R, n, E)), torch.Size((R, n, E)), torch.Size((R, n, Ev))] for r in others}, like=q)
    runs = []  # (global start, (q, k, v) rows of that run)
    for r in range(P):
        parts = [own(x, g.rank) for x in (qr, kr, vr)] if r == g.rank else got[r]
        at = 0
        for start, length in pieces(L, P, r, layout):
            runs.append((start, [x[:, at:at + length] for x in parts]))
            at += length
    runs.sort(key=lambda run: run[0])
    qs, ks, vs = (torch.cat([run[1][i] for run in runs], dim=1) for i in range(3))  # (R, L, *)
    keep = mask if mask is not None else torch.ones(B, n, dtype=torch.bool, device=q.device)
    full_mask = gather(keep, g, layout, dim=-1)  # (B, L): gathered on every rank, padded or not (the same exchanges)
    if whole_batch:
        b = R // H
        shape = (b, H, L)
        kmask = full_mask[g.rank * b:(g.rank + 1) * b]
    else:
        shape = (R, 1, L)
        kmask = full_mask[torch.arange(g.rank * R, (g.rank + 1) * R, device=q.device) // H]
    kmask = None if bool(kmask.all()) else kmask  # no padding: the kernel's fast path
    with _drawn_once(kernel, g, H, E, L, q.device):
        out = kernel(qs.reshape(*shape, E), ks.reshape(*shape, E), vs.reshape(*shape, Ev), mask=kmask).output
    out = out.reshape(R, L, Ev)
    back = {r: [torch.cat([out[:, s:s + length] for s, length in pieces(L, P, r, layout)], dim=1)] for r in others}
    got_back = exchange(g, back, {r: [torch.Size((R, n, Ev))] for r in others}, like=out)
    mine = torch.cat([out[:, s:s + length] for s, length in pieces(L, P, g.rank, layout)], dim=1)
    rows_out = [mine if r == g.rank else got_back[r][0] for r in range(P)]
    return torch.cat(rows_out, dim=0).view(B, H, n, Ev)


_RUN = {
    "ring": _ring, "halo": _halo, "summary": _summary, "state": _state, "projection": _projection, "ulysses": _ulysses,
    "ulysses-batch": lambda *args: _ulysses(*args, whole_batch=True),
}
