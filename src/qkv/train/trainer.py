"""The training loop: AdamW, a warm-up schedule, gradient clipping and accumulation, bf16
autocast, periodic evaluation, ``metrics.jsonl`` (+ TensorBoard when installed), atomic
checkpoints, exact resume and DistributedDataParallel under ``torchrun``.

Exact resume rests on the task contract (docs/contracts.md): a batch is a pure function of
``(seed, split, step, rank)``, so a run restarted from the checkpoint of step ``k`` (model,
optimizer, scheduler and every rank's RNG states) draws the same batches and dropout masks as the
uninterrupted run and logs the same losses.

Carried state (Transformer-XL's segment memory): on a task whose batches continue the previous
ones (``task.stream``), a model that declares ``carries_state = True`` is called with
``state=<its previous out.state>, return_state=True``; the trainer keeps ``out.state`` between
micro-batches and updates and saves it in checkpoints through the model's
``export_state(state) -> {name: tensor}`` / ``import_state(tensors) -> state``, so resume is exact.

Batch indexing: the ``m``-th micro-batch of update ``s`` (0-based) is
``task.get_batch("train", batch_size, s * grad_accum + m, seed=seed, rank=rank, world_size=world)``.
A task whose examples are a stream indexed by ``(step * world + rank) * batch_size + i`` therefore
gives the same update for (B, accum 1, 1 process), (B/2, accum 2) and (B/2 per rank, 2 ranks).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .._io import unwritable
from .._nn import Trainable, evaluating
from ..tasks.base import Task
from . import distributed, schedules
from .checkpoint import CheckpointError, CheckpointManager, atomic_write_text, capture_rng_state, load_checkpoint, read_checkpoint_meta
from .checkpoint import read_carried_state
from .lock import RunLock

__all__ = ["TrainConfig", "Trainer"]


@dataclass
class TrainConfig:
    """Everything the trainer needs besides the model and the task."""

    steps: int = 1000  # optimizer updates in the whole run
    batch_size: int = 32  # examples per micro-batch per process (update = batch_size * grad_accum * world_size)
    lr: float = 3e-4  # peak learning rate (the schedule multiplies it)
    weight_decay: float = 0.01  # AdamW decoupled weight decay, applied to tensors with >= 2 dims only
    betas: Tuple[float, float] = (0.9, 0.98)  # AdamW (beta1, beta2); Vaswani 2017 used (0.9, 0.98)
    eps: float = 1e-9  # AdamW epsilon (Vaswani 2017)
    warmup: int = 100  # linear warm-up updates (all schedules)
    schedule: Literal["noam", "cosine", "constant"] = "cosine"  # "noam" (peak = lr at warmup, then step^-0.5) | "cosine" (to 0 at steps) | "constant"
    grad_clip: Optional[float] = 1.0  # max global gradient L2 norm; None or 0 disables clipping
    grad_accum: int = 1  # micro-batches summed into one update
    eval_every: int = 0  # evaluate every this many updates (0: only at the end; `qkv train` defaults to 10 times per run)
    eval_batches: int = 8  # held-out batches (task.eval_batches("valid", ...)) averaged into valid_loss; 0 skips
    eval_max_examples: Optional[int] = 256  # max_examples passed to task.evaluate(model, "valid", ...)
    save_every: Optional[int] = None  # checkpoint every this many updates (0: only at the end; None: at every evaluation and at the end)
    keep_last: Optional[int] = 3  # checkpoints kept on disk (None keeps all)
    seed: int = 0  # seeds batches (task.get_batch seed=) and the RNGs (torch, numpy, random; + rank)
    precision: Literal["fp32", "bf16"] = "fp32"  # "fp32" | "bf16" (autocast; parameters and optimizer stay float32)
    log_every: int = 10  # write a train record to metrics.jsonl every this many updates
    out_dir: str = "runs/qkv"  # run directory: metrics.jsonl, train_config.json, checkpoints/
    device: str = "auto"  # "auto" (cuda:<LOCAL_RANK> if available, else cpu), "cpu", "cuda", ...
    progress: bool = True  # show a tqdm progress bar (rank 0 only)
    tensorboard: bool = True  # also write TensorBoard scalars when tensorboard is installed
    context_parallel: int = 1  # processes that split each sequence (qkv.parallel; world = data groups x this); 1: off

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "log_every", "context_parallel"):
            _positive(name, getattr(self, name))
        for name in ("warmup", "eval_every", "eval_batches", "seed"):
            _positive(name, getattr(self, name), allow_zero=True)
        if self.save_every is not None:
            _positive("save_every", self.save_every, allow_zero=True)
        _finite("lr", self.lr, positive=True)
        _finite("weight_decay", self.weight_decay)
        _finite("eps", self.eps)
        if not isinstance(self.betas, (tuple, list)) or len(tuple(self.betas)) != 2 or not all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two floats in [0, 1), got {self.betas!r}")
        self.betas = tuple(float(b) for b in self.betas)
        if self.schedule not in schedules.SCHEDULES:
            raise ValueError(f"schedule must be one of {schedules.SCHEDULES}, got {self.schedule!r}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.grad_clip is not None:
            _finite("grad_clip", self.grad_clip)
        if self.eval_max_examples is not None:
            _positive("eval_max_examples", self.eval_max_examples)
        if self.keep_last is not None:
            _positive("keep_last", self.keep_last)


def _finite(name: str, value: object, positive: bool = False) -> None:
    """``value`` is a finite float >= 0 (> 0 when ``positive``), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite float {'> 0' if positive else '>= 0'}, got {value!r}")


def _positive(name: str, value: object, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _count_tokens(batch: Dict[str, Any]) -> Tuple[int, str]:
    """What a batch trains on and its unit: ``"examples"`` when ``labels`` has one per example
    (classification: ``(B,)``), else ``"tokens"`` (target tokens: labels other than -100; without
    labels the first tensor's elements)."""
    labels = batch.get("labels")
    if isinstance(labels, Tensor):
        return int((labels != -100).sum()), "examples" if labels.dim() == 1 else "tokens"
    for value in batch.values():
        if isinstance(value, Tensor):
            return value.numel(), "tokens"
    return 0, "tokens"


class Trainer:
    """Train ``model`` on ``task`` as ``config`` says.

    ``model(**batch)`` must return an object with a scalar ``.loss`` (docs/contracts.md). Each
    micro-batch's loss is divided by ``grad_accum``, so an update averages micro-batch means;
    DDP averages over ranks.

    Usage::

        trainer = Trainer(model, task, TrainConfig(steps=2000, out_dir="runs/copy"))
        metrics = trainer.fit()            # or fit(resume=True) after an interruption

    Run directory: ``metrics.jsonl`` (one JSON object per event: ``{"event": "train", "step",
    "loss", "lr", "grad_norm", "tokens_per_s" (or "examples_per_s": one label per example), "time"}`` or ``{"event": "eval", "step",
    "valid_loss", <task metrics>}`` or ``{"event": "resume", "step", "checkpoint"}``), ``train_config.json``, ``checkpoints/step-*.safetensors`` +
    ``checkpoints/latest``, and ``.lock``: ``fit`` holds the directory's writer lock (``RunLock``), so
    a second writer is refused. Under ``torchrun`` only rank 0 writes, logs and evaluates.
    """

    def __init__(self, model: Trainable, task: Task, config: TrainConfig) -> None:
        if not isinstance(model, torch.nn.Module) or not isinstance(model, Trainable):
            raise TypeError(f"model must be a torch.nn.Module with the hooks the trainer calls (qkv._nn.Trainable; "
                            f"qkv.models.QKVModel declares them all: subclass it to train a module of your own), "
                            f"got {type(model).__name__}")
        if not isinstance(task, Task):
            raise TypeError(f"task must be a qkv.tasks.Task (docs/contracts.md; subclass it for a task of your own), "
                            f"got {type(task).__name__}")
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.model = model
        self.task = task
        self.config = config
        self.out_dir = Path(config.out_dir)
        self.checkpoints = CheckpointManager(self.out_dir / "checkpoints", keep_last=config.keep_last)
        self._writer = None
        self._grad_norm = float("nan")
        self._lr = float("nan")
        self._carried: Any = None  # the model's state carried from one micro-batch to the next (carries_state)
        self._context: Any = None  # (ContextGroups, qkv.parallel.Sharding) under context_parallel > 1

    @property
    def carries_state(self) -> bool:
        """Whether the model's ``out.state`` is passed on between batches (a stream task and a model that carries)."""
        return self.task.stream and self.model.carries_state

    # ------------------------------------------------------------------------------------------
    # Setup
    # ------------------------------------------------------------------------------------------

    def _make_optimizer(self) -> torch.optim.AdamW:
        decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=self.config.lr, betas=self.config.betas, eps=self.config.eps)

    def _apply_hyperparameters(self, optimizer: torch.optim.AdamW) -> None:
        """After loading an optimizer state: this config's betas, eps and weight decay govern."""
        for group, decay in zip(optimizer.param_groups, (self.config.weight_decay, 0.0)):
            group.update(betas=self.config.betas, eps=self.config.eps, weight_decay=decay)

    def _autocast(self, device: torch.device):
        if self.config.precision != "bf16":
            return nullcontext()
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            warnings.warn("precision='bf16' is not supported on this GPU; training in float32")
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def _seed(self, rank: int) -> None:
        seed = self.config.seed + rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    # ------------------------------------------------------------------------------------------
    # Logging
    # ------------------------------------------------------------------------------------------

    def _truncate_metrics(self, step: int) -> None:
        """On resume: drop records after ``step`` (written after the checkpoint, before the crash)
        and any half-written last line, so metrics.jsonl reads as one run."""
        path = self.out_dir / "metrics.jsonl"
        if not path.is_file():
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    def _log(self, record: Dict[str, Any]) -> None:
        path = self.out_dir / "metrics.jsonl"
        with unwritable(path), open(path, "a", encoding="utf-8") as f:  # a full disk: one line (a cut record is dropped on resume)
            f.write(json.dumps(record) + "\n")
        if self._writer is not None:
            prefix = record["event"]
            for key, value in record.items():
                if key not in ("event", "step", "time") and isinstance(value, (int, float)):
                    self._writer.add_scalar(f"{prefix}/{key}", value, record["step"])

    def _open_tensorboard(self) -> None:
        self._writer = None
        if not self.config.tensorboard:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return
        self._writer = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))

    # ------------------------------------------------------------------------------------------
    # Evaluation
    # ------------------------------------------------------------------------------------------

    def evaluate(self, device: Optional[torch.device] = None) -> Dict[str, float]:
        """``valid_loss`` over ``eval_batches`` held-out batches plus ``task.evaluate(model, "valid")``."""
        cfg = self.config
        device = device or next(self.model.parameters()).device
        results: Dict[str, float] = {}
        with evaluating(self.model):
            if cfg.eval_batches:
                total, n, state = 0.0, 0, None
                for i, batch in enumerate(self.task.eval_batches("valid", cfg.batch_size)):
                    if i >= cfg.eval_batches:
                        break
                    carry = {"state": state, "return_state": True} if self.carries_state else {}
                    with self._autocast(device):
                        out = self.model(**_to_device(batch, device), **carry)
                    state = out.state if carry else None
                    total += float(out.loss)
                    n += 1
                if n:
                    results["valid_loss"] = total / n
            metrics = self.task.evaluate(self.model, "valid", max_examples=cfg.eval_max_examples)
            results.update({k: float(v) for k, v in metrics.items()})
        return results

    # ------------------------------------------------------------------------------------------
    # The loop
    # ------------------------------------------------------------------------------------------

    def fit(self, resume: bool = False) -> Dict[str, float]:
        """Train for ``config.steps`` updates; with ``resume=True`` continue from the latest
        checkpoint in ``out_dir/checkpoints`` (starting fresh if there is none).

        Returns the last train loss and the final evaluation's metrics (rank 0; other ranks get
        the train loss only); an evaluation metric named like a train record's field (a task's
        own ``loss``) comes as ``eval_<name>``.
        """
        cfg = self.config
        ctx = distributed.setup(cfg.device)
        clean = False
        try:
            distributed.check_agreement(ctx, distributed.run_settings(cfg, self.model, self.task))
            with RunLock(self.out_dir) if ctx.is_main else nullcontext():  # one writer per run directory
                result = self._fit(ctx, resume)
            clean = True
            return result
        finally:
            if getattr(self, "_writer", None) is not None:
                self._writer.close()
            distributed.teardown(ctx, clean)

    def _fit(self, ctx: distributed.DistContext, resume: bool) -> Dict[str, float]:
        cfg = self.config
        device = ctx.device
        self.model.to(device)
        if not any(p.requires_grad for p in self.model.parameters()):
            return self._evaluate_only(ctx)
        self.model.train()
        optimizer = self._make_optimizer()
        scheduler = schedules.build(cfg.schedule, optimizer, warmup=cfg.warmup, total=cfg.steps)
        self._seed(ctx.rank)

        start = 0
        self._carried = None
        latest = self.checkpoints.latest_intact() if resume else None
        if resume and latest is None and self.checkpoints.checkpoints():
            raise ValueError(f"no checkpoint in {str(self.checkpoints.directory)!r} reads back intact; cannot resume")
        if not resume and self.checkpoints.checkpoints():
            raise ValueError(f"out_dir {str(self.out_dir)!r} already holds checkpoints; pass resume=True to continue "
                             "that run or choose another out_dir")
        if latest is not None:
            meta = read_checkpoint_meta(latest)
            same_world = len(meta["rng"]) == ctx.world_size
            if not same_world:
                warnings.warn(f"checkpoint {latest} was written by {len(meta['rng'])} process(es), this run has "
                              f"{ctx.world_size}: model and optimizer are restored, RNG streams restart from seed")
            meta = load_checkpoint(latest, self.model, optimizer, rank=ctx.rank if same_world else None)
            self._apply_hyperparameters(optimizer)
            if not isinstance(meta.get("scheduler"), dict):
                raise CheckpointError(f"checkpoint file {str(latest)!r}: its header has no valid 'scheduler' field")
            _restore_schedule(scheduler, meta["scheduler"])
            start = meta["step"]
            if self.carries_state:
                self._carried = self.model.import_state(_to_device(read_carried_state(latest, ctx.rank), device))

        self._writer = None
        if ctx.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.out_dir / "train_config.json", json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
            if resume:
                self._truncate_metrics(start)
            elif (self.out_dir / "metrics.jsonl").exists():
                (self.out_dir / "metrics.jsonl").unlink()
            self._open_tensorboard()
            if latest is not None:
                self._log({"event": "resume", "step": start, "checkpoint": latest.name, "time": time.time()})

        net: torch.nn.Module = self.model
        if cfg.context_parallel > 1:
            self._context = self._split_sequences(ctx)
        if ctx.distributed:
            net = DistributedDataParallel(self.model, device_ids=[device.index] if device.type == "cuda" else None)
        try:
            return self._loop(ctx, net, optimizer, scheduler, start)
        finally:
            if self._context is not None:
                self._context[1].remove()
                self._context = None

    def _split_sequences(self, ctx: distributed.DistContext) -> Tuple[distributed.ContextGroups, Any]:
        """Context parallelism: the groups of ranks that share sequences, and the model's kernels and
        positions wrapped to run on their shards (``qkv.parallel``); refuses a model that cannot split."""
        from .. import parallel

        distributed.refuse_unsplittable(self.model, self.carries_state)
        groups = distributed.context_groups(ctx, self.config.context_parallel)
        return groups, parallel.enable(self.model, groups.group)

    def _loop(self, ctx: distributed.DistContext, net: torch.nn.Module, optimizer, scheduler, start: int) -> Dict[str, float]:
        cfg = self.config
        device = ctx.device

        bar = tqdm(total=cfg.steps, initial=start, disable=not (cfg.progress and ctx.is_main), dynamic_ncols=True)
        last: Dict[str, float] = {}
        eval_metrics: Dict[str, float] = {}
        window_tokens, window_start, unit = 0, time.perf_counter(), "tokens"
        eval_every, save_every = cfg.eval_every, cfg.save_every
        for step in range(start, cfg.steps):
            step_start = time.perf_counter()
            loss, tokens, unit = self._update(net, optimizer, scheduler, ctx, step)
            if ctx.is_main and step - start == 1:  # the second update: past the first one's warm-up
                self._announce_speed(time.perf_counter() - step_start, cfg.steps - step - 1, eval_every)
            window_tokens += tokens
            done = step + 1
            logged = done % cfg.log_every == 0 or done == cfg.steps
            evaluated = bool(eval_every and done % eval_every == 0) or done == cfg.steps
            # the bar shows a real loss from the first update on, and the latest one beside an evaluation
            if logged or evaluated or step == start:
                loss_value = float(distributed.mean_across(ctx, loss))
                last = {"loss": loss_value}
                if ctx.is_main and not logged:
                    bar.set_postfix(_postfix(last, eval_metrics), refresh=False)
            if logged:
                elapsed = max(time.perf_counter() - window_start, 1e-9)
                record = {
                    "event": "train",
                    "step": done,
                    "loss": loss_value,
                    "lr": self._lr,
                    "grad_norm": float(self._grad_norm),
                    f"{unit}_per_s": window_tokens * ctx.world_size / elapsed,
                    "time": time.time(),
                }
                window_tokens, window_start = 0, time.perf_counter()
                if ctx.is_main:
                    self._log(record)
                    bar.set_postfix(_postfix(record, eval_metrics), refresh=False)
            if evaluated:
                if ctx.is_main:
                    eval_metrics = self.evaluate(device)
                    self._log({"event": "eval", "step": done, **eval_metrics, "time": time.time()})
                    self.model.on_evaluate(eval_metrics)  # e.g. a memory network's linear start ends
                    bar.set_postfix(_postfix(last, eval_metrics), refresh=False)
                distributed.barrier(ctx)
            if (evaluated if save_every is None else (save_every and done % save_every == 0)) or done == cfg.steps:
                self._save(ctx, done, optimizer, scheduler)
            bar.update(1)
        bar.close()
        if not ctx.is_main:
            return last
        # an evaluation metric named like a train record's field (a task's own "loss") keeps the
        # train value under its name and comes as "eval_<name>"
        return {**last, **{(f"eval_{k}" if k in last else k): v for k, v in eval_metrics.items()}}

    def _evaluate_only(self, ctx: distributed.DistContext) -> Dict[str, float]:
        """A model without trainable parameters (e.g. Nadaraya–Watson with a fixed kernel) has
        nothing to optimise: say so, evaluate it once and log that evaluation as step 0."""
        warnings.warn(f"{type(self.model).__name__} has no trainable parameters: nothing to train, "
                      "evaluating only", stacklevel=3)
        if not ctx.is_main:
            return {}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out_dir / "train_config.json", json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")
        metrics = self.evaluate(ctx.device)
        atomic_write_text(self.out_dir / "metrics.jsonl", json.dumps(
            {"event": "eval", "step": 0, **metrics, "note": "no trainable parameters", "time": time.time()}) + "\n")
        return metrics

    def _announce_speed(self, seconds: float, remaining: int, eval_every: int) -> None:
        """Say how long an update takes (measured on this run's first updates) and what is left."""
        note = f" (+ evaluations every {eval_every})" if eval_every and eval_every < remaining else ""
        tqdm.write(f"qkv: {seconds:.3g} s per update; about {_duration(seconds * remaining)} for the "
                   f"remaining {remaining} update(s){note}", file=sys.stderr)

    def _update(self, net, optimizer, scheduler, ctx, step: int) -> Tuple[Tensor, int, str]:
        """One optimizer update from ``grad_accum`` micro-batches; the mean loss, and the tokens
        (or examples: the unit) seen."""
        cfg = self.config
        device = ctx.device
        total = torch.zeros((), device=device)
        tokens, unit = 0, "tokens"
        self.model.set_step(step, cfg.steps)  # losses scheduled over training (e.g. Al-Rfou's intermediate layers)
        rank, world = ctx.rank, ctx.world_size
        if self._context is not None:  # the ranks that split one sequence draw the same batches
            rank, world = self._context[0].data_rank, self._context[0].data_size
        for micro in range(cfg.grad_accum):
            batch = self.task.get_batch("train", cfg.batch_size, step * cfg.grad_accum + micro,
                                        seed=cfg.seed, rank=rank, world_size=world)
            split = nullcontext()
            if self._context is not None:
                batch, split = self._shard(batch)
            count, unit = _count_tokens(batch)
            tokens += count
            batch = _to_device(batch, device)
            # DDP all-reduces gradients on the last micro-batch only.
            sync = micro == cfg.grad_accum - 1 or not ctx.distributed
            with (nullcontext() if sync else net.no_sync()), split:
                carry = {"state": self._carried, "return_state": True} if self.carries_state else {}
                with self._autocast(device):
                    out = net(**batch, **carry)
                if carry:
                    self._carried = out.state  # the next micro-batch continues these rows
                loss = out.loss
                if loss is None or not isinstance(loss, Tensor) or loss.dim() != 0:
                    raise ValueError(f"model(**batch).loss must be a scalar tensor, got {loss!r}")
                if self._context is not None:
                    loss = self._shard_weighted(loss, batch)
                (loss / cfg.grad_accum).backward()
            total += loss.detach().float()
        # The global L2 norm before clipping (max_norm=inf only measures it); kept as a tensor so
        # that a GPU step does not wait for it unless it is logged.
        self._grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or float("inf"))
        self._lr = optimizer.param_groups[0]["lr"]  # the lr this update uses (before scheduler.step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        return total / cfg.grad_accum, tokens, unit

    def _shard(self, batch: Dict[str, Any]):
        """This rank's shard of every sequence in ``batch`` (the tensors as long as the model's input
        along dim 1) and the context in which the model runs on shards."""
        from .. import parallel

        sharding = self._context[1]
        main = batch.get(self.model.input_key)
        if not isinstance(main, Tensor) or main.dim() < 2:
            raise ValueError(f"--context-parallel splits sequences: the batch's {self.model.input_key!r} must be a "
                             f"(batch, length) tensor")
        keys = tuple(k for k, v in batch.items() if isinstance(v, Tensor) and v.dim() >= 2 and v.shape[:2] == main.shape[:2])
        batch, L = parallel.shard_batch(batch, sharding, keys)
        return batch, sharding.active(L)

    def _shard_weighted(self, loss: Tensor, batch: Dict[str, Any]) -> Tensor:
        """A shard's mean loss as its part of the whole sequences' mean: times its share of the target
        tokens, times P (DistributedDataParallel averages the ranks' gradients)."""
        groups = self._context[0]
        mine = torch.tensor(float(_count_tokens(batch)[0]), dtype=torch.float64, device=loss.device)
        total = mine.clone()
        torch.distributed.all_reduce(total, group=groups.group)
        if float(mine) == 0:
            return loss.nan_to_num(0.0) * 0.0  # no target on this shard (its mean is 0 / 0)
        return loss * float(mine * groups.size / total)

    def _save(self, ctx: distributed.DistContext, step: int, optimizer, scheduler) -> None:
        rng_states = distributed.all_gather_objects(ctx, capture_rng_state())
        carried = None
        if self.carries_state:
            mine = {k: v.detach().cpu() for k, v in self.model.export_state(self._carried).items()}
            carried = distributed.all_gather_objects(ctx, mine)
        if ctx.is_main:
            self.checkpoints.save(step, self.model, optimizer, scheduler, rng_states=rng_states, carried=carried,
                                  extra={"train_config": dataclasses.asdict(self.config)})
        distributed.barrier(ctx)


def _restore_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, state: Dict[str, Any]) -> None:
    """Restore the schedule's position but keep the base lr and multiplier built from *this*
    config: resuming with a larger ``steps`` stretches the cosine instead of replaying the old one.
    With an unchanged config this is exactly the saved schedule."""
    state = {k: v for k, v in state.items() if k != "base_lrs"}
    scheduler.load_state_dict({**state, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    for group, base_lr, multiplier in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base_lr * multiplier(scheduler.last_epoch)  # what LambdaLR.get_lr computes
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def _to_device(batch: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _postfix(record: Dict[str, Any], eval_metrics: Dict[str, float]) -> Dict[str, str]:
    """The bar's fields: the training loss as ``loss``, the last evaluation as ``val_*``."""
    shown = {"loss": f"{record['loss']:.4f}"}
    if "tokens_per_s" in record:
        shown["tok/s"] = f"{record['tokens_per_s']:.0f}"
    if "examples_per_s" in record:
        shown["ex/s"] = f"{record['examples_per_s']:.0f}"
    if "valid_loss" in eval_metrics:
        shown["val_loss"] = f"{eval_metrics['valid_loss']:.4f}"
    for key, value in eval_metrics.items():
        if key not in ("valid_loss", "loss"):
            shown[f"val_{key}"] = f"{value:.4g}"
            break
    return shown
