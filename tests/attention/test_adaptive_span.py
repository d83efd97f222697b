"""Adaptive attention span (Sukhbaatar et al. 2019): the soft-masked weights against the
paper's equation written with loops, the full-span limit, the sliced score computation (counted),
the dynamic variant and the span loss."""

import math

import pytest
import torch

import qkv
from qkv import masks
from qkv.attention import adaptive_span


def tensors(B=2, H=3, M=10, N=10, E=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, E, generator=g, dtype=dtype) for L in (M, N, N))


def literal(q, k, v, z, S, R, causal=True, key_pe=None):
    """a_tr = m_z(t - r) exp(s_tr) / sum_q m_z(t - q) exp(s_tq) over keys with |t - r| < S; z: (B, H, M).
    ``key_pe``: s_tr = q_t . (k_r + p_{t-r}) / sqrt(d), ``p`` row ``t - r`` (non-causal: ``t - r + S - 1``)."""
    B, H, M, E = q.shape
    N = k.shape[2]
    out = torch.zeros(B, H, M, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(M):
                t = N - M + i
                num, den = torch.zeros(v.shape[-1], dtype=torch.float64), 0.0
                for r in range(N):
                    x = t - r if causal else abs(t - r)
                    if x < 0 or x >= S:
                        continue
                    m = min(max((R + float(z[b, h, i]) - x) / R, 0.0), 1.0)
                    key = k[b, h, r]
                    if key_pe is not None:
                        key = key + key_pe[t - r if causal else t - r + S - 1]
                    w = m * math.exp(float(q[b, h, i] @ key) / math.sqrt(E))
                    num += w * v[b, h, r]
                    den += w
                if den > 0:
                    out[b, h, i] = num / den
    return out


def with_spans(kernel, z):
    with torch.no_grad():
        kernel.span.copy_(torch.tensor(z, dtype=kernel.span.dtype) / kernel.max_span)
    return kernel


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_soft_mask_matches_the_equation(causal, need_weights):
    S, R = 8, 3
    kernel = with_spans(qkv.build_attention("adaptive-span", max_span=S, ramp=R, n_heads=3, causal=causal, block=4),
                        [0.5, 2.0, 6.0]).double()
    q, k, v = tensors(M=7, N=11)  # 4 cached positions before the queries
    z = kernel.spans().detach().view(1, 3, 1).expand(2, 3, 7)
    out = kernel(q, k, v, need_weights=need_weights)
    torch.testing.assert_close(out.output, literal(q, k, v, z, S, R, causal))
    if need_weights:
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64))
        signed = torch.arange(7).view(7, 1) + 4 - torch.arange(11).view(1, 11)  # t - r
        distance = signed if causal else signed.abs()
        assert (out.weights[:, 0][:, distance.abs() >= 4] == 0).all()  # head 0: m = 0 from z + R = 3.5 on
        assert (out.weights[:, 2][:, (distance >= 0) & (distance < 8)] > 0).all()  # head 2: z + R = 9 > S - 1


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_position_embeddings_match_the_equation(causal, need_weights):
    """The paper's relative position embeddings: s_tr = q_t . (k_r + p_{t-r}) / sqrt(d) (Sukhbaatar et
    al. 2019, §2), one table for every head; continuing a state gives the same numbers."""
    S, R = 6, 2
    kernel = with_spans(qkv.build_attention("adaptive-span", max_span=S, ramp=R, n_heads=3, causal=causal, block=3,
                                            position_embeddings=True, d_head=4), [1.0, 3.0, 6.0]).double()
    assert not kernel.exact and kernel.key_pe.shape == ((S if causal else 2 * S - 1), 4)
    q, k, v = tensors(M=7, N=11)
    z = kernel.spans().detach().view(1, 3, 1).expand(2, 3, 7)
    ref = literal(q, k, v, z, S, R, causal, key_pe=kernel.key_pe.detach())
    torch.testing.assert_close(kernel(q, k, v, need_weights=need_weights).output, ref)
    if causal:  # decoding in pieces through the cache: the same positions, the same embeddings
        q, k, v = tensors(M=11, N=11, seed=1)
        full = kernel(q, k, v).output
        first = kernel(q[:, :, :4], k[:, :, :4], v[:, :, :4], return_state=True)
        rest = kernel(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], state=first.state)
        torch.testing.assert_close(torch.cat([first.output, rest.output], 2), full)


def test_position_embeddings_are_one_table_per_stack():
    from qkv.models.transformer.stack import StackConfig, TransformerStack

    config = StackConfig(n_layers=3, d_model=8, n_heads=2, d_ff=16, attention="adaptive-span", positional="none",
                         attention_kwargs={"max_span": 4, "position_embeddings": True})
    stack = TransformerStack(config, vocab_size=5, causal=True)
    tables = {id(block.self_attn.kernel.key_pe) for block in stack.layers}
    assert len(tables) == 1
    assert sum(p.numel() for n, p in stack.named_parameters() if "key_pe" in n) == 4 * 4
    with pytest.raises(ValueError, match="needs d_head"):
        qkv.build_attention("adaptive-span", max_span=4, position_embeddings=True)


def test_full_span_equals_softmax_on_the_last_S_keys():
    S = 5
    kernel = qkv.build_attention("adaptive-span", max_span=S, ramp=2, n_heads=3, causal=True)
    with torch.no_grad():
        kernel.span.fill_(1.7)  # z >= S (clamped to S where used)
    q, k, v = tensors(M=12, N=12, dtype=torch.float32)
    allowed = masks.materialize(masks.window(S - 1, causal=True), 12, 12)
    ref = qkv.build_attention("softmax")(q, k, v, mask=allowed[None, None], need_weights=True)
    for need_weights in (False, True):
        out = kernel(q, k, v, need_weights=need_weights)
        torch.testing.assert_close(out.output, ref.output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights, ref.weights, atol=1e-6, rtol=1e-5)
    assert kernel.exact and kernel.current_span() == S


def count_scores(monkeypatch):
    counted = []
    original = adaptive_span._attend_band

    def counting(q_blocks, k_blocks, *args):
        counted.append(q_blocks.shape[:-1].numel() * k_blocks.shape[-2])  # (B H nb b) queries x W keys
        return original(q_blocks, k_blocks, *args)

    monkeypatch.setattr(adaptive_span, "_attend_band", counting)
    return counted


@pytest.mark.parametrize("need_weights", [False, True])
def test_scores_are_computed_only_inside_the_span(monkeypatch, need_weights):
    counted = count_scores(monkeypatch)
    S, R, L, B, H = 256, 4, 512, 1, 2
    q, k, v = tensors(B=B, H=H, M=L, N=L, E=4, dtype=torch.float32)
    per_query = {}
    for z in (4.0, 28.0, 252.0):
        kernel = with_spans(qkv.build_attention("adaptive-span", max_span=S, ramp=R, n_heads=H, causal=True,
                                                block=16), [z / 2, z])  # the largest span decides the band
        counted.clear()
        kernel(q, k, v, need_weights=need_weights)
        W = kernel.current_span()
        assert W == min(S, math.ceil(z + R))
        assert len(counted) == 1
        per_query[z] = counted[0] / (B * H * L)
        assert per_query[z] == 16 + W - 1  # one query block's band: b + W - 1 keys, not S
    assert per_query[4.0] < per_query[28.0] < per_query[252.0] <= 16 + S


def test_stepwise_equals_parallel_with_learned_spans():
    kernel = with_spans(qkv.build_attention("adaptive-span", max_span=6, ramp=2, n_heads=3, causal=True), [1.0, 2.5, 4.0])
    q, k, v = tensors(M=15, N=15, dtype=torch.float32)
    full = kernel(q, k, v).output
    state, outs, start = None, [], 0
    for size in [1, 4, 2, 7, 1]:
        sl = slice(start, start + size)
        o = kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], state=state, return_state=True)
        assert o.state.length <= 5  # the cache keeps the last S - 1 keys
        outs.append(o.output)
        state, start = o.state, start + size
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=1e-5, rtol=1e-5)


def test_dynamic_span_matches_the_equation():
    S, R = 6, 2
    kernel = qkv.build_attention("adaptive-span", max_span=S, ramp=R, n_heads=3, dynamic=True, d_head=4,
                                 init_span=3.0, causal=True).double()
    with torch.no_grad():
        kernel.span_weight.normal_(generator=torch.Generator().manual_seed(1))
    q, k, v = tensors(M=9, N=9)
    # z_t = S sigmoid(v^T q_t + b)
    z = S * torch.sigmoid(torch.einsum("bhme,he->bhm", q, kernel.span_weight) + kernel.span_bias.view(1, 3, 1))
    torch.testing.assert_close(kernel(q, k, v).output, literal(q, k, v, z.detach(), S, R))
    torch.testing.assert_close(kernel.span_loss(), z.mean(dim=(0, 2)).sum().float())


def test_gradients_reach_the_span():
    kernel = with_spans(qkv.build_attention("adaptive-span", max_span=8, ramp=3, n_heads=2, causal=True), [2.2, 4.5]).double()
    q, k, v = tensors(B=1, H=2, M=6, N=6)
    pad = torch.tensor([[True] * 5 + [False]])
    for need_weights in (False, True):
        def run(span, q_):
            return torch.func.functional_call(kernel, {"span": span}, (q_, k, v),
                                              {"mask": pad, "need_weights": need_weights}).output
        args = (kernel.span.detach().clone().requires_grad_(True), q.clone().requires_grad_(True))
        assert torch.autograd.gradcheck(run, args)
    kernel(q, k, v).output.sum().backward()
    assert (kernel.span.grad != 0).all()


def test_span_loss_and_clamp():
    kernel = qkv.build_attention("adaptive-span", max_span=10, ramp=2, n_heads=2, init_span=4.0)
    torch.testing.assert_close(kernel.span_loss(), torch.tensor(8.0))
    with torch.no_grad():
        kernel.span.copy_(torch.tensor([-0.5, 1.5]))
    torch.testing.assert_close(kernel.spans(), torch.tensor([0.0, 10.0]))  # clamped where used
    kernel.clamp_()
    torch.testing.assert_close(kernel.span.detach(), torch.tensor([0.0, 1.0]))
    assert kernel.current_span() == 10


def test_multihead_fills_heads_and_empty_input():
    mha = qkv.MultiHeadAttention(16, 4, "adaptive-span", causal=True, max_span=8, ramp=2)
    assert mha.kernel.n_heads == 4 and mha.kernel.spans().shape == (4,)
    x = torch.randn(2, 0, 16)
    assert mha(x).output.shape == (2, 0, 16)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="init_span"):
        qkv.build_attention("adaptive-span", max_span=4, init_span=5)
    with pytest.raises(ValueError, match="ramp"):
        qkv.build_attention("adaptive-span", max_span=4, ramp=0)
    with pytest.raises(ValueError, match="d_head"):
        qkv.build_attention("adaptive-span", max_span=4, dynamic=True)
    with pytest.raises(ValueError, match="max_span"):
        qkv.build_attention("adaptive-span", max_span=0)
    q, k, v = tensors(H=3, dtype=torch.float32)
    with pytest.raises(ValueError, match="n_heads=2"):
        qkv.build_attention("adaptive-span", max_span=4, n_heads=2)(q, k, v)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("M", [12, 5, 1])
@pytest.mark.parametrize("padded", [False, True])
def test_full_span_takes_one_fused_call_with_the_same_values_and_gradients(monkeypatch, causal, M, padded):
    """When every span covers the context (z > N - 1, N <= S) the kernel skips the bands (no
    score counted) and gives the banded result: outputs and gradients of q, k, v and z."""
    counted = count_scores(monkeypatch)
    S, N = 16, 12
    kernel = qkv.build_attention("adaptive-span", max_span=S, ramp=3, n_heads=3, causal=causal).double()
    q, k, v = (t.requires_grad_() for t in tensors(M=M, N=N))
    mask = None
    if padded:
        mask = torch.ones(2, N, dtype=torch.bool)
        mask[1, :5] = False  # batch 1: the first five keys padded (causal: early queries see nothing)
    fast = kernel(q, k, v, mask=mask)
    assert counted == []  # the fused path
    grads_fast = torch.autograd.grad(fast.output.square().sum(), (q, k, v, kernel.span), allow_unused=True)
    banded = kernel(q, k, v, mask=mask, need_weights=True)  # weights go through the bands
    assert len(counted) == 1
    torch.testing.assert_close(fast.output, banded.output)
    grads_band = torch.autograd.grad(banded.output.square().sum(), (q, k, v, kernel.span), allow_unused=True)
    for a, b in zip(grads_fast[:3], grads_band[:3]):
        torch.testing.assert_close(a, b)
    assert grads_fast[3] is None or torch.count_nonzero(grads_fast[3]) == 0
    assert grads_band[3] is None or torch.count_nonzero(grads_band[3]) == 0  # z: m is clamped at 1 everywhere


def test_a_span_short_of_the_context_is_not_taken_for_full(monkeypatch):
    counted = count_scores(monkeypatch)
    kernel = with_spans(qkv.build_attention("adaptive-span", max_span=16, ramp=3, n_heads=3, causal=True).double(),
                        [16.0, 16.0, 10.5])
    q, k, v = tensors(M=12, N=12)
    kernel(q, k, v)
    assert len(counted) == 1  # one head's ramp reaches inside the context: the banded path

def test_dynamic_span_of_a_nan_query_is_a_named_error():
    """Issue 20 item 6: a NaN query raised 'cannot convert float NaN to integer'."""
    kernel = qkv.build_attention("adaptive-span", max_span=4, dynamic=True, d_head=4, n_heads=3)
    q, k, v = tensors(dtype=torch.float32)
    q[0, 1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="q holds NaN: the dynamic span"):
        kernel(q, k, v)
