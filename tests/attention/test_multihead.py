"""qkv.MultiHeadAttention against torch.nn.MultiheadAttention and its own contract."""

import pytest
import torch
from torch import nn

import qkv
from qkv import masks


def torch_pair(d=16, h=4, bias=True, seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d, h, bias=bias, batch_first=True)
    return ref, qkv.MultiHeadAttention.from_torch(ref)


@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch_self_attention(bias):
    ref, mha = torch_pair(bias=bias)
    x = torch.randn(3, 7, 16)
    expected, expected_w = ref(x, x, x, need_weights=True, average_attn_weights=False)
    out = mha(x, need_weights=True)
    torch.testing.assert_close(out.output, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights, expected_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mha(x).output, expected, atol=1e-5, rtol=1e-5)  # SDPA path


def test_matches_torch_cross_attention_with_padding_and_causal():
    ref, mha = torch_pair()
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 8, 16)
    pad = masks.padding_mask(torch.tensor([8, 3]), 8)  # True = may attend
    expected, _ = ref(x, mem, mem, key_padding_mask=~pad)  # torch: True = ignore
    torch.testing.assert_close(mha(x, mem, mem, mask=pad).output, expected, atol=1e-5, rtol=1e-5)
    causal = masks.causal_mask(5, 5)
    expected, _ = ref(x, x, x, attn_mask=~causal)
    causal_mha = qkv.MultiHeadAttention.from_torch(ref, causal=True)
    torch.testing.assert_close(causal_mha(x).output, expected, atol=1e-5, rtol=1e-5)


def test_gradients_match_torch():
    ref, mha = torch_pair()
    x = torch.randn(2, 6, 16)
    ref(x, x, x)[0].pow(2).sum().backward()
    mha(x).output.pow(2).sum().backward()
    torch.testing.assert_close(mha.q_proj.weight.grad, ref.in_proj_weight.grad[:16], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(mha.out_proj.weight.grad, ref.out_proj.weight.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attention,kw", [("softmax", {}), ("window", {"radius": 2})])
def test_incremental_decoding_through_the_module(attention, kw):
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 4, attention=attention, causal=True, **kw).eval()
    x = torch.randn(2, 9, 16)
    full = mha(x).output
    state, outs = None, []
    for t in range(9):
        o = mha(x[:, t:t + 1], state=state, return_state=True)
        outs.append(o.output)
        state = o.state
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


def test_kernel_instance_and_kwargs():
    kernel = qkv.build_attention("window", radius=1)
    mha = qkv.MultiHeadAttention(8, 2, attention=kernel)
    assert mha.kernel is kernel
    with pytest.raises(TypeError, match="kernel kwargs"):
        qkv.MultiHeadAttention(8, 2, attention=kernel, radius=2)
    with pytest.raises(TypeError, match="unknown argument"):
        qkv.MultiHeadAttention(8, 2, attention="softmax", radius=2)


def test_kdim_vdim():
    mha = qkv.MultiHeadAttention(8, 2, kdim=5, vdim=3)
    out = mha(torch.randn(2, 4, 8), torch.randn(2, 6, 5), torch.randn(2, 6, 3))
    assert out.output.shape == (2, 4, 8)


def test_bad_input():
    with pytest.raises(ValueError, match="d_model .* divisible by n_heads"):
        qkv.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="unknown attention"):
        qkv.MultiHeadAttention(8, 2, attention="nope")
    mha = qkv.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="query must be 3-D"):
        mha(torch.randn(4, 8))
    with pytest.raises(ValueError, match="feature size of query"):
        mha(torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="batch size"):
        mha(torch.randn(2, 4, 8), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match="key-padding"):
        mha(torch.randn(2, 4, 8), mask=torch.ones(4, 4, dtype=torch.bool)[:3])
    with pytest.raises(TypeError, match="attention must be"):
        qkv.MultiHeadAttention(8, 2, attention=3)


def test_projected_kv_equals_key_value():
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(8, 2)
    x, mem = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    kv = mha.project_kv(mem)
    assert kv[0].shape == (2, 2, 5, 4)
    torch.testing.assert_close(mha(x, kv=kv).output, mha(x, mem, mem).output)
    with pytest.raises(ValueError, match="not both"):
        mha(x, mem, kv=kv)
    with pytest.raises(TypeError, match="project_kv"):
        mha(x, kv=[kv[0]])
