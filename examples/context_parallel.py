"""One sequence split over processes with qkv.parallel: each rank holds L/P positions of q, k, v,
runs a kernel on its shard and gets its shard of the output and gradients — the same numbers as
one process on the whole sequence. On a laptop (CPU, gloo):

    torchrun --nproc_per_node 2 examples/context_parallel.py
    torchrun --nproc_per_node 4 examples/context_parallel.py --length 4096 --kernels softmax linear

Rank 0 prints, per kernel, the strategy it ran (ring, halo, state passing, projection, Ulysses),
the largest difference to the one-process kernel, and the bytes this rank sent.
"""

import argparse
import os

import torch
import torch.distributed as dist

from qkv import parallel
from qkv.attention import build_attention
from qkv.registry import lookup, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", nargs="+", default=names("attention"), help="kernel names (default: all)")
    parser.add_argument("--length", type=int, default=1024, help="sequence length L (a multiple of 2P)")
    parser.add_argument("--batch", type=int, default=4, help="batch B (a multiple of P)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, P = dist.get_rank(), dist.get_world_size()
    B, H, L, E = args.batch, args.heads, args.length, args.head_dim
    for name in args.kernels:
        cls = lookup("attention", name)
        knobs = {**cls.default_knobs(L, H, E), **(cls.deterministic_kwargs or {})}
        if cls.supports_causal:
            knobs["causal"] = True
        torch.manual_seed(0)  # the same kernel (parameters, random features) and inputs on every rank
        kernel = build_attention(name, **knobs)
        q, k, v = (torch.randn(B, H, L, E) for _ in range(3))
        padding = torch.arange(L) < L - 7  # the last 7 keys are padding
        mask = padding.expand(B, L)
        layout = parallel.layout_for([kernel], L, P)  # zigzag balances causal ring attention
        mine = [parallel.shard(x, layout=layout).requires_grad_() for x in (q, k, v)]
        parallel.TRAFFIC.reset()
        out = parallel.attend(kernel, *mine, mask=parallel.shard(mask, layout=layout, dim=-1), layout=layout).output
        out.sum().backward()  # each rank: the gradients of its own shard of q, k, v
        sent = parallel.TRAFFIC.forward + parallel.TRAFFIC.backward
        whole = parallel.gather(out.detach(), layout=layout)  # (B, H, L, E) on every rank
        if rank == 0:
            reference = kernel(q, k, v, mask=mask).output
            error = (whole - reference).abs().max().item()
            print(f"{name:>14}: {parallel.strategy_for(kernel, L, P, layout):>13}  max |difference| {error:.1e}  "
                  f"sent {sent / 2**10:,.0f} KiB (forward + backward)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" not in os.environ:
        raise SystemExit("run me under torchrun: torchrun --nproc_per_node 2 examples/context_parallel.py")
    main()
