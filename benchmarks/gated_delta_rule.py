"""qkv's gated delta rule (or Kimi Linear's KDA) against transformers' PyTorch fallback, on the same inputs (CPU).

    PYTHONPATH=src python benchmarks/gated_delta_rule.py --lengths 2048 8192 --threads 1
    PYTHONPATH=src python benchmarks/gated_delta_rule.py --rule kda --heads 32 --value-heads 32 --lengths 2048
    PYTHONPATH=src python benchmarks/gated_delta_rule.py --check      # equality only, tiny, no timing

Inputs shaped as one Qwen3-Next-80B linear-attention layer (16 query/key heads of 128, 32 value
heads of 128; ``g = -exp(A) softplus(a + dt_bias)``-like log decays, ``beta = sigmoid(b)``), float32,
``use_qk_l2norm_in_kernel=True``, ``chunk_size=64``, with and without gradients. Prints, per length,
both times (median of ``--repeats`` runs, the two alternating run by run, ``torch.utils.benchmark``),
their ratio (the issue's goal: qkv <= 0.5 of transformers) and the largest output difference.
``--rule kda``: Kimi Delta Attention (a log decay per key channel, ``g (B, T, H, K)``; transformers'
fallback has one head count for q, k and v), ``qkv.functional.chunk_kda`` against
``modeling_kimi_linear.chunk_kimi_delta_attention`` as transformers defines it (its own function, not
the hub-kernel or fla dispatch).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils import benchmark


def inputs(T: int, B: int, H: int, Hv: int, D: int, seed: int = 0, channel: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, D, generator=g), torch.randn(B, T, H, D, generator=g)
    v = torch.randn(B, T, Hv, D, generator=g)
    gates = (B, T, Hv, D) if channel else (B, T, Hv)  # KDA: one decay per key channel
    decay = -torch.rand(Hv, *gates[3:], generator=g).mul(15).add(1) * torch.nn.functional.softplus(
        torch.randn(*gates, generator=g) - 4)
    beta = torch.sigmoid(torch.randn(B, T, Hv, generator=g))
    return q, k, v, decay, beta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--value-heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--check", action="store_true", help="equality on a tiny input, no timing")
    parser.add_argument("--rule", choices=["gated-delta", "kda"], default="gated-delta",
                        help="Qwen3-Next's gated delta rule, or Kimi Linear's KDA (per-channel decays)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kda = args.rule == "kda"
    if kda and args.heads != args.value_heads and not args.check:
        parser.error("--rule kda: transformers' KDA takes one head count for q, k and v (--heads = --value-heads)")
    if kda:
        from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention

        from qkv.functional import chunk_kda

        theirs_fn = getattr(chunk_kimi_delta_attention, "__wrapped__", chunk_kimi_delta_attention)
        ours_fn, theirs_fn = chunk_kda, (lambda q, k, v, f=theirs_fn, **kw: f(q, k, v, **kw))
    else:
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

        from qkv.functional import chunk_gated_delta_rule

        ours_fn, theirs_fn = chunk_gated_delta_rule, torch_chunk_gated_delta_rule

    kw = dict(initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    sizes = [(130, 1, 2, 2 if kda else 4, 16)] if args.check else [
        (T, args.batch, args.heads, args.value_heads, args.head_dim) for T in args.lengths]
    for T, B, H, Hv, D in sizes:
        x = inputs(T, B, H, Hv, D, channel=kda)
        ours, theirs = ours_fn(*x[:3], g=x[3], beta=x[4], **kw), theirs_fn(*x[:3], g=x[3], beta=x[4], **kw)
        diff = max(float((a - b).abs().max()) for a, b in zip(ours, theirs))
        if args.check:
            print(f"T={T}: max |qkv - transformers| = {diff:.2e}")
            assert diff <= 1e-4, diff
            continue

        def run(fn):
            leaves = [t.clone().requires_grad_(args.backward) for t in x]
            out = fn(*leaves[:3], g=leaves[3], beta=leaves[4], **kw)[0]
            if args.backward:
                out.sum().backward()

        timers = {name: benchmark.Timer("run(fn)", globals={"run": run, "fn": fn}, num_threads=args.threads)
                  for name, fn in (("qkv", ours_fn), ("transformers", theirs_fn))}
        if args.repeats <= 0:
            times = {name: timer.blocked_autorange(min_run_time=1.0).median for name, timer in timers.items()}
        else:  # the two alternate, run by run: a shared machine's load drifts alike for both
            runs = {name: [] for name in timers}
            for _ in range(args.repeats):
                for name, timer in timers.items():
                    runs[name].append(timer.timeit(1).mean)
            times = {name: sorted(ts)[args.repeats // 2] for name, ts in runs.items()}
        print(f"{args.rule} T={T} B={B} H={H} Hv={Hv} D={D} {'fwd+bwd' if args.backward else 'fwd'}: qkv {times['qkv']:.3f} s, "
              f"transformers {times['transformers']:.3f} s, ratio {times['qkv'] / times['transformers']:.2f}, "
              f"max |diff| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
