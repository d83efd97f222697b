"""Transformer-XL relative attention against the paper's equation written with loops."""

import math

import pytest
import torch

import qkv
from qkv.attention.relative import relative_shift


def make(H=2, E=4, causal=True, seed=0, **kw):
    torch.manual_seed(seed)
    kernel = qkv.build_attention("relative", n_heads=H, head_dim=E, causal=causal, **kw).double()
    with torch.no_grad():  # non-trivial biases
        kernel.u.normal_()
        kernel.v.normal_()
    return kernel


def tensors(B=2, H=2, M=5, N=8, E=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, E, generator=g, dtype=torch.float64) for L in (M, N, N))


def literal_sinusoid(d, width):
    """R_d of Vaswani et al. (2017, §3.5) in float64, one feature at a time:
    ``sin(d / 10000^(2i / width))`` at feature 2i, ``cos`` of the same at 2i + 1."""
    return torch.tensor([(math.sin if f % 2 == 0 else math.cos)(d / 10000 ** ((f - f % 2) / width))
                         for f in range(width)], dtype=torch.float64)


def literal(kernel, q, k, v, causal, clamp_len=None, allowed=None):
    """A_ij = (q_i + u)^T k_j + (q_i + v)^T W_{k,R} R_{i-j}, every R_{i-j} built on its own."""
    B, H, M, E = q.shape
    N = k.shape[2]
    out = torch.zeros(B, H, M, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(M):
                pos = N - M + i  # queries aligned to the end of the keys
                scores, keys = [], []
                for j in range(N):
                    if (causal and j > pos) or (allowed is not None and not allowed[i, j]):
                        continue
                    d = pos - j
                    if clamp_len is not None:
                        d = max(-clamp_len, min(clamp_len, d))
                    R = literal_sinusoid(d, H * E)  # (H E,)
                    r = (kernel.w_r.weight.double() @ R).view(H, E)[h]  # W_{k,R} R_{i-j}, head h
                    a = float((q[b, h, i] + kernel.u[h].detach()) @ k[b, h, j] + (q[b, h, i] + kernel.v[h].detach()) @ r.detach())
                    scores.append(a / math.sqrt(E))
                    keys.append(j)
                if not keys:
                    continue
                w = torch.tensor(scores, dtype=torch.float64).softmax(0)
                out[b, h, i] = sum(w[t] * v[b, h, j] for t, j in enumerate(keys))
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("M,N,clamp_len", [(6, 6, None), (3, 7, None), (5, 9, 3), (1, 4, None)])
def test_matches_literal_reference(causal, M, N, clamp_len):
    kernel = make(causal=causal, clamp_len=clamp_len)
    q, k, v = tensors(M=M, N=N)
    ref = literal(kernel, q, k, v, causal, clamp_len)
    for need_weights in (False, True):  # float64 throughout: the sinusoids too (issue 20 item 1, was float32)
        torch.testing.assert_close(kernel(q, k, v, need_weights=need_weights).output, ref, rtol=0, atol=1e-12)


def test_relative_shift_is_the_skewed_gather():
    M, N = 4, 6
    for K in (N, N + M - 1):
        x = torch.randn(2, M, K)
        out = relative_shift(x, N)
        for i in range(M):
            for j in range(N):
                c = M - 1 - i + j
                if c < K:
                    assert out[0, i, j] == x[0, i, c] and out[1, i, j] == x[1, i, c]


def test_segments_with_bounded_memory_equal_one_masked_pass():
    """Segment by segment with a detached KV memory of mem_len keys equals one pass over the
    concatenation where each query sees its own segment and the mem_len keys before it."""
    L, mem_len, T = 3, 4, 12
    kernel = make(mem_len=mem_len)
    q, k, v = tensors(B=1, M=T, N=T)
    pos = torch.arange(T)
    allowed = (pos[None, :] >= (pos[:, None] // L) * L - mem_len)  # (T, T) span of each query
    full = kernel(q, k, v, mask=allowed[None, None]).output
    torch.testing.assert_close(full, literal(kernel, q, k, v, True, allowed=allowed))
    state, outs = None, []
    for s in range(0, T, L):
        o = kernel(q[:, :, s:s + L], k[:, :, s:s + L], v[:, :, s:s + L], state=state, return_state=True)
        outs.append(o.output)
        state = o.state
        assert state.length <= mem_len
    torch.testing.assert_close(torch.cat(outs, 2), full)


def test_no_gradient_flows_into_the_memory():
    kernel = make(mem_len=8)
    q, k, v = (t.requires_grad_(True) for t in tensors(B=1, M=4, N=4))
    first = kernel(q, k, v, return_state=True)
    assert not first.state.key.requires_grad and not first.state.value.requires_grad
    q2, k2, v2 = (t.requires_grad_(True) for t in tensors(B=1, M=4, N=4, seed=2))
    second = kernel(q2, k2, v2, state=first.state)
    assert torch.autograd.grad(second.output.sum(), (k, v), allow_unused=True) == (None, None)
    assert all(g is not None for g in torch.autograd.grad(second.output.sum(), (q2, k2, v2)))


def test_shared_biases_and_gradients():
    kernel_a, kernel_b = make(seed=0), make(seed=1)
    u = torch.nn.Parameter(torch.randn(2, 4, dtype=torch.float64))
    w = torch.nn.Parameter(torch.randn(2, 4, dtype=torch.float64))
    for kern in (kernel_a, kernel_b):
        kern.share_biases(u, w)
    q, k, v = tensors()
    (kernel_a(q, k, v).output.sum() + kernel_b(q, k, v).output.sum()).backward()
    assert kernel_a.u is kernel_b.u is u and u.grad is not None and w.grad is not None
    with pytest.raises(ValueError, match="shape"):
        kernel_a.share_biases(torch.nn.Parameter(torch.zeros(3, 4)), w)
    with pytest.raises(TypeError, match="nn.Parameter"):
        kernel_a.share_biases(torch.zeros(2, 4), w)


def test_gradcheck_position_parameters():
    kernel = make(clamp_len=2)
    q, k, v = tensors(B=1, M=3, N=5)
    mask = torch.tensor([[True, True, False, True, True]])

    def f(u, w, W):
        return torch.func.functional_call(kernel, {"u": u, "v": w, "w_r.weight": W}, (q, k, v), {"mask": mask}).output

    args = tuple(t.detach().clone().requires_grad_(True) for t in (kernel.u, kernel.v, kernel.w_r.weight))
    assert torch.autograd.gradcheck(f, args)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="n_heads"):
        qkv.build_attention("relative", head_dim=4)
    with pytest.raises(ValueError, match="mem_len"):
        qkv.build_attention("relative", n_heads=2, head_dim=4, mem_len=-1)
    kernel = make()
    q, k, v = tensors(H=3)
    with pytest.raises(ValueError, match="n_heads=2"):
        kernel(q, k, v)


def test_multihead_fills_head_shape_and_empty_input():
    mha = qkv.MultiHeadAttention(16, 4, "relative", causal=True)
    assert (mha.kernel.n_heads, mha.kernel.head_dim) == (4, 4)
    out = mha(torch.randn(2, 0, 16))
    assert out.output.shape == (2, 0, 16)
