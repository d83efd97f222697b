"""qkv's gated delta rule inside transformers' Qwen3-Next (qkv.hf.qwen3_next, put in place by
``qkv.integrations.huggingface.register()``): a tiny random Qwen3NextForCausalLM (float32) gives
the logits of transformers' own PyTorch functions to 1e-5 — unpadded, left-padded, and through
``generate`` with its cache (greedy tokens identical) — and ``unpatch`` gives transformers its
functions back."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

import qkv  # noqa: E402
from qkv.hf import qwen3_next  # noqa: E402
from qkv.integrations import huggingface  # noqa: E402

ATOL = 1e-5
NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


@pytest.fixture(autouse=True)
def transformers_own_functions():
    """Each test starts and ends with transformers' functions in place."""
    qwen3_next.unpatch()
    yield
    qwen3_next.unpatch()


def _model():
    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Qwen3NextForCausalLM(config).eval()


def _ids(B, T, seed=0):
    return torch.randint(3, 50, (B, T), generator=torch.Generator().manual_seed(seed))


def test_register_patches_and_unpatch_restores():
    originals = [getattr(modeling, n) for n in NAMES]
    huggingface.register()
    assert [getattr(modeling, n).__wrapped__ for n in NAMES] == [
        qkv.functional.chunk_gated_delta_rule, qkv.functional.fused_recurrent_gated_delta_rule]
    assert sorted(qwen3_next.patched()) == sorted(f"{modeling.__name__}.{n}" for n in NAMES)
    huggingface.register()  # again: still one layer of qkv, the originals kept
    qwen3_next.unpatch()
    assert [getattr(modeling, n) for n in NAMES] == originals and qwen3_next.patched() == []


def test_logits_and_generation_equal_transformers_own(patch_keeps_the_model):
    patch_keeps_the_model(_model(), qwen3_next.patch, ATOL)


def test_training_gradients_flow_through_the_patched_layer():
    model = _model().train()
    ids = _ids(1, 20, seed=2)
    qwen3_next.patch()
    model(input_ids=ids, labels=ids).loss.backward()
    layer = model.model.layers[0].linear_attn
    assert layer.A_log.grad is not None and layer.dt_bias.grad is not None and layer.in_proj_ba.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("T", [1, 37, 130])
def test_functions_equal_transformers_reference_functions(T):
    """The same inputs to qkv's functions and transformers' (fp32, grouped value heads, a state)."""
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(2, T, 2, 8, generator=g), torch.randn(2, T, 2, 8, generator=g)
    v = torch.randn(2, T, 4, 6, generator=g)
    decay, beta = -torch.rand(2, T, 4, generator=g) * 2, torch.rand(2, T, 4, generator=g)
    S0 = torch.randn(2, 4, 8, 6, generator=g)
    pairs = ((qkv.functional.chunk_gated_delta_rule, modeling.torch_chunk_gated_delta_rule),
             (qkv.functional.fused_recurrent_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule))
    for ours, theirs in pairs:
        kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        o, S = ours(q, k, v, decay, beta, **kw)
        o_ref, S_ref = theirs(q, k, v, g=decay, beta=beta, **kw)
        torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(S, S_ref, atol=ATOL, rtol=0)


def test_patched_globals_take_transformers_positional_order():
    """transformers puts chunk_size sixth, where fla (and qkv.functional) put scale: the patched global
    binds a call by the signature of the function it replaced (qkv.hf.delta_rule)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 40, 2, d, generator=g) for d in (8, 8, 6))
    decay, beta = -torch.rand(1, 40, 2, generator=g), torch.rand(1, 40, 2, generator=g)
    S0 = torch.randn(1, 2, 8, 6, generator=g)
    expected = modeling.torch_chunk_gated_delta_rule(q, k, v, decay, beta, 16, S0, True, True)
    qwen3_next.patch()
    got = modeling.torch_chunk_gated_delta_rule(q, k, v, decay, beta, 16, S0, True, True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
