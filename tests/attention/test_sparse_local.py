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
       causal=st.booleans(), seed=st.integers(0, 1000))
def test_local_1d_equals_dense_softmax_on_its_pattern(N, dm, block, memory, causal, seed):
    M = max(1, N + dm)
    kernel = qkv.build_attention("local-1d", block=block, memory=memory, causal=causal)
    if M == N:
        assert torch.equal(masks.materialize(kernel.pattern(M, N), M, N),
                           masks.materialize(masks.local_1d(block, memory, causal=causal), M, N))
    check_against_dense(kernel, M, N, seed, kernel.pattern(M, N))


@settings(max_examples=30, deadline=None)
@given(H=st.integers(1, 6), W=st.integers(1, 6), bh=st.integers(1, 4), bw=st.integers(1, 4),
       top=st.integers(0, 3), left=st.integers(0, 3), right=st.integers(0, 3),
       short=st.integers(0, 4), fewer=st.integers(0, 4), causal=st.booleans(), seed=st.integers(0, 1000))
def test_local_2d_equals_dense_softmax_on_its_pattern(H, W, bh, bw, top, left, right, short, fewer, causal, seed):
    N = max(1, H * W - short)  # a block-raster prefix of the image (the whole image when short = 0)
    M = max(1, N - fewer)
    kernel = qkv.build_attention("local-2d", image_size=(H, W), block=(bh, bw), memory=(top, left, right),
                                 causal=causal)
    if M == N == H * W:
        assert torch.equal(masks.materialize(kernel.pattern(M, N), M, N),
                           masks.materialize(masks.local_2d((H, W), (bh, bw), (top, left, right), causal), M, N))
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


def test_local_kernels_causal_by_default_and_bidirectional_on_request():
    """Causal (generation) is the default; causal=False is the unmasked neighbourhood, which sees
    later positions of its block — and refuses incremental decoding."""
    for name, kw in [("local-1d", {"block": 2, "memory": 1}), ("local-2d", {"image_size": (2, 3), "block": (2, 2)})]:
        assert qkv.build_attention(name, **kw).causal
        both = qkv.build_attention(name, causal=False, **kw)
        assert not both.causal
        allowed = masks.materialize(both.pattern(6, 6), 6, 6)
        assert allowed[0, 1]  # position 0 sees position 1 of its block
        assert lookup_flags(name) == ("key_padding", True, True)
        q, k, v = heads(1, 1, 6, 6)
        with pytest.raises(ValueError, match="causal"):
            both(q, k, v, return_state=True)


def lookup_flags(name):
    cls = qkv.registry.lookup("attention", name)
    return cls.supports_mask, cls.supports_state, cls.exact


# ----------------------------------------------------------------------------- incremental decoding


INCREMENTAL = [
    ("strided", {"stride": 3}), ("strided", {"stride": 4, "subsets": (1,)}), ("strided", {"stride": 3, "subsets": (2,)}),
    ("fixed", {"stride": 4, "c": 2}), ("fixed", {"stride": 3, "c": 1, "subsets": (2,)}),
    ("fixed", {"stride": 5, "c": 2, "subsets": (1,)}), ("local-1d", {"block": 4, "memory": 3}),
    ("local-1d", {"block": 1, "memory": 0}), ("local-2d", {"image_size": (5, 7), "block": (2, 3), "memory": (1, 2, 1)}),
    ("local-2d", {"image_size": (6, 6), "block": (3, 2), "memory": (2, 0, 3)}),
]


@pytest.mark.parametrize("name,kw", INCREMENTAL)
@settings(max_examples=8, deadline=None)
@given(cuts=st.lists(st.integers(1, 34), max_size=10), seed=st.integers(0, 1000))
def test_incremental_equals_parallel(name, kw, cuts, seed):
    """Pieces of random sizes (single tokens included), each call continuing the returned state,
    give the outputs and weights of one parallel call; with key padding too."""
    N = 35
    kernel = qkv.build_attention(name, causal=True, **kw)
    q, k, v = heads(2, 2, N, N, seed=seed)
    pad = torch.rand(2, N, generator=torch.Generator().manual_seed(seed)) > 0.2
    full = kernel(q, k, v, mask=pad, need_weights=True)
    bounds = sorted(set(cuts)) + [N]
    state, start, outs = None, 0, []
    for stop in bounds:
        held = kernel._state_length(state) if state is not None else 0
        first = start - held  # the state's keys end at position start; masks cover them then the new keys
        piece_mask = _state_mask(kernel, state, pad, start, stop)
        o = kernel(q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop], mask=piece_mask, state=state,
                   return_state=True, need_weights=True)
        outs.append(o.output)
        ref_w = full.weights[:, :, start:stop]
        assert torch.allclose(o.weights.sum(-1), ref_w.sum(-1), atol=1e-5)  # no key counted twice
        assert first >= 0
        state, start = o.state, stop
    torch.testing.assert_close(torch.cat(outs, 2), full.output, atol=1e-5, rtol=1e-5)


def _state_positions(kernel, state, start):
    """The absolute positions of the keys a state holds (the state ends at position ``start``)."""
    if state is None:
        return torch.zeros(0, dtype=torch.long)
    if isinstance(state, qkv.attention.sparse.FixedState):
        l, c = kernel.stride, kernel.c
        nb = state.position // l
        summaries = [b * l + l - c + s for b in range(nb) for s in range(c)] if 2 in kernel.subsets else []
        return torch.tensor(summaries + list(range(nb * l, state.position)), dtype=torch.long)
    return torch.arange(state.offset, state.offset + state.length)


def _state_mask(kernel, state, pad, start, stop):
    cols = torch.cat([_state_positions(kernel, state, start), torch.arange(start, stop)])
    return pad[:, cols]


@pytest.mark.parametrize("name,kw,bound", [
    ("strided", {"stride": 8, "subsets": (1,)}, lambda n: 8),
    ("fixed", {"stride": 8, "c": 2}, lambda n: 8 + 2 * n // 8),
    ("local-1d", {"block": 8, "memory": 5}, lambda n: 8 + 5),
    ("local-2d", {"image_size": (16, 12), "block": (4, 4), "memory": (2, 3, 3)}, lambda n: (2 + 4 + 1) * 12),
])
def test_state_keeps_only_what_the_pattern_can_reach(name, kw, bound):
    """Token by token: the state stays within the pattern's reach (not the sequence length), and the
    keys it dropped are never needed (the outputs still match the parallel call)."""
    N = 192
    kernel = qkv.build_attention(name, causal=True, **kw)
    q, k, v = heads(1, 1, N, N)
    full = kernel(q, k, v).output
    state, outs = None, []
    for t in range(N):
        o = kernel(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state=state, return_state=True)
        state = o.state
        outs.append(o.output)
        assert kernel._state_length(state) <= bound(t + 1), (t, kernel._state_length(state))
    torch.testing.assert_close(torch.cat(outs, 2), full, atol=1e-5, rtol=1e-5)


def test_state_of_another_kernel_is_refused():
    q, k, v = heads(1, 1, 4, 4)
    kv_state = qkv.build_attention("strided", stride=2, causal=True)(q, k, v, return_state=True).state
    with pytest.raises(TypeError, match="FixedState"):
        qkv.build_attention("fixed", stride=2, c=1, causal=True)(q, k, v, state=kv_state)
    with pytest.raises(TypeError, match="KVCache"):
        fixed_state = qkv.build_attention("fixed", stride=2, c=1, causal=True)(q, k, v, return_state=True).state
        qkv.build_attention("local-1d", block=2, memory=1)(q, k, v, state=fixed_state)


# ----------------------------------------------------------------------------- connectivity (Child et al. 2019, §4.2)


def _reach(steps, n):
    """Boolean reachability of a stack of layers with patterns ``steps`` (first layer first): entry
    (i, j) is True when output i of the last layer depends on input j."""
    r = torch.eye(n)
    for allowed in steps:
        r = ((allowed.float() @ r) > 0).float()
    return r > 0


@pytest.mark.parametrize("mod", [masks.strided(5), masks.strided(7), masks.fixed(5, 1), masks.fixed(6, 2)])
def test_factorised_patterns_connect_every_pair_within_p_plus_one_hops(mod):
    """p = 2 (A1, A2): every position reaches every earlier one within p + 1 = 3 hops of the union
    pattern; in fact within 2 — and not within 1 (the pattern is sparse)."""
    n = 60
    allowed = masks.materialize(mod, n, n) | torch.eye(n, dtype=torch.bool)
    earlier = torch.ones(n, n, dtype=torch.bool).tril()
    assert (_reach([allowed] * 3, n) >= earlier).all()
    assert (_reach([allowed] * 2, n) >= earlier).all()
    assert not (allowed >= earlier).all()


def test_strided_interleaved_over_two_layers_reaches_everything():
    """Layer 1 attends with A1 (subsets=(1,)), layer 2 with A2 ((2,)): every output depends on every
    earlier input — checked through the kernels themselves (Jacobian), not only the masks."""
    n, l = 30, 5
    first = qkv.build_attention("strided", stride=l, subsets=(1,), causal=True)
    second = qkv.build_attention("strided", stride=l, subsets=(2,), causal=True)
    x = torch.randn(1, 1, n, 3, dtype=torch.float64)

    def two_layers(x):
        h = first(x, x, x).output
        return second(h, h, h).output

    jac = torch.autograd.functional.jacobian(two_layers, x)[0, 0, :, :, 0, 0, :, :]  # (n, 3, n, 3)
    depends = jac.abs().sum((1, 3)) > 0  # (n, n)
    assert torch.equal(depends, torch.ones(n, n, dtype=torch.bool).tril())
    one = qkv.build_attention("strided", stride=l, subsets=(2,), causal=True)
    jac1 = torch.autograd.functional.jacobian(lambda x: one(x, x, x).output, x)[0, 0, :, :, 0, 0, :, :]
    assert not torch.equal(jac1.abs().sum((1, 3)) > 0, torch.ones(n, n, dtype=torch.bool).tril())


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
    out = kernel(q, k[:, :, :5], v[:, :, :5]).output  # queries before the first key: zero rows
    assert (out[:, :, :8] == 0).all()
    torch.testing.assert_close(out[:, :, 8:], kernel(q[:, :, 8:], k[:, :, :5], v[:, :, :5]).output)


def test_registry_descriptions():
    listed = qkv.list_attention()
    for name in ("strided", "fixed", "local-1d", "local-2d"):
        assert name in listed and listed[name]


# ----------------------------------------------------------------------------- recomputation in chunks


@pytest.mark.parametrize("name,kw", [("strided", {"stride": 3}), ("strided", {"stride": 4, "subsets": (2,)}),
                                     ("fixed", {"stride": 3, "c": 2}), ("fixed", {"stride": 4, "c": 1, "subsets": (1,)})])
@pytest.mark.parametrize("causal", [True, False])
def test_chunked_recomputation_equals_whole_frame(name, kw, causal):
    """Training in chunks of query blocks (recomputed in backward) gives the outputs and gradients
    of the whole frame, with key padding and queries shorter than the keys."""
    q, k, v = (t.requires_grad_(True) for t in heads(2, 1, 25, 29, dtype=torch.float64))
    pad = torch.rand(2, 29, generator=torch.Generator().manual_seed(3)) > 0.2
    whole = qkv.build_attention(name, causal=causal, recompute=0, **kw)
    chunked = qkv.build_attention(name, causal=causal, recompute=3, **kw)
    a = whole(q, k, v, mask=pad).output
    ga = torch.autograd.grad(a.square().sum(), (q, k, v))
    b = chunked(q, k, v, mask=pad).output
    gb = torch.autograd.grad(b.square().sum(), (q, k, v))
    torch.testing.assert_close(b, a)
    for x, y in zip(gb, ga):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("name,kw", [("strided", {"stride": 3}), ("strided", {"stride": 4, "subsets": (2,)}),
                                     ("fixed", {"stride": 3, "c": 2}), ("fixed", {"stride": 4, "c": 1, "subsets": (2,)}),
                                     ("fixed", {"stride": 4, "c": 3, "subsets": (1,)})])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("budget", [1, 40, 200])
def test_inference_chunks_equal_whole_frame_and_reference(name, kw, causal, budget, monkeypatch):
    """Without gradients the query blocks go in chunks of about CHUNK_SCORES scores (here forced
    small: one block, a few, or most per chunk; causal fixed then reads only the summaries up to
    the chunk's last block): the output equals the whole frame's and the dense reference's."""
    from qkv.attention import sparse

    monkeypatch.setattr(sparse, "CHUNK_SCORES", budget)
    q, k, v = heads(2, 2, 25, 29, dtype=torch.float64)
    pad = torch.rand(2, 29, generator=torch.Generator().manual_seed(5)) > 0.2
    kernel = qkv.build_attention(name, causal=causal, **kw)
    with torch.no_grad():
        chunked = kernel(q, k, v, mask=pad).output
        whole = kernel(q, k, v, mask=pad, need_weights=True).output  # the unchunked frame
    ref, _, _ = dense_reference(q, k, v, kernel.pattern(25, 29), pad)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(chunked, ref)


@pytest.mark.parametrize("name,kw", [("strided", {"stride": 2}), ("fixed", {"stride": 2, "c": 1})])
def test_chunked_recomputation_gradcheck(name, kw):
    kernel = qkv.build_attention(name, causal=True, recompute=2, **kw)
    q, k, v = (t.requires_grad_(True) for t in heads(1, 1, 7, 8, E=2, dtype=torch.float64))
    pad = torch.tensor([[True] * 5 + [False] + [True] * 2])
    assert torch.autograd.gradcheck(lambda a, b, c: kernel(a, b, c, mask=pad).output, (q, k, v))


def test_chunked_recomputation_lowers_peak_memory():
    """At N = 4096 the training step's peak falls well below the whole-frame one (the chunk's scores
    instead of all of them); the benchmark (qkv bench complexity) measures it at 16,384."""
    q, k, v = (t.requires_grad_(True) for t in heads(1, 1, 4096, 4096, E=16))
    peaks = {}
    for recompute in (0, 8):
        kernel = qkv.build_attention("strided", stride=64, causal=True, recompute=recompute)
        kernel(q, k, v).output.sum().backward()
        with LargestAllocation() as tracker:
            kernel(q, k, v).output.sum().backward()
        peaks[recompute] = tracker.peak
    assert peaks[8] * 2 < peaks[0], peaks
