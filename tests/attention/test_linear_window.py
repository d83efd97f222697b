"""LoLCATs' hybrid attention ``linear-window``: a sliding window of softmax beside linear attention.

Tested against the equation written as a loop over (row, head, query, key) in float64 — outputs,
weights and gradients (queries, keys, values, the window factors and Hedgehog's maps) — and against
causal softmax when the window covers the sequence; decoding (prefill, then steps) against one pass;
inside MultiHeadAttention with grouped keys and inside a tiny Llama through ``generate``."""

import math

import pytest
import torch

import qkv
from qkv.attention import LinearWindowAttention, LinearWindowState
from qkv.attention.feature_maps import HedgehogFeatureMap, apply_feature_map
from qkv.attention.linear_window import linear_window_reference
from qkv.models import Llama, LlamaConfig
from qkv.types import KVCache, LinearState


def build(window, H=2, E=4, **kw):
    torch.manual_seed(0)
    kernel = qkv.build_attention("linear-window", causal=True, window=window, n_heads=H, d_head=E, **kw).double()
    with torch.no_grad():  # away from the initial values: gamma per head, maps that are not the identity
        kernel.window_logit.copy_(torch.randn(H, dtype=torch.float64))
        for p in kernel.feature_map.parameters() if isinstance(kernel.feature_map, HedgehogFeatureMap) else ():
            p.add_(0.3 * torch.randn_like(p))
    return kernel


def heads(B, H, M, N, E=4, Ev=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, M, E, generator=g, dtype=torch.float64),
            torch.randn(B, H, N, E, generator=g, dtype=torch.float64),
            torch.randn(B, H, N, Ev, generator=g, dtype=torch.float64))


def literal(q, k, v, phi_q, phi_k, gamma, W, key_mask=None):
    """The module docstring's equation, term by term: query ``m`` at key position ``i = N - M + m``,
    window keys ``i - W < j <= i`` (``gamma_h exp(s_ij - c_i)``, ``c_i`` their largest score), linear
    keys ``j <= i - W`` (``phi(q_i) . phi(k_j)``); masked keys in neither; no key at all: 0."""
    B, H, M, E = q.shape
    N = k.shape[2]
    rows = []
    for b in range(B):
        for h in range(H):
            for m in range(M):
                i = N - M + m
                ok = [j for j in range(N) if key_mask is None or bool(key_mask[b, j])]
                window = [j for j in ok if i - W < j <= i]
                linear = [j for j in ok if j <= i - W]
                s = {j: (q[b, h, m] * k[b, h, j]).sum() / math.sqrt(E) for j in window}
                c = max(s.values()) if window else 0.0
                terms = [(gamma[h] * torch.exp(s[j] - c), j) for j in window]
                terms += [((phi_q[b, h, m] * phi_k[b, h, j]).sum(), j) for j in linear]
                if not terms:
                    rows.append(torch.zeros_like(v[0, 0, 0]))
                    continue
                num = sum(w * v[b, h, j] for w, j in terms)
                den = sum(w for w, _ in terms)
                rows.append(num / den)
    return torch.stack(rows).view(B, H, M, v.shape[-1])


def expected(kernel, q, k, v, key_mask=None):
    phi_q, phi_k = apply_feature_map(kernel.feature_map, q, k)
    return literal(q, k, v, phi_q, phi_k, kernel.gamma, kernel.window, key_mask)


# ----------------------------------------------------------------------------- the equation


@pytest.mark.parametrize("feature_map", ["hedgehog", "elu+1"])
@pytest.mark.parametrize("window,chunk_size", [(1, None), (2, None), (3, 2), (4, 1), (3, 5), (9, None)])
def test_outputs_and_weights_are_the_equation(feature_map, window, chunk_size):
    kernel = build(window, feature_map=feature_map, chunk_size=chunk_size)
    q, k, v = heads(2, 2, 9, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :2] = False  # left padding
    mask[1, [3, 6]] = False  # holes inside the window and in the linear part
    for key_mask in (None, mask):
        ref = expected(kernel, q, k, v, key_mask)
        out = kernel(q, k, v, mask=key_mask, need_weights=True)
        torch.testing.assert_close(kernel(q, k, v, mask=key_mask).output, ref, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(out.output, ref, atol=1e-12, rtol=1e-10)
        # the weights: rows sum to 1, 0 above the diagonal and at masked keys, and they give the output
        torch.testing.assert_close(out.weights @ v, ref, atol=1e-12, rtol=1e-10)
        sees = torch.ones(2, 9, dtype=torch.bool) if key_mask is None else key_mask.cumsum(-1) > 0  # a key at or before i
        torch.testing.assert_close(out.weights.sum(-1), sees[:, None].expand(2, 2, 9).double())
        assert (out.weights.triu(1) == 0).all()
        if key_mask is not None:
            assert (out.weights[~key_mask[:, None, None, :].expand_as(out.weights)] == 0).all()


def test_fewer_queries_than_keys_and_the_reference_in_the_module():
    kernel = build(3, chunk_size=2)
    q, k, v = heads(2, 2, 5, 11, seed=1)
    mask = torch.rand(2, 11, generator=torch.Generator().manual_seed(2)) > 0.3
    phi_q, phi_k = apply_feature_map(kernel.feature_map, q, k)
    for key_mask in (None, mask):
        ref = expected(kernel, q, k, v, key_mask)
        torch.testing.assert_close(kernel(q, k, v, mask=key_mask).output, ref, atol=1e-12, rtol=1e-10)
        mine = linear_window_reference(q, k, v, phi_q, phi_k, kernel.gamma, 3,
                                       None if key_mask is None else key_mask[:, None])
        torch.testing.assert_close(mine, ref, atol=1e-12, rtol=1e-10)


def test_the_factor_multiplies_the_window_and_c_is_part_of_the_function():
    """gamma scales the softmax terms only (1 leaves the linear terms as they are), and c_i — the
    row's largest window score — is not a free normaliser: adding a constant to a row's scores
    moves weight between window and linear part."""
    kernel = build(2, feature_map="elu+1")
    q, k, v = heads(1, 2, 6, 6)
    with torch.no_grad():
        kernel.window_logit.fill_(20.0)  # gamma = 1 - 2e-9: the window at full weight
    near_one = kernel(q, k, v).output
    with torch.no_grad():
        kernel.window_logit.fill_(-20.0)  # gamma = 2e-9: the linear part alone where there is one
    linear_only = kernel(q, k, v).output
    phi_q, phi_k = apply_feature_map(kernel.feature_map, q, k)
    a = (phi_q @ phi_k.transpose(-1, -2)) * torch.ones(6, 6, dtype=torch.bool).tril(-2)  # j <= i - 2
    torch.testing.assert_close(linear_only[:, :, 2:], (a @ v / a.sum(-1, keepdim=True))[:, :, 2:], atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(linear_only[:, :, :2], near_one[:, :, :2])  # no linear key yet: softmax, gamma cancels
    assert (near_one[:, :, 2:] - linear_only[:, :, 2:]).abs().max() > 1e-2


@pytest.mark.parametrize("window", [9, 12, 1 << 20])
@pytest.mark.parametrize("logit", [-3.0, 0.0, 4.0])
def test_a_window_over_the_whole_sequence_is_causal_softmax(window, logit):
    """W >= L: no key is linear, and gamma cancels between numerator and denominator — the kernel
    is causal softmax attention, for any gamma and feature map, masks included."""
    kernel = build(window)
    with torch.no_grad():
        kernel.window_logit.fill_(logit)
    softmax = qkv.build_attention("softmax", causal=True)
    q, k, v = heads(2, 2, 9, 9, seed=3)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    for key_mask in (None, mask):
        torch.testing.assert_close(kernel(q, k, v, mask=key_mask).output, softmax(q, k, v, mask=key_mask).output,
                                   atol=1e-12, rtol=1e-10)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("feature_map", ["hedgehog", "elu+1"])
def test_gradients_are_the_equations(feature_map):
    kernel = build(2, feature_map=feature_map, chunk_size=2)
    q, k, v = (x.requires_grad_() for x in heads(2, 2, 6, 6, seed=4))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, [0, 3]] = False
    g = torch.randn(2, 2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    params = [kernel.window_logit, *kernel.feature_map.parameters()] if feature_map == "hedgehog" else [kernel.window_logit]
    leaves = [q, k, v, *params]
    fast = torch.autograd.grad((kernel(q, k, v, mask=mask).output * g).sum(), leaves)
    ref = torch.autograd.grad((expected(kernel, q, k, v, mask) * g).sum(), leaves)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert fast[3].abs().min() > 0  # every head's factor is learned


def test_gradcheck_on_tiny_shapes():
    kernel = build(2, H=2, E=3, chunk_size=2)
    q, k, v = (x.requires_grad_() for x in heads(1, 2, 5, 5, E=3, Ev=2, seed=6))
    mask = torch.tensor([[False, True, True, True, True]])

    def f(q, k, v, logit, query_weight):
        params = {"window_logit": logit, "feature_map.query_weight": query_weight}
        return torch.func.functional_call(kernel, params, (q, k, v), {"mask": mask}).output

    logit = kernel.window_logit.detach().clone().requires_grad_()
    weight = kernel.feature_map.query_weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (q, k, v, logit, weight))


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("pieces", [[1] * 9, [4, 1, 1, 3], [2, 0, 7], [9]])
def test_prefill_then_steps_equal_one_pass(window, pieces):
    kernel = build(window, chunk_size=2)
    q, k, v = heads(2, 2, 9, 9, seed=7)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :2] = False  # a left-padded row: its mask given again, over every position so far, at each call
    mask[0, 4] = False
    full = kernel(q, k, v, mask=mask).output
    state, outs, start = None, [], 0
    for n in pieces:
        part = slice(start, start + n)
        out = kernel(q[:, :, part], k[:, :, part], v[:, :, part], mask=mask[:, :start + n], state=state,
                     return_state=True)
        state, start = out.state, start + n
        outs.append(out.output)
        assert isinstance(state, LinearWindowState) and isinstance(state.sums, LinearState)
        assert isinstance(state.cache, KVCache)
        assert state.length == min(window - 1, start) and state.offset + state.length == start
        assert state.sums.S.shape == (2, 2, 8, 3) and state.sums.length == state.offset  # 2F features
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=1e-12, rtol=1e-10)


def test_the_state_is_the_sums_of_the_keys_that_left_and_the_window():
    kernel = build(3)
    q, k, v = heads(1, 2, 7, 7, seed=8)
    state = kernel(q, k, v, return_state=True).state
    phi_k = apply_feature_map(kernel.feature_map, q, k)[1]
    torch.testing.assert_close(state.sums.S, phi_k[:, :, :5].transpose(-1, -2) @ v[:, :, :5])
    torch.testing.assert_close(state.sums.Z, phi_k[:, :, :5].sum(-2))
    assert torch.equal(state.cache.key, k[:, :, 5:]) and torch.equal(state.cache.value, v[:, :, 5:])


def test_decoding_refuses_what_it_cannot_answer():
    kernel = build(3)
    q, k, v = heads(1, 2, 4, 4)
    state = kernel(q, k, v, return_state=True).state
    with pytest.raises(ValueError, match="need_weights=True with a state"):
        kernel(q[:, :, :1], k[:, :, :1], v[:, :, :1], state=state, need_weights=True)
    with pytest.raises(ValueError, match="may not precede the new keys"):
        kernel(q[:, :, :3], k[:, :, :1], v[:, :, :1], state=state)
    with pytest.raises(TypeError, match="state must be the LinearWindowState"):
        kernel(q, k, v, state=KVCache(k, v), return_state=True)
    other = build(3, E=4, feature_dim=2)  # 4 features, not 8
    with pytest.raises(ValueError, match="state holds S"):
        other(q[:, :, :1], k[:, :, :1], v[:, :, :1], state=state)


# ----------------------------------------------------------------------------- knobs


def test_bad_knobs_are_named():
    with pytest.raises(ValueError, match="causal only"):
        qkv.build_attention("linear-window", window=4, n_heads=2, d_head=4)
    for window in (0, -1, 2.5, True, "4"):
        with pytest.raises((ValueError, TypeError), match="window"):
            qkv.build_attention("linear-window", causal=True, window=window, n_heads=2, d_head=4)
    for factor in (0.0, 1.0, -0.5, True, "0.1"):
        with pytest.raises(ValueError, match="window_factor must be a float in \\(0, 1\\)"):
            qkv.build_attention("linear-window", causal=True, window=4, window_factor=factor, n_heads=2, d_head=4)
    with pytest.raises(ValueError, match="give n_heads"):
        qkv.build_attention("linear-window", causal=True, window=4)
    with pytest.raises(ValueError, match="feature_map='hedgehog' learns a map per head"):
        qkv.build_attention("linear-window", causal=True, window=4, n_heads=2)
    with pytest.raises(ValueError, match="unknown name 'relu'"):
        qkv.build_attention("linear-window", causal=True, window=4, n_heads=2, feature_map="relu")
    with pytest.raises(ValueError, match="dropout must be 0"):
        qkv.build_attention("linear-window", causal=True, window=4, n_heads=2, d_head=4, dropout=0.1)
    with pytest.raises(ValueError, match="chunk_size"):
        qkv.build_attention("linear-window", causal=True, window=4, n_heads=2, d_head=4, chunk_size=0)
    for B in (1, 0):  # checked before the empty-input shortcut too
        with pytest.raises(ValueError, match="built for n_heads=2"):
            build(2, H=2)(*heads(B, 3, 4, 4))
    with pytest.raises(ValueError, match="full mask|key-padding masks"):
        build(2)(*heads(1, 2, 4, 4), mask=torch.ones(1, 2, 4, 4, dtype=torch.bool).tril())


def test_its_knobs_and_parameters():
    kernel = qkv.build_attention("lolcats", causal=True, window=64, n_heads=3, d_head=8)
    assert isinstance(kernel, LinearWindowAttention) and isinstance(kernel.feature_map, HedgehogFeatureMap)
    torch.testing.assert_close(kernel.gamma, torch.full((3,), 0.1))  # the authors' released start
    assert {n for n, _ in kernel.named_parameters()} == {"window_logit", "feature_map.query_weight",
                                                         "feature_map.query_bias", "feature_map.key_weight",
                                                         "feature_map.key_bias"}
    assert LinearWindowAttention.default_knobs(2048, 9, 64) == {"n_heads": 9, "d_head": 64, "window": 64}
    assert LinearWindowAttention.default_knobs(16, 2, 4)["window"] == 2
    assert "window=64, feature_map=hedgehog" in repr(kernel)


# ----------------------------------------------------------------------------- inside models


def test_inside_multihead_attention_with_grouped_keys():
    """n_kv_heads < n_heads: the key/value heads repeated to the query heads (each query head turns
    its copy with its own map and factor), the state per query head; decoding equals one pass."""
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 4, "linear-window", causal=True, n_kv_heads=2, window=3).double()
    kernel = mha.kernel
    assert kernel.window_logit.shape == (4,) and kernel.feature_map.n_heads == 4
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    full = mha(x).output
    q = mha.q_proj(x).view(2, 8, 4, 4).transpose(1, 2)
    k = mha.k_proj(x).view(2, 8, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
    v = mha.v_proj(x).view(2, 8, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
    by_hand = mha.out_proj(kernel(q, k, v).output.transpose(1, 2).reshape(2, 8, 16))
    torch.testing.assert_close(full, by_hand, atol=1e-12, rtol=1e-10)
    state, steps = None, []
    for t in range(8):
        out = mha(x[:, t:t + 1], state=state, return_state=True)
        state = out.state
        steps.append(out.output)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=1e-10)
    assert state.sums.S.shape[1] == 4 and state.cache.key.shape == (2, 4, 2, 4)


def tiny_llama(**kw):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, max_len=32,
                         attention="linear-window", attention_kwargs={"window": 4, **kw})
    return Llama(config)


def test_inside_llama_trains_and_generates_with_its_cache():
    model = tiny_llama().train()
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    model(ids, labels=ids).loss.backward()
    kernel = model.stack.layers[0].self_attn.kernel
    assert kernel.window == 4 and kernel.window_logit.grad.abs().min() > 0
    assert kernel.feature_map.key_weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        cached = model.generate(ids[:, :5], 8, temperature=0)
        assert torch.equal(cached, model.generate(ids[:, :5], 8, temperature=0, use_cache=False))
        # the cache: per layer the sums and the last W - 1 = 3 keys, whatever the length
        out = model(ids[:, :12], return_state=True)
        cache = out.state.layers[0].self_attn
        assert isinstance(cache, LinearWindowState) and cache.cache.key.shape[-2] == 3 and cache.offset == 9


def test_inside_llama_left_padded_rows_generate_as_alone():
    model = tiny_llama().eval()
    a, b = torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[11, 12, 13]])
    batch = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 11, 12, 13]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        both = model.generate(batch, 6, temperature=0, attention_mask=mask)
        assert torch.equal(both[0], model.generate(a, 6, temperature=0)[0])
        assert torch.equal(both[1, 3:], model.generate(b, 6, temperature=0)[0])


@pytest.mark.parametrize("window", [1, 3, 6])
def test_decoding_step_reads_scores_and_sums_only_and_equals_one_pass(window, monkeypatch):
    """A one-token step after a state (decoding) takes the short path — no band blocks, features of the
    leaving key only — and its outputs and new state equal one pass over the whole sequence, with a
    left-padded row."""
    from qkv.attention.linear_window import LinearWindowAttention

    torch.manual_seed(window)
    kernel = LinearWindowAttention(window=window, causal=True, n_heads=2, d_head=8).double()
    with torch.no_grad():
        kernel.window_logit.normal_()
    q, k, v = (torch.randn(2, 2, 10, 8, dtype=torch.double) for _ in range(3))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, :3] = False
    whole = kernel(q, k, v, mask=mask, return_state=True)
    out = kernel(q[:, :, :4], k[:, :, :4], v[:, :, :4], mask=mask[:, :4], return_state=True)
    outs, state = [out.output], out.state
    blocks = []
    monkeypatch.setattr(kernel, "_blocks", lambda *a, **kw: blocks.append(1) or LinearWindowAttention._blocks(kernel, *a, **kw))
    for t in range(4, 10):
        out = kernel(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], mask=mask[:, :t + 1], state=state,
                     return_state=True)
        outs.append(out.output)
        state = out.state
    assert not blocks
    torch.testing.assert_close(torch.cat(outs, 2)[1], whole.output[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat(outs, 2)[0, :, 3:], whole.output[0, :, 3:], rtol=0, atol=1e-12)
    torch.testing.assert_close(state.sums.S, whole.state.sums.S, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.sums.Z, whole.state.sums.Z, rtol=0, atol=1e-12)
    assert torch.equal(state.cache.key, whole.state.cache.key) and state.cache.offset == whole.state.cache.offset
