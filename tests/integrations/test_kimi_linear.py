"""qkv's KDA inside transformers' Kimi Linear (qkv.hf.delta_rule, put in place by
``qkv.hf.attention.register()``): qkv.functional.chunk_kda / fused_recurrent_kda equal transformers'
own PyTorch functions on random inputs (read from the module unpatched), a tiny random
KimiLinearForCausalLM (float32) gives the logits of those functions to 1e-5 — unpadded, left-padded,
and through ``generate`` with its cache (greedy tokens identical) —, the patched globals take
transformers' positional order, and ``unpatch`` gives transformers its functions back."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

import qkv  # noqa: E402
from qkv.hf import attention, delta_rule  # noqa: E402

ATOL = 1e-5
NAMES = ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")
OURS = (qkv.functional.chunk_kda, qkv.functional.fused_recurrent_kda)


@pytest.fixture(autouse=True)
def transformers_own_functions():
    """Each test starts and ends with transformers' functions in place (Qwen3-Next's too: register() patches both)."""
    delta_rule.unpatch()
    yield
    delta_rule.unpatch()


def _model():
    torch.manual_seed(0)
    config = transformers.KimiLinearConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"],
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, num_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        linear_head_dim=8, linear_num_heads=2, linear_conv_kernel_dim=4, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.KimiLinearForCausalLM(config).eval()


def _ids(B, T, seed=0):
    return torch.randint(3, 50, (B, T), generator=torch.Generator().manual_seed(seed))


def _inputs(T, seed):
    """transformers' KDA layout (one head count for q, k and v): q, k (B, T, H, K), v (B, T, H, V),
    g (B, T, H, K) <= 0, beta (B, T, H), a state (B, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, T, 3, 8, generator=gen), torch.randn(2, T, 3, 8, generator=gen)
    v = torch.randn(2, T, 3, 6, generator=gen)
    g, beta = -torch.rand(2, T, 3, 8, generator=gen) * 2, torch.rand(2, T, 3, generator=gen)
    return q, k, v, g, beta, torch.randn(2, 3, 8, 6, generator=gen)


def test_register_patches_and_unpatch_restores():
    originals = [getattr(modeling, n) for n in NAMES]
    assert not any(hasattr(f, "_qkv_serves") for f in originals)
    attention.register()
    assert tuple(getattr(modeling, n).__wrapped__ for n in NAMES) == OURS
    assert sorted(delta_rule.patched(delta_rule.KIMI_LINEAR)) == sorted(f"{modeling.__name__}.{n}" for n in NAMES)
    attention.register()  # again: still one layer of qkv, the originals kept
    delta_rule.unpatch(delta_rule.KIMI_LINEAR)
    assert [getattr(modeling, n) for n in NAMES] == originals and delta_rule.patched(delta_rule.KIMI_LINEAR) == []
    with pytest.raises(ValueError, match="modules must be among"):
        delta_rule.patch("transformers.models.llama.modeling_llama")


@pytest.mark.parametrize("T", [1, 37, 130])
def test_functions_equal_transformers_reference_functions(T):
    """The same inputs to qkv's functions and to transformers' (fp32, a state, the L2 norm in the kernel;
    130 positions: three chunks of 64, the last short)."""
    q, k, v, g, beta, S0 = _inputs(T, seed=T)
    for ours, name in zip(OURS, NAMES):
        theirs = getattr(modeling, name)
        assert not hasattr(theirs, "_qkv_serves")
        kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        o, S = ours(q, k, v, g, beta, **kw)
        o_ref, S_ref = theirs(q, k, v, g=g, beta=beta, **kw)
        torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(S, S_ref, atol=ATOL, rtol=0)


def test_patched_globals_take_transformers_positional_order():
    """transformers' chunk function has chunk_size sixth, where fla (and qkv.functional) has scale: the
    patched global binds a call by the signature of the function it replaced, so the same positional
    call gives the same result; the layer's other keyword arguments are dropped, as transformers' wrapper does."""
    q, k, v, g, beta, S0 = _inputs(70, seed=3)
    chunk, step = (getattr(modeling, n) for n in NAMES)
    expected = chunk(q, k, v, g, beta, 16, S0, True, True)
    expected_step = step(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], S0, True, True)
    delta_rule.patch(delta_rule.KIMI_LINEAR)
    got = modeling.chunk_kimi_delta_attention(q, k, v, g, beta, 16, S0, True, True, position_ids=None)
    got_step = modeling.recurrent_kimi_delta_attention(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], S0, True,
                                                      True)
    for a, b in zip((*got, *got_step), (*expected, *expected_step)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    with pytest.raises(TypeError):  # what the replaced function refuses is refused
        modeling.recurrent_kimi_delta_attention(q, k, v, g, beta, S0, True, True, "one too many")


def test_logits_and_generation_equal_transformers_own(patch_keeps_the_model):
    def register():
        attention.register()
        assert modeling.chunk_kimi_delta_attention.__wrapped__ is qkv.functional.chunk_kda

    patch_keeps_the_model(_model(), register, ATOL)


def test_training_gradients_flow_through_the_patched_layer():
    model = _model().train()
    ids = _ids(1, 20, seed=2)
    delta_rule.patch(delta_rule.KIMI_LINEAR)
    model(input_ids=ids, labels=ids).loss.backward()
    layer = model.model.layers[0].self_attn
    assert layer.forget_gate.A_log.grad is not None and layer.forget_gate.dt_bias.grad.abs().sum() > 0
    assert layer.b_proj.weight.grad.abs().sum() > 0


def test_the_fallbacks_chunk_size_is_not_passed_on(monkeypatch):
    """transformers calls its KDA with chunks of 64, its own fallback's chunking; qkv's engine runs its
    faster default (8) instead — the same result to rounding."""
    from qkv import _chunkwise

    seen = []
    engine = _chunkwise.chunkwise
    monkeypatch.setattr(_chunkwise, "chunkwise", lambda *a, **kw: seen.append(kw["chunk_size"]) or engine(*a, **kw))
    q, k, v, g, beta, S0 = _inputs(70, seed=3)
    expected = getattr(modeling.chunk_kimi_delta_attention, "__wrapped__")(q, k, v, g, beta, 64, S0, True, True)
    delta_rule.patch(delta_rule.KIMI_LINEAR)
    got = modeling.chunk_kimi_delta_attention(q, k, v, g, beta, 64, S0, True, True)
    assert seen == [8]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
