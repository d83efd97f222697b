"""``qkv bench depth-memory``: peak training memory against depth, reversible against ordinary residual layers.

For each depth of ``--depths`` a Reformer LM (``qkv.models.Reformer``, LSH attention, chunked
feed-forward) is built twice — with reversible layers (``reversible=True``) and with the same
layers as ordinary pre-LN residual blocks (``reversible=False``) — and one training step
(forward, loss, backward) on a batch of ``--length`` random tokens is measured: its peak memory
(``qkv.bench.common.peak_memory``: on CPU the live bytes of every tensor the step allocates,
gradients included; parameters are not counted) and its time (median of ``--repeats``).
Reversible layers keep one layer's activations whatever the depth (Gomez et al. 2017; Kitaev et
al. 2020, §3), so their peak should stay nearly flat (parameter gradients still grow with depth)
while the ordinary stack's grows about linearly.

Writes ``depth_memory.json`` and ``depth_memory.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict

import torch

from .._errors import UserError
from ..models.transformer.reformer import Reformer, ReformerConfig
from . import common

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``depth-memory`` options (``--quick``, ``--device``, ``--threads`` come from ``qkv bench``)."""
    parser.add_argument("--depths", nargs="+", type=int, default=[1, 2, 4, 8, 12], help="layer counts (default 1 2 4 8 12)")
    parser.add_argument("--length", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--d-model", type=int, default=128, help="width (default 128)")
    parser.add_argument("--heads", type=int, default=4, help="heads (default 4)")
    parser.add_argument("--d-ff", type=int, default=512, help="feed-forward width (default 512)")
    parser.add_argument("--bucket-size", type=int, default=64, help="LSH chunk length (default 64)")
    parser.add_argument("--n-rounds", type=int, default=2, help="LSH rounds (default 2)")
    parser.add_argument("--ff-chunk-size", type=int, default=256, help="feed-forward chunk (default 256)")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps per point (default 1)")


def _step(model: Reformer, ids: torch.Tensor):
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
    return step


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Measure every (variant, depth) point; writes JSON and markdown into ``args.out``."""
    device = common.resolve_device(args.device)
    depths = [1, 2] if args.quick else sorted(set(args.depths))
    length = min(args.length, 256) if args.quick else args.length
    if min(depths) < 1 or length < 1 or args.batch < 1 or args.repeats < 1:
        raise UserError("--depths, --length, --batch and --repeats must be >= 1")
    for flag in ("d_model", "heads", "d_ff", "bucket_size", "n_rounds", "ff_chunk_size"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.d_model % args.heads:
        raise UserError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    common.check_lengths("--length", [length])
    common.check_range("--depths", max(depths), 1, 1024)
    machine = common.describe_machine(device)
    print(f"depth-memory on {common.machine_line(machine)}", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, 256, (args.batch, length), generator=gen).to(device)
    results: Dict[str, Any] = {
        "benchmark": "depth-memory", "command": args.command_line, "date": common.now_iso(), "machine": machine,
        "config": {"length": length, "batch": args.batch, "d_model": args.d_model, "heads": args.heads,
                   "d_ff": args.d_ff, "bucket_size": args.bucket_size, "n_rounds": args.n_rounds,
                   "ff_chunk_size": args.ff_chunk_size, "depths": depths,
                   "step": "forward + LM loss + backward of a Reformer LM (no optimizer)"},
        "points": [],
    }
    for reversible in (True, False):
        for depth in sorted(depths):
            torch.manual_seed(args.seed)
            config = ReformerConfig(vocab_size=256, max_len=length, n_layers=depth, d_model=args.d_model,
                                    n_heads=args.heads, d_ff=args.d_ff, bucket_size=args.bucket_size,
                                    n_rounds=args.n_rounds, ff_chunk_size=args.ff_chunk_size, reversible=reversible)
            model = Reformer(config).to(device).train()
            step = _step(model, ids)
            first = common.timed_once(step, device)  # warm-up
            peak = common.peak_memory(step, device)
            timing = common.time_steps(step, device, warmup=0, estimate=first, min_repeats=args.repeats,
                                       max_repeats=args.repeats, target_seconds=0)
            point = {"reversible": reversible, "depth": depth, "peak_memory_bytes": peak,
                     "time_median_s": timing.median, "parameters": sum(p.numel() for p in model.parameters())}
            results["points"].append(point)
            print(f"  {'reversible' if reversible else 'ordinary':>10} depth {depth:>3}: {peak / 2**20:9.1f} MB  "
                  f"{timing.median:8.2f} s", flush=True)
            model = step = None
    rows = []
    for p in results["points"]:
        base = next(q for q in results["points"] if q["reversible"] == p["reversible"] and q["depth"] == min(depths))
        p["memory_vs_shallowest"] = p["peak_memory_bytes"] / base["peak_memory_bytes"]
        rows.append(["reversible" if p["reversible"] else "ordinary residual", p["depth"], f"{p['parameters']:,}",
                     f"{p['peak_memory_bytes'] / 2**20:.1f}", f"{p['memory_vs_shallowest']:.2f}",
                     f"{p['time_median_s']:.2f}"])
    table = common.markdown_table(["layers", "depth", "parameters", "peak MB", f"x depth {min(depths)}",
                                   "fwd+bwd s"], rows)
    out = Path(args.out)
    common.write_json(out / "depth_memory.json", results)
    cfg = results["config"]
    setup = (f"Reformer LM, B={cfg['batch']}, L={cfg['length']}, d_model={cfg['d_model']}, heads={cfg['heads']}, "
             f"d_ff={cfg['d_ff']}, lsh bucket_size={cfg['bucket_size']}, n_rounds={cfg['n_rounds']}, "
             f"ff_chunk_size={cfg['ff_chunk_size']}; one step = {cfg['step']}.")
    common.write_markdown(out / "depth_memory.md", "qkv bench depth-memory", machine, args.command_line,
                          results["date"], [setup, table])
    print("\n" + table + f"\n\nwritten to {out}/", flush=True)
    return results
