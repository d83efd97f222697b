"""``qkv bench complexity``: how time and memory of each attention kernel grow with length.

For every registered kernel (``qkv.list_attention()``, or ``--attention`` names) and every length
``L`` of a doubling ladder, one forward + backward step of the bare kernel on random heads
``q, k, v (B, H, L, E)`` is timed (median of repeats after a warm-up) and its peak memory is
measured (``qkv.bench.common.peak_memory``). A kernel stops climbing the ladder once a step passes
the time or memory budget, or is predicted to (extrapolating the last two lengths). The growth
exponents are least-squares slopes of log(time) and log(memory) against log(L) over the long
lengths (``L >= --fit-min-length``, default 1024; the top half of the ladder in ``--quick`` mode):
about 2 for exact attention's time, about 1 for a kernel that is linear in length.

Writes ``complexity.json``, ``complexity.md`` and ``complexity.png`` (log–log) into ``--out``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from .._errors import UserError
from .._values import parse_kernel_kwargs
from ..attention import build_attention, list_attention
from ..registry import lookup
from . import common

__all__ = ["add_arguments", "run", "kernel_kwargs", "DEFAULT_LENGTHS", "QUICK_LENGTHS"]

DEFAULT_LENGTHS = [256 * 2 ** i for i in range(7)]  # 256 ... 16384
QUICK_LENGTHS = [128 * 2 ** i for i in range(5)]  # 128 ... 2048

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``complexity`` options (``--quick``, ``--device``, ``--out`` come from ``qkv.bench``)."""
    parser.add_argument("--attention", nargs="+", metavar="NAME",
                        help="kernels to measure (default: every registered kernel, see `qkv list`)")
    parser.add_argument("--lengths", nargs="+", type=int, metavar="L",
                        help=f"sequence lengths (default {DEFAULT_LENGTHS[0]}..{DEFAULT_LENGTHS[-1]} doubling; "
                             f"--quick: {QUICK_LENGTHS[0]}..{QUICK_LENGTHS[-1]})")
    parser.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    parser.add_argument("--heads", type=int, default=4, help="heads H (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="head size E (default 64)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    parser.add_argument("--causal", action="store_true", help="build causal kernels (non-causal kernels are skipped)")
    parser.add_argument("--need-weights", action="store_true",
                        help="call kernels with need_weights=True (e.g. softmax's explicit O(L^2) path instead of SDPA)")
    parser.add_argument("--budget-seconds", type=float, default=30.0,
                        help="stop a kernel once one step takes (or is predicted to take) longer (default 30)")
    parser.add_argument("--budget-memory-mb", type=float, default=4096.0,
                        help="stop a kernel once a step's peak memory is (or is predicted to be) larger (default 4096)")
    parser.add_argument("--kernel-kwargs", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="knobs for one kernel, e.g. 'window:radius=128,block=64' (repeatable)")
    parser.add_argument("--fit-min-length", type=int,
                        help="fit exponents over lengths >= this (default 1024; --quick: the top half of the ladder)")
    parser.add_argument("--target-seconds", type=float, default=3.0,
                        help="time spent on the timed repeats of one length (at least 3 repeats; default 3)")
    parser.add_argument("--count-flops", action="store_true",
                        help="also count the floating-point operations of one step (torch.utils.flop_counter: matmuls "
                             "and attention ops) and fit their exponent — free of timing noise on a shared machine")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")


def kernel_kwargs(name: str, length: int, heads: int, head_dim: int,
                  overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The constructor kwargs for kernel ``name`` at sequence length ``length``: the kernel's own
    ``default_knobs(length, heads, head_dim)`` (knobs that fit the length, and its head arguments),
    then ``overrides`` (which must all be accepted: the registry raises on unknown ones)."""
    return lookup("attention", name).knobs(length, heads, head_dim, overrides, with_heads=True)


def count_flops(step: Callable[[], None]) -> int:
    """Floating-point operations of one run of ``step`` as ``torch.utils.flop_counter`` counts them
    (matrix products and attention kernels; element-wise operations are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _fit_lengths(lengths: List[int], fit_min: Optional[int], quick: bool) -> List[int]:
    """The measured lengths the exponents are fitted over."""
    if fit_min is None and not quick:
        fit_min = 1024
    if fit_min is not None:
        chosen = [L for L in lengths if L >= fit_min]
        if len(chosen) >= 2:
            return chosen
    # Too few long lengths (quick mode, or a kernel stopped early): the top half, at least two.
    return lengths[-max(2, math.ceil(len(lengths) / 2)):] if len(lengths) >= 2 else []


def _predict(points: List[Dict[str, Any]], key: str, length: int) -> Optional[float]:
    """Extrapolate ``key`` to ``length`` through the last two points on a log–log line."""
    if len(points) < 2:
        return None
    (a, b) = points[-2], points[-1]
    if a[key] <= 0 or b[key] <= 0:
        return None
    slope = math.log(b[key] / a[key]) / math.log(b["length"] / a["length"])
    return b[key] * (length / b["length"]) ** max(slope, 0.0)


def _make_step(kernel: torch.nn.Module, B: int, H: int, L: int, E: int, dtype: torch.dtype,
               device: torch.device, seed: int, need_weights: bool = False) -> Callable[[], None]:
    """One forward + backward of ``kernel`` on fixed random heads ``(B, H, L, E)``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, E, generator=gen).to(device=device, dtype=dtype).requires_grad_()
               for _ in range(3))
    grad = torch.randn(B, H, L, E, generator=gen).to(device=device, dtype=dtype)  # dLoss/dOutput

    def step() -> None:
        for t in (q, k, v, *kernel.parameters()):
            t.grad = None
        kernel(q, k, v, need_weights=need_weights).output.backward(grad)

    return step


def _measure_kernel(name: str, lengths: List[int], args: argparse.Namespace, device: torch.device,
                    overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """Climb the length ladder for one kernel; returns its points and stop reason."""
    B, H, E = args.batch, args.heads, args.head_dim
    dtype = _dtype(args.dtype)
    record: Dict[str, Any] = {"points": [], "stopped": None}
    cls = lookup("attention", name)
    if args.causal and not cls.supports_causal:
        record["stopped"] = "skipped: cannot be causal"
        return record
    if not args.causal and cls.causal_only:
        record["stopped"] = "skipped: causal only (--causal measures it)"
        return record
    budget_bytes = args.budget_memory_mb * 2 ** 20
    kernel, built_with = None, None
    for L in lengths:
        # The fastest repeat extrapolates more steadily than the median when the machine is shared.
        pred_t = _predict(record["points"], "time_min_s", L)
        pred_m = _predict(record["points"], "peak_memory_bytes", L)
        if pred_t is not None and pred_t > args.budget_seconds:
            record["stopped"] = f"L={L}: predicted {pred_t:.1f} s per step > budget {args.budget_seconds:g} s"
            break
        if pred_m is not None and pred_m > budget_bytes:
            record["stopped"] = f"L={L}: predicted {pred_m / 2**20:.0f} MB > budget {args.budget_memory_mb:g} MB"
            break
        try:
            kwargs = kernel_kwargs(name, L, H, E, overrides)
            if kernel is None or kwargs != built_with:
                kernel = build_attention(name, causal=args.causal, **kwargs).to(device=device, dtype=dtype)
                built_with = kwargs
                record["kwargs"] = {key: (list(val) if isinstance(val, tuple) else val) for key, val in kwargs.items()}
            step = _make_step(kernel, B, H, L, E, dtype, device, args.seed, args.need_weights)
            first = common.timed_once(step, device)  # warm-up, and the estimate that sizes the repeats
            peak = common.peak_memory(step, device)
            timing = common.time_steps(step, device, warmup=0, estimate=first, min_repeats=3,
                                       max_repeats=10, target_seconds=args.target_seconds)
            flops = count_flops(step) if getattr(args, "count_flops", False) else None
        except torch.OutOfMemoryError as err:
            record["stopped"] = f"L={L}: out of memory ({str(err).splitlines()[0]})"
            break
        except (RuntimeError, ValueError, TypeError) as err:
            # A kernel that cannot run at this length (or at all with these knobs) is reported, and
            # the other kernels are still measured.
            record["stopped"] = f"L={L}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            print(f"  {name:>14} L={L:>6}: stopped, {record['stopped']}", flush=True)
            break
        finally:
            step = None  # release this length's tensors before the next one is allocated
            if device.type == "cuda":
                torch.cuda.empty_cache()
        point = {"length": L, "time_median_s": timing.median, "time_min_s": timing.best,
                 "repeats": len(timing.times), "peak_memory_bytes": peak}
        if flops is not None:
            point["flops"] = flops
        record["points"].append(point)
        print(f"  {name:>14} L={L:>6}: {timing.median * 1e3:10.2f} ms  {peak / 2**20:9.2f} MB", flush=True)
        if timing.median > args.budget_seconds:
            record["stopped"] = f"L={L}: {timing.median:.1f} s per step > budget {args.budget_seconds:g} s"
            break
        if peak > budget_bytes:
            record["stopped"] = f"L={L}: {peak / 2**20:.0f} MB > budget {args.budget_memory_mb:g} MB"
            break
    fit_at = _fit_lengths([p["length"] for p in record["points"]], args.fit_min_length, args.quick)
    if len(fit_at) >= 2:
        pts = [p for p in record["points"] if p["length"] in fit_at]
        xs = [p["length"] for p in pts]
        record["fit"] = {"lengths": xs,
                         "time": common.fit_loglog(xs, [p["time_median_s"] for p in pts]),
                         "memory": common.fit_loglog(xs, [max(p["peak_memory_bytes"], 1) for p in pts])}
        if all(p.get("flops") for p in pts):
            record["fit"]["flops"] = common.fit_loglog(xs, [p["flops"] for p in pts])
    return record


def _tables(results: Mapping[str, Any]) -> tuple[str, str]:
    """(per-length table, exponent table) in markdown."""
    rows, fits = [], []
    counted = any("flops" in p for rec in results["kernels"].values() for p in rec["points"])
    for name, rec in results["kernels"].items():
        for p in rec["points"]:
            rows.append([name, p["length"], f"{p['time_median_s'] * 1e3:.2f}", f"{p['peak_memory_bytes'] / 2**20:.2f}",
                         p["repeats"]] + ([f"{p['flops'] / 1e9:.3f}" if "flops" in p else "—"] if counted else []))
        fit = rec.get("fit")
        fits.append([
            name,
            ", ".join(f"{k}={v}" for k, v in rec.get("kwargs", {}).items()) or "—",
            f"{fit['lengths'][0]}–{fit['lengths'][-1]}" if fit else "—",
            f"{fit['time']['exponent']:.2f} (R² {fit['time']['r2']:.3f})" if fit else "—",
            f"{fit['memory']['exponent']:.2f} (R² {fit['memory']['r2']:.3f})" if fit else "—",
            rec.get("stopped") or "—",
        ] + ([f"{fit['flops']['exponent']:.2f} (R² {fit['flops']['r2']:.3f})" if fit and "flops" in fit else "—"]
             if counted else []))
    per_length = common.markdown_table(["kernel", "L", "fwd+bwd ms (median)", "peak MB", "repeats"]
                                       + (["GFLOP"] if counted else []), rows)
    exponents = common.markdown_table(
        ["kernel", "knobs", "fitted over L", "time exponent", "memory exponent", "stopped"]
        + (["FLOP exponent"] if counted else []), fits)
    return per_length, exponents


def _check_knobs(name: str, knobs: Mapping[str, Any], lengths: List[int], args: argparse.Namespace) -> None:
    """Refuse ``--kernel-kwargs`` knobs that kernel ``name`` rejects at the first and at the last length of
    the ladder (an unknown knob, a value out of range), before anything is measured: built on the meta
    device, nothing is allocated. (A kernel that fails at some lengths only is measured, and its
    report says where it stopped.)"""
    errors = []
    for L in (lengths[0], lengths[-1]):
        try:
            with torch.device("meta"):
                build_attention(name, causal=args.causal or lookup("attention", name).causal_only,
                                **kernel_kwargs(name, L, args.heads, args.head_dim, knobs))
            return
        except (ValueError, TypeError) as err:
            errors.append(str(err).splitlines()[0] if str(err) else type(err).__name__)
    raise UserError(f"--kernel-kwargs {name}: {errors[0]}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the complexity benchmark; writes JSON, markdown and PNG into ``args.out``."""
    device = common.resolve_device(args.device)
    for flag in ("batch", "heads", "head_dim"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.budget_seconds <= 0 or args.budget_memory_mb <= 0 or args.target_seconds < 0:
        raise UserError("--budget-seconds and --budget-memory-mb must be > 0 and --target-seconds >= 0")
    lengths = sorted(set(args.lengths or (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)))
    common.check_lengths("--lengths", lengths)
    if args.fit_min_length is not None:
        common.check_lengths("--fit-min-length", [args.fit_min_length])
    registered = list_attention()
    names = args.attention or list(registered)
    for name in names:
        lookup("attention", name)  # unknown names raise with close matches
    overrides = parse_kernel_kwargs(args.kernel_kwargs)
    for name in overrides:
        if name not in names:
            raise UserError(f"--kernel-kwargs names {name!r}, which is not among the measured kernels {names}")
        _check_knobs(name, overrides[name], lengths, args)

    machine = common.describe_machine(device)
    print(f"complexity on {common.machine_line(machine)}", flush=True)
    results: Dict[str, Any] = {
        "benchmark": "complexity",
        "command": args.command_line,
        "date": common.now_iso(),
        "machine": machine,
        "config": {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype,
                   "causal": args.causal, "need_weights": args.need_weights, "lengths": lengths,
                   "budget_seconds": args.budget_seconds,
                   "budget_memory_mb": args.budget_memory_mb, "fit_min_length": args.fit_min_length,
                   "memory_method": ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
                                     "AllocationTracker: live bytes of storages created by ATen ops (TorchDispatchMode)"),
                   "step": "forward + backward of the bare kernel on random q, k, v (B, H, L, E)"},
        "kernels": {},
    }
    for name in names:
        torch.manual_seed(args.seed)
        results["kernels"][name] = _measure_kernel(name, lengths, args, device, overrides.get(name, {}))

    per_length, exponents = _tables(results)
    out = Path(args.out)
    common.write_json(out / "complexity.json", results)
    cfg = results["config"]
    setup = (f"B={cfg['batch']}, H={cfg['heads']}, E={cfg['head_dim']}, {cfg['dtype']}, "
             f"{'causal' if cfg['causal'] else 'non-causal'}{', need_weights=True' if cfg['need_weights'] else ''}; "
             f"one step = {cfg['step']}; "
             f"peak memory = {cfg['memory_method']}.")
    common.write_markdown(out / "complexity.md", "qkv bench complexity", machine, args.command_line, results["date"],
                          [setup, "## Growth exponents\n\n" + exponents, "## Per length\n\n" + per_length])
    if not args.no_plot:
        series = {}
        for name, rec in results["kernels"].items():
            if not rec["points"]:
                continue
            fit = rec.get("fit")
            series[name] = {
                "x": [p["length"] for p in rec["points"]],
                "time": [p["time_median_s"] for p in rec["points"]],
                "memory": [p["peak_memory_bytes"] / 2**20 for p in rec["points"]],
                "time_label": f"{name} (slope {fit['time']['exponent']:.2f})" if fit else name,
                "memory_label": f"{name} (slope {fit['memory']['exponent']:.2f})" if fit else name,
            }
        common.plot_loglog(out / "complexity.png", series, title=f"qkv bench complexity ({setup.split(';')[0]})",
                           panels=[("time", "forward+backward seconds (median)"), ("memory", "peak MB")],
                           machine=machine)
    print("\n" + exponents + "\n\n" + per_length + f"\n\nwritten to {out}/", flush=True)
    return results
