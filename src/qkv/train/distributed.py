"""Process-group set-up for ``torchrun``: read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, start
gloo (CPU) or NCCL (CUDA) when ``WORLD_SIZE > 1``, and tear it down at the end.

The group waits ``timeout_seconds()`` (``QKV_DIST_TIMEOUT``, default 600 s) for a peer at any
collective, then fails: a rank that stops (paused, killed, stuck) ends the run with an error
instead of a hang. :func:`check_agreement` refuses, on every rank and before the first step, ranks
started with different settings (they would otherwise wait on each other for ever, or split
sequences differently and give a wrong number).

Also :func:`die_with_parent`: a worker process (a ``torchrun`` rank, a ``qkv bench lra --jobs``
cell worker) that ends when the process that started it ends, ``kill -9`` included, instead of
running on as an orphan."""

from __future__ import annotations

import gc
import os
from dataclasses import asdict, dataclass, is_dataclass
from datetime import timedelta
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from .._process import die_with_parent

__all__ = ["DistContext", "setup", "teardown", "all_gather_objects", "mean_across", "barrier", "die_with_parent",
           "ContextGroups", "context_groups", "refuse_unsplittable", "timeout_seconds", "run_settings",
           "check_agreement"]

@dataclass(frozen=True)
class DistContext:
    """Where this process sits: ``rank`` of ``world_size``, its ``device``, and whether ``setup``
    started the process group (and so must destroy it)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an int, got {value!r}") from None


#: how long a rank waits for its peers at a collective before the run fails (seconds)
DEFAULT_TIMEOUT_S = 600.0


def timeout_seconds() -> float:
    """The process group's timeout: ``QKV_DIST_TIMEOUT`` seconds (a positive number), default
    ``DEFAULT_TIMEOUT_S`` (NCCL's own default; gloo's was 30 min). The other ranks wait at a
    barrier while rank 0 evaluates: a run whose evaluation takes longer sets more."""
    value = os.environ.get("QKV_DIST_TIMEOUT")
    if value is None or value == "":
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"environment variable QKV_DIST_TIMEOUT must be a positive number of seconds, got {value!r}")
    return seconds


def setup(device: str = "auto") -> DistContext:
    """Join the ``torchrun`` process group when ``WORLD_SIZE > 1`` (else run alone).

    ``device="auto"`` picks ``cuda:<LOCAL_RANK>`` when CUDA is available, else the CPU; the backend
    is NCCL for CUDA and gloo for the CPU. A rank that ``torchrun`` started (``TORCHELASTIC_RUN_ID``
    set) ends when ``torchrun`` ends (:func:`die_with_parent`): ``kill -9`` of ``torchrun`` leaves
    no rank running; the checkpoints are what a resume reads.
    """
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # a rank that torchrun's agent started: end with the agent
        die_with_parent()
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_seconds()))
        owns = True
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, owns_group=owns)


def teardown(ctx: DistContext, clean: bool = True) -> None:
    """Destroy the process group if ``setup`` created it.

    After a clean run, first collect garbage, so that no ``DistributedDataParallel`` reducer
    outlives the group it holds, and wait at a barrier, so that no rank tears its connections down
    while another still talks to it (either race can end a gloo rank in ``terminate called without
    an active exception`` at exit). After an error (``clean=False``) there is no barrier: the other
    ranks may never reach it.
    """
    if ctx.owns_group and dist.is_initialized():
        try:
            if clean:
                gc.collect()
                dist.barrier()
        finally:
            dist.destroy_process_group()


def run_settings(config: Any, model: Any, task: Any) -> Dict[str, Any]:
    """What every rank of one run must share, flat (``train.steps``, ``model.attention``, ``task``):
    the training config, the model's config and the task's class."""
    settings: Dict[str, Any] = {"task": type(task).__name__, "model": type(model).__name__}
    for prefix, part in (("train", config), ("model", getattr(model, "config", None))):
        if is_dataclass(part):
            settings.update({f"{prefix}.{k}": v for k, v in asdict(part).items()})
    return settings


def check_agreement(ctx: DistContext, settings: Dict[str, Any]) -> None:
    """A ``UserError`` on every rank, naming what differs, when the ranks' ``settings``
    (``run_settings``) are not the same (one collective; nothing when alone). Ranks started with
    different steps, kernels or ``--context-parallel`` would wait on each other for ever; with
    different seeds they would train on other batches than one command's."""
    if not ctx.distributed:
        return
    from .._errors import UserError

    try:
        every = all_gather_objects(ctx, settings)
    except RuntimeError as error:  # torch.distributed's timeout (DistBackendError), a peer gone
        raise UserError(f"rank {ctx.rank}: the other processes of this run did not answer within "
                        f"{timeout_seconds():g} s (QKV_DIST_TIMEOUT) before the first step: a rank stopped, "
                        f"failed or is paused ({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    same = lambda a, b: a == b or repr(a) == repr(b)  # repr: a NaN setting equals itself
    differ = sorted(k for k in set().union(*every) if not all(same(s.get(k), every[0].get(k)) for s in every))
    if differ:
        shown = "; ".join(f"{k} (" + ", ".join(f"rank {r}: {s.get(k)!r}" for r, s in enumerate(every)) + ")"
                          for k in differ[:3])
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise UserError(f"the {ctx.world_size} processes of this run were started with different settings: "
                        f"{shown}{more}; start every rank with the same command (torchrun does)")


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def all_gather_objects(ctx: DistContext, obj: Any) -> List[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` (just ``[obj]`` when alone)."""
    if not ctx.distributed:
        return [obj]
    out: List[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def mean_across(ctx: DistContext, value: torch.Tensor) -> torch.Tensor:
    """The mean of a tensor over ranks (the tensor itself when alone)."""
    if not ctx.distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / ctx.world_size


# ----------------------------------------------------------------------------- context parallelism


@dataclass(frozen=True)
class ContextGroups:
    """The world as ``data`` groups × ``size`` context-parallel ranks: consecutive ranks
    ``[d P, (d + 1) P)`` split the same sequences (``group``); ``data_rank`` of ``data_size`` says
    which batches they share (``task.get_batch(rank=data_rank, world_size=data_size)``)."""

    size: int
    rank: int
    data_rank: int
    data_size: int
    group: Any  # torch.distributed.ProcessGroup of this rank's context-parallel ranks


def context_groups(ctx: DistContext, size: int) -> ContextGroups:
    """Cut the world into data-parallel groups of ``size`` context-parallel ranks (every rank calls it).

    The context-parallel ranks talk in a process group of their own, so that their point-to-point
    messages never meet the data-parallel all-reduce of DistributedDataParallel."""
    if ctx.world_size % size:
        raise ValueError(f"--context-parallel {size} must divide the number of processes ({ctx.world_size}: "
                         f"torchrun --nproc_per_node); the world is data-parallel groups x context-parallel ranks")
    groups = [dist.new_group(list(range(d * size, (d + 1) * size)), timeout=timedelta(seconds=timeout_seconds()))
              for d in range(ctx.world_size // size)]
    data_rank = ctx.rank // size
    return ContextGroups(size=size, rank=ctx.rank % size, data_rank=data_rank,
                         data_size=ctx.world_size // size, group=groups[data_rank])


def refuse_unsplittable(model: torch.nn.Module, carries_state: bool) -> None:
    """A ``UserError`` with the reason when ``model`` cannot run on sequence shards: only
    self-attention kernels (and the positional encoding, which ``qkv.parallel`` shifts to the global
    positions) may mix positions, and a qkv model must declare that it splits
    (``QKVModel.context_parallel``, ``context_parallel_refusal``: the reason, config by config)."""
    from .._errors import UserError
    from ..attention import AttentionKernel

    name = type(model).__name__
    if carries_state:
        raise UserError(f"{name} carries memory across segments (each segment reads the previous segment's hidden "
                         f"states): a rank's shard would need the whole previous segment, so it cannot be split "
                         f"over --context-parallel ranks")
    if any(isinstance(m, (torch.nn.RNNBase, torch.nn.RNNCellBase)) for m in model.modules()):
        raise UserError(f"{name} is recurrent: its state runs through the sequence in order, so the sequence cannot "
                         f"be split over --context-parallel ranks")
    if not any(isinstance(m, AttentionKernel) for m in model.modules()):
        raise UserError(f"{name} has no self-attention kernel to split: --context-parallel splits Transformer "
                         f"stacks (gpt, bert, the efficient-attention language models)")
    if any(getattr(m, "cross_attn", None) is not None for m in model.modules()):
        raise UserError(f"{name} attends across to a second sequence (cross-attention): --context-parallel splits "
                         f"self-attention only")
    refusal = model.context_parallel_refusal() if callable(getattr(model, "context_parallel_refusal", None)) else None
    if refusal:
        raise UserError(f"{getattr(model, 'registry_name', '') or name} cannot be split over --context-parallel "
                        f"ranks: {refusal}")
