"""Context parallelism is exact: every registered kernel, run by ``qkv.parallel.attend`` on sequence
shards over 2 and 4 gloo processes (float64), gives each rank its shard of the single-process
output and of the gradients of q, k, v and of the kernel's parameters (summed over the ranks),
to 1e-10 — causal and not, with and without key padding, contiguous and zigzag layouts.

One spawn per world size; the workers loop over every kernel (spawning costs seconds on 2 cores).
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from qkv.attention import build_attention
from qkv.registry import lookup, names

B, H, L, E = 4, 2, 16, 4


# the ring's blocks written out (off the fused CPU kernel) and its autograd form; fixed's two parts alone
# and a performer that draws its features at every training forward (from its seeded generator)
VARIANTS = ("softmax/written", "softmax/dropout", "fixed/blocks", "fixed/summaries", "performer/redraw")


def _cases():
    for name in (*names("attention"), *VARIANTS):
        cls = lookup("attention", name.partition("/")[0])
        for causal in ((True,) if cls.causal_only else (False, True) if cls.supports_causal else (False,)):
            for padded in (False, True):
                for layout in (("contiguous", "zigzag") if causal else ("contiguous",)):
                    yield name, causal, padded, layout


def _kernel(name: str, causal: bool):
    name, _, variant = name.partition("/")
    cls = lookup("attention", name)
    kwargs = {**cls.default_knobs(L, H, E), **(cls.deterministic_kwargs or {})}
    if variant == "dropout":  # > 0 takes the autograd path; so small that every weight is kept, times exactly 1
        kwargs["dropout"] = 1e-300
    if variant in ("blocks", "summaries"):
        kwargs["subsets"] = (1,) if variant == "blocks" else (2,)
    if variant == "redraw":
        kwargs.update(redraw=True, seed=5)
    if "causal" in cls.__init__.__code__.co_varnames:
        kwargs["causal"] = causal
    torch.manual_seed(1)
    kernel = build_attention(name, **kwargs).double()
    with torch.no_grad():  # parameters away from their initial values (zeros, equal spans), the same on every rank
        for p in kernel.parameters():
            p.add_(0.3 * torch.randn_like(p))
            if name == "adaptive-span":
                p.clamp_(0.2, 1.0)
    return kernel


def _compare(name: str, causal: bool, padded: bool, layout: str, world: int, rank: int) -> float:
    from qkv import parallel
    from qkv.parallel import strategies as attend_module

    kernel = _kernel(name, causal)
    fused = attend_module._fused
    if name == "softmax/written":
        attend_module._fused = lambda x: False
    torch.manual_seed(2)
    q, k, v, g = (torch.randn(B, H, L, E, dtype=torch.float64) for _ in range(4))
    mask = torch.rand(B, L) > 0.3 if padded else None
    # one process, the whole sequence
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    out = kernel(*ref, mask=mask).output
    (out * g).sum().backward()
    ref_params = [p.grad.clone() for p in kernel.parameters()]
    kernel.zero_grad()
    if name.endswith("/redraw"):  # the same draw as the reference's: a fresh kernel from the same seeds
        kernel = _kernel(name, causal)
    # this rank's shards
    cut = lambda x, dim=-2: parallel.shard(x, layout=layout, dim=dim)
    mine = [cut(x).requires_grad_() for x in (q, k, v)]
    got = parallel.attend(kernel, *mine, mask=None if mask is None else cut(mask, -1), layout=layout).output
    (got * cut(g)).sum().backward()
    errors = [(got - cut(out)).abs().max()]
    for x, r in zip(mine, ref):  # shared-QK kernels (lsh) leave k unused: no gradient, or zeros that travelled
        mine_grad = torch.zeros_like(x) if x.grad is None else x.grad
        errors.append((mine_grad - (0.0 if r.grad is None else cut(r.grad))).abs().max())
    for p, r in zip(kernel.parameters(), ref_params):
        summed = p.grad.clone()
        dist.all_reduce(summed)
        errors.append((summed - r).abs().max())
    attend_module._fused = fused
    err = torch.stack(errors).max().detach().reshape(1)
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return float(err)


def _with_dropout(name: str, world: int, rank: int) -> float:
    """Training with dropout 0.5 runs under every strategy (each rank draws its own masks, so only
    this is checked, not equality): finite outputs and gradients; returns 0.0, or inf if not finite."""
    from qkv import parallel

    cls = lookup("attention", name)
    torch.manual_seed(3)
    kernel = build_attention(name, **{**cls.default_knobs(L, H, E), **(cls.deterministic_kwargs or {}),
                                      **({"causal": True} if cls.supports_causal else {}), "dropout": 0.5}).double()
    layout = parallel.layout_for([kernel], L, world)
    mine = [parallel.shard(torch.randn(B, H, L, E, dtype=torch.float64), layout=layout).requires_grad_() for _ in range(3)]
    mask = parallel.shard(torch.rand(B, L) > 0.3, layout=layout, dim=-1)
    out = parallel.attend(kernel.train(), *mine, mask=mask, layout=layout).output
    out.sum().backward()
    finite = all(bool(x.isfinite().all()) for x in (out, *(m.grad for m in mine)))
    return 0.0 if finite else float("inf")


def _worker(rank: int, world: int, init: str, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    found = {}
    try:
        for case in _cases():
            try:
                found[case] = _compare(*case, world, rank)
            except Exception:
                found[case] = traceback.format_exc()
                raise  # a rank that fails leaves its peers waiting: stop the whole group
        for name in names("attention"):
            if lookup("attention", name).applies_dropout:
                found[("dropout", name)] = _with_dropout(name, world, rank)
    finally:
        if rank == 0:
            results.update(found)
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_every_kernel_is_exact_on_shards(world, tmp_path):
    manager = mp.Manager()
    results = manager.dict()
    try:
        mp.spawn(_worker, args=(world, f"file://{tmp_path}/store", results), nprocs=world, join=True)
    except Exception as error:  # a worker's traceback says which kernel failed
        failed = {case: r for case, r in results.items() if isinstance(r, str)}
        raise AssertionError(f"world {world}: {failed or error}") from None
    expected = set(_cases()) | {("dropout", n) for n in names("attention") if lookup("attention", n).applies_dropout}
    assert set(results.keys()) == expected
    bad = {case: err for case, err in results.items() if not err <= 1e-10}
    assert not bad, f"world {world}: shards differ from one process (max abs error) in {bad}"


def test_each_kernel_runs_its_declared_strategy():
    from qkv.parallel import strategy_for

    def strategy(name, causal=False, layout="contiguous", L=16, P=4, **knobs):
        cls = lookup("attention", name)
        kwargs = {**cls.default_knobs(L, H, E), **knobs}
        if cls.supports_causal:
            kwargs["causal"] = causal
        return strategy_for(build_attention(name, **kwargs), L, P, layout)

    assert strategy("softmax", causal=True, layout="zigzag") == "ring"
    assert strategy("window") == strategy("window", causal=True) == "halo"
    assert strategy("local-1d", causal=True) == "halo"
    assert strategy("linear", causal=True) == strategy("performer") == "state"
    assert strategy("linformer") == "projection"
    assert strategy("lsh") == strategy("relative") == strategy("adaptive-span") == "ulysses-batch"
    assert strategy("fixed") == strategy("fixed", causal=True) == "summary"
    assert strategy("strided") == strategy("efficient") == strategy("local-2d") == "ulysses"
    assert strategy("retention") == strategy("gla", causal=True, layout="zigzag") == "affine"
    assert strategy("deltanet", causal=True) == strategy("gated-deltanet") == "affine"
    assert strategy("fixed", stride=4, c=1, L=24, P=4) == "ulysses"  # shards of 6 positions cut blocks of 4
    # where the declared strategy does not fit, Ulysses
    assert strategy("window", causal=True, layout="zigzag") == "ulysses"
    assert strategy("linear", causal=True, layout="zigzag") == "ulysses"
    assert strategy("linear", eps=1e-6) == "ulysses"
    assert strategy("local-1d", block=4, memory=4, L=24, P=4) == "ulysses"  # shards of 6 positions cut blocks of 4
