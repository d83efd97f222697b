"""``qkv bench throughput``: achieved FLOP/s of exact attention against the device's measured matmul peak, and the pattern kernels against SDPA with a dense mask of the same pattern.

(a) **Peak**: the median time of one ``(n, n) @ (n, n)`` matrix product in ``--dtype``
    (``2 n^3`` FLOPs), measured in the same process — the number the attention rows are divided by.
(b) **Exact attention**: ``build_attention("softmax")`` (the fused SDPA path), forward and forward
    + backward, at ``B x H x L x E``; FLOPs counted as FlashAttention's benchmarks do: forward
    ``4 B H L^2 E`` (two products), backward 2.5 times the forward, both halved when causal.
(c) **Pattern kernels against a dense mask**: ``strided`` (``l = sqrt(L)``) and ``fixed``
    (``l = sqrt(L)``, ``c = l / 8``), causal, forward + backward, against
    ``F.scaled_dot_product_attention`` with the boolean ``(L, L)`` mask of the same
    ``qkv.masks`` predicate, interleaved round by round; the largest output difference is reported
    (both compute the same function). On CUDA the kernels take their FlexAttention path
    (``qkv.attention.flex``), on CPU their structured one.

Writes ``throughput.json`` and ``throughput.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

from .._errors import UserError
from .. import masks
from ..attention import build_attention, flex
from . import common

__all__ = ["add_arguments", "run", "attention_flops"]

#: (B, H, L, E) of the exact-attention rows.
SIZES = [(8, 16, 1024, 64), (4, 16, 4096, 64), (1, 16, 16384, 64), (4, 16, 4096, 128)]
SIZES_QUICK = [(1, 2, 256, 32)]
#: CPU defaults: an H100's sizes would take minutes per step on a few cores.
SIZES_CPU = [(1, 4, 1024, 64), (1, 4, 4096, 64)]
PATTERN_LENGTHS = [4096, 16384]
PATTERN_LENGTHS_CPU = [1024, 4096]
PATTERN_LENGTHS_QUICK = [256]


def attention_flops(B: int, H: int, L: int, E: int, causal: bool, backward: bool) -> float:
    """FLOPs of exact attention as FlashAttention counts them (forward 4 B H L^2 E; backward 2.5x)."""
    forward = 4.0 * B * H * L * L * E / (2 if causal else 1)
    return forward * (3.5 if backward else 1.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="dtype of every row (default: bfloat16 on CUDA, float32 on CPU; float32 means full "
                             "fp32 products, no TF32)")
    parser.add_argument("--sizes", nargs="+", metavar="BxHxLxE",
                        help="exact-attention sizes (default on CUDA: " + ", ".join("x".join(map(str, s)) for s in SIZES)
                             + "; on CPU: " + ", ".join("x".join(map(str, s)) for s in SIZES_CPU) + ")")
    parser.add_argument("--pattern-lengths", nargs="+", type=int, metavar="L",
                        help=f"lengths of the pattern rows (default {PATTERN_LENGTHS} on CUDA, {PATTERN_LENGTHS_CPU} on CPU)")
    parser.add_argument("--matmul-size", type=int, default=None,
                        help="n of the peak's (n, n) @ (n, n) product (default 8192 on CUDA, 2048 on CPU)")
    parser.add_argument("--target-seconds", type=float, default=2.0, help="time per timed comparison (default 2)")


def _parse_size(text: str):
    try:
        size = tuple(int(x) for x in text.split("x"))
    except ValueError:
        size = ()
    if len(size) != 4 or min(size) < 1:
        raise UserError(f"--sizes: a size is four positive integers joined by 'x' (e.g. 4x16x4096x64), got {text!r}")
    return size


def _randn(shape, dtype, device, seed, grad=True):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)


def _peak(n: int, dtype: torch.dtype, device: torch.device, target: float) -> Dict[str, Any]:
    a, b = _randn((n, n), dtype, device, 0, False), _randn((n, n), dtype, device, 1, False)
    timing = common.time_steps(lambda: a @ b, device, warmup=2, min_repeats=5, max_repeats=50, target_seconds=target)
    return {"n": n, "median_s": timing.median, "tflops": 2.0 * n ** 3 / timing.median / 1e12}


def _exact_rows(sizes, dtype, device, target, peak_tflops) -> List[Dict[str, Any]]:
    rows = []
    for B, H, L, E in sizes:
        for causal in (False, True):
            kernel = build_attention("softmax", causal=causal)
            q, k, v = (_randn((B, H, L, E), dtype, device, s) for s in range(3))
            grad = _randn((B, H, L, E), dtype, device, 3, False)

            def fwd():
                with torch.no_grad():
                    kernel(q, k, v)

            def fwd_bwd():
                q.grad = k.grad = v.grad = None
                kernel(q, k, v).output.backward(grad)

            for mode, step in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                t = common.time_steps(step, device, warmup=2, min_repeats=5, max_repeats=50, target_seconds=target)
                tflops = attention_flops(B, H, L, E, causal, mode == "fwd+bwd") / t.median / 1e12
                rows.append({"size": f"{B}x{H}x{L}x{E}", "causal": causal, "mode": mode, "ms": t.median * 1e3,
                             "tflops": tflops, "of_peak": tflops / peak_tflops})
                print(f"  softmax {B}x{H}x{L}x{E} causal={causal!s:<5} {mode:<8} {t.median * 1e3:9.3f} ms "
                      f"{tflops:8.3g} TFLOP/s ({100 * tflops / peak_tflops:.0f}% of the matmul peak)", flush=True)
            del q, k, v, grad
    return rows


def _pattern_rows(lengths, dtype, device, target) -> List[Dict[str, Any]]:
    rows = []
    B, H, E = 1, 16, 64
    for L in lengths:
        l = max(2, int(round(math.sqrt(L))))
        for name, kw in (("strided", {"stride": l}), ("fixed", {"stride": l, "c": max(1, l // 8)})):
            kernel = build_attention(name, causal=True, **kw)
            dense = masks.materialize(kernel.pattern(L, L), L, L, device=device)  # (L, L) bool
            q, k, v = (_randn((B, H, L, E), dtype, device, s) for s in range(3))
            grad = _randn((B, H, L, E), dtype, device, 3, False)

            def qkv_step():
                q.grad = k.grad = v.grad = None
                kernel(q, k, v).output.backward(grad)

            def sdpa_step():
                q.grad = k.grad = v.grad = None
                F.scaled_dot_product_attention(q, k, v, attn_mask=dense).backward(grad)

            with torch.no_grad():
                before = flex.calls
                ours = kernel(q, k, v).output
                path = "flex" if flex.calls > before else "structured"
                diff = (ours.float() - F.scaled_dot_product_attention(q, k, v, attn_mask=dense).float()).abs().max().item()
            timings = common.time_interleaved({"qkv": qkv_step, "sdpa": sdpa_step}, device, warmup=2,
                                              min_repeats=5, max_repeats=40, target_seconds=target)
            ratio = timings["qkv"].median / timings["sdpa"].median
            kept = dense.float().mean().item()
            rows.append({"kernel": name, "kwargs": kw, "length": L, "path": path, "qkv_ms": timings["qkv"].median * 1e3,
                         "sdpa_dense_ms": timings["sdpa"].median * 1e3, "ratio": ratio, "density": kept,
                         "max_abs_diff": diff})
            print(f"  {name:<8} L={L:<6} {path:<10} qkv {timings['qkv'].median * 1e3:9.2f} ms  sdpa+mask "
                  f"{timings['sdpa'].median * 1e3:9.2f} ms  ratio {ratio:.3f}  density {kept:.4f}  max|Δ| {diff:.1e}",
                  flush=True)
            del q, k, v, grad, dense
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def run(args: argparse.Namespace) -> Dict[str, Any]:
    device = common.resolve_device(args.device)
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, args.dtype)
    if args.target_seconds < 0:
        raise UserError(f"--target-seconds must be >= 0, got {args.target_seconds}")
    if args.matmul_size is None:
        args.matmul_size = 8192 if device.type == "cuda" else 2048
    if args.matmul_size < 1:
        raise UserError(f"--matmul-size must be >= 1, got {args.matmul_size}")
    cpu = device.type == "cpu"
    sizes = [_parse_size(s) for s in args.sizes] if args.sizes else (
        SIZES_QUICK if args.quick else SIZES_CPU if cpu else SIZES)
    lengths = args.pattern_lengths or (PATTERN_LENGTHS_QUICK if args.quick else PATTERN_LENGTHS_CPU if cpu else PATTERN_LENGTHS)
    common.check_lengths("--pattern-lengths", lengths, minimum=4)
    common.check_lengths("--sizes (L of BxHxLxE)", [L for _, _, L, _ in sizes])
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 rows are float32, not TF32
    try:
        machine = common.describe_machine(device)
        print(f"throughput on {common.machine_line(machine)}", flush=True)
        peak = _peak(256 if args.quick else args.matmul_size, dtype, device, args.target_seconds)
        print(f"  matmul peak ({peak['n']}^3, {args.dtype}): {peak['tflops']:.3g} TFLOP/s", flush=True)
        exact = _exact_rows(sizes, dtype, device, args.target_seconds, peak["tflops"])
        patterns = _pattern_rows(lengths, dtype, device, args.target_seconds)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    results = {"benchmark": "throughput", "command": args.command_line, "date": common.now_iso(), "machine": machine,
               "config": {"dtype": args.dtype, "flops": "forward 4 B H L^2 E, backward 2.5x forward, halved when causal"},
               "matmul_peak": peak, "exact": exact, "patterns": patterns}
    t1 = common.markdown_table(
        ["B×H×L×E", "causal", "mode", "ms", "TFLOP/s", "of matmul peak"],
        [[r["size"], r["causal"], r["mode"], f"{r['ms']:.3f}", f"{r['tflops']:.3g}", f"{100 * r['of_peak']:.0f}%"]
         for r in exact])
    t2 = common.markdown_table(
        ["kernel", "L", "path", "qkv ms", "SDPA + dense mask ms", "ratio", "density", "max |Δ|"],
        [[f"{r['kernel']} {r['kwargs']}", r["length"], r["path"], f"{r['qkv_ms']:.2f}", f"{r['sdpa_dense_ms']:.2f}",
          f"{r['ratio']:.3f}", f"{r['density']:.4f}", f"{r['max_abs_diff']:.1e}"] for r in patterns])
    head = (f"Matmul peak: {peak['tflops']:.3g} TFLOP/s ({peak['n']}³ {args.dtype} product, median). Exact attention "
            f"(`softmax` kernel), FLOPs counted as FlashAttention does; pattern kernels causal, forward + backward, "
            f"B=1 H=16 E=64, against SDPA with the dense mask of the same predicate, interleaved.")
    out = Path(args.out)
    common.write_json(out / "throughput.json", results)
    common.write_markdown(out / "throughput.md", "qkv bench throughput", machine, args.command_line, results["date"],
                          [head, t1, t2])
    print("\n" + head + "\n\n" + t1 + "\n\n" + t2 + f"\n\nwritten to {out}/", flush=True)
    return results
