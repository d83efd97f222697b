"""Grouped-query attention on sequence shards: a MultiHeadAttention with fewer key/value heads than
query heads (softmax, linear) gives each of 2 gloo processes its shard of the one-process output."""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

B, L, D = 2, 16, 16


def _worker(rank: int, world: int, init: str, results):
    from qkv import MultiHeadAttention, parallel
    from qkv.parallel.model import Sharding

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for name in ("softmax", "linear"):
            torch.manual_seed(0)
            mha = MultiHeadAttention(D, 4, name, causal=True, n_kv_heads=2).double()
            x = torch.randn(B, L, D, dtype=torch.float64)
            full = mha(x).output
            sharding = Sharding(mha)
            layout = sharding.current_layout(L)
            with sharding.active(L):
                got = mha(parallel.shard(x, layout=layout, dim=-2)).output
            sharding.remove()
            results[(rank, name)] = float((got - parallel.shard(full, layout=layout, dim=-2)).abs().max())
    except Exception:
        results[(rank, "error")] = traceback.format_exc()
        raise
    finally:
        dist.destroy_process_group()


def test_grouped_keys_on_two_shards_equal_one_process(tmp_path):
    results = mp.Manager().dict()
    try:
        mp.spawn(_worker, args=(2, f"file://{tmp_path}/store", results), nprocs=2, join=True)
    except Exception as error:
        raise AssertionError(dict(results).get((0, "error")) or dict(results).get((1, "error")) or error) from None
    assert len(results) == 4 and all(err <= 1e-10 for err in results.values()), dict(results)
