"""Where a peer pair's GPU time goes: ``torch.profiler`` tables of qkv's and the peer's forward +
backward for ``qkv bench peers`` pairs, side by side, with the peak memory of each; ``--bert L``
also profiles ``qkv bench models``' bert-forward pair (qkv's BERT against transformers' BertModel,
the same weights, a padded batch, no gradient) by CPU time, where a small model's step is spent.

    python benchmarks/gpu_profile.py --pairs lsh linformer --length 16384 [--dtype bfloat16] [--out DIR]
    python benchmarks/gpu_profile.py --pairs --bert 512
    python benchmarks/gpu_profile.py --pairs --patterns 4096      (strided / fixed against SDPA + dense mask)

Writes ``profile-<pair>-<length>.txt`` (``profile-bert-<L>.txt``) into ``--out`` (default
bench-out/gpu). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from qkv.bench import peers


def step(fn, inputs, grad):
    for t in inputs:
        t.grad = None
    fn().backward(grad)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="*", default=["lsh", "linformer"], choices=sorted(peers.PAIRS))
    p.add_argument("--bert", type=int, nargs="*", default=[], metavar="L", help="profile bert-forward at these lengths")
    p.add_argument("--patterns", type=int, nargs="*", default=[], metavar="L",
                   help="profile strided / fixed against SDPA with a dense mask at these lengths")
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--rows", type=int, default=18, help="ops listed per side")
    p.add_argument("--out", type=Path, default=Path("bench-out/gpu"))
    args = p.parse_args(argv)
    for name, values in (("--length", [args.length]), ("--patterns", args.patterns), ("--bert", args.bert)):
        bad = [v for v in values if v < 4]
        if bad:  # refused before anything is built or profiled
            p.error(f"{name} takes lengths >= 4, got {bad[0]}")
    if not torch.cuda.is_available():
        raise SystemExit("gpu_profile.py needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    for name in args.pairs:
        case = peers.build_case(peers.PAIRS[name], args.length, dtype=dtype, device=dev)
        title = (f"# {name}, L = {args.length}, {args.dtype}, B = 1, H = 4, E = 64, forward + backward "
                 f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
        profile_sides(title, {"qkv": case.qkv, "peer": case.peer}, case.inputs, args.rows,
                      args.out / f"profile-{name}-{args.length}.txt")
    for L in args.patterns:
        profile_pattern(L, dtype, args.rows, args.out)
    for L in args.bert:
        profile_bert(L, args.rows, args.out)


def profile_sides(title: str, sides, inputs, rows: int, path: Path) -> None:
    """Each side's forward + backward under ``torch.profiler`` (after three warm-up steps), one table per side."""
    lines = [title, ""]
    for side, fn in sides.items():
        grad = torch.randn_like(fn())
        for _ in range(3):  # warm-up: compilation, autotuning, caches
            step(fn, inputs, grad)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(fn, inputs, grad)
            torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events) / 5
        cpu_us = max(e.cpu_time_total for e in events) / 5 if events else 0.0
        lines += [f"## {side}: {gpu_us / 1e3:.3f} ms of GPU time per step, longest CPU op {cpu_us / 1e3:.3f} ms, "
                  f"peak {peak:.0f} MiB above the inputs", "",
                  events.table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60), ""]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:1] + [l for l in lines if l.startswith("## ")]), flush=True)


def profile_pattern(L: int, dtype: torch.dtype, rows: int, out: Path) -> None:
    """strided and fixed (causal, l = sqrt(L), B = 1, H = 16, E = 64: ``qkv bench throughput``'s pattern
    rows) against SDPA with the dense mask of the same predicate."""
    import math

    import torch.nn.functional as F

    from qkv import build_attention, masks

    l = max(2, int(round(math.sqrt(L))))
    for name, kw in (("strided", {"stride": l}), ("fixed", {"stride": l, "c": max(1, l // 8)})):
        kernel = build_attention(name, causal=True, **kw)
        dense = masks.materialize(kernel.pattern(L, L), L, L, device="cuda")
        q, k, v = (torch.randn(1, 16, L, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        title = (f"# {name} {kw}, causal, L = {L}, B = 1, H = 16, E = 64, forward + backward, against SDPA with the "
                 f"dense mask ({torch.cuda.get_device_name()}, torch {torch.__version__})")
        profile_sides(title, {"qkv": lambda: kernel(q, k, v).output,
                              "sdpa-dense-mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)},
                      [q, k, v], rows, out / f"profile-{name}-{L}.txt")


def profile_bert(L: int, rows: int, out: Path) -> None:
    """qkv's BERT and transformers' BertModel forward (bench models' bert-forward case), by CPU time."""
    from qkv.bench.models import SIZES, build_pair

    ours, theirs = build_pair("bert", SIZES, L, 0)
    ours.cuda().eval(), theirs.cuda().eval()
    B = SIZES["batch"]
    ids = torch.randint(SIZES["vocab"], (B, L), device="cuda")
    mask = torch.ones(B, L, dtype=torch.bool, device="cuda")
    mask[-1, L - L // 4:] = False
    types = torch.zeros_like(ids)
    sides = {"qkv": lambda: ours(ids, types, attention_mask=mask),
             "transformers": lambda: theirs(ids, attention_mask=mask.long(), token_type_ids=types)}
    lines = [f"# bert-forward, {B} x {L} tokens, padded, float32, no grad ({torch.cuda.get_device_name()}, "
             f"torch {torch.__version__})", ""]
    with torch.no_grad():
        for side, fn in sides.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            events = prof.key_averages()
            gpu_us = sum(e.self_device_time_total for e in events if e.device_type != torch.autograd.DeviceType.CPU) / 5
            syncs = sum(e.count for e in events if "Synchronize" in e.key or "DtoH" in e.key or "local_scalar" in e.key) / 5
            launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")) / 5
            lines += [f"## {side}: {launches:.0f} kernel launches, {syncs:.0f} syncs / reads back per forward; "
                      f"device time {gpu_us / 1e3:.3f} ms per forward", "",
                      events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60), ""]
    (out / f"profile-bert-{L}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:1] + [l for l in lines if l.startswith("## ")]), flush=True)


if __name__ == "__main__":
    main()
