"""Property-based edges of every registered kernel and of MultiHeadAttention (issue 14).

Over shapes (empty batches, queries, keys included), masks (fully masked rows and batch entries
included), dtypes, magnitudes up to 1e4 and each kernel's own knobs, a call either raises a named
ValueError/TypeError or returns outputs of the right shape and dtype — finite for finite input, zero
on rows that have no allowed key, inside the values' range for exact kernels, the same with and
without ``need_weights`` — and a causal kernel with a state continues a sequence fed in pieces
(empty pieces included) as it computes it at once. Parametrised over the registry: each kernel's
knobs are drawn from its own ``knob_choices`` (else it runs with its ``default_knobs``): no table here.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from test_kernels import build as contract_build

import qkv
from qkv.registry import check_kwargs, lookup

NAMES = list(qkv.list_attention())
# QKV_PROPERTY_EXAMPLES raises the count for a longer search (e.g. before a release).
EXAMPLES = settings(max_examples=int(os.environ.get("QKV_PROPERTY_EXAMPLES", 500)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HALF = (torch.bfloat16, torch.float16)
# 0: all-zero inputs; 1e4: q . k ~ 1e8 (float16 holds 65504: scores must be formed in float32)
MAGNITUDES = [0.0, 1e-3, 1.0, 30.0, 1e3, 1e4]


def knobs(name):
    """Each knob drawn from the kernel's own ``knob_choices`` (head sizes are filled in by
    test_kernels.build / MultiHeadAttention); a kernel that names none runs with its ``default_knobs``."""
    choices = lookup("attention", name).knob_choices()
    return st.fixed_dictionaries({knob: st.sampled_from(list(values)) for knob, values in choices.items()})


@pytest.mark.parametrize("name", NAMES)
def test_knob_choices_are_the_kernels_own_knobs(name):
    """A knob the constructor does not take would make every drawn example a refusal (a subclass
    inherits its parent's choices: it overrides them when its knobs differ)."""
    cls = lookup("attention", name)
    check_kwargs(cls, cls.knob_choices(), f"attention {name!r}")  # TypeError naming an unknown knob
    assert all(len(values) > 0 for values in cls.knob_choices().values())


def tensor(shape, dtype, magnitude, shift, seed):
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(*shape, generator=g, dtype=torch.float64) + shift) * magnitude).to(dtype)


def key_mask(kind, B, H, M, N, seed):
    """None, a key-padding mask (B, N) — "empty-batch" masks every key of batch entry 0 — or a full
    (B, H|1, M, N) mask whose first query row is fully masked."""
    if kind == "none":
        return None
    g = torch.Generator().manual_seed(seed)
    if kind == "full":
        mask = torch.rand(B, 1 + (seed % 2) * (H - 1), M, N, generator=g) < 0.6
        if M:
            mask[:, :, 0] = False
        return mask
    mask = torch.rand(B, N, generator=g) < 0.7
    if kind == "empty-batch" and B:
        mask[0] = False
    return mask


def rows_without_keys(kernel, mask, B, H, M, N):
    """(B, H, M) True where a query certainly has no allowed key: masked rows, no keys, and causal
    queries aligned before the first key."""
    none = torch.zeros(B, H, M, dtype=torch.bool)
    if N == 0:
        return ~none
    if mask is not None:
        none |= ~qkv.attention.normalize_mask(mask, B, H, M, N).any(-1).expand(B, H, M)
    if kernel.causal and M > N:
        none[:, :, :M - N] = True
    return none


def _tolerance(dtype):
    return {"atol": 3e-2, "rtol": 3e-2} if dtype in HALF else {"atol": 1e-4, "rtol": 1e-4}


def check_call(kernel, q, k, v, mask, need_weights, dtype, magnitude):
    """One kernel call: a named error, or outputs with the properties of the module docstring."""
    B, H, M, _ = q.shape
    N, Ev = k.shape[-2], v.shape[-1]
    try:
        out = kernel(q, k, v, mask=mask, need_weights=need_weights)
    except (ValueError, TypeError) as e:
        assert str(e), "an error must say what is wrong"
        if os.environ.get("QKV_PROPERTY_LOG"):
            print("REFUSED", type(kernel).__name__, type(e).__name__, str(e)[:90])
        return None
    assert out.output.shape == (B, H, M, Ev) and out.output.dtype == dtype
    assert torch.isfinite(out.output).all(), f"non-finite output from finite input ({dtype}, magnitude {magnitude})"
    assert (out.output[rows_without_keys(kernel, mask, B, H, M, N)] == 0).all(), "a row with no allowed key is not 0"
    if need_weights:
        assert out.weights.shape == (B, H, M, N) and torch.isfinite(out.weights).all()
    if kernel.exact and N and B * H * M:
        # a convex combination of the values (half types: rounding of the result)
        bound = v.abs().amax().float() * (1.01 if dtype in HALF else 1 + 1e-5) + 1e-30
        assert (out.output.float().abs() <= bound).all()
    if need_weights and magnitude <= 1.0:
        # the weights path and the fused path compute the same attention
        fused = kernel(q, k, v, mask=mask).output
        torch.testing.assert_close(out.output.float(), fused.float(), **_tolerance(dtype))
    return out


def check_pieces(kernel, q, k, v, cuts, dtype):
    """Stepwise == parallel, fed in pieces at ``cuts`` (empty pieces included)."""
    full = kernel(q, k, v).output
    M = q.shape[-2]
    bounds = [0] + sorted(min(c, M) for c in cuts) + [M]
    state, outs = None, []
    for a, b in zip(bounds, bounds[1:]):
        o = kernel(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state=state, return_state=True)
        assert o.output.shape[-2] == b - a and o.state is not None
        outs.append(o.output)
        state = o.state
    torch.testing.assert_close(torch.cat(outs, dim=2).float(), full.float(), **_tolerance(dtype))


@pytest.mark.parametrize("name", NAMES)
@EXAMPLES
@given(data=st.data(), B=st.integers(0, 2), H=st.integers(1, 2), M=st.integers(0, 6), N=st.integers(0, 6),
       E=st.integers(1, 4), Ev=st.integers(1, 3), dtype=st.sampled_from(DTYPES), magnitude=st.sampled_from(MAGNITUDES),
       shift=st.sampled_from([0.0, -1.0, 1.0]), need_weights=st.booleans(), seed=st.integers(0, 2**16))
def test_kernel_properties(name, data, B, H, M, N, E, Ev, dtype, magnitude, shift, need_weights, seed):
    cls = lookup("attention", name)
    causal = True if cls.causal_only else data.draw(st.booleans()) if cls.supports_causal else False
    kw = data.draw(knobs(name))
    if kw.get("init_span") is not None and data.draw(st.booleans()):
        kw["dynamic"], kw["d_head"] = True, E
    try:
        kernel = contract_build(name, causal, H=H, E=E, **kw)
    except (ValueError, TypeError) as e:  # a knob the kernel refuses, by name
        assert str(e)
        return
    kinds = ["none", "padding", "empty-batch"] * (kernel.supports_mask != "none") + ["full"] * (kernel.supports_mask == "full")
    mask = key_mask(data.draw(st.sampled_from(kinds or ["none"])), B, H, M, N, seed)
    q = tensor((B, H, M, E), dtype, magnitude, shift, seed)
    k = tensor((B, H, N, E), dtype, magnitude, shift, seed + 1)
    v = tensor((B, H, N, Ev), dtype, max(magnitude, 1.0), 0.0, seed + 2)
    with torch.no_grad():
        out = check_call(kernel, q, k, v, mask, need_weights, dtype, magnitude)
        bounded = getattr(kernel, "mem_len", None) is not None and kernel.mem_len < N  # sees only mem_len back
        if out is not None and kernel.supports_state and kernel.causal and magnitude <= 1.0 and dtype not in HALF \
                and not bounded:
            cuts = data.draw(st.lists(st.integers(0, N), max_size=3))
            try:
                check_pieces(kernel, k, k, v, cuts, dtype)  # self-attention, fed in pieces
            except (ValueError, TypeError) as e:  # e.g. more keys than local-2d's image (empty queries skip that check)
                assert str(e)


@EXAMPLES
@given(data=st.data(), name=st.sampled_from(NAMES), B=st.integers(0, 2), H=st.integers(1, 2), M=st.integers(0, 5),
       N=st.integers(0, 5), E=st.integers(1, 3), dtype=st.sampled_from(DTYPES), input_dtype=st.sampled_from([None, *DTYPES]),
       magnitude=st.sampled_from(MAGNITUDES), cross=st.booleans(), need_weights=st.booleans(),
       seed=st.integers(0, 2**16))
def test_multihead_properties(data, name, B, H, M, N, E, dtype, input_dtype, magnitude, cross, need_weights, seed):
    """MultiHeadAttention around any kernel: empty shapes, masks, dtypes (a mismatch between input and
    parameters is a TypeError naming both), magnitudes."""
    cls = lookup("attention", name)
    causal = True if cls.causal_only else data.draw(st.booleans()) if cls.supports_causal else False
    kw = data.draw(knobs(name))
    d = H * E
    torch.manual_seed(seed)
    try:
        mha = qkv.MultiHeadAttention(d, H, name, causal=causal, **kw).to(dtype)
    except (ValueError, TypeError) as e:
        assert str(e)
        return
    x_dtype = input_dtype or dtype
    x = tensor((B, M, d), x_dtype, magnitude, 0.0, seed)
    memory = tensor((B, N, d), x_dtype, magnitude, 0.0, seed + 1) if cross else None
    n_keys = N if cross else M
    kinds = ["none", "padding", "empty-batch"] * (mha.kernel.supports_mask != "none")
    mask = key_mask(data.draw(st.sampled_from(kinds or ["none"])), B, H, M, n_keys, seed)
    with torch.no_grad():
        try:
            out = mha(x, memory, mask=mask, need_weights=need_weights)
        except TypeError as e:
            if x_dtype != dtype:
                assert str(x_dtype) in str(e) and str(dtype) in str(e)
            return
        except ValueError as e:
            assert str(e)
            return
    assert x_dtype == dtype, "a dtype mismatch between input and parameters must be a TypeError"
    assert out.output.shape == (B, M, d) and out.output.dtype == dtype
    assert torch.isfinite(out.output).all(), f"non-finite output from finite input ({dtype}, magnitude {magnitude})"
    if need_weights:
        assert out.weights.shape == (B, H, M, n_keys)
