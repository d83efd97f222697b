"""Sparse Transformer (strided, fixed) and Image Transformer (local-1d, local-2d) kernels: equal to
dense softmax attention restricted to their ``qkv.masks`` pattern for any length, stride, subset,
causality, key padding and query offset; zero weights off the pattern; no (N, N) tensor on the
no-weights path; knob validation."""

import pytest
import torch
import torch.utils._pytree
from hypothesis import given, settings, strategies as st

import qkv
from qkv import masks
from qkv.bench.common import AllocationTracker


def heads(B, H, M, N, E=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, M, E, generator=g, dtype=dtype)
    k = torch.randn(B, H, N, E, generator=g, dtype=dtype)
    v = torch.randn(B, H, N, E + 1, generator=g, dtype=dtype)  # Ev != E on purpose
    return q, k, v


def dense_reference(q, k, v, pattern, pad):
    """Softmax attention over ``pattern & pad`` with the exact kernel: ``(out, weights)``."""
    M, N = q.shape[-2], k.shape[-2]
    allowed = masks.materialize(pattern, M, N) & pad[:, None, :]  # (B, M, N)
    ref = qkv.build_attention("softmax")(q, k, v, mask=allowed[:, None], need_weights=True)
    return ref.output, ref.weights, allowed


def check_against_dense(kernel, M, N, seed, pattern_mod):
    q, k, v = heads(2, 2, M, N, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    pad = torch.rand(2, N, generator=g) > 0.25
    ref_out, ref_w, allowed = dense_reference(q, k, v, pattern_mod, pad)
    fast = kernel(q, k, v, mask=pad)
    slow = kernel(q, k, v, mask=pad, need_weights=True)
    torch.testing.assert_close(fast.output, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(slow.output, ref_out, atol=1e-5, rtol=1e-5)
    assert slow.weights.shape == (2, 2, M, N)
    assert (slow.weights[~allowed[:, None].expand_as(slow.weights)] == 0).all()  # zero off the pattern
    torch.testing.assert_close(slow.weights, ref_w, atol=1e-6, rtol=1e-5)
    assert fast.weights is None and fast.state is None


# ----------------------------------------------------------------------------- exactness


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 30), dm=st.integers(-3, 3), stride=st.integers(1, 7),
       subsets=st.sampled_from([(1,), (2,), (1, 2)]), causal=st.booleans(), seed=st.integers(0, 1000))
def test_strided_equals_dense_softmax_on_its_pattern(N, dm, stride, subsets, causal, seed):
    M = max(1, N + dm)  # M < N: queries aligned to the end of the keys; M > N: some sit before key 0
    kernel = qkv.build_attention("strided", stride=stride, subsets=subsets, causal=causal)
    mod = kernel.pattern(M, N)
    offset = N - M
    expected = masks.materialize(masks.strided(stride, subsets, causal=causal), M + abs(offset) + N, M + abs(offset) + N)
    got = masks.materialize(mod, M, N)
    # pattern() is qkv.masks.strided with query i at key position N - M + i
    for i in range(M):
        p = i + offset
        if p >= 0:
            assert torch.equal(got[i], expected[p, :N])
    check_against_dense(kernel, M, N, seed, mod)


@settings(max_examples=40, deadline=None)
@given(N=st.integers(1, 30), dm=st.integers(-3, 3), stride=st.integers(1, 7), c=st.integers(1, 7),
       subsets=st.sampled_from([(1,), (2,), (1, 2)]), causal=st.booleans(), seed=st.integers(0, 1000))
def test_fixed_equals_dense_softmax_on_its_pattern(N, dm, stride, c, subsets, causal, seed):
    M = max(1, N + dm)
    c = min(c, stride)
    kernel = qkv.build_attention("fixed", stride=stride, c=c, subsets=subsets, causal=causal)
    if M == N:
        assert torch.equal(masks.materialize(kernel.pattern(M, N), M, N),
                           masks.materialize(masks.fixed(stride, c, subsets, causal=causal), M, N))
    check_against_dense(kernel, M, N, seed, kernel.pattern(M, N))


@settings(max_examples=30, deadline=None)
@given(N=st.integers(1, 30), dm=st.integers(-3, 3), block=st.integers(1, 7), memory=st.integers(0, 8),
       seed=st.integers(0, 1000))
def test_local_1d_equals_dense_softmax_on_its_pattern(N, dm, block, memory, seed):
    M = max(1, N + dm)
    kernel = qkv.build_attention("local-1d", block=block, memory=memory)
    if M == N:
        assert torch.equal(masks.materialize(kernel.pattern(M, N), M, N),
                           masks.materialize(masks.local_1d(block, memory), M, N))
    check_against_dense(kernel, M, N, seed, kernel.pattern(M, N))


@settings(max_examples=30, deadline=None)
@given(H=st.integers(1, 6), W=st.integers(1, 6), bh=st.integers(1, 4), bw=st.integers(1, 4),
       top=st.integers(0, 3), left=st.integers(0, 3), right=st.integers(0, 3),
       short=st.integers(0, 4), fewer=st.integers(0, 4), seed=st.integers(0, 1000))
def test_local_2d_equals_dense_softmax_on_its_pattern(H, W, bh, bw, top, left, right, short, fewer, seed):
    N = max(1, H * W - short)  # a raster prefix of the image (the whole image when short = 0)
    M = max(1, N - fewer)
    kernel = qkv.build_attention("local-2d", image_size=(H, W), block=(bh, bw), memory=(top, left, right))
    if M == N == H * W:
        assert torch.equal(masks.materialize(kernel.pattern(M, N), M, N),
                           masks.materialize(masks.local_2d((H, W), (bh, bw), (top, left, right)), M, N))
    check_against_dense(kernel, M, N, seed, kernel.pattern(M, N))


def test_local_2d_prefix_equals_whole_image():
    kernel = qkv.build_attention("local-2d", image_size=(5, 6), block=(2, 3), memory=(1, 2, 1))
    q, k, v = heads(1, 2, 30, 30)
    whole = kernel(q, k, v).output
    part = kernel(q[:, :, :17], k[:, :, :17], v[:, :, :17]).output
    torch.testing.assert_close(part, whole[:, :, :17])


@pytest.mark.parametrize("name,kw", [
    ("strided", {"stride": 4}), ("fixed", {"stride": 4, "c": 2}), ("local-1d", {"block": 4, "memory": 3}),
    ("local-2d", {"image_size": (3, 5), "block": (2, 2), "memory": (1, 1, 1)})])
def test_gradcheck_float64(name, kw):
    kernel = qkv.build_attention(name, **kw)
    q, k, v = (t.requires_grad_(True) for t in heads(1, 1, 15, 15, E=3, dtype=torch.float64))
    pad = torch.ones(1, 15, dtype=torch.bool)
    pad[0, 9] = False
    for need_weights in (False, True):
        assert torch.autograd.gradcheck(lambda a, b, c: kernel(a, b, c, mask=pad, need_weights=need_weights).output,
                                        (q, k, v))


def test_union_counts_shared_keys_once():
    """Keys in both A1 and A2 (strided: i - j in {0, l}; fixed: the own block's summaries) get the
    weight of one key: with equal scores every allowed key has weight 1 / |A_i|."""
    L = 12
    q = torch.zeros(1, 1, L, 4)
    k = torch.zeros(1, 1, L, 4)
    v = torch.randn(1, 1, L, 4)
    for kernel, mod in [
        (qkv.build_attention("strided", stride=3, causal=True), masks.strided(3, causal=True)),
        (qkv.build_attention("fixed", stride=4, c=2), masks.fixed(4, 2, causal=False)),
    ]:
        w = kernel(q, k, v, need_weights=True).weights[0, 0]
        allowed = masks.materialize(mod, L, L)
        torch.testing.assert_close(w, allowed.float() / allowed.sum(-1, keepdim=True))


# ----------------------------------------------------------------------------- structure


class LargestAllocation(AllocationTracker):
    """AllocationTracker that also records the largest single storage an operator creates."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("name,kw", [
    ("strided", {"stride": 32}), ("fixed", {"stride": 32, "c": 2}), ("local-1d", {"block": 32, "memory": 32}),
    ("local-2d", {"image_size": (32, 64), "block": (8, 8), "memory": (4, 4, 4)})])
def test_no_dense_matrix_on_the_no_weights_path(name, kw):
    """Forward + backward at N = 2048 with key padding: no tensor comes near one (N, N) float32
    matrix (16 MiB) — the largest is the gathered scores, O(N (l + N / l)) — and all live tensors
    together stay well below it."""
    N = 2048
    dense = N * N * 4
    kernel = qkv.build_attention(name, **kw)
    q, k, v = (t.requires_grad_(True) for t in heads(1, 1, N, N, E=16))
    pad = torch.ones(1, N, dtype=torch.bool)
    kernel(q, k, v, mask=pad).output.sum().backward()  # warm-up: one-time index caches
    with LargestAllocation() as tracker:
        kernel(q, k, v, mask=pad).output.sum().backward()
    assert tracker.largest < dense / 8, f"{name}: a tensor of {tracker.largest} bytes"
    assert tracker.peak < dense / 2, f"{name}: peak {tracker.peak} bytes"


def test_local_kernels_are_always_causal():
    for name, kw in [("local-1d", {"block": 2, "memory": 1}), ("local-2d", {"image_size": (2, 3)})]:
        assert qkv.build_attention(name, **kw).causal
        assert qkv.build_attention(name, causal=True, **kw).causal
        assert lookup_flags(name) == ("key_padding", False, True)


def lookup_flags(name):
    cls = qkv.registry.lookup("attention", name)
    return cls.supports_mask, cls.supports_state, cls.exact


def test_half_precision_union():
    q, k, v = heads(1, 2, 40, 40, E=8, dtype=torch.float16)
    for kernel in (qkv.build_attention("strided", stride=6), qkv.build_attention("fixed", stride=8, c=2, causal=True)):
        out = kernel(q, k, v).output
        ref = kernel(q.float(), k.float(), v.float()).output
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), ref, atol=5e-3, rtol=5e-3)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name,kw,err,match", [
    ("strided", {"stride": 0}, ValueError, "stride"),
    ("strided", {"stride": -2}, ValueError, "stride"),
    ("strided", {"stride": 2.5}, TypeError, "stride"),
    ("strided", {"stride": 2, "subsets": (3,)}, ValueError, "subsets"),
    ("strided", {"stride": 2, "subsets": ()}, ValueError, "subsets"),
    ("strided", {"stride": 2, "subsets": "12"}, TypeError, "subsets"),
    ("fixed", {"stride": 4, "c": 5}, ValueError, "c must be <= stride"),
    ("fixed", {"stride": 4, "c": 0}, ValueError, "c must be > 0"),
    ("fixed", {"stride": 4}, TypeError, "c"),
    ("local-1d", {"block": 0, "memory": 1}, ValueError, "block"),
    ("local-1d", {"block": 2, "memory": -1}, ValueError, "memory"),
    ("local-2d", {"image_size": 16}, ValueError, "image_size"),
    ("local-2d", {"image_size": (4, 4, 1)}, ValueError, "image_size"),
    ("local-2d", {"image_size": (4, 0)}, ValueError, r"image_size\[1\]"),
    ("local-2d", {"image_size": (4, 4), "block": (2, 2, 2)}, ValueError, "block"),
    ("local-2d", {"image_size": (4, 4), "block": (0, 2)}, ValueError, "block"),
    ("local-2d", {"image_size": (4, 4), "memory": (1, 1)}, ValueError, "memory"),
])
def test_bad_knobs_are_named(name, kw, err, match):
    with pytest.raises(err, match=match):
        qkv.build_attention(name, **kw)


def test_local_2d_rejects_sequences_longer_than_the_image():
    kernel = qkv.build_attention("local-2d", image_size=(3, 4))
    q, k, v = heads(1, 1, 13, 13)
    with pytest.raises(ValueError, match=r"H \* W = 3 \* 4 = 12"):
        kernel(q, k, v)
    with pytest.raises(ValueError, match="more queries"):
        kernel(q, k[:, :, :5], v[:, :, :5])


def test_registry_descriptions():
    listed = qkv.list_attention()
    for name in ("strided", "fixed", "local-1d", "local-2d"):
        assert name in listed and listed[name]
