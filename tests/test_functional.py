"""qkv.functional against literal references."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from qkv.functional import attend, masked_softmax, nadaraya_watson


def literal_masked_softmax(scores, mask):
    out = torch.zeros_like(scores)
    for idx in range(scores.shape[0]):
        allowed = [j for j in range(scores.shape[1]) if mask[idx, j]]
        if not allowed:
            continue
        denom = sum(math.exp(scores[idx, j].item()) for j in allowed)
        for j in allowed:
            out[idx, j] = math.exp(scores[idx, j].item()) / denom
    return out


def test_masked_softmax_matches_literal():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(5, 7, generator=g, dtype=torch.float64)
    m = torch.rand(5, 7, generator=g) > 0.4
    m[2] = False  # a fully masked row
    torch.testing.assert_close(masked_softmax(s, m), literal_masked_softmax(s, m))


def test_fully_masked_row_is_zero_not_nan():
    s = torch.randn(2, 3, 4)
    m = torch.zeros(2, 3, 4, dtype=torch.bool)
    w = masked_softmax(s, m)
    assert torch.equal(w, torch.zeros_like(w))
    s.requires_grad_(True)
    masked_softmax(s, m).sum().backward()
    assert torch.isfinite(s.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_masked_softmax_large_logits_low_precision(dtype):
    s = torch.tensor([[1024.0, 1020.0, -1024.0, 30000.0]]).to(dtype)  # exactly representable in fp16/bf16
    m = torch.tensor([[True, True, True, False]])
    w = masked_softmax(s, m)
    assert w.dtype == dtype and torch.isfinite(w).all()
    assert w[0, 3] == 0
    ref = torch.softmax(torch.tensor([0.0, -4.0]), 0)
    torch.testing.assert_close(w[0, :2].float(), ref, atol=1e-2, rtol=1e-2)


def test_masked_softmax_gradcheck():
    s = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    m = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda x: masked_softmax(x, m), (s,))


def test_masked_softmax_bad_mask():
    with pytest.raises(TypeError, match="mask"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="scores"):
        masked_softmax(torch.ones(2, 3, dtype=torch.long))


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), m=st.integers(1, 5), n=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_masked_softmax_properties(b, m, n, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, m, n, generator=g) * 10
    mask = torch.rand(b, m, n, generator=g) > 0.5
    w = masked_softmax(s, mask)
    assert (w[~mask] == 0).all()
    sums = w.sum(-1)
    has_any = mask.any(-1)
    torch.testing.assert_close(sums[has_any], torch.ones_like(sums[has_any]))
    assert (sums[~has_any] == 0).all()


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "cosine"])
def test_attend_matches_loops(score):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, n, 3, generator=g, dtype=torch.float64) for n in (4, 5, 5))
    mask = torch.rand(2, 4, 5, generator=g) > 0.3
    out = attend(q, k, v, mask=mask, score=score, need_weights=True)
    for b in range(2):
        for i in range(4):
            if score == "dot":
                s = torch.stack([q[b, i] @ k[b, j] for j in range(5)])
            elif score == "scaled_dot":
                s = torch.stack([q[b, i] @ k[b, j] / math.sqrt(3) for j in range(5)])
            else:
                s = torch.stack([q[b, i] @ k[b, j] / (q[b, i].norm() * k[b, j].norm()) for j in range(5)])
            w = literal_masked_softmax(s[None], mask[b, i][None])[0]
            torch.testing.assert_close(out.weights[b, i], w)
            torch.testing.assert_close(out.output[b, i], (w[:, None] * v[b]).sum(0))


def test_attend_no_leak_through_mask():
    q, k, v = torch.randn(1, 2, 4), torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    mask = torch.tensor([[[True, True, False, True, False, False]] * 2])
    base = attend(q, k, v, mask=mask).output
    k2, v2 = k.clone(), v.clone()
    k2[:, [2, 4, 5]] += 100.0
    v2[:, [2, 4, 5]] -= 50.0
    torch.testing.assert_close(attend(q, k2, v2, mask=mask).output, base)


def test_attend_bad_input():
    with pytest.raises(ValueError, match="feature size"):
        attend(torch.randn(2, 3, 4), torch.randn(2, 5, 3), torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="positions"):
        attend(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match="score"):
        attend(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4), score="bogus")
    with pytest.raises(ValueError, match="query"):
        attend(torch.randn(4), torch.randn(2, 5, 4), torch.randn(2, 5, 4))


def test_nadaraya_watson_literal():
    x = torch.tensor([0.0, 1.0, 2.5])
    xs = torch.tensor([0.0, 0.5, 2.0, 3.0])
    ys = torch.tensor([1.0, 2.0, -1.0, 0.5])
    for w in (1.0, 2.0):
        out = nadaraya_watson(x, xs, ys, width=w)
        for i in range(3):
            k = [math.exp(-((x[i] - xs[j]).item() * w) ** 2 / 2) for j in range(4)]
            expected = sum(kj * ys[j].item() for j, kj in enumerate(k)) / sum(k)
            assert out.output[i].item() == pytest.approx(expected, rel=1e-5)
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(3))


def test_nadaraya_watson_learnable_width_and_vectors():
    w = torch.tensor(1.5, requires_grad=True)
    x, xs, ys = torch.randn(2, 3, 2), torch.randn(2, 5, 2), torch.randn(2, 5, 4)
    out = nadaraya_watson(x, xs, ys, width=w)
    assert out.output.shape == (2, 3, 4) and out.weights.shape == (2, 3, 5)
    out.output.sum().backward()
    assert w.grad is not None and torch.isfinite(w.grad)
    with pytest.raises(ValueError, match="number of points"):
        nadaraya_watson(torch.randn(3), torch.randn(5), torch.randn(4))
