"""qkv's kernels inside transformers models (qkv.hf.attention): registered through both
AttentionInterface and AttentionMaskInterface, ``qkv-softmax`` equal to transformers' eager
attention (padding, causal, grouped key/value heads), the other kernels equal to qkv's own models
on the same weights, decoding under transformers' KV cache, and the kernels that cannot serve."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from qkv.hf import attention as hf  # noqa: E402
from qkv.models import BERT  # noqa: E402

ATOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def registered():
    return hf.register()


def _bert(**kw):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=24, **kw)
    return transformers.BertModel(config).eval()


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _llama(kv_heads=1):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config).eval()


def _llama_gqa():
    return _llama(kv_heads=2)  # grouped: two query heads per key/value head (MQA above: one for all)


def _batch(padding="right"):
    ids = torch.randint(1, 40, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padding == "right":
        mask[1, 6:] = 0
        mask[2, 3:] = 0
    else:
        mask[1, :4] = 0
        mask[2, :7] = 0
    return ids, mask


def _run(model, impl, ids, mask, **kw):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kw)


def test_register_puts_every_fitting_kernel_in_both_interfaces(registered):
    assert {"qkv-softmax", "qkv-window", "qkv-local-1d", "qkv-strided", "qkv-fixed", "qkv-performer", "qkv-linear",
            "qkv-efficient", "qkv-lsh", "qkv-retention"} == set(registered)
    assert registered["qkv-lsh"][1]["shared_qk"] is False  # lsh fits encoders without shared QK
    for name in registered:
        assert name in AttentionInterface._global_mapping and name in AttentionMaskInterface._global_mapping
    for refused in ("qkv-linformer", "qkv-adaptive-span", "qkv-relative", "qkv-local-2d", "qkv-gla", "qkv-deltanet",
                    "qkv-gated-deltanet"):
        assert refused not in registered  # registered to say why, not to run
        assert AttentionInterface._global_mapping[refused].__name__.startswith("qkv_refused_")


@pytest.mark.parametrize("make, padding", [(_bert, "right"), (_gpt2, "right"), (_gpt2, "left"), (_llama, "left"),
                                           (_llama_gqa, "left")])
def test_qkv_softmax_is_eager_attention(make, padding):
    model = make()
    ids, mask = _batch(padding)
    eager = _run(model, "eager", ids, mask, output_attentions=True)
    ours = _run(model, "qkv-softmax", ids, mask, output_attentions=True)
    real = mask.bool()  # rows with no real key (left padding) are zeros in qkv, uniform in eager
    key = "last_hidden_state" if hasattr(eager, "last_hidden_state") else "logits"
    torch.testing.assert_close(getattr(ours, key)[real], getattr(eager, key)[real], atol=ATOL, rtol=0)
    for ours_w, eager_w in zip(ours.attentions, eager.attentions):  # (B, H, L, L) per layer
        torch.testing.assert_close(ours_w.transpose(1, 2)[real], eager_w.transpose(1, 2)[real], atol=ATOL, rtol=0)


def test_without_its_mask_function_an_attention_loses_the_padding():
    model = _bert()
    ids, mask = _batch()
    eager = _run(model, "eager", ids, mask).last_hidden_state
    AttentionInterface.register("qkv-test-no-mask", AttentionInterface._global_mapping["qkv-softmax"])
    try:
        lost = _run(model, "qkv-test-no-mask", ids, mask).last_hidden_state
    finally:
        del AttentionInterface._global_mapping["qkv-test-no-mask"]
    assert not torch.allclose(lost[mask.bool()], eager[mask.bool()], atol=1e-3)
    torch.testing.assert_close(_run(model, "qkv-softmax", ids, mask).last_hidden_state[mask.bool()], eager[mask.bool()],
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("kernel, knobs", [("window", {"radius": 2}), ("strided", {"stride": 3}), ("linear", {}),
                                           ("efficient", {}), ("lsh", {"shared_qk": False, "seed": 0, "bucket_size": 2})])
def test_kernels_in_transformers_equal_qkv_models_on_the_same_weights(tmp_path, kernel, knobs):
    model = _bert()
    model.save_pretrained(tmp_path)
    impl = f"qkv-test-{kernel}"
    hf.register(impl, kernel, **knobs)
    ids, mask = _batch()
    theirs = _run(model, impl, ids, mask).last_hidden_state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the heads a BertModel lacks start fresh
        ours = BERT.from_pretrained(tmp_path, attention=kernel, attention_kwargs=knobs).eval()
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask.bool()).hidden
    torch.testing.assert_close(theirs[mask.bool()], expected[mask.bool()], atol=ATOL, rtol=0)
    eager = _run(model, "eager", ids, mask).last_hidden_state
    assert not torch.allclose(theirs, eager, atol=1e-4)  # it is another kernel, not softmax


@pytest.mark.parametrize("impl", ["qkv-softmax", "qkv-linear", "qkv-performer", "qkv-window-2", "qkv-local-1d-3"])
def test_decoding_under_the_kv_cache_equals_recomputing(impl):
    hf.register("qkv-window-2", "window", radius=2)
    hf.register("qkv-local-1d-3", "local-1d", block=3, memory=3)
    model = _gpt2()
    model.set_attn_implementation(impl)
    ids = torch.randint(1, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    cached = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=True)
    again = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, again)
    # the same logits as one pass over the whole sequence
    full = _run(model, impl, cached, torch.ones_like(cached)).logits
    model.set_attn_implementation(impl)
    with torch.no_grad():
        prefix = model(input_ids=cached[:, :-1], use_cache=True)
        step = model(input_ids=cached[:, -1:], past_key_values=prefix.past_key_values).logits
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=ATOL, rtol=0)


def test_static_cache_needs_full_masks():
    model = _gpt2()
    ids = torch.randint(1, 40, (1, 4), generator=torch.Generator().manual_seed(3))
    model.set_attn_implementation("qkv-softmax")
    dynamic = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static"), dynamic)
    model.set_attn_implementation("qkv-linear")
    with pytest.raises(ValueError, match="takes key-padding masks only; use qkv-softmax"):
        model.generate(ids, max_new_tokens=2, do_sample=False, cache_implementation="static")


def test_kernels_that_cannot_serve_say_why():
    with pytest.raises(ValueError, match="linformer.*learned projections E and F"):
        hf.register("qkv-my-linformer", "linformer", seq_len=16)
    with pytest.raises(ValueError, match="shares queries and keys.*shared_qk=False"):
        hf.register("qkv-my-lsh", "lsh")
    with pytest.raises(ValueError, match="image_size"):
        hf.register("qkv-my-2d", "local-2d")
    with pytest.raises(ValueError, match="must be an attn_implementation starting with 'qkv-'"):
        hf.register("sdpa", "window", radius=2)
    assert hf.register("qkv-w", "window") == {"qkv-w": ("window", {})}  # the radius: its own default_knobs
    with pytest.raises(TypeError, match="unknown argument"):
        hf.register("qkv-w", "window", radius=2, width=3)
    model = _gpt2()
    model.set_attn_implementation("qkv-efficient")
    with pytest.raises(ValueError, match="'efficient' cannot be causal.*GPT2Attention is a decoder"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_a_kernel_without_dropout_says_it_in_training():
    model = _bert(attention_probs_dropout_prob=0.1)
    model.set_attn_implementation("qkv-linear")
    model.train()
    hf._warned.discard(("qkv-linear", "dropout"))
    with pytest.warns(UserWarning, match="applies no dropout"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_knobs_not_given_are_the_kernels_own_for_the_models_length():
    """A registered kernel fills the knobs it was not given from its ``default_knobs`` at the
    model's length (config.max_position_embeddings), as qkv's own models do."""
    from qkv.registry import lookup

    hf.register("qkv-w-default", "window")
    model = _bert()
    model.set_attn_implementation("qkv-w-default")
    ids, mask = _batch()
    _run(model, "qkv-w-default", ids, mask)
    built = [k for layer in model.modules() for key, k in hf.layer_kernels(layer).items() if key.impl == "qkv-w-default"]
    assert built
    expected = lookup("attention", "window").default_knobs(model.config.max_position_embeddings, 1, 1)["radius"]
    assert all(k.radius == expected for k in built)


def test_the_old_import_paths_name_the_same_modules():
    """``qkv.hf`` is the one home of qkv meets transformers; ``qkv.integrations.huggingface``,
    ``.pretrained`` and ``.export`` are the same module objects (issue 40, item 5)."""
    import qkv.hf.attention
    import qkv.hf.export
    import qkv.hf.pretrained
    from qkv.integrations import export, huggingface, pretrained

    assert huggingface is qkv.hf.attention and export is qkv.hf.export and pretrained is qkv.hf.pretrained
    assert hf is qkv.hf.attention
