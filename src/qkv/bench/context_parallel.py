"""``qkv bench context-parallel``: each kernel on sequence shards over P processes — per-rank memory, time and bytes sent per layer.

For every kernel of ``--kernels`` and every ``P`` of ``--ranks`` the benchmark starts ``P`` gloo
processes on this machine (``torch.multiprocessing``), gives each its shard ``(B, H, L/P, E)`` of
one self-attention layer's q, k, v and measures one training step of the layer through
``qkv.parallel.attend`` (forward, then backward of a fixed cotangent):

- each rank's peak activation memory (``qkv.bench.common.peak_memory``: the bytes of the tensors
  the step allocates — scores, partials, received blocks, gradients; the inputs are not counted);
  the largest over the ranks is reported, and its ratio to ``P = 1``;
- the step's time (median of ``--repeats``; the ranks share the machine's cores, so on a small
  machine ``P = 4`` is slower, not faster: what this measures at ``P > 1`` is memory and bytes);
- the bytes the busiest rank sends in the forward pass (``qkv.parallel.TRAFFIC``: the payloads of
  the point-to-point messages as sent; an all-reduce is counted as a ring all-reduce sends,
  ``2 (P - 1) / P`` of the tensor) against the strategy's formula (``expected_bytes``) — backward
  sends about as much again (the gradients of what was received).

Causal kernels run causal (a language model's layer), the others not; the layout is the one
``qkv train --context-parallel`` uses (zigzag for causal ring attention). Writes
``context_parallel.json`` and ``context_parallel.md`` into ``--out``.

``--budget-mb M`` measures the headline instead: for each kernel and ``P``, the longest sequence one
training step of a small GPT (``BUDGET_GPT``: one layer, width ``--heads x --head-dim``, the
kernel's default knobs for that length, one sequence per step) fits in ``M`` MB per rank. ``L``
starts at ``--length`` and doubles while the busiest rank's peak (``peak_memory`` of forward and
backward through ``qkv.parallel.enable``; the parameters not counted, their gradients counted)
stays within ``M``; the largest ``L`` that fitted is reported. Writes ``context_parallel_budget.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import math
import socket
from pathlib import Path
from typing import Any, Dict, List

import torch

from .._errors import UserError
from ..attention import build_attention
from ..registry import lookup, names
from . import common

__all__ = ["add_arguments", "run", "expected_bytes"]


#: the most processes one point spawns, and the most numbers in one (B, H, L, E) tensor at P = 1
MAX_RANKS = 64
MAX_NUMBERS = 2**28
#: the most memory one point may take (the P = 1 point holds the whole step in one process), and
#: the (B, H, L, E) float32 tensors a step holds at least: q, k, v, the cotangent, the output and
#: the gradients of q, k, v and of the output's partials (scores and received blocks not counted)
MAX_STEP_BYTES = 4 * 10**9
STEP_TENSORS = 10
#: the budget run's model: a one-layer GPT (width and heads from --heads x --head-dim), a small
#: vocabulary (so that the logits are no wider than the hidden states), no dropout, one sequence per step
BUDGET_GPT = {"n_layers": 1, "vocab_size": 64, "dropout": 0.0, "batch": 1, "ff_factor": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``context-parallel`` options (``--quick``, ``--threads``, ``--seed`` come from ``qkv bench``)."""
    parser.add_argument("--kernels", nargs="+", default=None, help="kernel names (default: every registered kernel)")
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4], help="process counts P (default 1 2 4)")
    parser.add_argument("--length", type=int, default=1024, help="sequence length L (default 1024)")
    parser.add_argument("--batch", type=int, default=4, help="sequences B (default 4: a multiple of P for the "
                                                             "kernels that split whole batch rows)")
    parser.add_argument("--heads", type=int, default=4, help="heads H (default 4)")
    parser.add_argument("--head-dim", type=int, default=16, help="head size E (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per point (default 3)")
    parser.add_argument("--budget-mb", type=float, default=None,
                        help="instead: the longest sequence one GPT training step fits in this many MB per rank, per "
                             "kernel and P (L doubled from --length until the step's peak exceeds the budget)")


def expected_bytes(strategy: str, kernel: Any, B: int, H: int, L: int, P: int, E: int, Ev: int, itemsize: int) -> int:
    """What the busiest rank sends in one forward pass under ``strategy`` (``qkv.parallel.attend``), by formula.

    ring ``(P - 1) B n ((E + Ev) H s + 1)`` (key/value shards and the key padding, ``P - 1`` steps);
    halo ``(left + right) B ((E + Ev) H s + 1)`` (an interior rank, halos within one shard);
    summary ``(P - 1) B (n / l) c ((E + Ev) H s + 1)`` (fixed: the shard's summaries to every rank);
    state ``2 (P - 1) / P B H (F (Ev + 1) + 1) s`` (non-causal: two all-reduces) or
    ``(P - 1) B H (F (Ev + 1) + 1) s`` (causal: rank 0's sums to every later rank);
    projection ``2 (P - 1) / P B H k (E + Ev) s``; Ulysses ``(P - 1) / P B H n (2E + 2Ev) s + (P - 1) B n``
    (q, k, v out, the output back, the key padding gathered). ``n = L / P``, ``s`` the item size.
    """
    from ..parallel import halo_widths

    n = L // P
    if P == 1:
        return 0
    if strategy == "ring":
        return (P - 1) * B * n * ((E + Ev) * H * itemsize + 1)
    if strategy == "halo":
        left, right = halo_widths(kernel)
        return (left + right) * B * ((E + Ev) * H * itemsize + 1)
    if strategy == "summary":
        summaries = n // kernel.stride * kernel.c if 2 in kernel.subsets else 0
        return (P - 1) * B * summaries * ((E + Ev) * H * itemsize + 1)
    if strategy == "state":
        F = kernel.nb_features if kernel.registry_name == "performer" else E
        per_rank = B * H * (F * (Ev + 1) + 1) * itemsize
        return (P - 1) * per_rank if kernel.causal else 2 * (P - 1) * per_rank // P
    if strategy == "projection":
        return 2 * (P - 1) * B * H * kernel.k * (E + Ev) * itemsize // P
    return (P - 1) * B * H * n * (2 * E + 2 * Ev) * itemsize // P + (P - 1) * B * n


def _kernel(name: str, L: int, H: int, E: int):
    cls = lookup("attention", name)
    kwargs = {**cls.default_knobs(L, H, E), **(cls.deterministic_kwargs or {})}
    if cls.supports_causal:
        kwargs["causal"] = True
    return build_attention(name, **kwargs)


def _worker(rank: int, P: int, init: str, cfg: Dict[str, Any], results) -> None:
    import torch.distributed as dist

    from .. import parallel

    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=P)
    device = torch.device("cpu")
    B, H, L, E = cfg["batch"], cfg["heads"], cfg["length"], cfg["head_dim"]
    try:
        for name in cfg["kernels"]:
            torch.manual_seed(cfg["seed"])
            kernel = _kernel(name, L, H, E)
            layout = parallel.layout_for([kernel], L, P)
            strategy = parallel.strategy_for(kernel, L, P, layout)
            q, k, v, g = (parallel.shard(torch.randn(B, H, L, E), layout=layout) for _ in range(4))
            q, k, v = (x.requires_grad_() for x in (q, k, v))

            def step() -> None:
                for x in (q, k, v):
                    x.grad = None
                kernel.zero_grad(set_to_none=True)
                out = parallel.attend(kernel, q, k, v, layout=layout).output
                (out * g).sum().backward()

            first = common.timed_once(step, device)  # warm-up (lazy buffers, the first messages)
            parallel.TRAFFIC.reset()
            step()
            sent = [parallel.TRAFFIC.forward, parallel.TRAFFIC.backward]
            peak = common.peak_memory(step, device)
            timing = common.time_steps(step, device, warmup=0, estimate=first, min_repeats=cfg["repeats"],
                                       max_repeats=cfg["repeats"], target_seconds=0)
            mine = [sent[0], sent[1], peak, timing.median]
            every: List[Any] = [None] * P
            dist.all_gather_object(every, mine)
            if rank == 0:
                results[name] = {
                    "P": P, "strategy": strategy, "layout": layout, "causal": kernel.causal,
                    "sent_forward_bytes": max(r[0] for r in every), "sent_backward_bytes": max(r[1] for r in every),
                    "expected_forward_bytes": expected_bytes(strategy, kernel, B, H, L, P, E, E, 4),
                    "peak_memory_bytes": max(r[2] for r in every), "time_median_s": max(r[3] for r in every),
                }
    finally:
        dist.destroy_process_group()


def _budget_worker(rank: int, P: int, init: str, cfg: Dict[str, Any], results) -> None:
    import torch.distributed as dist

    from .. import parallel
    from ..models.transformer.gpt import GPT, GPTConfig

    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=P)
    device = torch.device("cpu")
    width, heads, B, V = cfg["heads"] * cfg["head_dim"], cfg["heads"], BUDGET_GPT["batch"], BUDGET_GPT["vocab_size"]
    try:
        for name in cfg["kernels"]:
            L, tried, longest, strategy = cfg["length"], [], None, "one process"
            while L <= cfg["max_length"]:
                torch.manual_seed(cfg["seed"])
                model = GPT(GPTConfig(vocab_size=V, max_len=L, n_layers=BUDGET_GPT["n_layers"], d_model=width,
                                      n_heads=heads, d_ff=BUDGET_GPT["ff_factor"] * width,
                                      dropout=BUDGET_GPT["dropout"], attention=name))
                ids = torch.randint(V, (B, L + 1), generator=torch.Generator().manual_seed(cfg["seed"]))
                batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
                sharding = parallel.enable(model) if P > 1 else None
                if sharding is not None:
                    batch, _ = parallel.shard_batch(batch, sharding, ("input_ids", "labels"))
                    strategy = parallel.strategy_for(sharding.kernels[0], L, P, sharding.current_layout(L))

                def step() -> None:
                    model.zero_grad(set_to_none=True)
                    if sharding is None:
                        model(**batch).loss.backward()
                        return
                    with sharding.active(L):
                        model(**batch).loss.backward()

                step()  # one-time allocations (position tables, drawn features) before the measured step
                every: List[Any] = [None] * P
                dist.all_gather_object(every, common.peak_memory(step, device))
                peak = max(every)
                tried.append({"length": L, "peak_memory_bytes": peak})
                del model, sharding, batch
                if peak > cfg["budget_bytes"]:
                    break
                longest, L = L, 2 * L
            if rank == 0:
                results[name] = {"P": P, "strategy": strategy, "longest_length": longest, "tried": tried}
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(P: int, cfg: Dict[str, Any], worker=_worker) -> Dict[str, Any]:
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(worker, args=(P, f"tcp://127.0.0.1:{_free_port()}", cfg, results), nprocs=P, join=True)
    return dict(results)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Measure every (kernel, P) point; writes JSON and markdown into ``args.out``."""
    if args.device != "cpu":
        raise UserError("qkv bench context-parallel runs its ranks as gloo processes on the CPU (--device cpu)")
    kernels = args.kernels or list(names("attention"))
    for name in kernels:
        lookup("attention", name)  # an unknown name: the registry's error names the close ones
    ranks = sorted(set(args.ranks))
    for P in ranks:
        common.check_range("--ranks", P, 1, MAX_RANKS)  # each rank is a process on this machine
    common.check_lengths("--length", [args.length])
    L = min(args.length, 256) if args.quick else args.length
    repeats = 1 if args.quick else args.repeats
    for flag, value in (("--batch", args.batch), ("--heads", args.heads), ("--head-dim", args.head_dim)):
        common.check_range(flag, value, 1, 4096)
    common.check_range("--repeats", repeats, 1, 1000)
    if args.batch * args.heads * L * args.head_dim > MAX_NUMBERS:
        raise UserError(f"--batch x --heads x --length x --head-dim = {args.batch * args.heads * L * args.head_dim:,} "
                        f"numbers per tensor; at most {MAX_NUMBERS:,} (the P = 1 point holds them all)")
    _check_memory(args.batch * args.heads * L * args.head_dim, args.heads * args.head_dim, args.budget_mb is not None)
    for P in ranks:
        if L % (2 * P) or args.batch % P or (args.batch * args.heads) % P:
            raise UserError(f"P={P}: --length ({L}) must be a multiple of 2P and --batch ({args.batch}) a multiple of P")
    if args.budget_mb is not None:
        return _run_budget(args, kernels, ranks, L)
    machine = common.describe_machine(torch.device("cpu"))
    print(f"context-parallel on {common.machine_line(machine)}", flush=True)
    cfg = {"kernels": kernels, "batch": args.batch, "heads": args.heads, "length": L, "head_dim": args.head_dim,
           "repeats": repeats, "seed": args.seed, "threads": args.threads or 1}
    results: Dict[str, Any] = {
        "benchmark": "context-parallel", "command": args.command_line, "date": common.now_iso(), "machine": machine,
        "config": {**cfg, "ranks": ranks, "dtype": "float32",
                   "step": "one attention layer on shards: qkv.parallel.attend forward + backward"},
        "points": [],
    }
    for P in ranks:
        measured = _spawn(P, cfg)
        for name in kernels:
            point = {"kernel": name, **measured[name]}
            results["points"].append(point)
            print(f"  {name:>14} P={P} {point['strategy']:>13}: {point['peak_memory_bytes'] / 2**20:8.2f} MB  "
                  f"{point['time_median_s'] * 1e3:8.1f} ms  sent {point['sent_forward_bytes']:>10,} B "
                  f"(formula {point['expected_forward_bytes']:,})", flush=True)
    rows = []
    for p in results["points"]:
        base = next(q for q in results["points"] if q["kernel"] == p["kernel"] and q["P"] == min(ranks))
        p["memory_vs_fewest_ranks"] = p["peak_memory_bytes"] / base["peak_memory_bytes"]
        rows.append([p["kernel"], p["P"], p["strategy"], f"{p['peak_memory_bytes'] / 2**20:.2f}",
                     f"{p['memory_vs_fewest_ranks']:.2f}", f"{p['time_median_s'] * 1e3:.1f}",
                     f"{p['sent_forward_bytes']:,}", f"{p['expected_forward_bytes']:,}"])
    table = common.markdown_table(["kernel", "P", "strategy", "peak MB per rank", f"x P={min(ranks)}",
                                   "step ms", "sent fwd B", "formula B"], rows)
    out = Path(args.out)
    common.write_json(out / "context_parallel.json", results)
    setup = (f"One attention layer, B={args.batch}, H={args.heads}, L={L}, E={args.head_dim}, float32, causal where "
             f"the kernel can be; each rank holds L/P positions. Memory and bytes are deterministic; times on a "
             f"shared machine are not (the P ranks share its cores).")
    common.write_markdown(out / "context_parallel.md", "qkv bench context-parallel", machine, args.command_line,
                          results["date"], [setup, table])
    print("\n" + table + f"\n\nwritten to {out}/", flush=True)
    return results


def _check_memory(numbers: int, width: int, budget: bool) -> None:
    """Refuse, before anything is allocated, sizes whose P = 1 point would not fit: ``STEP_TENSORS``
    tensors of ``numbers`` float32 numbers (``--budget-mb``: also a GPT of ``width`` = heads x
    head-dim, whose about ``12 width**2`` weights and their gradients are held), more than
    ``MAX_STEP_BYTES`` or than the memory available."""
    from ..models.base import available_memory

    need = STEP_TENSORS * numbers * 4 + (2 * 12 * width**2 * 4 if budget else 0)
    have = available_memory()
    limit = min(MAX_STEP_BYTES, have) if have is not None else MAX_STEP_BYTES
    if need > limit:
        model = f" and a GPT of width {width:,} (--heads x --head-dim)" if budget else ""
        raise UserError(f"--batch x --heads x --length x --head-dim = {numbers:,} numbers per tensor{model}: the P = 1 "
                        f"point would hold about {need / 1e9:,.1f} GB, more than the {limit / 1e9:.1f} GB allowed; "
                        "choose smaller sizes")


def _run_budget(args: argparse.Namespace, kernels: List[str], ranks: List[int], start: int) -> Dict[str, Any]:
    """``--budget-mb``: the longest sequence of one GPT training step within the budget, per kernel and P."""
    if not math.isfinite(args.budget_mb):
        raise UserError(f"--budget-mb must be a number of MB (the per-rank peak allowed), got {args.budget_mb}")
    budget = common.check_range("--budget-mb", args.budget_mb, 0.01, 1e6)
    width = args.heads * args.head_dim
    machine = common.describe_machine(torch.device("cpu"))
    print(f"context-parallel --budget-mb {budget:g} on {common.machine_line(machine)}", flush=True)
    cfg = {"kernels": kernels, "heads": args.heads, "head_dim": args.head_dim, "length": start,
           "max_length": common.MAX_LENGTH, "budget_bytes": budget * 2**20, "seed": args.seed,
           "threads": args.threads or 1}
    results: Dict[str, Any] = {
        "benchmark": "context-parallel-budget", "command": args.command_line, "date": common.now_iso(),
        "machine": machine,
        "config": {**cfg, "ranks": ranks, "dtype": "float32", "budget_mb": budget,
                   "model": {**BUDGET_GPT, "d_model": width, "n_heads": args.heads},
                   "step": "one GPT training step (forward + backward) on shards through qkv.parallel.enable"},
        "points": [],
    }
    for P in ranks:
        measured = _spawn(P, cfg, _budget_worker)
        for name in kernels:
            point = {"kernel": name, **measured[name]}
            results["points"].append(point)
            tried = ", ".join(f"{t['length']}: {t['peak_memory_bytes'] / 2**20:.1f}" for t in point["tried"])
            print(f"  {name:>14} P={P} {point['strategy']:>13}: longest L {point['longest_length']}  (L: MB {tried})",
                  flush=True)
    rows = []
    for name in kernels:
        mine = {p["P"]: p for p in results["points"] if p["kernel"] == name}
        longest = [mine[P]["longest_length"] for P in ranks]
        gain = f"{longest[-1] / longest[0]:g}" if len(ranks) > 1 and longest[0] and longest[-1] else "-"
        rows.append([name, mine[ranks[-1]]["strategy"], *[f"{x:,}" if x else f"< {start:,}" for x in longest], gain])
    table = common.markdown_table(["kernel", f"strategy at P={ranks[-1]}", *[f"longest L, P={P}" for P in ranks],
                                   f"x P={ranks[0]}"], rows)
    out = Path(args.out)
    common.write_json(out / "context_parallel_budget.json", results)
    setup = (f"One training step of a {BUDGET_GPT['n_layers']}-layer GPT (width {width}, {args.heads} heads, vocabulary "
             f"{BUDGET_GPT['vocab_size']}, one sequence, float32, the kernel's default knobs for the length) within "
             f"{budget:g} MB of peak tensor memory per rank (the busiest rank); L doubled from {start}. Memory is "
             f"deterministic; times are not measured.")
    common.write_markdown(out / "context_parallel_budget.md", "qkv bench context-parallel --budget-mb", machine,
                          args.command_line, results["date"], [setup, table])
    print("\n" + table + f"\n\nwritten to {out}/", flush=True)
    return results
