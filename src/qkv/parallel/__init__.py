"""Context parallelism: one sequence split over the processes of a ``torch.distributed`` group.

Each rank holds ``L/P`` positions of every sequence (``layout``: contiguous, or the zigzag that
balances causal attention); ``attend(kernel, q, k, v, mask=..., group=...)`` runs any registered
kernel on the shards with the strategy the kernel declares (``AttentionKernel.context_parallel``:
ring, halo, state passing, projection sums, or Ulysses for everything else) and gives each rank its
shard of the output — and, in backward, of every gradient. ``enable(model, group)`` does it for
a whole Transformer stack (its kernels and positions; ``qkv train --context-parallel P``). ``comm`` holds the differentiable
communication, ``layout`` the sharding. docs/design.md §1: this floor sits above ``attention/``
and below the models.
"""

from .strategies import STRATEGIES, attend, check_rows, halo_widths, strategy_for
from .comm import TRAFFIC, Group, all_gather, all_reduce_sum, exchange
from .layout import LAYOUTS, gather, pieces, positions, shard
from .model import Sharding, check_batch, enable, layout_for, shard_batch

__all__ = ["attend", "strategy_for", "check_rows", "halo_widths", "STRATEGIES", "LAYOUTS", "Group",
           "TRAFFIC", "exchange", "all_gather", "all_reduce_sum", "shard", "gather", "pieces", "positions",
           "enable", "Sharding", "layout_for", "shard_batch", "check_batch"]
