"""Communication with gradients: the collectives ``qkv.parallel`` builds its strategies from.

Every function here is differentiable: its backward is the matching communication the other way
(what a rank sent comes back to it as the gradient of what its peers received), so a loss summed
over the ranks has the gradients of the same loss computed on one process.

- ``exchange``: point-to-point messages, each tensor sent as it lies (``torch.distributed.batch_isend_irecv``
  on any backend — gloo on the CPU, NCCL on CUDA); a ring shift, a halo, an all-to-all and an
  all-gather are all one exchange.
- ``all_reduce_sum``: ``torch.distributed.all_reduce``; backward all-reduces the gradient.
- ``all_gather``: every rank's tensor (one exchange), stacked in rank order.

``TRAFFIC`` counts the bytes this process sent, forward and backward apart, so that a benchmark can
read what a strategy costs on the wire against its formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Group", "TRAFFIC", "Traffic", "exchange", "send_receive", "all_reduce_sum", "all_reduce_max", "all_gather"]


@dataclass
class Traffic:
    """Bytes sent by this process since the last ``reset`` (payloads only, as the formulas count them)."""

    forward: int = 0
    backward: int = 0

    def reset(self) -> None:
        self.forward = self.backward = 0


TRAFFIC = Traffic()


@dataclass(frozen=True)
class Group:
    """A process group seen from one rank: ``rank`` of ``size``, and the group itself (None: the world)."""

    group: Optional[dist.ProcessGroup]
    rank: int
    size: int

    @classmethod
    def of(cls, group: Optional[dist.ProcessGroup] = None) -> "Group":
        """This process's place in ``group`` (default: the whole world); the process group must be started."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("qkv.parallel needs a started torch.distributed process group "
                               "(torch.distributed.init_process_group, or run under torchrun)")
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def global_rank(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)


_TAGS = [0]  # exchanges are numbered in the order they are made, the same on every rank
_PER_EXCHANGE = 64  # tags an exchange may use: one per tensor in a message


def _next_tag() -> int:
    """The first tag of a new exchange (its backward uses the next block of tags)."""
    _TAGS[0] = (_TAGS[0] + 2) % (1 << 24)
    return _TAGS[0] * _PER_EXCHANGE


def _transfer(group: Group, sends: Dict[int, List[Tensor]], recvs: Dict[int, List[Tensor]], tag: int) -> int:
    """Send each tensor of ``sends[peer]`` to its peer and receive into ``recvs[peer]``, the ``i``-th
    tensor of a message tagged ``tag + i`` (a message can only meet the receive it was meant for; no
    tensor is copied into one buffer first); returns the bytes sent."""
    ops = []
    for op, plan in ((dist.isend, sends), (dist.irecv, recvs)):
        for peer, tensors in plan.items():
            if len(tensors) > _PER_EXCHANGE:
                raise ValueError(f"one message carries at most {_PER_EXCHANGE} tensors, got {len(tensors)}")
            ops += [dist.P2POp(op, t, group.global_rank(peer), group.group, tag + i)
                    for i, t in enumerate(tensors) if t.numel()]
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return sum(t.numel() * t.element_size() for tensors in sends.values() for t in tensors)


def _wire(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` as it can be sent: contiguous, in ``dtype`` (a copy only where it is neither)."""
    return t.to(dtype).contiguous()


class _Exchange(torch.autograd.Function):
    """Forward: the tensors of each ``send_peers[i]`` (``send_counts[i]`` of them) go to that peer;
    returns what ``recv_plan`` expects from each peer. Backward: the same messages the other way,
    gradients summed where a tensor was sent to several peers."""

    @staticmethod
    def forward(ctx, group: Group, send_peers: Tuple[int, ...], send_counts: Tuple[int, ...],
                recv_plan: Tuple[Tuple[int, Tuple[torch.Size, ...]], ...], like: Tensor, *tensors: Tensor):
        dtype, device = like.dtype, like.device
        tag = _next_tag()
        ctx.tag = tag + _PER_EXCHANGE
        sends, at = {}, 0
        for peer, count in zip(send_peers, send_counts):
            sends[peer] = [_wire(t, dtype) for t in tensors[at:at + count]]
            at += count
        recvs = {peer: [torch.empty(s, dtype=dtype, device=device) for s in shapes] for peer, shapes in recv_plan}
        TRAFFIC.forward += _transfer(group, sends, recvs, tag)
        ctx.group, ctx.send_peers, ctx.recv_plan = group, send_peers, recv_plan
        ctx.send_shapes = [t.shape for t in tensors]
        ctx.send_counts, ctx.dtype, ctx.device = send_counts, dtype, device
        received = [t for peer, _ in recv_plan for t in recvs[peer]]
        ctx.mark_non_differentiable(*[r for r in received if not r.is_floating_point()])
        return tuple(received)

    @staticmethod
    def backward(ctx, *grads: Optional[Tensor]):
        sends, at = {}, 0
        for peer, shapes in ctx.recv_plan:  # the gradients of what came from peer go back to it
            sends[peer] = [_wire(g, ctx.dtype) if g is not None else torch.zeros(s, dtype=ctx.dtype, device=ctx.device)
                           for g, s in zip(grads[at:at + len(shapes)], shapes)]
            at += len(shapes)
        recvs, at = {}, 0
        for peer, count in zip(ctx.send_peers, ctx.send_counts):
            recvs[peer] = [torch.empty(s, dtype=ctx.dtype, device=ctx.device) for s in ctx.send_shapes[at:at + count]]
            at += count
        TRAFFIC.backward += _transfer(ctx.group, sends, recvs, ctx.tag)
        return (None, None, None, None, None, *[t for peer in ctx.send_peers for t in recvs[peer]])


def send_receive(group: Group, sends: Dict[int, List[Tensor]], expect: Dict[int, List[torch.Size]], like: Tensor,
                 phase: str = "forward") -> Dict[int, List[Tensor]]:
    """``exchange`` without gradient, for code that writes its own backward (the ring's): the bytes
    count toward ``TRAFFIC.<phase>``."""
    dtype = torch.uint8 if like.dtype == torch.bool else like.dtype  # bool travels as bytes
    buffers = {p: [_wire(t, dtype) for t in ts] for p, ts in sends.items() if p != group.rank}
    recvs = {p: [torch.empty(s, dtype=dtype, device=like.device) for s in shapes]
             for p, shapes in expect.items() if p != group.rank}
    sent = _transfer(group, buffers, recvs, _next_tag())
    setattr(TRAFFIC, phase, getattr(TRAFFIC, phase) + sent)
    return {p: [x.to(like.dtype) for x in recvs[p]] for p in recvs}


def exchange(group: Group, sends: Dict[int, List[Tensor]], expect: Dict[int, List[torch.Size]],
             like: Tensor) -> Dict[int, List[Tensor]]:
    """Send ``sends[peer]`` to each peer and receive ``expect[peer]`` (their shapes) from each peer,
    all in ``like``'s dtype and device — every rank must name the same messages from both ends, and
    every rank must make the same exchanges in the same order (a collective).

    Differentiable in floating tensors; bool tensors travel as they are, in an exchange of their own
    (``like`` bool). Backward runs on a rank only when one of its received tensors is used: name
    every peer you receive from in ``expect`` (a zero-size shape where nothing is due) and use each
    tensor received, so that the ranks' backward passes meet; ``like`` joins the graph where a rank
    sends nothing."""
    send_peers = tuple(p for p in sorted(sends) if p != group.rank)
    recv_plan = tuple((p, tuple(torch.Size(s) for s in expect[p])) for p in sorted(expect) if p != group.rank)
    tensors = [t for p in send_peers for t in sends[p]]
    boolean = like.dtype == torch.bool
    if boolean:
        tensors, like = [t.to(torch.uint8) for t in tensors], like.to(torch.uint8)
    received = _Exchange.apply(group, send_peers, tuple(len(sends[p]) for p in send_peers), recv_plan,
                               like.reshape(-1)[:0], *tensors)
    out, at = {}, 0
    for peer, shapes in recv_plan:
        got = list(received[at:at + len(shapes)])
        out[peer] = [g.bool() for g in got] if boolean else got
        at += len(shapes)
    return out


def all_gather(group: Group, x: Tensor) -> List[Tensor]:
    """Every rank's ``x`` (all the same shape), in rank order; differentiable (one exchange)."""
    others = [p for p in range(group.size) if p != group.rank]
    got = exchange(group, {p: [x] for p in others}, {p: [x.shape] for p in others}, x)
    return [x if p == group.rank else got[p][0] for p in range(group.size)]


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group: Group, x: Tensor) -> Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group.group)
        TRAFFIC.forward += _ring_all_reduce_bytes(out, group.size)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        # every rank's output is the sum of every rank's input: d(sum_p L_p)/dx_r = sum_p grad_p
        out = grad.contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=ctx.group.group)
        TRAFFIC.backward += _ring_all_reduce_bytes(out, ctx.group.size)
        return None, out


def _ring_all_reduce_bytes(x: Tensor, P: int) -> int:
    """What a ring all-reduce sends per rank: ``2 (P - 1) / P`` of the tensor (reduce-scatter + all-gather)."""
    return 2 * (P - 1) * x.numel() * x.element_size() // P


def all_reduce_sum(group: Group, x: Tensor) -> Tensor:
    """The sum of ``x`` over the ranks (a copy), differentiable."""
    return _AllReduceSum.apply(group, x)


def all_reduce_max(group: Group, x: Tensor) -> Tensor:
    """The elementwise maximum over the ranks, without gradient (for stabilising constants)."""
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group.group)
    TRAFFIC.forward += _ring_all_reduce_bytes(out, group.size)
    return out
