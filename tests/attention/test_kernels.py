"""Contract tests run for every registered self-attention kernel (parametrised over the registry):
a new kernel gets them for free. Each kernel is built with its own ``default_knobs`` for the
tests' short sequences (``KNOB_LENGTH``) and, if it draws random numbers on every call, its
``deterministic_kwargs``: no table of knobs lives here."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import qkv
from qkv import masks
from qkv.registry import lookup

KNOB_LENGTH = 16  # the test sequences are at most this long
NAMES = list(qkv.list_attention())


def knobs(name, H=3, E=8, with_heads=True):
    """Kernel ``name``'s example knobs for the test sizes (head arguments included unless
    ``with_heads`` is False: ``MultiHeadAttention`` fills those in itself)."""
    cls = lookup("attention", name)
    kw = {**cls.default_knobs(KNOB_LENGTH, H, E), **(cls.deterministic_kwargs or {})}
    return kw if with_heads else {k: v for k, v in kw.items() if k not in cls.head_kwargs(H, E)}


def build(name, causal=None, H=3, E=8, **extra):
    """Kernel ``name`` with its example knobs; ``causal`` None: its plain form (causal for a
    causal-only kernel, else not)."""
    causal = causal_only(name) if causal is None else causal
    return qkv.build_attention(name, causal=causal, **{**knobs(name, H, E), **extra})


def can_causal(name):
    return lookup("attention", name).supports_causal


def causal_only(name):
    return lookup("attention", name).causal_only


def qkv_tensors(B=2, H=3, M=11, N=11, E=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, E, generator=g, dtype=dtype) for L in (M, N, N))


def literal_attention(q, k, v, allowed, shared_qk=False):
    """softmax(q k^T / sqrt(d)) v over allowed pairs, written with loops (float64).

    ``shared_qk`` (kernels with that capability flag, Reformer): the keys are the unit-normalised
    queries ``k_j = q_j / ||q_j||`` and query ``i`` attends to itself only when no other key is allowed.
    """
    B, H, M, E = q.shape
    if shared_qk:
        k = q / q.norm(dim=-1, keepdim=True)
        eye = torch.eye(M, dtype=torch.bool)
        others = allowed & ~eye
        allowed = torch.where(others.any(-1, keepdim=True), others, allowed & eye)
    N = k.shape[2]
    out = torch.zeros(B, H, M, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(M):
                js = [j for j in range(N) if allowed[b, h, i, j]]
                if not js:
                    continue
                s = [float(q[b, h, i].double() @ k[b, h, j].double()) / math.sqrt(E) for j in js]
                mx = max(s)
                e = [math.exp(x - mx) for x in s]
                z = sum(e)
                for w, j in zip(e, js):
                    out[b, h, i] += (w / z) * v[b, h, j].double()
    return out


def allowed_pairs(kernel, B, H, M, N, mask=None):
    mod = kernel.pattern(M, N)
    allowed = torch.ones(B, H, M, N, dtype=torch.bool)
    if mod is not None:
        allowed = allowed & masks.materialize(mod, M, N)
    if mask is not None:
        allowed = allowed & qkv.attention.normalize_mask(mask, B, H, M, N)
    return allowed


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [False, True])
def test_exact_kernels_match_literal_reference(name, causal):
    if causal and not can_causal(name):
        pytest.skip(f"{name} cannot be causal")
    if not causal and causal_only(name):
        pytest.skip(f"{name} is causal only")
    kernel = build(name, causal=causal)
    if not kernel.exact:
        if kernel.exact_kwargs is None:
            pytest.skip(f"{name} is approximate: see its error test")
        kernel = build(name, causal=causal, **kernel.exact_kwargs)  # the knobs that make it exact
    q, k, v = qkv_tensors(M=11, N=11)
    ref = literal_attention(q, k, v, allowed_pairs(kernel, 2, 3, 11, 11), shared_qk=kernel.shared_qk)
    for need_weights in (False, True):
        out = kernel(q, k, v, need_weights=need_weights)
        torch.testing.assert_close(out.output.double(), ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_weights_are_distributions_on_the_pattern(name):
    kernel = build(name)
    if not kernel.exact:
        if kernel.exact_kwargs is None:
            pytest.skip("approximate kernel")
        kernel = build(name, **kernel.exact_kwargs)
    q, k, v = qkv_tensors(M=9, N=9)
    out = kernel(q, k, v, need_weights=True)
    assert out.weights.shape == (2, 3, 9, 9)
    allowed = allowed_pairs(kernel, 2, 3, 9, 9)
    assert (out.weights[~allowed] == 0).all()
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(2, 3, 9))


@pytest.mark.parametrize("name", NAMES)
def test_key_padding_mask_does_not_leak(name):
    kernel = build(name)
    if kernel.supports_mask == "none":
        pytest.skip("kernel takes no mask")
    q, k, v = qkv_tensors(M=10, N=10)
    pad = masks.padding_mask(torch.tensor([7, 10]), 10)  # (B, N)
    out = kernel(q, k, v, mask=pad).output
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 7:] = 1e3
    v2[0, :, 7:] = -1e3
    out2 = kernel(q, k2, v2, mask=pad).output
    torch.testing.assert_close(out2, out)


@pytest.mark.parametrize("name", NAMES)
def test_fully_masked_queries_give_zeros(name):
    kernel = build(name)
    if kernel.supports_mask == "none":
        pytest.skip("kernel takes no mask")
    q, k, v = qkv_tensors(M=6, N=6)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1] = True
    out = kernel(q, k, v, mask=pad, need_weights=kernel.exact)
    assert torch.isfinite(out.output).all()
    assert (out.output[0] == 0).all()


@pytest.mark.parametrize("name", [n for n in NAMES if can_causal(n)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_outputs_depend_on_no_later_position(name, need_weights):
    """A causal output at position i depends on nothing after i (issue 20 item 3: linear attention's
    eps term was formed from maxima over a whole chunk). Replacing the queries, keys and values
    after t moves no output at or before t beyond float64 rounding, for every t (chunk boundaries
    included), with and without key padding."""
    kernel = build(name, causal=True).double()
    q, k, v = qkv_tensors(M=12, N=12, dtype=torch.float64)
    pads = [None]
    if kernel.supports_mask != "none":
        pads.append(torch.tensor([[True, False] * 6, [True] * 9 + [False] * 3]))
    g = torch.Generator().manual_seed(5)
    for pad in pads:
        out = kernel(q, k, v, mask=pad, need_weights=need_weights)
        for t in range(11):
            later = [x.clone() for x in (q, k, v)]
            for x in later:
                x[:, :, t + 1:] = torch.randn(x[:, :, t + 1:].shape, generator=g, dtype=torch.float64) * 4 + 1
            moved = kernel(*later, mask=pad, need_weights=need_weights)
            torch.testing.assert_close(moved.output[:, :, :t + 1], out.output[:, :, :t + 1], rtol=0, atol=1e-12)
            if out.weights is not None:
                torch.testing.assert_close(moved.weights[:, :, :t + 1], out.weights[:, :, :t + 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pieces", [[1] * 10, [3, 1, 4, 2], [10]])
def test_stepwise_equals_parallel(name, pieces):
    """Feeding a sequence in pieces (one token at a time included) computes the same numbers as one
    call, with the kernel's default knobs: float64, to rounding (linear attention's eps term
    differed by ~1e-6 before issue 20 item 3)."""
    cls = lookup("attention", name)
    if not cls.supports_state:
        pytest.skip(f"{name} keeps no incremental state")
    kernel = build(name, causal=True).double()
    q, k, v = qkv_tensors(M=10, N=10, dtype=torch.float64)
    full = kernel(q, k, v).output
    state, outs, start = None, [], 0
    for size in pieces:
        sl = slice(start, start + size)
        o = kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], state=state, return_state=True)
        outs.append(o.output)
        state = o.state
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_flow_and_gradcheck(name):
    kernel = build(name, causal=can_causal(name), H=2, E=4)
    q, k, v = (t.requires_grad_(True) for t in qkv_tensors(B=1, H=2, M=7, N=7, E=4, dtype=torch.float64))
    pad = torch.tensor([[True] * 6 + [False]])
    mask = pad if kernel.supports_mask != "none" else None
    assert torch.autograd.gradcheck(lambda a, b, c: kernel(a, b, c, mask=mask).output, (q, k, v))
    if kernel.exact:
        assert torch.autograd.gradcheck(lambda a, b, c: kernel(a, b, c, mask=mask, need_weights=True).output, (q, k, v))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs(name, dtype):
    kernel = build(name)
    q, k, v = qkv_tensors(M=16, N=16, dtype=dtype)
    out = kernel(q, k, v)
    assert out.output.dtype == dtype and torch.isfinite(out.output).all()
    ref = kernel(q.float(), k.float(), v.float()).output
    torch.testing.assert_close(out.output.float(), ref, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_named(name):
    kernel = build(name)
    q, k, v = qkv_tensors()
    with pytest.raises(ValueError, match="q must be 4-D"):
        kernel(q[0], k, v)
    with pytest.raises(ValueError, match="head size"):
        kernel(q, k[..., :4], v)
    with pytest.raises(ValueError, match="number of keys"):
        kernel(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match="batch, heads"):
        kernel(q, k[:1], v[:1])
    with pytest.raises(TypeError, match="mask"):
        kernel(q, k, v, mask=torch.ones(2, 11))
    with pytest.raises(ValueError, match="mask"):
        kernel(q, k, v, mask=torch.ones(3, 11, dtype=torch.bool))
    with pytest.raises(TypeError, match="q must be a floating"):
        kernel(q.long(), k, v)
    if not kernel.causal:
        with pytest.raises(ValueError, match="causal"):
            kernel(q, k, v, return_state=True)


@pytest.mark.parametrize("name", NAMES)
def test_dropout_is_applied_or_refused(name):
    """A kernel either applies dropout (and is deterministic in eval mode) or refuses dropout > 0 —
    never accepts it silently (design.md: every kernel takes ``dropout``)."""
    cls = lookup("attention", name)
    if not cls.applies_dropout:
        with pytest.raises(ValueError, match="dropout must be 0, got dropout=0.1"):
            build(name, dropout=0.1)
        assert build(name, dropout=0.0).dropout == 0.0
        return
    kernel = build(name, dropout=0.1).eval()
    q, k, v = qkv_tensors(M=9, N=9)
    torch.testing.assert_close(kernel(q, k, v).output, kernel(q, k, v).output)


def test_unknown_names_and_kwargs():
    with pytest.raises(ValueError, match="unknown attention 'sofmax'.*Did you mean 'softmax'"):
        qkv.build_attention("sofmax")
    with pytest.raises(TypeError, match="radus"):
        qkv.build_attention("window", radus=3)
    with pytest.raises(ValueError, match="radius"):
        qkv.build_attention("window", radius=-1)
    with pytest.raises(TypeError, match="radius"):
        qkv.build_attention("window")
    with pytest.raises(ValueError, match="dropout"):
        qkv.build_attention("softmax", dropout=1.5)


def test_list_attention_describes_every_kernel():
    listed = qkv.list_attention()
    assert {"softmax", "window"} <= set(listed)
    assert all(desc for desc in listed.values())


@settings(max_examples=20, deadline=None)
@given(M=st.integers(1, 20), extra=st.integers(0, 6), r=st.integers(0, 8), block=st.integers(1, 9),
       causal=st.booleans(), seed=st.integers(0, 1000))
def test_window_blocks_match_dense_pattern(M, extra, r, block, causal, seed):
    """The blocked window kernel equals dense softmax restricted to |i - j| <= r for any lengths,
    block sizes and cache offsets (N = M + extra keys, queries aligned to the end)."""
    N = M + extra
    q, k, v = qkv_tensors(B=1, H=2, M=M, N=N, E=4, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    pad = torch.rand(1, N, generator=g) > 0.2
    kernel = qkv.build_attention("window", radius=r, causal=causal, block=block)
    out = kernel(q, k, v, mask=pad, need_weights=True)
    allowed = masks.materialize(masks.window(r, causal=causal, offset=N - M), M, N) & pad[:, None, :]
    ref = qkv.build_attention("softmax")(q, k, v, mask=allowed[:, None], need_weights=True)
    torch.testing.assert_close(out.output, ref.output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights, ref.weights, atol=1e-6, rtol=1e-5)


def test_window_cache_is_bounded():
    kernel = qkv.build_attention("window", radius=4, causal=True)
    q, k, v = qkv_tensors(M=20, N=20)
    state = None
    for t in range(20):
        state = kernel(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], state=state, return_state=True).state
        assert state.length <= 4
    assert state.offset == 16


def test_window_full_masks_are_rejected_with_advice():
    q, k, v = qkv_tensors(M=5, N=5)
    with pytest.raises(ValueError, match="key-padding"):
        qkv.build_attention("window", radius=1)(q, k, v, mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))


def test_softmax_sdpa_path_equals_explicit_path_with_cache_offset():
    kernel = qkv.build_attention("softmax", causal=True)
    q, k, v = qkv_tensors(M=4, N=9)
    fast = kernel(q, k, v).output
    slow = kernel(q, k, v, need_weights=True)
    torch.testing.assert_close(fast, slow.output)
    allowed = masks.causal_mask(4, 9, offset=5)
    assert (slow.weights[..., ~allowed] == 0).all()


def test_kv_cache_appends_in_place_while_decoding_and_branches_stay_true():
    """Without autograd the softmax KV cache grows into buffers written in place (no re-copy of
    the cached positions per step); continuing an older state (a branch) copies, so every state
    keeps its own keys and stepwise still equals parallel."""
    kernel = qkv.build_attention("softmax", causal=True)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g) for _ in range(3))
    full = kernel(q, k, v).output
    with torch.no_grad():
        first = kernel(q[:, :, :5], k[:, :, :5], v[:, :, :5], return_state=True)
        a = kernel(q[:, :, 5:6], k[:, :, 5:6], v[:, :, 5:6], state=first.state, return_state=True)
        b = kernel(q[:, :, 6:7], k[:, :, 6:7], v[:, :, 6:7], state=a.state, return_state=True)
        assert b.state.room[0] is a.state.room[0] is first.state.room[0]  # one buffer, appended in place
        # a branch from `first` with other keys: copied, and `a`/`b` keep theirs
        other_k, other_v = torch.randn(2, 3, 1, 4, generator=g), torch.randn(2, 3, 1, 4, generator=g)
        branch = kernel(q[:, :, 5:6], other_k, other_v, state=first.state, return_state=True)
        assert branch.state.room[0] is not first.state.room[0]
        torch.testing.assert_close(a.state.key[:, :, 5:6], k[:, :, 5:6])
        torch.testing.assert_close(branch.state.key[:, :, 5:6], other_k)
        rest = kernel(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], state=b.state, return_state=True)
    stepwise = torch.cat([first.output, a.output, b.output, rest.output], dim=2)
    torch.testing.assert_close(stepwise, full)
    assert first.state.length == 5 and rest.state.length == 9


AUTOCAST = [pytest.param("cpu", torch.bfloat16, id="cpu-bf16")] + [
    pytest.param("cuda", dtype, id=f"cuda-{name}",
                 marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16))]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device, dtype", AUTOCAST)
def test_autocast_forward_and_backward_match_float32(name, causal, device, dtype):
    """Under ``torch.autocast`` (bfloat16 on the CPU; bfloat16 and float16 on CUDA) — the inputs
    coming out of an autocast linear layer in half precision — forward and backward run and agree
    with float32 to half precision (the kernels keep their sums in float32; a custom backward must
    meet its own dtypes)."""
    if causal and not can_causal(name):
        pytest.skip(f"{name} cannot be causal")
    if not causal and causal_only(name):
        pytest.skip(f"{name} is causal only")
    kernel = build(name, causal=causal).to(device)
    torch.manual_seed(0)
    proj = torch.nn.Linear(8, 8).to(device)
    q, k, v = (x.to(device) for x in qkv_tensors(B=2, H=3, M=11, N=11))
    upstream = torch.randn(2, 3, 11, 8, generator=torch.Generator().manual_seed(1)).to(device)

    def run(autocast):
        proj.zero_grad()
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        with torch.autocast(device, dtype=dtype, enabled=autocast):
            out = kernel(*(proj(x) for x in leaves)).output
        (out.float() * upstream).sum().backward()
        return out, [x.grad for x in leaves] + [proj.weight.grad.clone()]

    ref, ref_grads = run(False)
    out, grads = run(True)
    assert out.dtype == dtype
    scale = lambda t: float(t.abs().max()) + 1e-3
    assert float((out.detach().float() - ref.detach()).abs().max()) <= 0.05 * scale(ref.detach()), name
    for g, r in zip(grads, ref_grads):
        if r is None:  # an input the kernel does not read (shared-QK LSH's keys)
            assert g is None
            continue
        assert g.dtype == torch.float32 and torch.isfinite(g).all()
        assert float((g - r).abs().max()) <= 0.08 * scale(r), name
