"""A whole model on sequence shards: ``enable(model, group)`` makes every attention kernel in it run
through ``attend`` and every positional scheme add the encoding of the shard's *global* positions,
so that each rank can feed its ``L/P`` tokens of each sequence (``shard_batch``) and get its shard
of the hidden states — while the sharding is ``active``.

Nothing in the model's structure changes: the kernels' and positional modules' ``forward`` are
wrapped on the instances (``Sharding.remove`` restores them), so the state dict, checkpoints and
``save_pretrained`` are those of the model on one process. Outside ``active()`` the model runs as
on one process (evaluation on whole sequences, generation).

Which models split: those whose only mixing across positions is self-attention kernels and a
positional scheme of the form ``x + P(offset ..)`` (decoder- or encoder-only Transformer stacks);
a qkv model declares it (``QKVModel.context_parallel``), and the caller refuses the others
(``qkv.train.distributed.refuse_unsplittable``: recurrent models, memory carried across segments,
cross-attention, heads that read one position, adaptive computation time).

Backward runs inside ``active()`` too (the trainer's does): a block that recomputes its forward in
backward (gradient checkpointing) must meet the kernels on shards again.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..attention import AttentionKernel
from ..registry import lookup, names
from .strategies import attend, check_rows, strategy_for
from .comm import Group
from .layout import check_length, pieces

__all__ = ["Sharding", "enable", "layout_for", "shard_batch", "check_batch"]


def layout_for(kernels: List[AttentionKernel], L: int, P: int) -> str:
    """The zigzag layout when every kernel is a causal ring kernel (it balances their work), else contiguous."""
    zigzag = bool(kernels) and all(k.causal and strategy_for(k, L, P, "zigzag") == "ring" for k in kernels)
    return "zigzag" if zigzag and L % (2 * P) == 0 else "contiguous"


def check_batch(model: nn.Module, L: int, P: int, batch_size: int) -> None:
    """A ValueError, before anything runs, when ``model``'s kernels cannot split batches of
    ``batch_size`` sequences of ``L`` over ``P`` ranks in the layout ``enable`` would choose:
    ``check_rows`` for each kernel that ``attend`` runs (one inside another kernel runs in its
    call), the heads read from ``model.config.n_heads``."""
    kernels = [m for m in model.modules() if isinstance(m, AttentionKernel)]
    inner = {id(m) for k in kernels for m in k.modules() if m is not k}
    heads = getattr(getattr(model, "config", None), "n_heads", None)
    layout = layout_for(kernels, L, P)
    check_length(L, P, layout, "the sequence length")
    if isinstance(heads, int):
        for kernel in kernels:
            if id(kernel) not in inner:
                check_rows(kernel, batch_size, heads, L, P, layout)


def _positional_classes() -> Tuple[type, ...]:
    return tuple({lookup("positional", name) for name in names("positional")})


class Sharding:
    """The wrapped model's switch: ``with sharding.active(L): ...`` runs kernels and positions on the
    shards of length-``L`` sequences; ``remove()`` unwraps the model."""

    def __init__(self, model: nn.Module, group: Union[None, Group, dist.ProcessGroup] = None,
                 layout: Optional[str] = None) -> None:
        rotary = [type(m).__name__ for m in model.modules() if getattr(m, "rotary", None) is not None
                  and not isinstance(getattr(m, "rotary"), bool)]
        if rotary:  # the rotation needs each shard's global positions, which the stack does not pass on here
            raise ValueError(f"{type(model).__name__} turns queries and keys by rotary positions ({rotary[0]}): context "
                             f"parallelism does not shard rotary positions; use positional='sinusoidal' or 'learned'")
        self.group = group if isinstance(group, Group) else Group.of(group)
        self.kernels = [m for m in model.modules() if isinstance(m, AttentionKernel)]
        if not self.kernels:
            raise ValueError(f"{type(model).__name__} has no attention kernel to split a sequence over")
        positional = _positional_classes()
        self.positional = [m for m in model.modules() if isinstance(m, positional)]
        self.layout = layout  # None: chosen per sequence length by layout_for
        self.length: Optional[int] = None  # the global length while active
        self._inside = False  # attend calls the kernel itself: that call runs the kernel's own forward
        self._wrapped: List[nn.Module] = []
        for kernel in self.kernels:
            self._wrap(kernel, self._kernel_forward(kernel, kernel.forward))
        for module in self.positional:
            self._wrap(module, self._positional_forward(module.forward))

    def _wrap(self, module: nn.Module, forward) -> None:
        module.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's
        self._wrapped.append(module)

    def remove(self) -> None:
        for module in self._wrapped:
            del module.forward
        self._wrapped = []

    def current_layout(self, L: int) -> str:
        return self.layout or layout_for(self.kernels, L, self.group.size)

    @contextmanager
    def active(self, L: int) -> Iterator["Sharding"]:
        """Run on shards of length-``L`` sequences (each rank feeding ``L/P`` positions) inside the block."""
        check_length(L, self.group.size, self.current_layout(L))
        self.length = L
        try:
            yield self
        finally:
            self.length = None

    def _kernel_forward(self, kernel: AttentionKernel, own):
        def forward(q, k, v, mask=None, state=None, need_weights=False, return_state=False):
            if self.length is None or self._inside:
                return own(q, k, v, mask=mask, state=state, need_weights=need_weights, return_state=return_state)
            if state is not None or return_state or need_weights:
                raise ValueError("a model on sequence shards returns outputs only: no state, return_state or "
                                 "need_weights (decode and inspect weights on one process)")
            if k.shape[1] != q.shape[1]:  # grouped keys (n_kv_heads): the strategies split equal heads
                R = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(R, dim=1), v.repeat_interleave(R, dim=1)  # (B, H, L/P, E)
            self._inside = True
            try:
                return attend(kernel, q, k, v, mask=mask, group=self.group, layout=self.current_layout(self.length))
            finally:
                self._inside = False
        return forward

    def _positional_forward(self, own):
        def forward(x: Tensor, offset: int = 0, *args: Any, **kwargs: Any) -> Tensor:
            if self.length is None:
                return own(x, offset, *args, **kwargs)
            L, P, layout = self.length, self.group.size, self.current_layout(self.length)
            parts, at = [], 0
            for start, length in pieces(L, P, self.group.rank, layout):  # each run at its global positions
                parts.append(own(x[:, at:at + length], offset + start, *args, **kwargs))
                at += length
            return torch.cat(parts, dim=1)
        return forward


def enable(model: nn.Module, group: Union[None, Group, dist.ProcessGroup] = None,
           layout: Optional[str] = None) -> Sharding:
    """Wrap ``model``'s kernels and positional schemes for sequence shards over ``group`` (see ``Sharding``)."""
    return Sharding(model, group, layout)


def shard_batch(batch: Dict[str, Any], sharding: Sharding, seq_keys: Tuple[str, ...]) -> Tuple[Dict[str, Any], int]:
    """This rank's part of a batch: every tensor named in ``seq_keys`` cut along dim 1 (the sequence)
    in the layout; the rest as it is. Returns ``(batch, L)``, ``L`` the whole sequence length."""
    lengths = {int(batch[key].shape[1]) for key in seq_keys if isinstance(batch.get(key), Tensor) and batch[key].dim() >= 2}
    if len(lengths) != 1:
        raise ValueError(f"context parallelism needs the batch's sequences {list(seq_keys)} to share one length, got {sorted(lengths)}")
    L = lengths.pop()
    layout = sharding.current_layout(L)
    check_length(L, sharding.group.size, layout, "the batch's sequence length")
    runs = pieces(L, sharding.group.size, sharding.group.rank, layout)
    out = dict(batch)
    for key in seq_keys:
        value = batch.get(key)
        if isinstance(value, Tensor) and value.dim() >= 2:
            out[key] = torch.cat([value[:, s:s + n] for s, n in runs], dim=1)
    return out, L
