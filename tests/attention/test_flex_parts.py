"""The FlexAttention path's decomposition, checked on the CPU: ``strided``/``fixed`` split their
pattern into parts (``_flex_inputs`` / ``_flex_program``) that ``qkv.attention.flex.merge`` joins by
log-sum-exp, one compiled graph (``flex.run``). Here each part is computed by a dense reference of
FlexAttention (same block mask predicate, same ``(out, lse)`` contract) instead of the compiled
kernel, so the parts, the grid transposition, the gathered summaries, the overlap exclusions and the
padding are held equal to the structured path without a GPU; and the program is traced whole
(``fullgraph``) with the real FlexAttention run by its eager reference. tests/attention/test_cuda.py
checks the real kernel."""

import math

import pytest
import torch

import qkv
from qkv import masks
from qkv.attention import flex


def dense_lse_attend(q, k, v, block_mask):
    """``flex.lse_attend`` densely: the block mask's element predicate (padding folded in) at every pair."""
    return dense_attend_parts(q, k, v, block_mask.mask_mod, None, None)


def dense_attend_parts(q, k, v, mod, key_valid, key):
    """FlexAttention's ``(out, lse)`` for the pairs ``mod`` allows, densely (float64 inside)."""
    B, H, M, E = q.shape
    N = k.shape[-2]
    b, h = torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1)
    allowed = mod(b, h, torch.arange(M).view(1, 1, M, 1), torch.arange(N).view(1, 1, 1, N)).expand(B, H, M, N)
    if key_valid is not None:
        allowed = allowed & key_valid.reshape(key_valid.shape[0], key_valid.shape[1], 1, N)
    scores = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(E)).masked_fill(~allowed, float("-inf"))
    lse = scores.logsumexp(-1)  # -inf on empty rows
    weights = torch.exp(scores - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
    out = (weights @ v.double()).to(q.dtype)
    return out.masked_fill(torch.isneginf(lse).unsqueeze(-1), 0.0), lse.to(torch.promote_types(q.dtype, torch.float32))


CASES = [
    ("strided", {"stride": 4}, True),
    ("strided", {"stride": 4}, False),
    ("strided", {"stride": 5, "subsets": (2,)}, True),
    ("strided", {"stride": 3, "subsets": (2,)}, False),
    ("strided", {"stride": 6, "subsets": (1,)}, True),
    ("fixed", {"stride": 4, "c": 2}, True),
    ("fixed", {"stride": 5, "c": 1}, False),
    ("fixed", {"stride": 4, "c": 4, "subsets": (2,)}, True),
    ("fixed", {"stride": 6, "c": 2, "subsets": (1,)}, False),
]


@pytest.mark.parametrize("name,kw,causal", CASES)
@pytest.mark.parametrize("L", [16, 23])
@pytest.mark.parametrize("padded", [False, True])
def test_parts_merged_by_log_sum_exp_equal_the_structured_path(monkeypatch, name, kw, causal, L, padded):
    monkeypatch.setattr(flex, "lse_attend", dense_lse_attend)
    kernel = qkv.build_attention(name, causal=causal, **kw)
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(2, 3, L, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pad = masks.padding_mask(torch.tensor([L - 5, L]), L) if padded else None
    valid = None if pad is None else pad.view(2, 1, L)
    tensors, static = kernel._flex_inputs(q, valid)
    ours = kernel._flex_program(q, k, v, *tensors, **static)
    ref = kernel(q, k, v, mask=pad).output
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=1e-9)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(ours, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):  # the gradient flows through the parts' log-sum-exps too
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("name,kw", [("strided", {"stride": 4}), ("fixed", {"stride": 4, "c": 2})])
@pytest.mark.parametrize("padded", [False, True])
def test_the_program_traces_as_one_graph_and_equals_the_structured_path(monkeypatch, name, kw, padded):
    # inductor's CPU FlexAttention has no log-sum-exp: trace with aot_eager, FlexAttention runs its
    # eager reference (forward only: it has no CPU backward; the gradients are checked above with the
    # dense parts and on CUDA); fullgraph makes a graph break an error (it would run densely).
    monkeypatch.setattr(flex, "backend", "aot_eager")
    kernel = qkv.build_attention(name, causal=True, **kw)
    L = 23
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, L, 16, generator=g) for _ in range(3))
    pad = masks.padding_mask(torch.tensor([L - 5, L]), L) if padded else None
    tensors, static = kernel._flex_inputs(q, None if pad is None else pad.view(2, 1, L))
    ours = flex.run(type(kernel)._flex_program, q, k, v, *tensors, **static)
    ref = kernel(q, k, v, mask=pad).output
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def test_merge_of_disjoint_parts_is_one_softmax_and_empty_rows_are_zero():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    first = lambda b, h, i, j: j < 3  # noqa: E731
    second = lambda b, h, i, j: (j >= 3) & (i > 0)  # noqa: E731  (row 0 has no key here)
    merged = flex.merge([dense_attend_parts(q, k, v, first, None, None), dense_attend_parts(q, k, v, second, None, None)])
    whole = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + torch.where(
        torch.arange(6).view(6, 1).gt(0) | torch.arange(6).view(1, 6).lt(3), 0.0, float("-inf")), -1) @ v
    torch.testing.assert_close(merged, whole)
    nothing = lambda b, h, i, j: j < 0  # noqa: E731
    empty = flex.merge([dense_attend_parts(q, k, v, nothing, None, None)] * 2)
    assert (empty == 0).all()


def test_cpu_inputs_never_take_the_flexattention_path():
    kernel = qkv.build_attention("strided", stride=16, causal=True)
    q, k, v = (torch.randn(1, 2, 64, 64) for _ in range(3))
    before = flex.calls
    kernel(q, k, v)
    assert flex.calls == before and not flex.usable(q, v, False, 0.0)


def test_strided_column_block_masks_hold_no_padded_key_in_a_full_block():
    # L % l != 0: the grid's last row exists only in some columns (heads h l + c), so a key block
    # that is full for column 0 is not for the others; FlexAttention skips the predicate inside full
    # blocks, so the mask must be built per head or those columns would attend to padding.
    l, L = 3, 3 * 255 + 1  # 256 grid rows: two whole 128-row blocks, the last row in column 0 only
    kernel = qkv.build_attention("strided", stride=l, subsets=(2,), causal=False)
    q = torch.zeros(1, 2, L, 16)
    (_, cols), _ = kernel._flex_inputs(q, None)
    nr, heads = 256, 2 * l
    rows = torch.arange(nr)
    for h in range(heads):
        allowed = (rows.view(1, nr) * l + h % l < L).expand(nr, nr)  # |a - a'| >= 0, key row a' exists
        hh = h if cols.full_kv_num_blocks.shape[1] > 1 else 0
        for qb in range(cols.full_kv_num_blocks.shape[2]):
            for i in range(int(cols.full_kv_num_blocks[0, hh, qb])):
                kb = int(cols.full_kv_indices[0, hh, qb, i])
                block = allowed[qb * 128:(qb + 1) * 128, kb * 128:(kb + 1) * 128]
                assert block.all(), f"column head {h}: key block {kb} marked full but holds padding"


@pytest.mark.parametrize("name,kw", [("strided", {"stride": 4}), ("fixed", {"stride": 4, "c": 2})])
@pytest.mark.parametrize("padded", [False, True])
def test_the_program_is_not_compiled_again_for_new_inputs_or_padding(monkeypatch, name, kw, padded):
    """One graph per kernel and shape: a new padding mask (a new block mask, a new predicate
    closure) is an input of the graph, not a reason to compile again."""
    compiled = []

    def counting(gm, example_inputs):  # a backend that counts the graphs it is given
        compiled.append(gm)
        return gm.forward

    monkeypatch.setattr(flex, "backend", counting)
    kernel = qkv.build_attention(name, causal=True, **kw)
    seen = []
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(3))
        valid = masks.padding_mask(torch.tensor([40 - 3 * (seed + 1), 40]), 40).view(2, 1, 40) if padded else None
        tensors, static = kernel._flex_inputs(q, valid)
        flex.run(type(kernel)._flex_program, q, k, v, *tensors, **static)
        seen.append(len(compiled))
    assert 1 <= seen[1] <= 2 and seen[3] == seen[1], seen
