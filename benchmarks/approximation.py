"""How far the linear-time kernels land from exact softmax attention; prints the markdown tables of
docs/approximation.md.

    .venv/bin/python benchmarks/approximation.py            # ~1 min on 2 CPU cores
    .venv/bin/python benchmarks/approximation.py --seeds 2 --lengths 128

Error: for random heads ``q, k ~ N(0, sigma^2)``, ``v ~ N(0, 1)`` of shape ``(B, H, L, E)``, the mean
over the ``B * H`` slices of ``||Y - Y_softmax||_F / ||Y_softmax||_F`` (non-causal), averaged over
seeds (each seed draws new inputs and new random features). ``sigma`` sets how peaked softmax is
(logit std ~ sigma^2) and how large ``|q / d^{1/4}|^2 = sigma^2 sqrt(E)`` — the exponent of the
Performer estimator's variance.
"""

from __future__ import annotations

import argparse

import torch

import qkv


def mean_relative_error(name: str, q, k, v, **kwargs) -> float:
    exact = qkv.build_attention("softmax")(q, k, v).output
    approx = qkv.build_attention(name, **kwargs)(q, k, v).output
    return ((approx - exact).norm(dim=(-2, -1)) / exact.norm(dim=(-2, -1))).mean().item()


def tables(L: int = 512, E: int = 64, B: int = 1, H: int = 4, sigmas=(0.5, 1.0), features=(16, 64, 256, 1024),
           seeds: int = 3) -> str:
    lines = [f"L = {L}, E = {E}, B x H = {B} x {H} slices, {seeds} seeds; mean relative error (lower is better).", ""]
    head = "| performer features | sigma | " + " | ".join(f"m = {m}" for m in features) + " |"
    lines += [head, "|" + " --- |" * (2 + len(features))]
    others = ["", "| kernel (no knob) | " + " | ".join(f"sigma = {s:g}" for s in sigmas) + " |",
              "|" + " --- |" * (1 + len(sigmas))]
    fixed = {"linear": [], "efficient": []}
    for sigma in sigmas:
        inputs = []
        for s in range(seeds):
            g = torch.Generator().manual_seed(1000 + s)
            q, k = (torch.randn(B, H, L, E, generator=g) * sigma for _ in range(2))
            inputs.append((q, k, torch.randn(B, H, L, E, generator=g)))
        for orthogonal in (True, False):
            errs = [sum(mean_relative_error("performer", *x, nb_features=m, orthogonal=orthogonal, seed=s)
                        for s, x in enumerate(inputs)) / seeds for m in features]
            label = "orthogonal" if orthogonal else "iid"
            lines.append(f"| {label} | {sigma:g} | " + " | ".join(f"{e:.3f}" for e in errs) + " |")
        for name in fixed:
            fixed[name].append(sum(mean_relative_error(name, *x) for x in inputs) / seeds)
    lines += others + [f"| {name} | " + " | ".join(f"{e:.3f}" for e in errs) + " |" for name, errs in fixed.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0])
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(tables(L=args.length, E=args.head_dim, sigmas=tuple(args.sigmas), seeds=args.seeds))


if __name__ == "__main__":
    main()
