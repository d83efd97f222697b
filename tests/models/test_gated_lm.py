"""The gated linear-attention LMs (``gla``, ``deltanet``) and the stack knobs they are made of:
the short convolution and the output gate against their literal equations, decoding with the
recurrent state against the full forward, left padding, hybrid stacks, bad configurations."""

import pytest
import torch
import torch.nn.functional as F

import qkv  # noqa: F401  (registers everything)
from qkv.blocks import OutputGate, ShortConv
from qkv.models import DeltaNet, DeltaNetConfig, GLA, GLAConfig, GPT, GPTConfig
from qkv.models.transformer.stack import GatedSelfAttention, GatedSelfAttentionState, StackConfig
from qkv.registry import lookup

SMALL = dict(vocab_size=20, n_layers=2, d_model=32, n_heads=2, d_ff=64, dropout=0.0)


def test_short_conv_is_the_causal_depthwise_sum_then_silu():
    torch.manual_seed(0)
    conv = ShortConv(5, 3).double()
    x = torch.randn(2, 7, 5, dtype=torch.float64)
    y, cache = conv(x)
    w = conv.weight  # (C, K): w[:, -1] multiplies x_t
    want = torch.zeros_like(x)
    for t in range(7):
        for j in range(3):
            if t - j >= 0:
                want[:, t] += w[:, 2 - j] * x[:, t - j]
    torch.testing.assert_close(y, F.silu(want))
    torch.testing.assert_close(cache, x[:, -2:])
    a, c1 = conv(x[:, :4])  # in pieces: the cache carries the last K - 1 inputs
    b, c2 = conv(x[:, 4:], c1)
    torch.testing.assert_close(torch.cat([a, b], 1), y)
    torch.testing.assert_close(c2, cache)
    (y.sum()).backward()
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0


def test_short_conv_of_one_position_and_bad_input():
    conv = ShortConv(3, 1)
    x = torch.randn(1, 4, 3)
    y, cache = conv(x)
    torch.testing.assert_close(y, F.silu(x * conv.weight[:, 0]))
    assert cache.shape == (1, 0, 3)
    with pytest.raises(ValueError, match="feature size"):
        conv(torch.randn(1, 4, 2))
    with pytest.raises(ValueError, match=r"cache must be \(B, kernel_size - 1, channels\)"):
        ShortConv(3, 4)(x, torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="kernel_size must be > 0"):
        ShortConv(3, 0)


def test_output_gate_is_silu_of_x_w_r_times_o():
    gate = OutputGate(4, 6).double()
    x, o = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, 6, dtype=torch.float64)
    torch.testing.assert_close(gate(x, o), F.silu(x @ gate.proj.weight.T) * o)
    assert gate.proj.bias is None
    with pytest.raises(ValueError, match="the shape"):
        gate(x, torch.randn(2, 3, 5))


def _mha(attention="deltanet", **kw):
    torch.manual_seed(0)
    return GatedSelfAttention(16, 2, attention, causal=True, short_conv=kw.pop("short_conv", 3),
                              output_gate=kw.pop("output_gate", True), **kw).double()


def test_gated_self_attention_is_conv_then_kernel_then_gate():
    """The literal composition: q, k, v = SiLU(conv(x W)), the kernel with its gates, SiLU(x W_r) ⊙ o, W^O."""
    mha = _mha()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    qkv_ = torch.cat([mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)], -1)
    qkv_, _ = mha.conv(qkv_)
    q, k, v = (t.view(2, 6, 2, 8).transpose(1, 2) for t in qkv_.chunk(3, -1))
    o = mha.kernel(q, k, v, **mha.gates(x)).output.transpose(1, 2).reshape(2, 6, 16)
    want = mha.out_proj(F.silu(mha.out_gate.proj(x)) * o)
    torch.testing.assert_close(mha(x).output, want)


@pytest.mark.parametrize("attention", ["deltanet", "gla", "gated-deltanet", "linear", "softmax"])
def test_gated_self_attention_decodes_token_by_token_as_the_full_forward(attention):
    mha = _mha(attention)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    full = mha(x).output
    state, outs = None, []
    for t in range(7):
        out = mha(x[:, t:t + 1], state=state, return_state=True)
        assert isinstance(out.state, GatedSelfAttentionState) and out.state.conv.shape == (2, 2, 48)
        state, outs = out.state, outs + [out.output]
    torch.testing.assert_close(torch.cat(outs, 1), full)
    first = mha(x[:, :3], return_state=True)  # a prompt, then the rest
    torch.testing.assert_close(torch.cat([first.output, mha(x[:, 3:], state=first.state).output], 1), full)


@pytest.mark.parametrize("attention", ["gated-deltanet", "softmax", "linear"])
def test_gated_self_attention_keeps_grouped_keys_qk_norm_and_rotary(attention):
    """The short convolution and output gate sit around MultiHeadAttention's own head handling:
    grouped keys, qk-norm and rotary positions act on the convolved heads, decoding included."""
    from qkv.rotary import RotaryEmbedding

    torch.manual_seed(0)
    mha = GatedSelfAttention(16, 4, attention, causal=True, short_conv=3, output_gate=True, n_kv_heads=2,
                             qk_norm=True, rotary=RotaryEmbedding(4, base=100.0)).double()
    assert mha.conv.channels == 16 + 2 * 8  # q: 4 heads of 4, k and v: 2 heads of 4
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    full = mha(x).output
    state, outs = None, []
    for t in range(6):
        out = mha(x[:, t:t + 1], state=state, return_state=True)
        state, outs = out.state, outs + [out.output]
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-12, rtol=1e-10)
    same_place = mha(x, positions=torch.zeros(6, dtype=torch.long)).output  # rotary reads the positions it is given
    assert not torch.allclose(same_place, full)


def test_gated_self_attention_refuses_cross_attention_and_foreign_state():
    mha = _mha()
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="self-attention only"):
        mha(x, torch.randn(1, 3, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="GatedSelfAttentionState"):
        mha(x, state=(None, None))


@pytest.mark.parametrize("cls, config", [(GLA, GLAConfig), (DeltaNet, DeltaNetConfig)])
def test_lm_decoding_with_the_state_equals_the_full_forward(cls, config):
    torch.manual_seed(0)
    model = cls(config(**SMALL)).double().eval()
    ids = torch.randint(0, 20, (2, 9))
    full = model(ids).logits
    state, steps = None, []
    for t in range(9):
        out = model(ids[:, t:t + 1], state=state, return_state=True)
        state, steps = out.state, steps + [out.logits]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=1e-10)  # float64 end to end
    cached = model.generate(ids[:, :3], 6, temperature=0)
    assert torch.equal(cached, model.generate(ids[:, :3], 6, temperature=0, use_cache=False))


def test_the_presets_are_the_papers_layers():
    gla, delta = GLA(GLAConfig(**SMALL)), DeltaNet(DeltaNetConfig(**SMALL))
    for model, kernel, conv in ((gla, "gla", None), (delta, "deltanet", 4)):
        for block in model.stack.layers:
            attn = block.self_attn
            assert isinstance(attn, GatedSelfAttention) and attn.kernel.registry_name == kernel
            assert attn.out_gate is not None and attn.kernel.norm  # SiLU(x W_r) ⊙ Norm(o)
            assert (attn.conv.kernel_size if attn.conv is not None else None) == conv
            assert attn.gates is not None  # the data-dependent gates from x
    assert gla.config.positional == delta.config.positional == "none"
    assert lookup("model", "gla").default_preset == "cpu" and "shakespeare-char" in DeltaNet.suggested_tasks


def test_left_padding_gives_the_row_alone():
    torch.manual_seed(0)
    model = DeltaNet(DeltaNetConfig(**SMALL)).double().eval()
    ids = torch.randint(0, 20, (1, 6))
    alone = model(ids).logits
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask = torch.tensor([[False] * 3 + [True] * 6])
    torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, 3:], alone)


def test_hybrid_stack_puts_softmax_on_every_kth_layer():
    model = DeltaNet(DeltaNetConfig(**{**SMALL, "n_layers": 4}, hybrid_every=2)).double().eval()
    kinds = [type(b.self_attn).__name__ + ":" + b.self_attn.kernel.registry_name for b in model.stack.layers]
    assert kinds == ["GatedSelfAttention:deltanet", "MultiHeadAttention:softmax"] * 2
    assert StackConfig(hybrid_every=3, n_layers=6).layer_attention(2) == "softmax"
    assert [StackConfig(hybrid_every=3, attention="gla", hybrid_attention="linear").layer_attention(i)
            for i in range(6)] == ["gla", "gla", "linear"] * 2
    ids = torch.randint(0, 20, (2, 7))
    full = model(ids).logits
    first = model(ids[:, :4], return_state=True)
    torch.testing.assert_close(torch.cat([first.logits, model(ids[:, 4:], state=first.state).logits], 1), full)


def test_knobs_on_any_stack_model():
    model = GPT(GPTConfig(**SMALL, attention="gla", short_conv=2))
    assert isinstance(model.stack.layers[0].self_attn, GatedSelfAttention)
    assert model.stack.layers[0].self_attn.out_gate is None
    plain = GPT(GPTConfig(**SMALL, attention="gla"))
    assert type(plain.stack.layers[0].self_attn).__name__ == "MultiHeadAttention"


@pytest.mark.parametrize("field, value, error, message", [
    ("short_conv", -1, ValueError, "short_conv must be >= 0"),
    ("short_conv", 2.0, TypeError, "short_conv must be an int"),
    ("output_gate", "yes", TypeError, "output_gate must be a bool"),
    ("hybrid_every", -2, ValueError, "hybrid_every must be >= 0"),
    ("hybrid_attention", "nope", ValueError, "hybrid_attention: "),
    ("hybrid_attention", 3, TypeError, "hybrid_attention must be a str"),
])
def test_bad_knobs_are_refused(field, value, error, message):
    with pytest.raises(error, match=message):
        StackConfig(**{field: value})


def test_context_parallel_refuses_the_short_convolution():
    from qkv._errors import UserError
    from qkv.train.distributed import refuse_unsplittable

    with pytest.raises(UserError, match="short_conv"):
        refuse_unsplittable(GPT(GPTConfig(**SMALL, short_conv=2)), carries_state=False)
    refuse_unsplittable(GPT(GPTConfig(**SMALL, output_gate=True)), carries_state=False)  # the gate is per position
