"""``qkv bench kernels``: qkv against PyTorch's own attention, the speed acceptance of the core.

Two comparisons, forward + backward, each timed interleaved with its baseline (so both see the
same load on a shared machine) and reported as the ratio of medians ``qkv / baseline`` — the
acceptance is ``<= 1.10``:

(a) the bare ``softmax`` kernel (no weights asked: the ``F.scaled_dot_product_attention`` path)
    against calling ``F.scaled_dot_product_attention`` directly on the same ``q, k, v``;
(b) ``qkv.MultiHeadAttention(attention="softmax")`` against ``torch.nn.MultiheadAttention
    (batch_first=True)`` holding the same weights (``MultiHeadAttention.from_torch``).

Each size is run non-causal and causal. Outputs are compared before timing (the largest absolute
difference is reported), so the two sides are known to compute the same thing.

Writes ``kernels.json`` and ``kernels.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .._errors import UserError
from ..attention import MultiHeadAttention, build_attention
from . import common

__all__ = ["add_arguments", "run", "ACCEPT_RATIO"]

#: qkv may be at most this much slower than the PyTorch baseline (the core issue's acceptance).
ACCEPT_RATIO = 1.10

#: (batch B, heads H, length L, head size E) of the bare-kernel comparison.
KERNEL_SIZES: List[Tuple[int, int, int, int]] = [(8, 8, 256, 64), (2, 8, 1024, 64), (1, 8, 2048, 64)]
KERNEL_SIZES_QUICK: List[Tuple[int, int, int, int]] = [(2, 2, 64, 32), (1, 4, 256, 32)]
#: (batch B, length L, d_model, heads H) of the multi-head comparison.
MHA_SIZES: List[Tuple[int, int, int, int]] = [(16, 128, 512, 8), (4, 512, 512, 8), (1, 2048, 512, 8)]
MHA_SIZES_QUICK: List[Tuple[int, int, int, int]] = [(2, 32, 64, 4), (1, 128, 128, 4)]
#: the defaults on a GPU: sizes whose arithmetic outweighs a call's launch and Python overhead (at the
#: CPU's sizes an H100 step takes ~0.25 ms, mostly dispatch).
KERNEL_SIZES_CUDA: List[Tuple[int, int, int, int]] = [(8, 16, 1024, 64), (4, 16, 4096, 64), (1, 16, 16384, 64)]
MHA_SIZES_CUDA: List[Tuple[int, int, int, int]] = [(32, 512, 1024, 16), (8, 2048, 1024, 16), (2, 8192, 1024, 16)]


def _sizes(text: str) -> Tuple[int, int, int, int]:
    try:
        sizes = tuple(int(x) for x in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is four integers joined by 'x' (e.g. 2x8x1024x64), got {text!r}") from None
    if len(sizes) != 4 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"a size is four positive integers joined by 'x' (e.g. 2x8x1024x64), got {text!r}")
    return sizes  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kernels`` options (``--quick``, ``--device``, ``--out`` come from ``qkv.bench``)."""
    parser.add_argument("--kernel-sizes", nargs="+", type=_sizes, metavar="BxHxLxE",
                        help="sizes of the bare-kernel comparison (default: " +
                             ", ".join("x".join(map(str, s)) for s in KERNEL_SIZES) + "; on CUDA " +
                             ", ".join("x".join(map(str, s)) for s in KERNEL_SIZES_CUDA) + ")")
    parser.add_argument("--mha-sizes", nargs="+", type=_sizes, metavar="BxLxDxH",
                        help="(batch, length, d_model, heads) of the multi-head comparison (default: " +
                             ", ".join("x".join(map(str, s)) for s in MHA_SIZES) + "; on CUDA " +
                             ", ".join("x".join(map(str, s)) for s in MHA_SIZES_CUDA) + ")")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    parser.add_argument("--target-seconds", type=float, default=3.0,
                        help="time spent on the timed rounds of one comparison (at least 5 rounds; default 3)")


def _zero_grads(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        t.grad = None


def _kernel_case(B: int, H: int, L: int, E: int, causal: bool, dtype: torch.dtype, device: torch.device,
                 seed: int) -> Tuple[Dict[str, Callable[[], None]], float]:
    """Steps for (a) and the largest output difference between qkv and SDPA."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, E, generator=gen).to(device=device, dtype=dtype).requires_grad_()
               for _ in range(3))
    grad = torch.randn(B, H, L, E, generator=gen).to(device=device, dtype=dtype)
    kernel = build_attention("softmax", causal=causal)

    def qkv_step() -> None:
        _zero_grads((q, k, v))
        kernel(q, k, v).output.backward(grad)

    def sdpa_step() -> None:
        _zero_grads((q, k, v))
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)

    with torch.no_grad():
        diff = (kernel(q, k, v).output - F.scaled_dot_product_attention(q, k, v, is_causal=causal)).abs().max().item()
    return {"qkv": qkv_step, "torch": sdpa_step}, diff


def _mha_case(B: int, L: int, D: int, H: int, causal: bool, dtype: torch.dtype, device: torch.device,
              seed: int) -> Tuple[Dict[str, Callable[[], None]], float]:
    """Steps for (b) and the largest output difference between the two modules."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, batch_first=True).to(device=device, dtype=dtype)
    ours = MultiHeadAttention.from_torch(ref, causal=causal).to(device=device, dtype=dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(B, L, D, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    grad = torch.randn(B, L, D, generator=gen).to(device=device, dtype=dtype)
    # nn.MultiheadAttention wants a mask with is_causal (as a hint); it then calls SDPA with is_causal.
    attn_mask = torch.ones(L, L, dtype=torch.bool, device=device).triu(1) if causal else None

    def torch_forward() -> torch.Tensor:
        return ref(x, x, x, attn_mask=attn_mask, is_causal=causal, need_weights=False)[0]

    def qkv_step() -> None:
        _zero_grads((x, *ours.parameters()))
        ours(x).output.backward(grad)

    def torch_step() -> None:
        _zero_grads((x, *ref.parameters()))
        torch_forward().backward(grad)

    with torch.no_grad():
        diff = (ours(x).output - torch_forward()).abs().max().item()
    return {"qkv": qkv_step, "torch": torch_step}, diff


def _compare(label: str, size: str, causal: bool, steps: Dict[str, Callable[[], None]], diff: float,
             device: torch.device, target_seconds: float) -> Dict[str, Any]:
    timings = common.time_interleaved(steps, device, warmup=2, min_repeats=7, max_repeats=40,
                                      target_seconds=target_seconds)
    ratio = timings["qkv"].median / timings["torch"].median
    # The ratio of the fastest rounds is shown beside it: when it disagrees with the ratio of
    # medians, the machine's load moved between rounds and the row should be rerun.
    ratio_min = timings["qkv"].best / timings["torch"].best
    row = {"comparison": label, "size": size, "causal": causal, "qkv": timings["qkv"].as_dict(),
           "torch": timings["torch"].as_dict(), "ratio": ratio, "ratio_of_min": ratio_min, "max_abs_diff": diff,
           "accepted": ratio <= ACCEPT_RATIO}
    print(f"  {label:<34} {size:<14} causal={causal!s:<5}  qkv {timings['qkv'].median * 1e3:9.2f} ms  "
          f"torch {timings['torch'].median * 1e3:9.2f} ms  ratio {ratio:.3f} (of min {ratio_min:.3f})", flush=True)
    return row


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Run both comparisons; writes ``kernels.json`` and ``kernels.md`` into ``args.out``."""
    device = common.resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.target_seconds < 0:
        raise UserError(f"--target-seconds must be >= 0, got {args.target_seconds}")
    cuda = device.type == "cuda" and not args.quick
    kernel_sizes = args.kernel_sizes or (KERNEL_SIZES_QUICK if args.quick else KERNEL_SIZES_CUDA if cuda else KERNEL_SIZES)
    mha_sizes = args.mha_sizes or (MHA_SIZES_QUICK if args.quick else MHA_SIZES_CUDA if cuda else MHA_SIZES)
    common.check_lengths("--kernel-sizes (L of BxHxLxE)", [L for _, _, L, _ in kernel_sizes])
    common.check_lengths("--mha-sizes (L of BxLxDxH)", [L for _, L, _, _ in mha_sizes])
    for B, L, D, H in mha_sizes:
        if D % H:
            raise UserError(f"--mha-sizes {B}x{L}x{D}x{H}: d_model {D} must be divisible by heads {H}")
    machine = common.describe_machine(device)
    print(f"kernels on {common.machine_line(machine)}", flush=True)

    rows: List[Dict[str, Any]] = []
    for causal in (False, True):
        for B, H, L, E in kernel_sizes:
            steps, diff = _kernel_case(B, H, L, E, causal, dtype, device, args.seed)
            rows.append(_compare("softmax kernel vs F.sdpa", f"{B}x{H}x{L}x{E}", causal, steps, diff, device,
                                 args.target_seconds))
    for causal in (False, True):
        for B, L, D, H in mha_sizes:
            steps, diff = _mha_case(B, L, D, H, causal, dtype, device, args.seed)
            rows.append(_compare("MultiHeadAttention vs nn.MHA", f"{B}x{L}x{D}x{H}", causal, steps, diff, device,
                                 args.target_seconds))

    worst = max(r["ratio"] for r in rows)
    results: Dict[str, Any] = {
        "benchmark": "kernels",
        "command": args.command_line,
        "date": common.now_iso(),
        "machine": machine,
        "config": {"dtype": args.dtype, "accept_ratio": ACCEPT_RATIO, "step": "forward + backward",
                   "kernel_sizes": "B x H x L x E", "mha_sizes": "B x L x d_model x H",
                   "timing": "median of interleaved rounds after 2 warm-up rounds"},
        "rows": rows,
        "worst_ratio": worst,
        "accepted": all(r["accepted"] for r in rows),
    }
    table = common.markdown_table(
        ["comparison", "size", "causal", "qkv ms", "torch ms", "ratio qkv/torch", f"≤ {ACCEPT_RATIO}",
         "ratio of min", "max |Δ|"],
        [[r["comparison"], r["size"], r["causal"], f"{r['qkv']['median_s'] * 1e3:.2f}",
          f"{r['torch']['median_s'] * 1e3:.2f}", f"{r['ratio']:.3f}", "yes" if r["accepted"] else "NO",
          f"{r['ratio_of_min']:.3f}", f"{r['max_abs_diff']:.1e}"] for r in rows])
    summary = (f"Worst ratio {worst:.3f} (acceptance ≤ {ACCEPT_RATIO}): "
               f"{'accepted' if results['accepted'] else 'NOT accepted'}. Sizes: kernel B×H×L×E, "
               f"multi-head B×L×d_model×H; {args.dtype}; forward + backward; ms are medians of interleaved "
               f"rounds; 'ratio of min' compares the fastest rounds (a check on load noise).")
    out = Path(args.out)
    common.write_json(out / "kernels.json", results)
    common.write_markdown(out / "kernels.md", "qkv bench kernels", machine, args.command_line, results["date"],
                          [summary, table])
    print("\n" + table + "\n\n" + summary + f"\n\nwritten to {out}/", flush=True)
    return results
