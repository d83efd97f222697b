"""``qkv bench lra``: Long Range Arena at small scale — every encoder kernel trained and tested on LRA's five tasks (or their stand-ins), and LRA's speed and memory table.

Tay et al. 2020 ("Long Range Arena: A Benchmark for Efficient Transformers", arXiv:2011.04006)
compare efficient Transformers on ListOps, Text, Retrieval, Image and Pathfinder (their Table 1:
test accuracy) and on training speed and peak memory relative to the Transformer from 1K to 4K
tokens (their Table 2). This benchmark trains one encoder-classifier (``lra-encoder``, and the
two-tower ``lra-dual-encoder`` for Retrieval; ``qkv.models.transformer.lra``) per (task, kernel,
seed) with the same settings within a task, evaluates it on the task's test set, measures one
training step per kernel and length, and writes a page (``--out``/``lra.md``; the published one is
``--report docs/reproductions/lra.md``): our
Table 1 beside the published one, the speed and memory ratios beside LRA's, a plot, the machine
and the time. Text, Retrieval and Image are stand-ins (``qkv.tasks.lra``).

Resuming: every finished (task, kernel, seed) cell and speed point is stored in one results file
(``--out``/``lra-results.json``, written atomically after each); a cell already there with the
same settings is skipped, an interrupted cell continues from its last checkpoint. Run the same
command again to continue; change a setting and the cells it touches run again. ``--report-only``
writes the page again from that results file alone, training and timing nothing.

The default plan (``PLAN``) is sized for two CPU cores: measured on 2026-11-24 (AMD EPYC), its 57
cells took 199 min of one-thread training and testing: **1 h 45 min two cells at a time** (measured
with two one-thread processes that split the kernels between them, which ``--jobs 2 --threads 1``
does by itself, handing the next cell to whichever process is free), about 3 h 20 min in one
process with one thread; the speed table adds minutes. The page records the time each invocation took. ``--quick``
is a smoke run of seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .._errors import UserError, user_input
from .. import _checks
from .._io import atomic_path
from ..registry import lookup
from . import common

__all__ = ["add_arguments", "run", "build_lra_task", "model_for", "PLAN", "QUICK_PLAN", "MODELS", "TASKS", "PUBLISHED",
           "PUBLISHED_SPEED_4K", "LRA_NAMES", "TaskPlan", "learned", "write_report"]

#: every kernel that fits an encoder; ``local-2d`` only where the task is an image
MODELS = ("softmax", "local-1d", "window", "strided", "fixed", "linformer", "lsh", "linear", "performer", "efficient",
          "adaptive-span", "local-2d")
#: LRA's five tasks in its column order: (qkv task, LRA column)
TASKS = (("listops", "ListOps"), ("bbc-bytes", "Text"), ("bbc-match", "Retrieval"), ("fashion-mnist-seq", "Image"),
         ("pathfinder", "Pathfinder"))
#: the LRA model each kernel stands for (Tay et al. 2020, Table 1 rows)
LRA_NAMES = {"softmax": "Transformer", "local-1d": "Local Attention", "window": "Local Attention",
             "strided": "Sparse Trans.", "fixed": "Sparse Trans.", "linformer": "Linformer", "lsh": "Reformer",
             "linear": "Linear Trans.", "performer": "Performer"}
#: Tay et al. 2020, Table 1: test accuracy (%) on ListOps, Text, Retrieval, Image, Pathfinder
PUBLISHED: Dict[str, Tuple[float, float, float, float, float]] = {
    "Transformer": (36.37, 64.27, 57.46, 42.44, 71.40),
    "Local Attention": (15.82, 52.98, 53.39, 41.46, 66.63),
    "Sparse Trans.": (17.07, 63.58, 59.59, 44.24, 71.71),
    "Longformer": (35.63, 62.85, 56.89, 42.22, 69.71),
    "Linformer": (35.70, 53.94, 52.27, 38.56, 76.34),
    "Reformer": (37.27, 56.10, 53.40, 38.07, 68.50),
    "Sinkhorn Trans.": (33.67, 61.20, 53.83, 41.23, 67.45),
    "Synthesizer": (36.99, 61.68, 54.67, 41.61, 69.45),
    "BigBird": (36.05, 64.02, 59.29, 40.83, 74.87),
    "Linear Trans.": (16.13, 65.90, 53.09, 42.34, 75.30),
    "Performer": (18.01, 65.40, 53.82, 42.77, 77.05),
}
#: Tay et al. 2020, Table 2 at 4K tokens (Text task, batch 32, 4x4 TPU v3): steps/s and peak memory
#: (GB per device); the Transformer: 1.4 steps/s, 9.48 GB
PUBLISHED_SPEED_4K: Dict[str, Tuple[float, float]] = {
    "Transformer": (1.4, 9.48), "Local Attention": (7.4, 1.37), "Linformer": (7.7, 0.99), "Reformer": (1.1, 2.28),
    "Sinkhorn Trans.": (5.3, 1.48), "Synthesizer": (1.9, 6.99), "BigBird": (1.5, 2.88), "Linear Trans.": (7.8, 1.03),
    "Performer": (8.0, 1.06),
}
LRA_LENGTHS = {"listops": "500-2,000 tokens", "bbc-bytes": "IMDb, up to 4,096 bytes",
               "bbc-match": "AAN, 2 x 4,000 bytes", "fashion-mnist-seq": "CIFAR-10, 1,024 grey pixels",
               "pathfinder": "32x32 = 1,024 pixels"}


@dataclass(frozen=True)
class TaskPlan:
    """How one task is run: its options at this scale, the training and the test set's size."""

    options: Mapping[str, Any]  # the task's constructor options
    steps: int  # optimizer updates per cell
    batch_size: int  # examples per update
    eval_examples: int  # test examples scored per cell (fewer if the test set is smaller)
    lr: float = 1e-3  # peak learning rate (linear warm-up, cosine decay)
    warmup: int = 30  # warm-up updates
    model: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # encoder fields set by --set model.FIELD=V


#: The default plan, sized for 2 cores: 57 cells (5 tasks x 11 kernels + local-2d on the 2 image
#: tasks), one seed, 199 min of one-thread cell time (1 h 45 min two cells at a time, measured):
#: sequences 1/8 (ListOps) to 1/4 of LRA's, a 2-layer width-64 encoder; ListOps, the cheapest per
#: update, gets the most updates.
PLAN: Dict[str, TaskPlan] = {
    "listops": TaskPlan({"min_len": 64, "max_len": 256, "eval_size": 1000}, steps=1000, batch_size=32, eval_examples=1000),
    "bbc-bytes": TaskPlan({"max_len": 1024}, steps=250, batch_size=32, eval_examples=1000),
    "bbc-match": TaskPlan({"max_len": 512, "eval_size": 1000}, steps=250, batch_size=32, eval_examples=1000),
    "fashion-mnist-seq": TaskPlan({"size": 28}, steps=250, batch_size=32, eval_examples=1000),
    "pathfinder": TaskPlan({"size": 32, "contour_length": 14, "eval_size": 1000}, steps=250, batch_size=32,
                           eval_examples=1000),
}
#: ``--quick``: seconds, to check that every path runs (the numbers mean nothing)
QUICK_PLAN: Dict[str, TaskPlan] = {
    "listops": TaskPlan({"min_len": 16, "max_len": 64, "max_depth": 4, "eval_size": 8}, 2, 4, 8, warmup=1),
    "bbc-bytes": TaskPlan({"max_len": 64}, 2, 4, 8, warmup=1),
    "bbc-match": TaskPlan({"max_len": 64, "eval_size": 8}, 2, 4, 8, warmup=1),
    "fashion-mnist-seq": TaskPlan({"size": 28}, 2, 4, 8, warmup=1),
    "pathfinder": TaskPlan({"size": 24, "contour_length": 4, "n_distractors": 1, "eval_size": 8}, 2, 4, 8, warmup=1),
}
SPEED_LENGTHS = (1024, 2048, 3072, 4096)  # LRA Table 2's lengths
#: the longest input a cell or a speed point may have: LRA's longest, Path-X's 128 x 128 pixels
MAX_LENGTH = 128 * 128
#: the most tokens one training batch (or one timed step) may hold: 256 sequences of 4K, 8 x LRA's Text batch (32 x 4K)
MAX_BATCH_TOKENS = 1 << 20
#: the most held-out examples a task may generate (the plan's: 1,000; each is generated and kept in memory)
MAX_EVAL_SIZE = 100_000
QUICK_SPEED_LENGTHS = (64, 128)
RESULTS_FILE = "lra-results.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``lra`` options (``--quick``, ``--device``, ``--threads``, ``--seed``, ``--out`` come from ``qkv bench``)."""
    parser.add_argument("--tasks", nargs="+", metavar="TASK", choices=[t for t, _ in TASKS],
                        help="tasks to run (default: all five, " + ", ".join(t for t, _ in TASKS) + ")")
    parser.add_argument("--models", nargs="+", metavar="KERNEL",
                        help="attention kernels (default: every encoder kernel, " + ", ".join(MODELS) + ")")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="S", help="seeds (default: --seed, i.e. 0)")
    parser.add_argument("--steps", type=int, help="training updates per cell, every task (default: the plan's: "
                        "1000 for ListOps, 250 for the others)")
    parser.add_argument("--batch-size", type=int, help="examples per update, every task (default: the plan's, 32)")
    parser.add_argument("--eval-examples", type=int, help="test examples per cell (default: the plan's, 1000)")
    parser.add_argument("--lr", type=float, help="peak learning rate, every task (default: the plan's, 1e-3)")
    parser.add_argument("--set", action="append", default=[], metavar="TASK.OPTION=VALUE",
                        help="a task option of the plan, e.g. listops.max_len=2000 or pathfinder.contour_length=6, "
                             "or an encoder field of every cell, model.FIELD=VALUE, e.g. model.pair_features=abs-diff "
                             "(repeatable)")
    parser.add_argument("--speed-lengths", nargs="+", type=int, metavar="L",
                        help=f"lengths of the speed and memory table (default {' '.join(map(str, SPEED_LENGTHS))}, LRA's)")
    parser.add_argument("--speed-batch", type=int, default=None,
                        help="sequences per timed step (default 32 on CUDA as LRA, 2 on the CPU)")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed and memory table")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cells trained at once, each in its own process with --threads torch threads (default "
                             "1 thread there); CPU only. --jobs 2 --threads 1 uses two cores best (default: 1 job)")
    parser.add_argument("--report", default=None,
                        help="the page to write (default OUT/lra.md; the published one: docs/reproductions/lra.md)")
    parser.add_argument("--report-only", action="store_true",
                        help=f"write the page from the results already in OUT/{RESULTS_FILE}, training and measuring "
                             "nothing (every seed there unless --seeds)")


# ============================================================================================ plan


def _plan(args: argparse.Namespace) -> Dict[str, TaskPlan]:
    """The plan after the command line's overrides, for the chosen tasks. ``--set`` values are read
    as ``qkv train --set task.KEY=VALUE`` reads them: against the task's own option types."""
    from ..runs import init_params, typed

    base = QUICK_PLAN if args.quick else PLAN
    tasks = list(args.tasks or [t for t, _ in TASKS])
    given: Dict[str, Dict[str, str]] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        task, dot, option = key.partition(".")
        if not sep or not dot or not option or (task not in base and task != "model"):
            raise UserError(f"--set must be TASK.OPTION=VALUE with TASK one of {sorted(base)}, or model.FIELD=VALUE, "
                            f"got {item!r}")
        given.setdefault(task, {})[option] = value
    for field in set(given.get("model", {})) & _DECIDED:
        raise UserError(f"--set model.{field}: the task (or --models, for the kernel) decides {field}")
    model = typed(given.pop("model", {}), _model_fields(), "--set model")
    overrides = {task: typed(options, init_params(lookup("task", task)), f"--set {task}")
                 for task, options in given.items()}
    plan = {}
    for task in tasks:
        p = base[task]
        changes: Dict[str, Any] = {"options": {**p.options, **overrides.get(task, {})}, "model": model}
        for name, value in (("steps", args.steps), ("batch_size", args.batch_size), ("eval_examples", args.eval_examples)):
            if value is not None:
                changes[name] = _checks.positive_int(f"--{name.replace('_', '-')}", value)
        if args.lr is not None:
            if not (math.isfinite(args.lr) and args.lr > 0):
                raise UserError(f"--lr must be a positive finite number, got {args.lr}")
            changes["lr"] = float(args.lr)
        plan[task] = dataclasses.replace(p, **changes)
    return plan


def _models(args: argparse.Namespace) -> List[str]:
    models = list(args.models or MODELS)
    for name in models:
        lookup("attention", name)  # ValueError naming close matches
        if name not in MODELS:
            raise UserError(f"--models: {name!r} is not one of the encoder kernels {MODELS}")
    return models


class MissingData(Exception):
    """A task's data set is not in the cache."""


def build_lra_task(name: str, options: Mapping[str, Any]):
    """The task ``name`` with a plan's ``options`` (``PLAN[name].options``); ``MissingData`` when its
    data set is not cached."""
    from ..tasks import build_task

    try:
        return build_task(name, **options)
    except FileNotFoundError:
        data = "fashion-mnist" if name == "fashion-mnist-seq" else "bbc"
        raise MissingData(f"its data is not cached: run `qkv data fetch {data}`") from None


#: encoder fields that the task or the kernel decides (``--set model.FIELD`` may not set them)
_DECIDED = frozenset({"vocab_size", "n_classes", "max_len", "image_size", "attention", "attention_kwargs"})


def _model_class(task_name: str) -> type:
    """The model that runs ``task_name``: the two-tower one for Retrieval."""
    from ..models.transformer.lra import LRADualEncoder, LRAEncoder

    return LRADualEncoder if task_name == "bbc-match" else LRAEncoder


def _model_fields() -> Dict[str, Any]:
    """The encoder fields ``--set model.FIELD=VALUE`` may set (the two-tower model has them all), and their types."""
    from ..runs.settings import fields_of

    return {k: v for k, v in fields_of(_model_class("bbc-match").config_class).items() if k not in _DECIDED}


def _model_defaults() -> Dict[str, Any]:
    """The encoder's settings that no task decides (sizes, wiring): a cell trained with others is stale.
    The two-tower model's own fields (its head's ``pair_features``) are named only where set (below)."""
    from ..models.transformer.lra import LRAEncoderConfig

    return {f.name: f.default for f in dataclasses.fields(LRAEncoderConfig)
            if f.name not in _DECIDED and f.default is not dataclasses.MISSING}


def _model_settings(model: Mapping[str, Any]) -> Dict[str, Any]:
    """The encoder settings a cell records: the defaults with ``--set model.*`` over them. A field
    the shared encoder lacks is named only away from its default, so that the cells trained before
    it existed (at its default) keep their settings."""
    defaults = {f.name: f.default for f in dataclasses.fields(_model_class("bbc-match").config_class)}
    shared = _model_defaults()
    return {**shared, **{k: v for k, v in model.items() if k in shared or v != defaults[k]}}


def model_for(task_name: str, task: Any, kernel: str, seed: int, model: Optional[Mapping[str, Any]] = None):
    """The encoder of ``task`` with ``kernel`` — every other setting the task's (same for all kernels),
    with ``model``'s fields (``--set model.FIELD=VALUE``) over the defaults."""
    from ..runs.settings import fields_of, model_hints
    from ..tasks.base import stable_seed

    model_class = _model_class(task_name)
    config_class = model_class.config_class
    fields = fields_of(config_class)
    for name in model or {}:
        if name not in fields:
            raise ValueError(f"{name} is a field of the two-tower model's config (task bbc-match) only; "
                             f"{config_class.__name__} has no {name}")
    config = config_class(attention=kernel, **{**dict(model or {}), **model_hints(task, fields)})
    torch.manual_seed(stable_seed("lra", task_name, seed))  # one initialisation per (task, seed), whatever the kernel
    return model_class(config)


# ============================================================================================ results


def _load(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        return {"cells": {}, "speed": {}}
    data = json.loads(path.read_text(encoding="utf-8"))
    data.setdefault("cells", {})
    data.setdefault("speed", {})
    return data


def _save(path: Path, results: Mapping[str, Any]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: list(v) if isinstance(v, tuple) else str(v)))


# ============================================================================================ one cell


def _worker_pool(jobs: int):
    """``jobs`` fresh worker processes (spawned: no state inherited from this one), or None for one
    job. Each worker ends when this process ends, ``kill -9`` included (``die_with_parent``; the
    cells it ran are checkpointed), and with them multiprocessing's resource tracker."""
    if jobs == 1:
        return None
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from ..train.distributed import die_with_parent

    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))


def _test_set(task: Any, n: int) -> Dict[str, Any]:
    """What the test set scored by the cells is: its size and the share of its commonest label."""
    labels = torch.cat([b["labels"] for b in task.eval_batches("test", 256, n)])
    return {"test_examples": len(labels), "majority": float(torch.bincount(labels).max()) / len(labels),
            "n_classes": task.n_classes}


def _train_cell(task_name: str, task: Any, kernel: str, seed: int, plan: TaskPlan, run_dir: Path,
                device: str, settings: Mapping[str, Any], progress: bool = True) -> Dict[str, Any]:
    """Train one (task, kernel, seed) cell into ``run_dir`` (continuing its checkpoint) and test it."""
    from ..runs import Run

    marker = run_dir / "cell.json"
    if run_dir.exists() and (not marker.is_file() or json.loads(marker.read_text()) != settings):
        shutil.rmtree(run_dir)  # another cell's settings: start over
    run_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(marker) as tmp:
        tmp.write_text(json.dumps(settings, indent=1) + "\n")
    model = model_for(task_name, task, kernel, seed, plan.model)
    train = dict(steps=plan.steps, batch_size=plan.batch_size, lr=plan.lr, warmup=min(plan.warmup, plan.steps // 4),
                 schedule="cosine", eval_every=0, eval_batches=0, eval_max_examples=min(256, plan.eval_examples),
                 save_every=max(50, plan.steps // 4), keep_last=1, seed=seed, device=device,
                 log_every=max(1, min(10, plan.steps)), progress=progress, tensorboard=False)
    start = time.perf_counter()
    with Run.of(run_dir, model, task, train, resume=True) as run:  # continues the cell's checkpoint
        valid = run.train(save=False)
    seconds = time.perf_counter() - start
    model.eval()
    test = task.evaluate(model, "test", max_examples=plan.eval_examples)
    curve = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the cell is done; its curve stays
    return {
        "task": task_name, "model": kernel, "seed": seed, "settings": settings,
        "test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_examples": int(test["examples"]),
        "valid_accuracy": valid.get("accuracy"), "valid_loss": valid.get("loss"),
        "train_loss_curve": [(r["step"], r["loss"]) for r in curve if r.get("event") == "train"],
        "seconds": seconds, "parameters": sum(p.numel() for p in model.parameters()),
        "attention_kwargs": _jsonable(model.config.attention_kwargs), "date": common.now_iso(),
    }


_WORKER_TASKS: Dict[str, Any] = {}  # a --jobs worker's task, built once per task


def _cell_job(task_name: str, plan: TaskPlan, kernel: str, seed: int, run_dir: Path, device: str,
              settings: Mapping[str, Any], threads: int) -> Dict[str, Any]:
    """One cell in a ``--jobs`` worker process: its own copy of the task (built as the parent's,
    deterministically), ``threads`` torch threads, no inner progress bar."""
    torch.set_num_threads(threads)
    key = json.dumps([task_name, _jsonable(dict(plan.options))])
    if key not in _WORKER_TASKS:
        _WORKER_TASKS.clear()  # one task's data in memory at a time
        _WORKER_TASKS[key] = build_lra_task(task_name, plan.options)
    return _train_cell(task_name, _WORKER_TASKS[key], kernel, seed, plan, run_dir, device, settings, progress=False)


# ============================================================================================ speed


def _speed_point(kernel: str, length: int, batch: int, device: torch.device) -> Dict[str, Any]:
    """Steps/s and peak memory of one training step (forward, loss, backward, AdamW) of the Text
    task's encoder at ``length`` bytes, ``batch`` sequences (LRA Table 2's measurement)."""
    from ..models.transformer.lra import LRAEncoder, LRAEncoderConfig

    torch.manual_seed(0)
    model = LRAEncoder(LRAEncoderConfig(attention=kernel, max_len=length, vocab_size=259, n_classes=5)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (batch, length), generator=g).to(device)
    labels = torch.randint(0, 5, (batch,), generator=g).to(device)

    def step() -> None:
        model(ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    first = common.timed_once(step, device)  # warm-up (allocations, lazy buffers)
    timing = common.time_steps(step, device, warmup=0, estimate=first, min_repeats=2, max_repeats=10, target_seconds=2.0)
    peak = common.peak_memory(step, device)
    return {"steps_per_s": 1.0 / timing.median, "time_median_s": timing.median, "peak_memory_bytes": peak,
            "repeats": len(timing.times)}


def _measure_speed(models: Sequence[str], lengths: Sequence[int], batch: int, device: torch.device,
                   results: Dict[str, Any], save) -> None:
    """Every (kernel, length) point not yet in ``results["speed"]`` with these settings."""
    from tqdm.auto import tqdm

    todo = [(k, L) for k in models if k != "local-2d" for L in lengths]
    bar = tqdm(todo, desc="speed and memory", dynamic_ncols=True)
    for kernel, length in bar:
        key = f"{kernel}|{length}|{batch}|{device.type}"
        if key in results["speed"]:
            continue
        bar.set_postfix_str(f"{kernel} L={length}")
        start = time.perf_counter()
        try:
            point = _speed_point(kernel, length, batch, device)
        except (RuntimeError, MemoryError) as err:  # out of memory at this length: say so in the table
            point = {"error": str(err).splitlines()[0][:120]}
        results["speed"][key] = {"model": kernel, "length": length, "batch": batch, "device": device.type, **point,
                                 "seconds": time.perf_counter() - start}
        save()


# ============================================================================================ run


@dataclass
class _Checked:
    """``run``'s command line after every check: nothing runs before all of it is known to be good."""

    plan: Dict[str, TaskPlan]
    tasks: Dict[str, Any]  # task name -> built task (the ones whose data is cached)
    missing: Dict[str, str]  # task name -> what to fetch
    models: List[str]
    seeds: List[int]
    jobs: int
    lengths: List[int]
    speed_batch: int
    report: Path


def _check(args: argparse.Namespace, device: torch.device) -> _Checked:
    """Every option of ``qkv bench lra`` checked, and every planned task built, before any cell runs:
    a bad value is one ``UserError`` line naming it."""
    with user_input():  # the command line's values: a bad one is one line, not a traceback
        plan = _plan(args)
        jobs = _checks.positive_int("--jobs", args.jobs)
        if args.speed_batch is not None:
            _checks.positive_int("--speed-batch", args.speed_batch)
        lengths = list(args.speed_lengths or (QUICK_SPEED_LENGTHS if args.quick else SPEED_LENGTHS))
        for L in lengths:
            _checks.positive_int("--speed-lengths", L)
    if jobs > 1 and device.type != "cpu":
        raise UserError(f"--jobs {jobs}: several cells at once run on the CPU only; on {device.type} use --jobs 1")
    cores = os.cpu_count() or 1
    if jobs > max(4, cores):  # each job is a process with its own torch and data
        raise UserError(f"--jobs {jobs}: at most {max(4, cores)} cells at once on this machine ({cores} CPU(s))")
    models = _models(args)
    seeds = list(args.seeds if args.seeds is not None else [args.seed])
    if any(s < 0 for s in seeds):
        raise UserError(f"--seeds must be >= 0, got {seeds}")
    speed_batch = args.speed_batch or (1 if args.quick else (32 if device.type == "cuda" else 2))
    if not args.no_speed:
        for L in lengths:
            _bounded(f"--speed-lengths {L}", L, speed_batch, f"--speed-batch {speed_batch}")
    report = _report_path(args)
    tasks: Dict[str, Any] = {}
    missing: Dict[str, str] = {}
    for name, p in plan.items():
        try:
            with user_input():
                tasks[name] = build_lra_task(name, p.options)
        except MissingData as err:  # the other tasks still run; the page says what to fetch
            missing[name] = str(err)
            continue
        except UserError as err:
            raise UserError(f"--set {name}: {err}") from None
        if p.model:  # --set model.*: built once per task now, so that a field no model of it takes stops the run here
            try:
                with user_input():
                    model_for(name, tasks[name], "softmax", 0, p.model)
            except UserError as err:
                raise UserError(f"--set model ({name}): {err}") from None
        rows = 2 if name == "bbc-match" else 1
        _bounded(f"{name} (its inputs are {tasks[name].max_len:,} tokens)", tasks[name].max_len, p.batch_size * rows,
                 f"--batch-size {p.batch_size}" + (" (x 2 articles)" if rows == 2 else ""))
        eval_size = getattr(tasks[name], "eval_size", None)
        if eval_size is not None and eval_size > MAX_EVAL_SIZE:
            raise UserError(f"--set {name}.eval_size={eval_size:,}: at most {MAX_EVAL_SIZE:,} held-out examples")
    return _Checked(plan, tasks, missing, models, seeds, jobs, lengths, speed_batch, report)


def _report_path(args: argparse.Namespace) -> Path:
    """The page ``--report`` names (checked), or its default: OUT/lra.md, beside the results (never a
    path of its own choosing: a run in another folder must not create or overwrite a page there;
    the published page is ``--report docs/reproductions/lra.md``)."""
    from .._io import output_file

    try:
        return output_file(args.report or Path(args.out) / "lra.md", (".md",), ".md")
    except UserError as err:
        raise UserError(f"--report: {err}") from None


def _bounded(what: str, length: int, batch: int, batch_what: str) -> None:
    """Refuse an input longer than ``MAX_LENGTH`` or a batch of more than ``MAX_BATCH_TOKENS`` tokens."""
    if length > MAX_LENGTH:
        raise UserError(f"{what}: at most {MAX_LENGTH:,} tokens per input (LRA's longest, Path-X's 128 x 128), "
                        f"got {length:,}")
    if length * batch > MAX_BATCH_TOKENS:
        raise UserError(f"{what} with {batch_what}: {length * batch:,} tokens per step, more than "
                        f"{MAX_BATCH_TOKENS:,}; use a smaller batch")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Check every option, then train and test every cell not yet done, measure the speed table, write the page."""
    if args.report_only:
        return _report_only(args)
    device = common.resolve_device(args.device)
    checked = _check(args, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS_FILE
    results = _load(path)
    results["machine"] = common.describe_machine(device)
    results["command"] = args.command_line
    save = lambda: _save(path, results)  # noqa: E731

    plan, models, seeds, jobs = checked.plan, checked.models, checked.seeds, checked.jobs
    cells = [(t, k, s) for t in plan for s in seeds for k in models if k != "local-2d" or t in ("fashion-mnist-seq", "pathfinder")]
    print(f"lra: {len(cells)} cells ({len(plan)} tasks x {len(models)} kernels x {len(seeds)} seed(s)) on "
          f"{common.machine_line(results['machine'])}" + (f", {jobs} at once" if jobs > 1 else "") +
          f"; results in {path}", flush=True)
    started = time.perf_counter()
    ran = _train_cells(cells, checked, args, device, out, results, save)
    if not args.no_speed:
        _measure_speed(models, checked.lengths, checked.speed_batch, device, results, save)
    results["missing"] = checked.missing
    results["last_run_seconds"] = time.perf_counter() - started
    results.setdefault("invocations", []).append(
        {"command": args.command_line, "seconds": results["last_run_seconds"], "date": common.now_iso(),
         "cells_run": ran, "machine": common.machine_line(results["machine"])})
    results["date"] = common.now_iso()
    save()
    report = checked.report
    write_report(results, report, plan, models, seeds, device)
    print(f"lra: wrote {report} and {path}", flush=True)
    return results


def _report_only(args: argparse.Namespace) -> Dict[str, Any]:
    """``--report-only``: the page from the saved results file, which stays as it is (nothing is trained or timed)."""
    path = Path(args.out) / RESULTS_FILE
    if not path.is_file():
        raise UserError(f"--report-only: no results at {path}; run `qkv bench lra --out {args.out}` first "
                        "(or give --out the folder that holds them)")
    needed = {"task", "model", "seed", "test_accuracy", "test_examples", "settings", "seconds"}  # what the page reads
    try:
        results = _load(path)
        absent = sorted({"machine", "command"} - set(results))
        cells = results["cells"]
        broken = [key for key, c in cells.items() if not needed <= set(c)]
        device = torch.device(results.get("machine", {}).get("device", "cpu"))
    except (ValueError, TypeError, AttributeError, RuntimeError) as err:
        raise UserError(f"--report-only: {path} is not a `qkv bench lra` results file ({type(err).__name__}: {err})") \
            from None
    if absent:
        raise UserError(f"--report-only: {path} lacks {absent}: not a `qkv bench lra` results file")
    if broken:
        raise UserError(f"--report-only: {path}: cell {broken[0]!r} lacks {sorted(needed - set(cells[broken[0]]))}")
    if not cells:
        raise UserError(f"--report-only: {path} holds no finished cells")
    seeds = list(args.seeds) if args.seeds is not None else sorted({c["seed"] for c in cells.values()})
    report = _report_path(args)
    write_report(results, report, {}, [], seeds, device)
    print(f"lra: wrote {report} from {path} ({len(cells)} cells; nothing trained)", flush=True)
    return results


def _cell_settings(p: TaskPlan, device: torch.device) -> Dict[str, Any]:
    """What a cell was trained with: a finished cell whose settings differ is trained again."""
    return _jsonable({"task_options": dict(p.options), "steps": p.steps, "batch_size": p.batch_size, "lr": p.lr,
                      "warmup": p.warmup, "eval_examples": p.eval_examples, "device": device.type,
                      "model": _model_settings(p.model)})


def _train_cells(cells: Sequence[Tuple[str, str, int]], checked: _Checked, args: argparse.Namespace,
                 device: torch.device, out: Path, results: Dict[str, Any], save) -> int:
    """Train and test every (task, kernel, seed) cell not yet done with these settings, here or in --jobs
    worker processes, saving the results after each; returns how many cells ran."""
    from tqdm.auto import tqdm

    plan, jobs, tasks, missing = checked.plan, checked.jobs, checked.tasks, checked.missing
    bar = tqdm(total=len(cells), desc="lra cells", dynamic_ncols=True, position=0)
    for name, why in missing.items():
        tqdm.write(f"lra: skipping {name}: {why}")
    ran = 0
    described: set = set()
    pool = _worker_pool(jobs)
    pending = {}  # future -> key (--jobs)

    def finish(key: str, cell: Dict[str, Any]) -> None:
        nonlocal ran
        results["cells"][key] = cell
        ran += 1
        save()
        bar.update(1)
        tqdm.write(f"lra: {cell['task']:18s} {cell['model']:14s} seed {cell['seed']}: test accuracy "
                   f"{100 * cell['test_accuracy']:.2f}% ({cell['seconds']:.0f} s)")

    for task_name, kernel, seed in cells:
        p = plan[task_name]
        key = f"{task_name}|{kernel}|{seed}"
        settings = _cell_settings(p, device)
        done = results["cells"].get(key)
        if (done is not None and done.get("settings") == settings) or task_name in missing:
            bar.update(1)
            continue
        if task_name not in described:  # once per invocation, for the first cell of the task that runs
            described.add(task_name)
            results.setdefault("tasks", {})[task_name] = _test_set(tasks[task_name], p.eval_examples)
        run_dir = out / "runs" / task_name / kernel / f"seed{seed}"
        if pool is None:
            bar.set_postfix_str(f"{task_name} x {kernel} (seed {seed})")
            finish(key, _train_cell(task_name, tasks[task_name], kernel, seed, p, run_dir, args.device, settings))
        else:
            pending[pool.submit(_cell_job, task_name, p, kernel, seed, run_dir, args.device, settings,
                                args.threads or 1)] = key
    if pool is not None:
        from concurrent.futures import as_completed

        with pool:
            bar.set_postfix_str(f"{jobs} cells at once")
            for future in as_completed(pending):
                finish(pending[future], future.result())
    bar.close()
    return ran


# ============================================================================================ page


def _accuracies(results: Mapping[str, Any], task: str, model: str, seeds: Sequence[int]) -> List[float]:
    cells = results["cells"]
    return [100 * cells[f"{task}|{model}|{s}"]["test_accuracy"] for s in seeds if f"{task}|{model}|{s}" in cells]


def _mean_text(values: Sequence[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _baseline(results: Mapping[str, Any], task: str) -> Tuple[float, int]:
    """``(majority-class accuracy %, test examples)`` of the task's test set as the run scored it."""
    info = results.get("tasks", {}).get(task)
    if info:
        return 100 * info["majority"], info["test_examples"]
    counts = [c["test_examples"] for c in results["cells"].values() if c["task"] == task]
    return _chance(task), min(counts) if counts else 1


def _chance(task: str) -> float:
    from ..tasks.lra import BBCBytes, BBCMatch, FashionMnistSequence, ListOps, Pathfinder

    n = {"listops": ListOps, "bbc-bytes": BBCBytes, "bbc-match": BBCMatch, "fashion-mnist-seq": FashionMnistSequence,
         "pathfinder": Pathfinder}[task].n_classes
    return 100.0 / n


def _two_se(n: int, *accuracies: float) -> float:
    """Two binomial standard errors (points) of one accuracy, or of the difference of two, on ``n`` examples."""
    return 2 * 100 * math.sqrt(sum((a / 100) * (1 - a / 100) for a in accuracies) / max(n, 1))


def _mean_accuracy(results: Mapping[str, Any], task: str, model: str, seeds: Sequence[int]) -> Optional[float]:
    """The kernel's test accuracy (%) on the task, averaged over the seeds it ran; None if it did not run."""
    values = _accuracies(results, task, model, seeds)
    return statistics.mean(values) if values else None


def learned(results: Mapping[str, Any], task: str, seeds: Sequence[int]) -> Tuple[bool, str]:
    """Whether some kernel learned ``task``: its best kernel's accuracy (mean over ``seeds``) beats the
    majority class of the test set by more than two binomial standard errors on that test set; and
    the sentence that says so. The one test of "learned" for the page: Table 1's average counts only
    these tasks, and the reading judges a ranking only on them."""
    base, n = _baseline(results, task)
    values = {m: v for m in MODELS if (v := _mean_accuracy(results, task, m, seeds)) is not None}
    if not values:
        return False, "no kernel ran it"
    best = max(values, key=values.get)
    margin = _two_se(n, base)
    text = (f"the majority class scores {base:.2f}% on its {n} test examples; best `{best}` "
            f"{values[best]:.2f}%, two standard errors {margin:.1f} points")
    return values[best] - base > margin, text


def _reading(results: Mapping[str, Any], seeds: Sequence[int]) -> List[str]:
    """Does the ranking agree with the paper? Only from the numbers in ``results``: a difference
    counts when it exceeds two binomial standard errors of the difference on the test set."""
    lines = []

    def acc(task: str, model: str) -> Optional[float]:
        return _mean_accuracy(results, task, model, seeds)

    def compare(task: str, rivals: Sequence[str]) -> Dict[str, List[str]]:
        _, n = _baseline(results, task)
        soft = acc(task, "softmax")
        out: Dict[str, List[str]] = {"behind": [], "level": [], "ahead": []}
        for m in rivals:
            diff = acc(task, m) - soft
            side = "level" if abs(diff) <= _two_se(n, soft, acc(task, m)) else ("ahead" if diff > 0 else "behind")
            out[side].append(f"`{m}` {acc(task, m):.2f}%")
        return out

    checks = (("listops", "ListOps", ("linear", "performer", "local-1d"),
               "Transformer 36.37% well ahead of Linear 16.13%, Performer 18.01%, Local 15.82%",
               lambda c, rivals: len(c["behind"]) == len(rivals)),
              ("pathfinder", "Pathfinder", ("linear", "performer"),
               "Linear 75.30% and Performer 77.05% at least level with the Transformer's 71.40%",
               lambda c, rivals: not c["behind"]))
    for task, column, wanted, paper, agrees in checks:
        rivals = [m for m in wanted if acc(task, m) is not None]
        if acc(task, "softmax") is None or not rivals:
            continue
        ok, baseline = learned(results, task, seeds)
        c = compare(task, rivals)
        groups = "; ".join(f"{side}: {', '.join(ms)}" for side, ms in c.items() if ms)
        head = f"- **{column}** (paper: {paper}): softmax {acc(task, 'softmax'):.2f}% — relative to it, {groups}"
        if not ok:
            lines.append(f"{head}. **Cannot be judged**: no kernel learned the task ({baseline}), so the "
                         "differences are noise.")
        else:
            verdict = "agrees" if agrees(c, rivals) else "differs"
            lines.append(f"{head}. The ranking **{verdict}** with the paper's ({baseline}; a difference counts when it "
                         "exceeds two standard errors of the difference).")
    for task, column in TASKS:
        if task in ("listops", "pathfinder") or not any(c["task"] == task for c in results["cells"].values()):
            continue
        ok, baseline = learned(results, task, seeds)
        lines.append(f"- **{column}**: " + ("learned" if ok else "not learned by any kernel") + f" ({baseline}).")
    return lines


def write_report(results: Mapping[str, Any], path: Path, plan: Mapping[str, TaskPlan], models: Sequence[str],
                 seeds: Sequence[int], device: torch.device) -> Path:
    """The page: setup, our Table 1 beside the published one, the speed and memory ratios, the plot."""
    path = Path(path)
    cells = results["cells"]
    img = path.parent / "img" / "lra.png"
    order = [m for m in MODELS if any(c["model"] == m for c in cells.values())]
    tasks_run = [(t, col) for t, col in TASKS if any(c["task"] == t for c in cells.values())]
    sections = (_setup_sections(results) + _accuracy_sections(results, order, tasks_run, seeds)
                + _speed_sections(results, device))
    if cells:
        _plot(results, img, order, tasks_run, seeds)
        sections.append(f"![accuracy per task and kernel; speed against length](img/{img.name})")
    reading = _reading(results, seeds)
    sections.append("## Reading: does the ranking agree with the paper?\n\n" + ("\n".join(reading) if reading else
                    "Not enough cells for a reading (it needs `softmax` and its rivals on ListOps or Pathfinder).") +
                    "\n\n" + _scale_sentence(results))
    sections += _time_sections(results)
    common.write_markdown(path, "Long Range Arena at small scale", results["machine"], results["command"],
                          results.get("date", common.now_iso()), sections)
    return path


def _setup_sections(results: Mapping[str, Any]) -> List[str]:
    """The setup: what was trained on what, beside LRA's inputs, and the tasks not run."""
    cells = results["cells"]
    sections = []
    setup_rows = []
    for task, column in TASKS:
        done = [c for c in cells.values() if c["task"] == task]
        if not done:
            continue
        s = done[0]["settings"]
        note = " (**stand-in**)" if task in ("bbc-bytes", "bbc-match", "fashion-mnist-seq") else ""
        if task == "listops":
            note += " — brackets kept" if s["task_options"].get("brackets", True) else " — brackets dropped (LRA's release)"
        options = ", ".join(f"{k}={v}" for k, v in s["task_options"].items())
        defaults = _model_defaults()
        changed = {k: v for k, v in s.get("model", {}).items() if k not in defaults or defaults[k] != v}
        if changed:  # --set model.*: a departure from the encoder the page describes
            options += "; **encoder: " + ", ".join(f"{k}={v}" for k, v in changed.items()) + "**"
        setup_rows.append([f"{column}: `{task}`{note}", LRA_LENGTHS[task], options or "defaults",
                           f"{s['steps']} x {s['batch_size']}" + (f", lr {s['lr']:g}" if s.get("lr", 1e-3) != 1e-3 else ""),
                           _baseline(results, task)[1]])
    from ..models.transformer.lra import PAIR_FEATURES

    heads = sorted({c["settings"].get("model", {}).get("pair_features", "lra") for c in cells.values()
                    if c["task"] == "bbc-match"}, key=lambda h: (h != "lra", h)) or ["lra"]  # LRA's first
    reads = " or ".join(f"`{PAIR_FEATURES[h]}`" + ("" if h == "lra" else f" (`pair_features={h}`, not LRA's head)")
                        for h in heads)
    sections.append(
        "Long Range Arena (Tay et al. 2020, arXiv:2011.04006) at small scale, produced by `qkv bench lra` "
        "(`qkv.bench.lra`). One encoder-classifier (`lra-encoder`; the two-tower `lra-dual-encoder` reading "
        f"{reads} for Retrieval) with the attention kernel swapped by name and every other setting the "
        "same within a task: 2 pre-LN layers, width 64, 2 heads, feed-forward 128, learned positions, mean "
        "pooling, an MLP head of 128 (LRA: 4-6 layers, width 256-512); AdamW, linear warm-up then cosine decay, "
        "one initialisation per (task, seed) for every kernel. Kernel knobs follow the length "
        "(`qkv.models.transformer.lra.kernel_knobs`). Text, Retrieval and Image are **stand-ins** "
        "(`qkv.tasks.lra`): LRA's data (IMDb, the ACL Anthology Network, CIFAR-10) cannot be had from the package "
        "registries.\n\n" + common.markdown_table(
            ["task", "LRA's input", "our options", "updates x batch", "test examples"], setup_rows))
    for task, why in results.get("missing", {}).items():
        sections.append(f"**Not run: `{task}`** — {why}.")
    return sections


def _accuracy_sections(results: Mapping[str, Any], order: Sequence[str], tasks_run,
                       seeds: Sequence[int]) -> List[str]:
    """Our Table 1 (test accuracy per kernel and task; the majority class and whether the task was
    learned below), then the published one. The average counts only the tasks some kernel learned
    (``learned``): a task nobody learned scores the majority class, whatever the kernel."""
    cells = results["cells"]
    sections = []
    verdicts = {task: learned(results, task, seeds) for task, _ in tasks_run}
    counted = [(task, col) for task, col in tasks_run if verdicts[task][0]]
    names = ", ".join(col for _, col in counted)
    header = ["kernel", "LRA model"] + [col for _, col in tasks_run] + ([f"avg ({names})"] if counted else [])
    rows = []
    for m in order:
        row = [f"`{m}`", LRA_NAMES.get(m, "—")] + [_mean_text(_accuracies(results, t, m, seeds)) for t, _ in tasks_run]
        if counted:
            means = [_mean_accuracy(results, t, m, seeds) for t, _ in counted]
            row.append(f"{statistics.mean(means):.2f}" if None not in means else "–")
        rows.append(row)
    tail = [""] if counted else []
    rows.append(["majority class", ""] + [f"{_baseline(results, t)[0]:.2f}" for t, _ in tasks_run] + tail)
    rows.append(["learned?", ""] + ["yes" if verdicts[t][0] else "no" for t, _ in tasks_run] + tail)
    n_seeds = len({c["seed"] for c in cells.values()})
    per_task = {col: len({c["seed"] for c in cells.values() if c["task"] == t}) for t, col in tasks_run}
    seeds_text = (f"{n_seeds} seed(s)" if len(set(per_task.values())) <= 1 else
                  "seeds per task: " + ", ".join(f"{col} {n}" for col, n in per_task.items()))
    rule = ("a task is *learned* when its best kernel beats the majority class by more than two binomial standard "
            "errors on its test set")
    if counted:
        left_out = [col for t, col in tasks_run if not verdicts[t][0]]
        average = (f"`avg`: the mean over the learned tasks only ({names})" +
                   (f"; {', '.join(left_out)} left out, no kernel learned {'it' if len(left_out) == 1 else 'them'}"
                    if left_out else "") + f" ({rule})")
    else:
        average = f"**No task was learned by any kernel**, so no average is given ({rule})"
    sections.append(f"## Table 1: test accuracy (%)\n\nOurs ({seeds_text}{'; mean ± sd' if n_seeds > 1 else ''}; "
                    f"`local-2d` only on the image tasks; `–`: not run). {average}.\n\n" +
                    common.markdown_table(header, rows))
    columns = [col for _, col in TASKS]  # PUBLISHED's order
    same = [columns.index(col) for _, col in counted]
    partial = 0 < len(same) < len(columns)  # the paper's average is over all five: show it over ours too
    pub_rows = [[name] + [f"{v:.2f}" for v in values] + [f"{statistics.mean(values):.2f}"] +
                ([f"{statistics.mean(values[i] for i in same):.2f}"] if partial else [])
                for name, values in PUBLISHED.items()]
    note = (f". `avg`: the paper's, over all five; `avg ({names})`: over the tasks our average counts, the one to "
            "set beside ours" if partial else "")
    sections.append(f"Published (Tay et al. 2020, Table 1; Path-X left out — every model failed it){note}:\n\n" +
                    common.markdown_table(["model"] + columns + ["avg"] + ([f"avg ({names})"] if partial else []),
                                          pub_rows))
    return sections


def _speed_sections(results: Mapping[str, Any], device: torch.device) -> List[str]:
    """The speed and memory table relative to `softmax`, LRA's 4K column beside it (none without speed points)."""
    speed = list(results.get("speed", {}).values())
    if not speed:
        return []
    sections = []
    lengths = sorted({p["length"] for p in speed})
    batch = speed[0]["batch"]
    base = {p["length"]: p for p in speed if p["model"] == "softmax" and "steps_per_s" in p}
    rows = []
    for m in [m for m in MODELS if any(p["model"] == m for p in speed)]:
        row = [f"`{m}`", LRA_NAMES.get(m, "—")]
        for L in lengths:
            p = next((q for q in speed if q["model"] == m and q["length"] == L), None)
            if p is None or "steps_per_s" not in p or L not in base:
                row.append("–" if p is None or "error" not in p else "failed")
                continue
            row.append(f"{p['steps_per_s'] / base[L]['steps_per_s']:.2f}x / "
                       f"{p['peak_memory_bytes'] / max(base[L]['peak_memory_bytes'], 1):.2f}")
        lra = PUBLISHED_SPEED_4K.get(LRA_NAMES.get(m, ""))
        t0 = PUBLISHED_SPEED_4K["Transformer"]
        row.append(f"{lra[0] / t0[0]:.1f}x / {lra[1] / t0[1]:.2f}" if lra else "—")
        rows.append(row)
    absolute = ", ".join(f"L={L}: {base[L]['steps_per_s']:.2f} steps/s, {base[L]['peak_memory_bytes'] / 2**20:.0f} MB"
                         for L in lengths if L in base)
    sections.append(
        "## Speed and memory, relative to the Transformer (`softmax`)\n\n"
        f"One training step (forward, loss, backward, AdamW) of the Text task's encoder on {batch} sequence(s) of "
        f"L random bytes, on {device.type}: steps/s relative to `softmax` / peak memory relative to `softmax` "
        f"(`qkv.bench.common`: on the CPU the live bytes of the tensors the step creates). `softmax` itself: "
        f"{absolute}. LRA measured batch 32 on a 4x4 TPU v3 (Table 2); its 4K column, as ratios to its "
        "Transformer (1.4 steps/s, 9.48 GB), is on the right. `local-2d` is left out: it needs an image.\n\n" +
        common.markdown_table(["kernel", "LRA model"] + [f"L={L}" for L in lengths] + ["LRA at 4K"], rows)
        + _speed_reading(speed, base, lengths[-1]))
    return sections


def _scale_sentence(results: Mapping[str, Any]) -> str:
    """How far our cells are from LRA's: the updates and the device they actually ran with."""
    settings = [c["settings"] for c in results["cells"].values()]
    if not settings:  # nothing trained (every task's data missing): nothing to compare
        return "Scale matters here: our models are about 1/50 of LRA's in parameters; no cell was trained."
    steps = sorted({s["steps"] for s in settings})
    devices = sorted({s.get("device", "cpu") for s in settings})
    budget = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}-{steps[-1]:,}"
    where = " and ".join("a GPU" if d == "cuda" else "a CPU" if d == "cpu" else d for d in devices)
    return (f"Scale matters here: our models are about 1/50 of LRA's in parameters and train for {budget} updates "
            f"on {where}, most on shorter sequences than LRA's; a kernel that needs many updates to find "
            "long-range structure (LRA trained Pathfinder for 200 epochs) may rank differently after few.")


def _time_sections(results: Mapping[str, Any]) -> List[str]:
    """Where the time went, where the results are, and the invocations that produced them."""
    cells = results["cells"]
    train_seconds = sum(c["seconds"] for c in cells.values())
    sections = []
    speed_seconds = sum(p.get("seconds", 0) for p in results.get("speed", {}).values())
    sections.append(f"Time: {train_seconds / 60:.1f} min training and testing {len(cells)} cells (summed over the "
                    "cells; cells of parallel processes overlap), "
                    f"{speed_seconds / 60:.1f} min measuring {len(results.get('speed', {}))} speed points "
                    f"(the last invocation: {results.get('last_run_seconds', 0) / 60:.1f} min). Results: "
                    f"`{RESULTS_FILE}` in the run's `--out` folder; every cell's training curve is in "
                    "`runs/TASK/KERNEL/seedS/metrics.jsonl` there.")
    invocations = results.get("invocations", [])
    if len(invocations) > 1:  # a run continued, or cells from several invocations merged into one results file
        sections.append("The results come from these invocations (each skips the cells already done):\n\n" +
                        common.markdown_table(["command", "cells trained", "minutes", "machine", "date"],
                                              [[f"`{i['command']}`", i.get("cells_run", "–"), f"{i['seconds'] / 60:.1f}",
                                                i.get("machine", ""), i.get("date", "")] for i in invocations]))
    return sections


def _speed_reading(speed: Sequence[Mapping[str, Any]], base: Mapping[int, Mapping[str, Any]], L: int) -> str:
    """What the speed table says at its longest length, from its numbers."""
    if L not in base:
        return ""
    points = [p for p in speed if p["length"] == L and p["model"] != "softmax" and "steps_per_s" in p]
    if not points:
        return ""
    speedup = {p["model"]: p["steps_per_s"] / base[L]["steps_per_s"] for p in points}
    memory = {p["model"]: p["peak_memory_bytes"] / max(base[L]["peak_memory_bytes"], 1) for p in points}
    faster = [m for m, r in speedup.items() if r > 1]
    fastest, slowest = max(speedup, key=speedup.get), min(speedup, key=speedup.get)
    heavier = [m for m, r in memory.items() if r > 1]
    text = (f"\n\nAt L={L}: {len(faster)} of {len(points)} kernels train faster than `softmax` (fastest `{fastest}` "
            f"{speedup[fastest]:.2f}x, slowest `{slowest}` {speedup[slowest]:.2f}x); {len(heavier)} of {len(points)} "
            "need more peak memory than it")
    if heavier:
        most = max(memory, key=memory.get)
        text += (f" (most: `{most}` {memory[most]:.2f}x). qkv's `softmax` is PyTorch's fused scaled-dot-product "
                 "attention, which never holds the (L, L) score matrix; LRA's Transformer held it, so LRA's ratios "
                 "(0.10-0.24 at 4K) compare with a quadratic footprint and these with a linear one")
    return text + "."


def _plot(results: Mapping[str, Any], path: Path, order: Sequence[str], tasks_run, seeds: Sequence[int]) -> Path:
    """Left: test accuracy per task, one bar per kernel (chance dashed). Right: steps/s relative to
    ``softmax`` against length, LRA's 4K ratios as stars."""
    from ..viz import pyplot, save_figure

    plt = pyplot()
    speed = [p for p in results.get("speed", {}).values() if "steps_per_s" in p]
    fig, axes = plt.subplots(1, 2 if speed else 1, figsize=(15 if speed else 10, 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1]} if speed else None)
    ax = axes[0][0]
    width = 0.8 / max(len(order), 1)
    colours = plt.get_cmap("tab20")
    for i, m in enumerate(order):
        xs, ys, es = [], [], []
        for j, (task, _) in enumerate(tasks_run):
            values = _accuracies(results, task, m, seeds)
            if values:
                xs.append(j + (i - (len(order) - 1) / 2) * width)
                ys.append(statistics.mean(values))
                es.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        ax.bar(xs, ys, width, yerr=es if any(es) else None, label=m, color=colours(i % 20))
    for j, (task, _) in enumerate(tasks_run):
        ax.hlines(_baseline(results, task)[0], j - 0.45, j + 0.45, colors="k", linestyles="dashed", linewidth=0.8)
    ax.set_xticks(range(len(tasks_run)))
    ax.set_xticklabels([f"{col}\n({t})" for t, col in tasks_run], fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("accuracy per task (dashed: the majority class)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    if speed:
        ax = axes[0][1]
        base = {p["length"]: p["steps_per_s"] for p in speed if p["model"] == "softmax"}
        for i, m in enumerate(order):
            pts = sorted((p["length"], p["steps_per_s"] / base[p["length"]]) for p in speed
                         if p["model"] == m and p["length"] in base)
            if pts:
                line, = ax.plot(*zip(*pts), marker="o", label=m, color=colours(i % 20))
                lra = PUBLISHED_SPEED_4K.get(LRA_NAMES.get(m, ""))
                if lra:
                    ax.plot([4096], [lra[0] / PUBLISHED_SPEED_4K["Transformer"][0]], marker="*", markersize=11,
                            color=line.get_color(), linestyle="none")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("steps/s relative to softmax")
        ax.set_title("training speed (stars: LRA at 4K)", fontsize=9)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"Long Range Arena at small scale\n{common.machine_line(results['machine'])}", fontsize=8)
    return save_figure(fig, path, dpi=110)
