"""FlexAttention path of the pattern kernels on CUDA.

``torch.nn.attention.flex_attention`` runs a fused, block-sparse attention from a ``BlockMask``:
the key blocks a query block cannot reach are skipped, the partial blocks are masked element-wise
by the predicate. The kernels ``strided``, ``fixed``, ``window``, ``local-1d`` and ``local-2d``
build that mask from the same ``qkv.masks`` predicate their structured CPU path implements
(``kernel.pattern(M, N)``), so the two paths compute the same function;
``tests/attention/test_cuda.py`` checks it on a GPU.

A pattern whose allowed keys are scattered over every key block (the strided columns ``A2``, the
fixed summaries) skips no block as one mask; the kernels then give FlexAttention each part where it
is contiguous — the band and the own block as they are, the strided columns on the transposed
``(l, n / l)`` grid, the summaries gathered — and merge the parts by their log-sum-exp
(``merge``): one softmax over the union, as on the structured path.

The path is taken when every condition holds: the inputs are on a CUDA device, FlexAttention
imports, no weights are asked (it forms none), no dropout (it has none), no decoding state, the
head sizes are equal powers of two in 16 … 256 and the dtype is float16, bfloat16 or float32 (the
window and local kernels also: no decoding state asked for, and no more queries than keys).
Otherwise the kernel stays on its structured path (FlexAttention has no CPU backward in
torch 2.13, so CPU training always does). ``with qkv.attention.flex.disabled():`` forces the
structured path, for comparisons.

A kernel of several parts (``strided``, ``fixed``) runs them and their merge as ONE compiled graph
(``run``: the layout copies, every part's fused kernel and the merge, with one guard check per call
instead of a Python dispatch per operation); its block masks are built before, outside the graph.

Block masks are built once per pattern and shape (a small cache); a key-padding mask is folded
into the predicate and its block mask built per call. Rows with no allowed key are zeros, as on
every other path (FlexAttention's log-sum-exp of such a row is -inf).
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from typing import Hashable, Iterator, Optional

import torch
from torch import Tensor

from .. import masks

__all__ = ["available", "usable", "part_mask", "lse_attend", "run", "attend_parts", "attend_pattern", "merge", "count",
           "disabled", "calls"]

_enabled = True
_CACHE_SIZE = 32
_block_masks: "OrderedDict[Hashable, object]" = OrderedDict()
#: Number of calls that took the FlexAttention path (tests check that it was taken).
calls = 0


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when ``torch.nn.attention.flex_attention`` imports."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, kernels keep to their structured path on CUDA too."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def usable(q: Tensor, v: Tensor, need_weights: bool, dropout_p: float) -> bool:
    """Whether a call with these inputs can take the FlexAttention path."""
    E, Ev = q.shape[-1], v.shape[-1]
    return (_enabled and q.is_cuda and not need_weights and dropout_p == 0.0 and E == Ev
            and 16 <= E <= 256 and E & (E - 1) == 0
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and available())


@functools.lru_cache(maxsize=None)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    # Compiled, FlexAttention is one fused Triton kernel per direction; eager it is a dense reference.
    return torch.compile(flex_attention, dynamic=False)


def _block_mask(mod: masks.MaskMod, B: Optional[int], H: Optional[int], M: int, N: int, device: torch.device,
                key: Optional[Hashable]):
    from torch.nn.attention.flex_attention import create_block_mask

    if key is not None:
        key = (key, M, N, str(device))
        hit = _block_masks.get(key)
        if hit is not None:
            _block_masks.move_to_end(key)
            return hit
    block_mask = create_block_mask(mod, B, H, M, N, device=device)
    if key is not None:
        _block_masks[key] = block_mask
        if len(_block_masks) > _CACHE_SIZE:
            _block_masks.popitem(last=False)
    return block_mask


@contextlib.contextmanager
def _recompile_limit():
    # Every distinct pattern and length is one compilation; a model holds a few (its layers' kernels
    # and lengths), more than dynamo's default of 8 per function when several are benchmarked.
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    with config.patch(**{name: max(64, getattr(config, name))}):
        yield


def _flex(q: Tensor, k: Tensor, v: Tensor, block_mask):
    with _recompile_limit():
        return _compiled()(q, k, v, block_mask=block_mask, return_lse=True)


def part_mask(mod: masks.MaskMod, key_valid: Optional[Tensor], B: int, H: int, M: int, N: int,
              device: torch.device, key: Optional[Hashable], per_head: bool = False):
    """The ``BlockMask`` of the pairs ``mod`` allows among ``M`` queries and ``N`` keys, and the valid keys.

    ``key_valid (B|1, H|1, N)`` bool or None; ``key``: a hashable description of ``mod`` under which
    its block mask is cached (None: not cached; a padding mask is per call and never cached);
    ``per_head``: ``mod`` depends on the head index (the mask is then built for each of ``H`` heads:
    a block that is full for head 0 need not be for the others)."""
    if key_valid is None:
        heads = H if per_head else None
        return _block_mask(mod, None, heads, M, N, device, None if key is None else (key, heads))
    Bv, Hv = key_valid.shape[0], key_valid.shape[1]
    valid = key_valid.reshape(Bv, Hv, N)
    bi = (lambda b: b) if Bv > 1 else (lambda b: 0 * b)
    hi = (lambda h: h) if Hv > 1 else (lambda h: 0 * h)
    return _block_mask(masks.and_masks(mod, lambda b, h, q_idx, kv_idx: valid[bi(b), hi(h), kv_idx]),
                       B if Bv > 1 else None, H if (Hv > 1 or per_head) else None, M, N, device, None)


def lse_attend(q: Tensor, k: Tensor, v: Tensor, block_mask):
    """``(out (B, H, M, Ev), lse (B, H, M) float32)`` of FlexAttention under ``block_mask``; ``lse`` is
    ``-inf`` on rows with no allowed key, their ``out`` zeros. Meant to be traced inside ``run`` (run
    eagerly, FlexAttention is its dense reference implementation)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _zero_empty_rows(*flex_attention(q, k, v, block_mask=block_mask, return_lse=True))


def _zero_empty_rows(out: Tensor, lse: Tensor):
    """``(out, lse)`` with ``out`` zero on the rows no key was allowed (``lse = -inf``; FlexAttention
    leaves them undefined)."""
    return out.masked_fill(torch.isneginf(lse).unsqueeze(-1), 0.0), lse


#: The ``torch.compile`` backend of ``run`` (tests on a CPU use ``"aot_eager"``: inductor's CPU
#: FlexAttention has no backward and no log-sum-exp).
backend = "inductor"


@functools.lru_cache(maxsize=None)
def _compiled_program(program, backend_name: str):
    # fullgraph: a graph break would run FlexAttention eagerly, i.e. densely; better an error than that.
    return torch.compile(program, fullgraph=True, dynamic=False, backend=backend_name)


def run(program, *args, **static):
    """``program(*args, **static)`` compiled as one graph (cached per program; ``static`` are
    Python constants the graph is specialised on, e.g. a stride): a kernel's parts, their layout
    copies and their ``merge`` in one call."""
    with _recompile_limit():
        return _compiled_program(program, backend)(*args, **static)


def attend_parts(q: Tensor, k: Tensor, v: Tensor, mod: masks.MaskMod, key_valid: Optional[Tensor],
                 key: Optional[Hashable]):
    """One part: ``(out (B, H, M, Ev), lse (B, H, M) float32)`` of attention over the pairs ``mod``
    allows and the valid keys; ``lse`` is ``-inf`` on rows with no allowed key (their ``out`` is 0).

    ``key_valid (B|1, H|1, N)`` bool or None; ``key``: a hashable description of ``mod`` under which
    its block mask is cached (None: not cached; a padding mask is per call and never cached).
    """
    B, H, M, _ = q.shape
    block_mask = part_mask(mod, key_valid, B, H, M, k.shape[-2], q.device, key)
    return _zero_empty_rows(*_flex(q, k, v, block_mask))


def attend_pattern(q: Tensor, k: Tensor, v: Tensor, mod: masks.MaskMod, mask: Optional[Tensor],
                   key: Hashable) -> Tensor:
    """A kernel's whole pattern ``mod`` as one block mask: ``out (B, H, M, Ev)``, rows with no allowed
    key zeros; ``mask`` the kernel's key-padding mask ``(B|1, H|1, 1, N)`` or None; ``key`` describes
    ``mod`` for the block-mask cache (with ``M`` and ``N``). Counts the call."""
    out, _ = attend_parts(q, k, v, mod, None if mask is None else mask[:, :, 0, :], key)
    count()
    return out


def merge(parts):
    """One softmax over the union of disjoint parts ``[(out, lse), ...]`` (``merge`` of their
    log-sum-exps): ``sum_p exp(lse_p - lse) out_p`` with ``lse = logsumexp_p lse_p``; rows allowed no
    key by any part are zeros. Differentiable (through ``lse`` too)."""
    acc = torch.promote_types(parts[0][0].dtype, torch.float32)  # half outputs are summed in float32
    lse = torch.stack([l.to(acc) for _, l in parts]).logsumexp(0)  # (B, H, M)
    empty = torch.isneginf(lse)
    lse = lse.masked_fill(empty, 0.0)
    out = sum(torch.exp(l.to(acc) - lse).unsqueeze(-1) * o.to(acc) for o, l in parts)
    return out.masked_fill(empty.unsqueeze(-1), 0.0).to(parts[0][0].dtype)


def count() -> None:
    """Count one kernel call that took the FlexAttention path (``calls``; tests check it was taken)."""
    global calls
    calls += 1
