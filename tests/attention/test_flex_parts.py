"""The FlexAttention path's decomposition, checked on the CPU: ``strided``/``fixed`` split their
pattern into parts (``_flex_parts``) that ``qkv.attention.flex.merge`` joins by log-sum-exp. Here
each part is computed by a dense reference of FlexAttention (same predicate, same ``(out, lse)``
contract) instead of the compiled kernel, so the parts, the grid transposition, the gathered
summaries, the overlap exclusions and the padding are held equal to the structured path without a
GPU; tests/attention/test_cuda.py checks the real kernel."""

import math

import pytest
import torch

import qkv
from qkv import masks
from qkv.attention import flex


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
    monkeypatch.setattr(flex, "attend_parts", dense_attend_parts)
    kernel = qkv.build_attention(name, causal=causal, **kw)
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(2, 3, L, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pad = masks.padding_mask(torch.tensor([L - 5, L]), L) if padded else None
    valid = None if pad is None else pad.view(2, 1, L)
    ours = flex.merge(kernel._flex_parts(q, k, v, valid))
    ref = kernel(q, k, v, mask=pad).output
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=1e-9)
    grad = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(ours, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):  # the gradient flows through the parts' log-sum-exps too
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8)


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
