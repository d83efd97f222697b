"""Which positions of a sequence each rank holds, and moving a sequence between whole and shards.

Two layouts of a length-``L`` sequence over ``P`` ranks:

- ``"contiguous"``: rank ``p`` holds ``[p L/P, (p + 1) L/P)`` (``L`` a multiple of ``P``);
- ``"zigzag"``: the sequence is cut into ``2P`` chunks of ``c = L / 2P`` and rank ``p`` holds
  chunks ``p`` and ``2P - 1 - p`` (``L`` a multiple of ``2P``). Under causal attention every rank
  then has the same number of (query, key) pairs to compute — the layout of ring-flash-attention
  and of Llama 3's context parallelism — where the contiguous layout leaves rank 0 with the least
  work and rank ``P - 1`` with the most.

A rank's shard is its pieces concatenated in order: ``(..., L/P, ...)`` along the sequence dim.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .comm import Group, all_gather

__all__ = ["LAYOUTS", "pieces", "positions", "shard", "gather", "check_length"]

LAYOUTS = ("contiguous", "zigzag")


def check_length(L: int, P: int, layout: str, what: str = "the sequence length") -> None:
    """``L`` must split evenly: a multiple of ``P`` (contiguous) or of ``2P`` (zigzag)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    unit = P if layout == "contiguous" else 2 * P
    if L % unit:
        raise ValueError(f"{what} ({L}) must be a multiple of {unit} to split into {P} shards in the {layout} "
                         f"layout{' (2 chunks per rank)' if layout == 'zigzag' else ''}")


def pieces(L: int, P: int, rank: int, layout: str = "contiguous") -> List[Tuple[int, int]]:
    """The ``(start, length)`` runs of global positions rank ``rank`` holds, in shard order."""
    check_length(L, P, layout)
    if layout == "contiguous":
        n = L // P
        return [(rank * n, n)]
    c = L // (2 * P)
    return [(rank * c, c), ((2 * P - 1 - rank) * c, c)]


def positions(L: int, group: Optional[Group] = None, layout: str = "contiguous", *, rank: Optional[int] = None,
              size: Optional[int] = None, device=None) -> Tensor:
    """The global positions ``(L/P,)`` (long) of the shard rank ``rank`` (default: this process) holds."""
    if rank is None or size is None:
        group = group or Group.of()
        rank, size = group.rank, group.size
    runs = pieces(L, size, rank, layout)
    return torch.cat([torch.arange(s, s + n, device=device) for s, n in runs])


def shard(x: Tensor, group: Optional[Group] = None, layout: str = "contiguous", dim: int = -2, *,
          rank: Optional[int] = None, size: Optional[int] = None) -> Tensor:
    """This rank's shard of a whole sequence ``x`` (every rank holds all of it): the positions
    ``positions(...)`` along ``dim``. No communication; differentiable (a slice)."""
    if rank is None or size is None:
        group = group or Group.of()
        rank, size = group.rank, group.size
    L = x.shape[dim]
    check_length(L, size, layout, f"x's length along dim {dim}")
    runs = pieces(L, size, rank, layout)
    return torch.cat([x.narrow(dim, s, n) for s, n in runs], dim=dim)


def gather(x: Tensor, group: Optional[Group] = None, layout: str = "contiguous", dim: int = -2) -> Tensor:
    """The whole sequence from every rank's shard ``x`` (``L/P`` along ``dim``), in position order,
    on every rank. Differentiable: the gradient of the whole goes back to each rank's positions (a
    loss summed over the ranks' copies counts each copy, as ``all_gather`` does)."""
    group = group or Group.of()
    n = x.shape[dim]
    L = n * group.size
    check_length(L, group.size, layout, "the gathered length")
    shards = all_gather(group, x.contiguous())
    runs = []  # (global start, tensor) of every piece
    for rank, part in enumerate(shards):
        at = 0
        for start, length in pieces(L, group.size, rank, layout):
            runs.append((start, part.narrow(dim, at, length)))
            at += length
    return torch.cat([t for _, t in sorted(runs, key=lambda r: r[0])], dim=dim)
