"""transformers' Llama, Mistral, Qwen2 and Qwen3 in and out of qkv's Llama: tiny random models of
each family (2 layers, width 64, 4 query / 2 key-value heads) saved by transformers and loaded by
qkv give the same logits (a left-padded batch too) and the same greedy 20 tokens; qkv's model
written in their format loads back into transformers with the same logits."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

import qkv  # noqa: E402
from qkv.hf.llama import llama_config  # noqa: E402
from qkv.models.base import CheckpointError  # noqa: E402

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None)
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5000.0, "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 6}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 24}),
}


def theirs(family, **extra):
    config_cls, model_cls, kw = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**SIZES, **kw, **extra}, attn_implementation="eager")).eval()
    with torch.no_grad():  # transformers starts norms at 1 and biases at 0: draw them, so that each is read
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def saved(model, path):
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    family = request.param
    hf = theirs(family)
    ours = qkv.Llama.from_pretrained(saved(hf, tmp_path_factory.mktemp(family))).eval()
    return family, hf, ours


IDS = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(1))


def test_logits_equal(pair):
    family, hf, ours = pair
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, rtol=0, atol=1e-5)
    c = ours.config
    assert (c.n_kv_heads, c.qk_norm, c.qkv_bias, c.sliding_window, c.tie_embeddings) == {
        "llama": (2, False, None, None, False), "mistral": (2, False, None, 6, False),
        "qwen2": (2, False, True, None, True), "qwen3": (2, True, None, None, False)}[family]


def test_left_padded_batch_logits_equal(pair):
    _, hf, ours = pair
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad():
        a, b = ours(IDS, attention_mask=mask).logits, hf(IDS, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-5)


def test_greedy_generation_equal(pair):
    _, hf, ours = pair
    prompt = IDS[:, :5]
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0  # left padded
    with torch.no_grad():
        expected = hf.generate(prompt, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    got = ours.generate(prompt, 20, do_sample=False, attention_mask=mask)
    assert torch.equal(got, expected)
    assert torch.equal(ours.generate(prompt[:1], 20, do_sample=False), expected[:1])


def test_round_trip_into_transformers(pair, tmp_path):
    family, hf, ours = pair
    ours.save_pretrained(tmp_path, format="huggingface")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == family
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ours(IDS).logits, rtol=0, atol=1e-5)
    again = qkv.Llama.from_pretrained(tmp_path)
    assert again.config == ours.config


def test_sliding_window_matters():
    """Mistral's window is read: without it the logits beyond the window differ."""
    hf = theirs("mistral")
    state = {k: v for k, v in hf.state_dict().items()}
    config = hf.config.to_dict()
    windowed = qkv.Llama.from_hf(config, state).eval()
    full = qkv.Llama.from_hf({**config, "sliding_window": None}, state).eval()
    with torch.no_grad():
        a, b = windowed(IDS).logits, full(IDS).logits
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, -1], b[:, -1], atol=1e-4)


def test_from_hf_seam_and_tied_copies():
    hf = theirs("qwen2")
    state = hf.state_dict()
    assert "lm_head.weight" in state  # a tied copy: given or left out, one table
    for given in (state, {k: v for k, v in state.items() if k != "lm_head.weight"}):
        ours = qkv.Llama.from_hf(hf.config.to_dict(), dict(given)).eval()
        with torch.no_grad():
            torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, rtol=0, atol=1e-5)
    ours = qkv.Llama.from_hf(hf.config.to_dict(), dict(state), attention="linear")
    assert ours.stack.layers[0].self_attn.kernel.registry_name == "linear"
    with pytest.raises(ValueError, match=r"\['n_kv_heads'\] are fixed by the checkpoint"):
        qkv.Llama.from_hf(hf.config.to_dict(), dict(state), n_kv_heads=4)


def test_sharded_checkpoint(tmp_path):
    hf = theirs("llama")
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    hf.config.to_json_file(tmp_path / "config.json")
    ours = qkv.Llama.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, rtol=0, atol=1e-5)
    index["weight_map"][names[0]] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="against what"):
        qkv.Llama.from_pretrained(tmp_path)


@pytest.mark.parametrize("change,message", [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, "rope_type='longrope' is not a rotary"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"pretraining_tp": 2}, "pretraining_tp=2 is not supported"),
    ({"hidden_act": "tanh"}, "hidden_act='tanh' is not a gate"),
    ({"attention_bias": True}, "attention_bias=True with mlp_bias=False"),
    ({"num_key_value_heads": 3}, "n_kv_heads .3. must divide n_heads .4."),
])
def test_unsupported_fields_are_refused_in_one_line(change, message):
    hf = theirs("llama")
    config = {**hf.config.to_dict(), **change}
    with pytest.raises(ValueError, match=message) as info:
        qkv.Llama.from_hf(config, hf.state_dict())
    assert "\n" not in str(info.value)


def test_legacy_rope_fields_and_missing_tensors():
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 500000.0,
              "rope_scaling": {"type": "linear", "factor": 2.0}}
    _, values = llama_config(config)
    assert values["rope_theta"] == 500000.0 and values["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    hf = theirs("llama")
    state = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    with pytest.raises(CheckpointError, match="lacks model.layers.1.mlp.up_proj.weight"):
        qkv.Llama.from_hf(hf.config.to_dict(), state)
