"""Adaptive span's relative position embeddings (Sukhbaatar et al. 2019; the authors' ``key_pe``):
s_tr = q_t . (k_r + p_{t-r}) / sqrt(d) against the equation written with loops, through the cache,
and in the model, where without them a head with a long span cannot tell the order of its keys."""

import math

import pytest
import torch

import qkv
from qkv.models.transformer.adaptive_span import AdaptiveSpanTransformer, AdaptiveSpanTransformerConfig


def tensors(B=2, H=3, M=10, N=10, E=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, L, E, generator=g, dtype=dtype) for L in (M, N, N))


def literal(q, k, v, z, pe, S, R, causal=True):
    """a_tr = m_z(x) exp(q_t . (k_r + p_x) / sqrt(E)) / sum (...), x = t - r (|t - r| bidirectional), |x| < S."""
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
                    m = min(max((R + float(z[h]) - x) / R, 0.0), 1.0)
                    w = m * math.exp(float(q[b, h, i] @ (k[b, h, r] + pe[:, x])) / math.sqrt(E))
                    num += w * v[b, h, r]
                    den += w
                if den > 0:
                    out[b, h, i] = num / den
    return out


def kernel(S=8, R=3, causal=True, **kw):
    att = qkv.build_attention("adaptive-span", max_span=S, ramp=R, n_heads=3, d_head=4, relative=True, causal=causal,
                              **kw).double()
    with torch.no_grad():
        att.span.copy_(torch.tensor([0.5, 2.0, 6.0], dtype=torch.float64) / S)
    return att


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_relative_scores_match_the_equation(causal, need_weights):
    att = kernel(causal=causal, block=4)
    q, k, v = tensors(M=7, N=11)  # 4 cached positions before the queries
    out = att(q, k, v, need_weights=need_weights)
    expected = literal(q, k, v, att.spans().detach(), att.key_pe.detach(), 8, 3, causal)
    torch.testing.assert_close(out.output, expected)


def test_relative_embeddings_learn_and_survive_the_cache():
    att = kernel().float()
    q, k, v = tensors(M=15, N=15, dtype=torch.float32)
    full = att(q, k, v).output
    state, outs, start = None, [], 0
    for size in [1, 4, 2, 7, 1]:
        o = att(q[:, :, start:start + size], k[:, :, start:start + size], v[:, :, start:start + size], state=state,
                return_state=True)
        outs.append(o.output)
        state, start = o.state, start + size
    torch.testing.assert_close(torch.cat(outs, dim=2), full, atol=1e-5, rtol=1e-5)
    full.square().sum().backward()
    assert att.key_pe.grad is not None and att.key_pe.grad[:, :5].abs().sum() > 0  # distances 0..4 carry weight


def test_relative_needs_the_head_size():
    with pytest.raises(ValueError, match="d_head"):
        qkv.build_attention("adaptive-span", max_span=8, relative=True)
    with pytest.raises(TypeError, match="relative"):
        qkv.build_attention("adaptive-span", max_span=8, relative=1, d_head=4)


def order_sensitivity(relative_positions: bool) -> float:
    """One layer, every span at S: how much the last position's prediction changes when the keys
    before it are permuted."""
    torch.manual_seed(0)
    m = AdaptiveSpanTransformer(AdaptiveSpanTransformerConfig(
        vocab_size=20, n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0, max_span=16, ramp=2.0,
        init_span=16.0, relative_positions=relative_positions)).eval()
    x = torch.arange(1, 11)[None]
    shuffled = torch.cat([x[:, :-1][:, torch.randperm(9, generator=torch.Generator().manual_seed(1))], x[:, -1:]], 1)
    with torch.no_grad():
        return float((m(x).logits[0, -1] - m(shuffled).logits[0, -1]).abs().max())


def test_the_model_tells_the_order_of_keys_inside_a_long_span():
    # without relative positions a full span is a bag of keys: permuting them changes nothing,
    # so a longer span can only blur the order and the language model pulls spans down to the ramp
    assert order_sensitivity(relative_positions=False) < 1e-5
    assert order_sensitivity(relative_positions=True) > 1e-3
    assert AdaptiveSpanTransformerConfig().relative_positions  # the paper's model has them
