"""Linear attention's gated and delta-rule descendants on sequence shards (the ``affine`` strategy:
each shard's affine map of the state all-gathered and composed, LASP-2): each row, run by
``qkv.parallel.attend`` with its per-token gates cut like q, k, v, gives each rank its shard of the
one-process output and of the gradients of q, k, v, g and beta (float64, 1e-10) — causal and not,
key padding, packed documents (``position_ids``, a document starting on a shard boundary),
contiguous and zigzag layouts, 2 and 4 ranks.

One spawn of 4 gloo processes: the rows of 2 ranks run on the pairs (0, 1) and (2, 3) at once. The
refusals are checked in the same spawn (they need a group of more than one process).
"""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from qkv.attention import build_attention

B, H, L, E, Ev = 2, 2, 16, 4, 3

# (what the user does, kernel, its kwargs, gates passed, padding, packed documents, layout, ranks)
ROWS = [
    ("retention, padded", "retention", {"causal": True}, (), True, False, "contiguous", 4),
    ("retention, zigzag, packed", "retention", {"causal": True, "chunk_size": 3}, (), False, True, "zigzag", 2),
    ("retention, not causal, padded", "retention", {}, (), True, False, "contiguous", 4),
    ("gla, gates, padded", "gla", {"causal": True, "chunk_size": 3}, ("g",), True, False, "contiguous", 2),
    ("gla, gates, packed, zigzag", "gla", {"causal": True}, ("g",), True, True, "zigzag", 4),
    ("gla, gates, not causal, padded", "gla", {}, ("g",), True, False, "contiguous", 2),
    ("deltanet, beta, padded", "deltanet", {"causal": True, "chunk_size": 3}, ("beta",), True, False, "contiguous", 4),
    ("deltanet, beta, packed", "deltanet", {"causal": True}, ("beta",), False, True, "contiguous", 2),
    ("gated-deltanet, gates, padded", "gated-deltanet", {"causal": True, "chunk_size": 3}, ("g", "beta"), True, False,
     "contiguous", 2),
    ("gated-deltanet, gates, padded, packed", "gated-deltanet", {"causal": True}, ("g", "beta"), True, True,
     "contiguous", 4),
    ("gated-deltanet, gates, zigzag", "gated-deltanet", {"causal": True}, ("g", "beta"), False, False, "zigzag", 4),
    ("gated-deltanet, recurrent form", "gated-deltanet", {"causal": True, "form": "recurrent"}, ("g", "beta"), True,
     False, "contiguous", 2),
    ("gated-deltanet, no gates (fixed decay)", "gated-deltanet", {"causal": True}, (), True, False, "contiguous", 2),
    ("gated-deltanet, gates, not causal", "gated-deltanet", {}, ("g", "beta"), True, False, "contiguous", 4),
]


def _inputs(name: str, gates, padding: bool, packed: bool):
    torch.manual_seed(2)
    q, k = (torch.randn(B, H, L, E, dtype=torch.float64) for _ in range(2))
    v, weight = (torch.randn(B, H, L, Ev, dtype=torch.float64) for _ in range(2))
    call = {}
    if "g" in gates:  # log decays <= 0, strong enough that the state forgets within a shard
        call["g"] = F.logsigmoid(torch.randn(B, H, L, *((E,) if name == "gla" else ()), dtype=torch.float64))
    if "beta" in gates:
        call["beta"] = torch.rand(B, H, L, dtype=torch.float64)
    mask = torch.rand(B, L) > 0.3 if padding else None
    positions = None
    if packed:  # documents of 5, 3 and 8 tokens; the second row's start on the boundaries of 2 and 4 ranks
        positions = torch.cat([torch.arange(5), torch.arange(3), torch.arange(8)]).repeat(B, 1)
        positions[1] = torch.cat([torch.arange(4), torch.arange(4), torch.arange(6), torch.arange(2)])
    return q, k, v, weight, call, mask, positions


def _error(row, group, rank: int) -> float:
    from qkv import parallel

    what, name, kwargs, gates, padding, packed, layout, world = row
    kernel = build_attention(name, **kwargs).double()
    q, k, v, weight, call, mask, positions = _inputs(name, gates, padding, packed)
    extra = {} if positions is None else {"position_ids": positions}
    ref = {n: x.clone().requires_grad_() for n, x in {"q": q, "k": k, "v": v, **call}.items()}
    out = kernel(ref["q"], ref["k"], ref["v"], mask=mask, **{n: ref[n] for n in call}, **extra).output
    (out * weight).sum().backward()
    cut = lambda x, dim=2: parallel.shard(x, layout=layout, dim=dim, rank=rank, size=world)
    mine = {n: cut(x).requires_grad_() for n, x in {"q": q, "k": k, "v": v, **call}.items()}
    got = parallel.attend(kernel, mine["q"], mine["k"], mine["v"], mask=None if mask is None else cut(mask, 1),
                          group=group, layout=layout, **{n: mine[n] for n in call},
                          **({} if positions is None else {"position_ids": cut(positions, 1)})).output
    (got * cut(weight)).sum().backward()
    errors = [(got - cut(out)).abs().max()] + [(mine[n].grad - cut(ref[n].grad)).abs().max() for n in mine]
    err = torch.stack(errors).max().detach()
    return float(torch.where(err.isnan(), torch.full_like(err, float("inf")), err))


def _refusals(group) -> dict:
    """The one-line errors of the cases the strategy cannot run, keyed by what the user did."""
    from qkv import parallel

    said = {}
    n = L // 2
    q, k, v = (torch.randn(B, H, n, E, dtype=torch.float64) for _ in range(3))
    beta = torch.rand(B, H, n, dtype=torch.float64)
    cases = {
        "packed documents, not causal": lambda: parallel.attend(
            build_attention("deltanet").double(), q, k, v, group=group, beta=beta,
            position_ids=torch.arange(n).repeat(B, 1)),
        "gates under another strategy": lambda: parallel.attend(
            build_attention("deltanet", causal=True).double(), q, k, v, group=group, strategy="ulysses-batch", beta=beta),
        "affine for softmax": lambda: parallel.attend(build_attention("softmax").double(), q, k, v, group=group,
                                                      strategy="affine"),
        "gates of another length": lambda: parallel.attend(build_attention("deltanet", causal=True).double(), q, k, v,
                                                           group=group, beta=beta[:, :, 1:]),
    }
    for what, run in cases.items():
        try:
            run()
            said[what] = "no error"
        except (TypeError, ValueError) as error:
            said[what] = f"{type(error).__name__}: {error}"
    return said


def _worker(rank: int, world: int, init: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    # the rows of 2 ranks run on both pairs at once: every rank makes the same exchanges in the same
    # order (qkv.parallel.comm numbers them), and each pair must give one process's answer
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    found = {}
    try:
        for row in ROWS:
            what, size = row[0], row[-1]
            try:
                group, place = (None, rank) if size == world else (pairs[rank // 2], rank % 2)
                err = torch.tensor([_error(row, group, place)], dtype=torch.float64)
                dist.all_reduce(err, op=dist.ReduceOp.MAX)
                found[what] = float(err)
            except Exception:
                found[what] = traceback.format_exc()
                raise  # a rank that fails leaves its peers waiting: stop the group
        found["refusals"] = _refusals(pairs[rank // 2])
    finally:
        if rank == 0:
            results.update(found)
        dist.destroy_process_group()


def test_gated_kernels_on_shards_equal_one_process(tmp_path):
    results = mp.Manager().dict()
    try:
        mp.spawn(_worker, args=(4, f"file://{tmp_path}/store", results), nprocs=4, join=True)
    except Exception as error:
        failed = {what: r for what, r in results.items() if isinstance(r, str)}
        raise AssertionError(f"{failed or error}") from None
    said = results.pop("refusals")
    assert set(results.keys()) == {row[0] for row in ROWS}
    bad = {what: err for what, err in results.items() if not err <= 1e-10}
    assert not bad, f"shards differ from one process (max abs error; inf: NaN) in {bad}"
    assert said["packed documents, not causal"].startswith("ValueError: position_ids (packed documents) need causal=True")
    assert "'deltanet'" in said["packed documents, not causal"]
    assert said["gates under another strategy"].startswith("TypeError: attention 'deltanet' got per-token gates (beta)")
    assert said["affine for softmax"].startswith("ValueError: strategy 'affine'") and "'softmax'" in said["affine for softmax"]
    assert said["gates of another length"].startswith("ValueError: beta must hold this rank's 8 positions")
    assert all("\n" not in line for line in said.values()), said
