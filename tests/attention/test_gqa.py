"""Grouped- and multi-query attention (Ainslie et al. 2023) in MultiHeadAttention: the literal
equation, every registered kernel equal to full multi-head attention with its key/value weights
repeated, stepwise decoding, and caches kept per key/value head."""

import math

import pytest
import torch

import qkv
from qkv import MultiHeadAttention
from qkv.registry import lookup
from qkv.types import KVCache, LinearState

NAMES = list(qkv.list_attention())
D, H, G, L = 16, 4, 2, 8


def knobs(name, H=H, E=D // H):
    cls = lookup("attention", name)
    kw = {**cls.default_knobs(16, H, E), **(cls.deterministic_kwargs or {})}
    return {k: v for k, v in kw.items() if k not in cls.head_kwargs(H, E)}


def repeated(weight, G, H):
    """A (G E, ...) key/value projection as (H E, ...): each key head's rows repeated H / G times."""
    return weight.unflatten(0, (G, -1)).repeat_interleave(H // G, dim=0).flatten(0, 1)


def grouped_and_full(name, causal, n_kv_heads=G, **kw):
    torch.manual_seed(0)
    grouped = MultiHeadAttention(D, H, name, causal=causal, n_kv_heads=n_kv_heads, **knobs(name), **kw).double()
    full = MultiHeadAttention(D, H, name, causal=causal, **knobs(name), **kw).double()
    with torch.no_grad():
        for proj in ("q_proj", "out_proj"):
            getattr(full, proj).load_state_dict(getattr(grouped, proj).state_dict())
        for proj in ("k_proj", "v_proj"):
            if getattr(grouped, proj) is None:
                continue
            ours, theirs = getattr(grouped, proj), getattr(full, proj)
            theirs.weight.copy_(repeated(ours.weight, n_kv_heads, H))
            theirs.bias.copy_(repeated(ours.bias, n_kv_heads, H))
        full.kernel.load_state_dict(grouped.kernel.state_dict())
        if grouped.gates is not None:  # a gated kernel's gate projections (GLA, DeltaNet) read the tokens, not the heads
            full.gates.load_state_dict(grouped.gates.state_dict())
    return grouped.eval(), full.eval()


CASES = [(n, c) for n in NAMES for c in (False, True)
         if (lookup("attention", n).supports_causal if c else not lookup("attention", n).causal_only)]


@pytest.mark.parametrize("name,causal", CASES)
def test_grouped_equals_full_attention_with_repeated_key_value_weights(name, causal):
    grouped, full = grouped_and_full(name, causal)
    x = torch.randn(2, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(grouped(x).output, full(x).output, rtol=1e-9, atol=1e-10)
    if lookup("attention", name).supports_mask != "none":
        pad = torch.ones(2, L, dtype=torch.bool)
        pad[1, :2] = False
        torch.testing.assert_close(grouped(x, mask=pad).output, full(x, mask=pad).output, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).supports_state])
def test_grouped_decoding_equals_full_and_parallel(name):
    grouped, full = grouped_and_full(name, causal=True)
    x = torch.randn(1, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    parallel = grouped(x).output
    s_grouped = s_full = None
    for t in range(L):
        a = grouped(x[:, t:t + 1], state=s_grouped, return_state=True)
        b = full(x[:, t:t + 1], state=s_full, return_state=True)
        s_grouped, s_full = a.state, b.state
        torch.testing.assert_close(a.output, b.output, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(a.output[:, 0], parallel[:, t], rtol=1e-7, atol=1e-9)
    if isinstance(s_grouped, KVCache):
        assert s_grouped.key.shape[1] == G and s_full.key.shape[1] == H
    if isinstance(s_grouped, LinearState):
        assert s_grouped.S.shape[1] == G and s_full.S.shape[1] == H


def test_literal_grouped_query_attention():
    """out_h = softmax(q_h k_g^T / sqrt(E)) v_g with g = floor(h G / H), written with loops (float64)."""
    torch.manual_seed(3)
    Hq, Gk, E, M = 6, 2, 3, 4
    q = torch.randn(1, Hq, M, E, dtype=torch.float64)
    k, v = torch.randn(2, 1, Gk, M, E, dtype=torch.float64).unbind(0)
    kernel = qkv.build_attention("softmax", causal=True)
    for need_weights in (False, True):
        out = kernel(q, k, v, need_weights=need_weights).output
        for h in range(Hq):
            g = h * Gk // Hq
            for i in range(M):
                s = [float(q[0, h, i] @ k[0, g, j]) / math.sqrt(E) for j in range(i + 1)]
                w = [math.exp(x - max(s)) for x in s]
                expected = sum(wj / sum(w) * v[0, g, j] for j, wj in enumerate(w))
                torch.testing.assert_close(out[0, h, i], expected, rtol=0, atol=1e-12)


def test_cache_is_per_key_value_head():
    """A 9-head model with 3 key/value heads caches a third of what the 9-head model does."""
    x = torch.randn(2, 5, 18)
    sizes = {}
    for kv_heads in (9, 3, 1):
        mha = MultiHeadAttention(18, 9, "softmax", causal=True, n_kv_heads=kv_heads).eval()
        with torch.no_grad():
            state = mha(x, return_state=True).state
            state = mha(x[:, :1], state=state, return_state=True).state
        assert state.key.shape == (2, kv_heads, 6, 2) and state.value.shape == (2, kv_heads, 6, 2)
        sizes[kv_heads] = state.key.numel() + state.value.numel()
    assert sizes[3] * 3 == sizes[9] and sizes[1] * 9 == sizes[9]


def test_multi_query_attention_and_gradients():
    grouped, full = grouped_and_full("softmax", True, n_kv_heads=1)
    x = torch.randn(2, L, D, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(grouped(x, need_weights=True).weights, full(x, need_weights=True).weights)
    grouped(x).output.sum().backward()
    assert grouped.k_proj.weight.grad.shape == (D // H, D) and torch.isfinite(x.grad).all()


def test_bad_head_counts_are_refused():
    with pytest.raises(ValueError, match="n_kv_heads .3. must divide n_heads .4."):
        MultiHeadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(TypeError, match="n_kv_heads must be an int"):
        MultiHeadAttention(16, 4, n_kv_heads=2.0)
    with pytest.raises(ValueError, match="must share"):  # a kernel without grouped_kv gets H key heads
        qkv.build_attention("window", radius=2)(torch.zeros(1, 4, 3, 2), torch.zeros(1, 2, 3, 2), torch.zeros(1, 2, 3, 2))
    with pytest.raises(ValueError, match="must share"):
        qkv.build_attention("softmax")(torch.zeros(1, 4, 3, 2), torch.zeros(1, 3, 3, 2), torch.zeros(1, 3, 3, 2))


def test_literal_llama_attention_with_qk_norm_and_rotary():
    """MultiHeadAttention with grouped keys, qk-norm and rotary, against its equations in float64 loops:
    q_h = R(m) g_q * norm(x W^Q_h), k_g = R(n) g_k * norm(x W^K_g), out = sum_h softmax(q_h k_g / sqrt(E)) v_g W^O_h."""
    from qkv.rotary import RotaryEmbedding

    torch.manual_seed(5)
    Hq, Gk, E, M = 4, 2, 4, 5
    rope = RotaryEmbedding(E, base=50.0)
    mha = MultiHeadAttention(8, Hq, causal=True, n_kv_heads=Gk, d_head=E, bias=False, qk_norm=True, norm_eps=1e-6,
                             rotary=rope).double()
    with torch.no_grad():
        mha.q_norm.weight.copy_(torch.rand(E) + 0.5)
        mha.k_norm.weight.copy_(torch.rand(E) + 0.5)
    x = torch.randn(1, M, 8, dtype=torch.float64)
    positions = torch.tensor([3, 4, 5, 6, 7])
    out = mha(x, positions=positions).output[0]

    def norm(vec, g):
        rms = math.sqrt(sum(t * t for t in vec.tolist()) / E + 1e-6)
        return vec / rms * g

    def turn(vec, m):  # pairs (i, i + E/2) turned by m theta_i
        res = vec.clone()
        for i, t in enumerate(rope.theta.tolist()):
            a, b = vec[i].item(), vec[i + E // 2].item()
            res[i] = a * math.cos(m * t) - b * math.sin(m * t)
            res[i + E // 2] = a * math.sin(m * t) + b * math.cos(m * t)
        return res

    Wq, Wk, Wv, Wo = (p.weight.detach() for p in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj))
    q = [[turn(norm(Wq[h * E:(h + 1) * E] @ x[0, i], mha.q_norm.weight.detach()), positions[i].item())
          for i in range(M)] for h in range(Hq)]
    k = [[turn(norm(Wk[g * E:(g + 1) * E] @ x[0, j], mha.k_norm.weight.detach()), positions[j].item())
          for j in range(M)] for g in range(Gk)]
    v = [[Wv[g * E:(g + 1) * E] @ x[0, j] for j in range(M)] for g in range(Gk)]
    for i in range(M):
        heads = []
        for h in range(Hq):
            g = h * Gk // Hq
            s = [float(q[h][i] @ k[g][j]) / math.sqrt(E) for j in range(i + 1)]
            w = [math.exp(t - max(s)) for t in s]
            heads.append(sum(wj / sum(w) * v[g][j] for j, wj in enumerate(w)))
        torch.testing.assert_close(out[i], Wo @ torch.cat(heads), rtol=0, atol=1e-12)
    # positions default to those after the state: a cached continuation equals the parallel pass at 0..M-1
    parallel = mha(x).output
    state, steps = None, []
    for t in range(M):
        o = mha(x[:, t:t + 1], state=state, return_state=True)
        state = o.state
        steps.append(o.output)
    torch.testing.assert_close(torch.cat(steps, 1), parallel, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="self-attention only"):
        mha(x, torch.randn(1, 3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="no rotary embedding"):
        MultiHeadAttention(8, 2)(x.float(), positions=positions)


def test_grouped_projections_are_packed_and_fused_in_inference():
    """q (H E rows), k and v (G E rows each) lie in one buffer; without gradients one product
    computes all three, with the same result as three."""
    mha = MultiHeadAttention(16, 4, causal=True, n_kv_heads=2).eval()
    q, k, v = mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
    assert v.data_ptr() == k.data_ptr() + k.numel() * k.element_size()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        fused = mha(x).output
        assert mha._in_proj(x, (mha.q_proj, mha.k_proj, mha.v_proj))[1].shape == (2, 9, 8)
    torch.testing.assert_close(fused, mha(x).output, rtol=1e-5, atol=1e-6)  # with gradients: three products


@pytest.mark.parametrize("name", [n for n in NAMES if lookup("attention", n).grouped_kv])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_kernels_equal_their_repeated_call(name, causal):
    """A kernel that takes grouped keys (softmax; linear and performer group the queries) gives what
    it gives on keys and values repeated to the query heads — weights and a key-padding mask too."""
    kernel = qkv.build_attention(name, causal=causal, **{**knobs(name, H=6, E=4),
                                                        **lookup("attention", name).head_kwargs(6, 4)}).double()
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 6, 5, 4, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 5, 4, generator=g, dtype=torch.float64).unbind(0)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, 1] = False
    for m in (None, mask):
        a = kernel(q, k, v, mask=m, need_weights=True)
        b = kernel(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask=m, need_weights=True)
        torch.testing.assert_close(a.output, b.output, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(a.weights, b.weights, rtol=1e-10, atol=1e-12)
