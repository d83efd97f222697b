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


# ---------------------------------------------------------------- item 6: lsh, a padded row and the row alone

#: (L, LSH knobs): a row of ``L // 2 + 1`` tokens padded to ``L``; ``n_buckets`` fixed (the rotations,
#: and so every real token's buckets, are those of the row alone); chunks of 4
PADDED_LSH = [
    (8, {}),
    (32, {}),
    (32, {"n_rounds": 3}),
    (32, {"n_rounds": 2, "dedup": True}),
    (32, {"shared_qk": False}),
    (32, {"n_rounds": 2, "causal": True}),
    (13, {"bucket_size": 16}),  # the row alone is one chunk, the padded batch too
    (40, {"bucket_size": 8, "n_buckets": (2, 4), "n_rounds": 2}),
]


@pytest.mark.parametrize("L, kw", PADDED_LSH)
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_lsh_row_is_the_row_alone(L, kw, side):
    """Padding is never attended, and a padded row's real positions get exactly what the row gets alone
    with the same rotations: chunk 0 looks back at the row's last chunk of real keys, not at chunks of
    padding (non-causal: 0.74 apart at L = 32 before)."""
    kernel = qkv.build_attention("lsh", **{"bucket_size": 4, "n_buckets": 4, "seed": 0, **kw}).double()
    n = L // 2 + 1
    q, k, v = _tensors(1, 2, n, 8)
    alone = kernel(q, k, v).output
    pad_q, pad_k, pad_v = (1e3 * t for t in _tensors(1, 2, L - n, 8, seed=1))  # loud padding: it must not count
    real = torch.arange(L) >= L - n if side == "left" else torch.arange(L) < n
    join = (lambda a, p: torch.cat([p, a], 2)) if side == "left" else (lambda a, p: torch.cat([a, p], 2))
    out = kernel(join(q, pad_q), join(k, pad_k), join(v, pad_v), mask=real[None], need_weights=True)
    torch.testing.assert_close(out.output[:, :, real], alone, atol=1e-12, rtol=0)
    assert out.weights[:, :, :, ~real].eq(0).all()  # no query attends to padding


def test_a_padded_lsh_batch_is_each_row_alone():
    """A batch of rows padded by different amounts on the left, as a tokenizer gives them."""
    kernel = qkv.build_attention("lsh", bucket_size=4, n_buckets=8, n_rounds=2, seed=0).double()
    L, pads = 24, (0, 5, 11, 19)
    q, k, v = _tensors(len(pads), 2, L, 8)
    mask = _left_padded(L, pads)
    out = kernel(q, k, v, mask=mask).output
    for b, n in enumerate(pads):
        alone = kernel(q[b:b + 1, :, n:], k[b:b + 1, :, n:], v[b:b + 1, :, n:]).output
        torch.testing.assert_close(out[b:b + 1, :, n:], alone, atol=1e-12, rtol=0)


def test_lsh_with_a_derived_bucket_count_refuses_padding():
    """``n_buckets=None`` derives the count from the call's length (padding included), which changes the
    rotations and so every real token's bucket: refused with a key-padding mask, with the way out."""
    kernel = qkv.build_attention("lsh", bucket_size=4, seed=0)
    q, k, v = _tensors(1, 1, 16, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"n_buckets=None .* give n_buckets \(e\.g\. \(8,\)"):
        kernel(q, k, v, mask=_left_padded(16, (3,)))
    assert torch.isfinite(kernel(q, k, v).output).all()  # without padding: derived as before


# ---------------------------------------------------------------- item 7: performer at large inputs

#: (causal, std of q and k, key padding): float32 must give the float64 FAVOR+ estimate
LARGE_INPUTS = [
    (False, 30.0, False),
    (False, 100.0, False),
    (False, 30.0, True),
    (True, 30.0, False),  # error 1.76 before
    (True, 100.0, False),  # rows of zeros before
    (True, 30.0, True),
    (False, 1.0, True),  # moderate inputs: as before
    (True, 1.0, False),
]


@pytest.mark.parametrize("causal, std, padded", LARGE_INPUTS)
def test_performer_in_float32_is_the_float64_estimate_at_large_inputs(causal, std, padded):
    kernel = qkv.build_attention("performer", causal=causal, nb_features=16, seed=0, d_head=8, chunk_size=4)
    q, k, v = _tensors(2, 2, 12, 8, scale=std)
    mask = _left_padded(12, (0, 3)) if padded else None
    expected = kernel.double()(q, k, v, mask=mask).output
    q32, k32, v32 = (t.float().requires_grad_(True) for t in (q, k, v))
    got = kernel.float()(q32, k32, v32, mask=mask).output
    torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4)
    got.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q32, k32, v32))


@pytest.mark.parametrize("std", [1.0, 30.0])
def test_causal_performer_decodes_one_token_at_a_time_as_in_one_pass_at_large_inputs(std):
    """The state stays valid across calls: a call that ran in float64 hands on float32 sums, and one token
    at a time gives the one pass's numbers (some calls in float64, some not)."""
    kernel = qkv.build_attention("performer", causal=True, nb_features=16, seed=0, d_head=8)
    q, k, v = (t.float() for t in _tensors(1, 2, 10, 8, scale=std))
    full = kernel(q, k, v).output
    expected = kernel.double()(q.double(), k.double(), v.double()).output
    kernel.float()
    state, parts = None, []
    for lo, hi in [(0, 3)] + [(i, i + 1) for i in range(3, 10)]:  # a prompt of 3, then one token at a time
        out = kernel(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], state=state, return_state=True)
        state, parts = out.state, parts + [out.output]
        assert state.S.dtype == torch.float32 and state.Z.dtype == torch.float32
    torch.testing.assert_close(torch.cat(parts, 2), full, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(full.double(), expected, atol=2e-5, rtol=1e-4)
