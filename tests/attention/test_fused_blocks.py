"""``_ops.fused_blocks``: SDPA over query blocks and their key bands, folded to the 4-D layout that
the fused CPU kernel takes — the same numbers as attention written out block by block, and the
fused kernel (not SDPA's unfused reference path) in the forward and the backward pass."""

import math

import pytest
import torch
from torch.profiler import profile

import qkv
from qkv.attention._ops import fused_blocks


def reference(qb, kb, vb, mask):
    """Each block's softmax(q k^T / sqrt(E) + bias) v, written out; rows with no key give zeros."""
    scores = qb @ kb.transpose(-1, -2) / math.sqrt(qb.shape[-1])
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask
    weights = torch.softmax(scores, -1).nan_to_num(0.0)
    return weights @ vb


@pytest.mark.parametrize("mask_shape", [(6, 8), (1, 6, 8), (3, 6, 8), (2, 1, 3, 6, 8), (2, 4, 3, 6, 8), (1, 4, 1, 6, 8)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_equals_blockwise_attention_for_every_mask_layout(mask_shape, kind):
    torch.manual_seed(0)
    qb = torch.randn(2, 4, 3, 6, 5, dtype=torch.float64, requires_grad=True)  # (B, H, n, b, E)
    kb = torch.randn(2, 4, 3, 8, 5, dtype=torch.float64, requires_grad=True)
    vb = torch.randn(2, 4, 3, 8, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(mask_shape) > 0.3
    if kind == "float":
        mask = torch.where(mask, torch.randn(mask_shape, dtype=torch.float64), float("-inf"))
    out = fused_blocks(qb, kb, vb, mask)
    expected = reference(qb, kb, vb, mask)
    assert out.shape == (2, 4, 3, 6, 7)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)
    grads = torch.autograd.grad(out.pow(2).sum(), (qb, kb, vb))
    expected_grads = torch.autograd.grad(expected.pow(2).sum(), (qb, kb, vb))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-9, rtol=1e-9)


def test_empty_blocks_give_empty_outputs():
    qb, kb, vb = torch.randn(2, 4, 0, 6, 5), torch.randn(2, 4, 0, 8, 5), torch.randn(2, 4, 0, 8, 7)
    assert fused_blocks(qb, kb, vb, torch.ones(0, 6, 8, dtype=torch.bool)).shape == (2, 4, 0, 6, 7)


def sdpa_ops(fn):
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


@pytest.mark.parametrize("name,knobs", [("window", {"radius": 16}), ("window", {"radius": 16, "causal": True}),
                                         ("local-1d", {"block": 16, "memory": 16})])
def test_band_kernels_take_the_fused_cpu_kernel_forward_and_backward(name, knobs):
    """A 5-D block layout once sent these kernels to SDPA's unfused path on the CPU."""
    kernel = qkv.registry.lookup("attention", name)(**knobs)
    q, k, v = (torch.randn(1, 2, 128, 16, requires_grad=True) for _ in range(3))
    ops = sdpa_ops(lambda: kernel(q, k, v).output.sum().backward())
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops, ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ops, ops
    assert "aten::_scaled_dot_product_attention_math" not in ops, ops


def test_adaptive_span_takes_the_fused_cpu_kernel_without_a_gradient():
    """Its score bias (log of the soft mask) carries the span's gradient, which the fused kernel does
    not give: with gradients it takes the unfused path; in inference the fused one."""
    kernel = qkv.registry.lookup("attention", "adaptive-span")(max_span=32, n_heads=2, causal=True)
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    with torch.no_grad():
        ops = sdpa_ops(lambda: kernel(q, k, v))
    assert ops == {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"}, ops
