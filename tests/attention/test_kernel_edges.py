"""The edges of every registered kernel and of MultiHeadAttention (issue 14, items 14-17): empty
inputs, extreme magnitudes of linear attention's feature map, half precision on the weights path,
non-finite values behind a mask, queries before the first key, and dtype mismatches.
Parametrised over the registry: a new kernel gets them for free (its own default_knobs, see test_kernels)."""

import math

import pytest
import torch
from test_kernels import build as contract_build, knobs

import qkv
from qkv.attention.linear import elu_plus_one
from qkv.registry import lookup

NAMES = list(qkv.list_attention())
CAUSAL = [(name, causal) for name in NAMES for causal in (False, True)
          if (lookup("attention", name).supports_causal if causal else not lookup("attention", name).causal_only)]


def build(name, causal=None, H=2, E=4, **extra):
    return contract_build(name, causal, H=H, E=E, **extra)


def heads(B, H, M, N, E=4, Ev=3, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, M, E, generator=g) * scale).to(dtype)
    k = (torch.randn(B, H, N, E, generator=g) * scale).to(dtype)
    v = torch.randn(B, H, N, Ev, generator=g).to(dtype)
    return q, k, v


# ------------------------------------------------------------------ 14. empty inputs


@pytest.mark.parametrize("name,causal", CAUSAL)
@pytest.mark.parametrize("B,M,N", [(0, 5, 5), (2, 0, 5), (2, 5, 0), (2, 0, 0), (0, 0, 0)])
def test_empty_inputs_give_empty_outputs(name, causal, B, M, N):
    kernel = build(name, causal)
    q, k, v = heads(B, 2, M, N)
    if M != N:
        try:
            kernel(*heads(2, 2, M + 1, N + 2))
        except ValueError:  # the kernel needs as many queries as keys (lsh): empty or not, it says so
            with pytest.raises(ValueError):
                kernel(q, k, v)
            return
    for need_weights in (False, True):
        out = kernel(q, k, v, need_weights=need_weights)
        assert out.output.shape == (B, 2, M, 3) and (out.output == 0).all()
        if need_weights:
            assert out.weights.shape == (B, 2, M, N) and (out.weights == 0).all()


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).supports_state])
def test_empty_decoding_steps_keep_the_state(name):
    """Empty steps (no token) before, between and after real ones change nothing."""
    kernel = build(name, causal=True)
    q, k, v = heads(2, 2, 6, 6)
    full = kernel(q, k, v).output
    state, outs, start = None, [], 0
    for size in (0, 2, 0, 0, 3, 0, 1, 0):
        sl = slice(start, start + size)
        o = kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], state=state, return_state=True)
        assert o.output.shape == (2, 2, size, 3) and o.state is not None
        outs.append(o.output)
        state, start = o.state, start + size
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=1e-5, rtol=1e-5)
    # a batch of no sequence keeps a state of no sequence
    o = kernel(*heads(0, 2, 2, 2), return_state=True)
    assert o.output.shape == (0, 2, 2, 3)
    assert kernel(*heads(0, 2, 1, 1), state=o.state, return_state=True).output.shape == (0, 2, 1, 3)


@pytest.mark.parametrize("name", NAMES)
def test_multihead_batch_size_zero(name):
    causal = lookup("attention", name).supports_causal
    mha = qkv.MultiHeadAttention(8, 2, name, causal=causal, **knobs(name, H=2, E=4, with_heads=False))
    x = torch.randn(0, 5, 8)
    out = mha(x, need_weights=True)
    assert out.output.shape == (0, 5, 8) and out.weights.shape == (0, 2, 5, 5)
    out.output.sum().backward()  # still part of the graph
    assert mha.out_proj.weight.grad is not None


# ------------------------------------------------------------------ 15. elu + 1 without cancellation


def test_elu_plus_one_does_not_cancel():
    x = torch.tensor([-200.0, -80.0, -30.0, -17.0, -1.0, 0.0, 2.0])
    torch.testing.assert_close(elu_plus_one(x), torch.where(x > 0, x + 1, x.double().exp().float()), rtol=1e-6, atol=0)
    assert (elu_plus_one(x[1:]) > 0).all()
    x = torch.tensor([-30.0, 100.0], dtype=torch.float64, requires_grad=True)
    elu_plus_one(x).sum().backward()  # the branch not taken overflows nowhere
    torch.testing.assert_close(x.grad, torch.tensor([math.exp(-30.0), 1.0], dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shift", [-30.0, -200.0, -1e4])
def test_linear_attention_is_a_weighted_average_at_extreme_magnitudes(causal, shift):
    """phi(x) = exp(x) below 0: the weights phi(q_i) . phi(k_j) / sum are those of the literal
    equation in float64 (exp(-200) is representable there), not 0."""
    q, k, v = heads(1, 2, 5, 5, E=4, dtype=torch.float64, seed=1)
    q, k = (q + shift).float().double(), (k + shift).float().double()  # the float32 inputs, exactly
    kernel = qkv.build_attention("linear", causal=causal)
    out = kernel(q.float(), k.float(), v.float(), need_weights=True)
    # literal, in log space: log(phi_q_i . phi_k_j) = logsumexp_e(q_ie + k_je) for x <= 0
    logw = torch.logsumexp(q.unsqueeze(-2) + k.unsqueeze(-3), dim=-1)  # (B, H, M, N)
    if causal:
        logw = logw.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    w = torch.softmax(logw, dim=-1)
    torch.testing.assert_close(out.output.double(), w @ v, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.weights.double(), w, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ 16. half precision, weights path


@pytest.mark.parametrize("name,causal", CAUSAL)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_path_matches_fused_path(name, causal, dtype):
    """q . k = 1e4 E overflows float16 before the 1/sqrt(E) scale; both paths must agree.

    Seeded: at scores of ~2500 a bfloat16 product (Linformer's projected keys, kept in bfloat16)
    rounds by several units, so for some random projections (1 in 30 seeds) a near tie flips
    against the float32 reference; what this test checks is the overflow, not that rounding."""
    torch.manual_seed(0)
    kernel = build(name, causal, E=16)
    g = torch.Generator().manual_seed(0)
    q, k = (100.0 * torch.randn(1, 2, 9, 16, generator=g).sign()).to(dtype), (100.0 * torch.randn(1, 2, 9, 16, generator=g).sign()).to(dtype)
    v = torch.randn(1, 2, 9, 3, generator=g).to(dtype)
    fused = kernel(q, k, v).output
    slow = kernel(q, k, v, need_weights=True)
    assert torch.isfinite(slow.output).all() and torch.isfinite(slow.weights).all()
    assert slow.output.dtype == dtype and slow.weights.dtype == dtype
    torch.testing.assert_close(slow.output.float(), fused.float(), atol=2e-2, rtol=2e-2)
    ref = kernel(q.float(), k.float(), v.float()).output
    torch.testing.assert_close(slow.output.float(), ref, atol=5e-2, rtol=5e-2)


# ------------------------------------------------------------------ 17. masks, causal edges, dtypes


@pytest.mark.parametrize("name,causal", CAUSAL)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_values_at_masked_keys_have_no_influence(name, causal, bad):
    kernel = build(name, causal)
    q, k, v = heads(2, 2, 8, 8)
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[0, 2] = pad[0, 6:] = False
    pad[1] = False  # a fully masked batch entry
    clean = kernel(q, k, v, mask=pad)
    hidden = ~pad[:, None, :, None]  # (B, 1, N, 1)
    k2, v2 = k.masked_fill(hidden, bad), v.masked_fill(hidden, bad)
    for need_weights in (False, True):
        out = kernel(q, k2, v2, mask=pad, need_weights=need_weights)
        assert torch.isfinite(out.output).all()
        torch.testing.assert_close(out.output, clean.output)
        assert (out.output[1] == 0).all()


def test_non_finite_values_at_keys_masked_for_every_query_of_a_full_mask():
    kernel = qkv.build_attention("softmax")
    q, k, v = heads(1, 2, 4, 6)
    mask = torch.ones(1, 2, 4, 6, dtype=torch.bool)
    mask[:, 0, :, 1] = False  # key 1 hidden from every query of head 0
    v2 = v.clone()
    v2[:, 0, 1] = float("nan")
    for need_weights in (False, True):
        torch.testing.assert_close(kernel(q, k, v2, mask=mask, need_weights=need_weights).output,
                                   kernel(q, k, v, mask=mask).output)


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).supports_causal])
def test_causal_queries_before_the_first_key_are_zero_rows(name):
    """One behaviour for every causal kernel: M > N aligns the first M - N queries before key 0."""
    kernel = build(name, causal=True)
    q, k, v = heads(2, 2, 7, 3)
    for need_weights in (False, True):
        out = kernel(q, k, v, need_weights=need_weights)
        assert out.output.shape == (2, 2, 7, 3) and (out.output[:, :, :4] == 0).all()
        tail = kernel(q[:, :, 4:], k, v, need_weights=need_weights)
        torch.testing.assert_close(out.output[:, :, 4:], tail.output)
        if need_weights:
            assert out.weights.shape == (2, 2, 7, 3) and (out.weights[:, :, :4] == 0).all()
    assert (kernel(q, k[:, :, :0], v[:, :, :0]).output == 0).all()


def test_multihead_dtype_mismatch_names_both_dtypes():
    mha = qkv.MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match="query has dtype torch.float64.*torch.float32"):
        mha(x.double())
    with pytest.raises(TypeError, match="key has dtype torch.float64.*torch.float32"):
        mha(x, x.double())
    with pytest.raises(TypeError, match="value has dtype torch.bfloat16.*torch.float32"):
        mha(x, x, x.bfloat16())
    with pytest.raises(TypeError, match="torch.float32, torch.float64"):
        mha(x, kv=tuple(t.double() for t in mha.project_kv(x)))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts: accepted
        assert mha(x).output.shape == (1, 3, 8)
    assert mha.double()(x.double()).output.dtype == torch.float64


@pytest.mark.parametrize("name", NAMES)
def test_kernel_dtype_mismatch_names_both_dtypes(name):
    kernel = build(name)
    q, k, v = heads(1, 2, 3, 3)
    with pytest.raises(TypeError, match="torch.float32, torch.float64"):
        kernel(q, k.double(), v)


# ------------------------------------------------------------------ validation before the empty shortcut


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).supports_state])
@pytest.mark.parametrize("B,M", [(2, 3), (0, 3), (2, 0)])
def test_a_junk_state_is_refused_even_for_empty_inputs(name, B, M):
    """Issue 20 item 6: with an empty batch or length the edge shortcut returned a junk ``state``
    unchecked. The state's type is checked at the boundary, before any shortcut."""
    kernel = build(name, causal=True)
    with pytest.raises(TypeError, match="state must be"):
        kernel(*heads(B, 2, M, M), state="junk", return_state=True)


@pytest.mark.parametrize("B,L", [(0, 5), (2, 0)])
def test_kernel_checks_run_for_empty_inputs(B, L):
    """lsh's M != N and linformer's N > seq_len were accepted when the batch or length was empty."""
    q, _, _ = heads(B, 2, L, L)
    _, k, v = heads(B, 2, L + 3, L + 3)
    with pytest.raises(ValueError, match="same length"):
        build("lsh")(q, k, v)
    linformer = build("linformer", seq_len=4)
    with pytest.raises(ValueError, match="seq_len=4"):
        linformer(*heads(B, 2, 0 if L == 0 else 6, 6))
    with pytest.raises(ValueError, match="heads"):
        build("relative", H=3)(*heads(B, 2, L, L))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_values_at_keys_padded_per_head_have_no_influence(bad):
    """A key-padding mask of its own per head, (B, H, 1, N): only the keys each head hides are
    cleaned; a non-finite value at a key some head still sees reaches that head's output."""
    kernel = qkv.build_attention("softmax")
    q, k, v = heads(2, 3, 5, 7)
    pad = torch.ones(2, 3, 1, 7, dtype=torch.bool)
    pad[0, 1, 0, 4] = pad[1, :, 0, 0] = False
    clean = kernel(q, k, v, mask=pad).output
    v2 = v.clone()
    v2[0, 1, 4] = v2[1, :, 0] = bad
    torch.testing.assert_close(kernel(q, k, v2, mask=pad).output, clean)
    v2[0, 2, 4] = bad  # head 2 of batch 0 sees key 4
    out = kernel(q, k, v2, mask=pad).output
    assert not torch.isfinite(out[0, 2]).any() and torch.isfinite(out[0, :2]).all() and torch.isfinite(out[1]).all()


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).supports_causal
                                  and lookup("attention", n).supports_mask == "full"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_values_at_a_key_hidden_by_mask_and_causality_together_have_no_influence(name, bad):
    """Key 3 is after queries 0-2 (causality) and masked for queries 3-5 (the mask): hidden from
    every query, though no mask column is all False."""
    kernel = build(name, causal=True)
    q, k, v = heads(1, 2, 6, 6)
    mask = torch.ones(1, 6, 6, dtype=torch.bool)
    mask[:, 3:, 3] = False
    clean = kernel(q, k, v, mask=mask)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 3], v2[:, :, 3] = bad, bad
    for need_weights in (False, True):
        out = kernel(q, k2, v2, mask=mask, need_weights=need_weights)
        assert torch.isfinite(out.output).all()
        torch.testing.assert_close(out.output, clean.output)
