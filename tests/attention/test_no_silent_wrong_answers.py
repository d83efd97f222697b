"""Places where a user got a wrong number without a word (issue 52, items 5-7), kept as tables:
each row is what a user does and what they must get, compared with the answer that must agree.

- item 5: causal ``linear`` / ``performer`` with ``eps=0`` (the default) on a left-padded batch —
  a query that sees no key returned 0 but its gradient was NaN (``_divide`` clamped the
  denominator to ``tiny`` and backward multiplied by ``1 / tiny``);
- item 6: non-causal ``lsh`` — a padded row differed from the same row alone (chunk 0's look-back
  wrapped around to the chunks of padding);
- item 7: ``performer`` — rows of zeros (and errors of ~2) in float32 for inputs of std 30, where
  the float64 FAVOR+ estimate is finite.
"""

import pytest
import torch

import qkv


def _tensors(B, H, L, E, dtype=torch.float64, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, E, generator=g, dtype=dtype) for _ in range(3))
    return q * scale, k * scale, v


def _left_padded(L, pads):
    """A ``(B, L)`` key-padding mask with ``pads[b]`` positions of padding on the left of row ``b``."""
    mask = torch.ones(len(pads), L, dtype=torch.bool)
    for b, n in enumerate(pads):
        mask[b, :n] = False
    return mask


# ---------------------------------------------------------------- item 5: eps = 0, a query that sees no key

#: (kernel, its arguments): the kernels whose default ``eps = 0`` divides exactly
EXACT_DIVISION = [
    ("linear", {"causal": True}),
    ("linear", {"causal": True, "chunk_size": 2}),
    ("performer", {"causal": True, "nb_features": 6, "seed": 0, "d_head": 3}),
    ("performer", {"causal": True, "nb_features": 6, "seed": 0, "d_head": 3, "chunk_size": 2}),
    ("linear", {"causal": False}),
    ("performer", {"causal": False, "nb_features": 6, "seed": 0, "d_head": 3}),
]


@pytest.mark.parametrize("name, kw", EXACT_DIVISION)
def test_a_query_that_sees_no_key_has_zero_output_and_finite_gradient(name, kw):
    """Left padding: causal queries before the row's first token see no key. They must return zeros
    with a zero gradient (was NaN in q.grad), the others what the row gives alone, and gradcheck must
    hold in float64 over the whole padded batch."""
    kernel = qkv.build_attention(name, **kw).double()
    L, pads = 6, (0, 2, 5)
    mask = _left_padded(L, pads)
    q, k, v = (t.requires_grad_(True) for t in _tensors(len(pads), 1, L, 3))
    out = kernel(q, k, v, mask=mask).output  # (B, 1, L, 3)
    (out * 1e3).sum().backward()  # a large upstream gradient: 1e3 / tiny overflowed
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    for b, n in enumerate(pads):
        alone = kernel(q[b:b + 1, :, n:], k[b:b + 1, :, n:], v[b:b + 1, :, n:]).output
        torch.testing.assert_close(out[b:b + 1, :, n:], alone, atol=1e-12, rtol=1e-10)
        if kw["causal"]:  # no key before the first token: zeros, and nothing flows back to those queries
            assert out[b, :, :n].eq(0).all()
            assert q.grad[b, :, :n].eq(0).all()
    assert torch.autograd.gradcheck(lambda a, c, d: kernel(a, c, d, mask=mask).output, (q, k, v))


@pytest.mark.parametrize("name, kw", EXACT_DIVISION[:4])
def test_a_query_that_sees_no_key_has_finite_gradient_in_float32(name, kw):
    """The same in float32, where ``1 / tiny`` (8.5e37) times a gradient of a few units overflowed."""
    kernel = qkv.build_attention(name, **kw)
    mask = _left_padded(6, (3,))
    q, k, v = (t.float().requires_grad_(True) for t in _tensors(1, 2, 6, 3))
    (kernel(q, k, v, mask=mask).output * 10).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert q.grad[:, :, :3].eq(0).all()
