"""Every keyword argument a transformers model passes to a qkv attention function is honoured or
refused by name (qkv.hf.attention.CARRIED / UNIMPLEMENTED): none is dropped without a word. The
standard ones (transformers' TransformersKwargs, FlashAttentionKwargs, sdpa's own parameters)
give qkv-softmax eager attention's answer; DeepSeek V3.2's sparse ``indices=`` and the score
modifiers are refused naming the argument and the kernel."""

import inspect
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.modeling_flash_attention_utils import FlashAttentionKwargs  # noqa: E402
from transformers.models.llama.modeling_llama import eager_attention_forward  # noqa: E402
from transformers.utils.generic import TransformersKwargs  # noqa: E402

from qkv.hf import attention as hf  # noqa: E402

#: the arguments the attention function itself honours (beyond query, key, value and the mask)
HONOURED = {"dropout", "scaling", "is_causal", "output_attentions"}


@pytest.fixture(scope="module", autouse=True)
def registered():
    return hf.register()


def _llama_layer():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config).eval().model.layers[0].self_attn


def _heads():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64), torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64)
    return q, k, v


def test_every_standard_argument_is_honoured_carried_or_refused():
    """The names transformers passes to every attention function, read from transformers itself:
    a name added in a later version fails here until it is placed in one of the tables."""
    standard = set(TransformersKwargs.__annotations__) | set(FlashAttentionKwargs.__annotations__)
    standard |= set(inspect.signature(sdpa_attention_forward).parameters) - {"module", "query", "key", "value",
                                                                            "attention_mask", "kwargs"}
    unplaced = sorted(n for n in standard if n not in HONOURED | set(hf.CARRIED) | set(hf.UNIMPLEMENTED))
    assert unplaced == []
    assert not set(hf.CARRIED) & set(hf.UNIMPLEMENTED)


# a value of each carried argument as a model passes it
CARRIED_VALUES = {
    "position_ids": torch.arange(6).expand(2, 6), "cu_seq_lens_q": torch.tensor([0, 6]),
    "cu_seq_lens_k": torch.tensor([0, 6]), "max_length_q": 6, "max_length_k": 6, "seq_idx": torch.zeros(2, 6),
    "sliding_window": 6, "deterministic": True, "output_hidden_states": True, "output_router_logits": True,
    "return_dict": True, "num_items_in_batch": torch.tensor(12), "use_cache": True, "past_key_values": object(),
    "cache_position": torch.arange(6), "encoder_hidden_states": torch.zeros(2, 6, 32),
    "encoder_attention_mask": torch.ones(2, 6), "input_ids": torch.ones(2, 6, dtype=torch.long),
    "inputs_embeds": torch.zeros(2, 6, 32), "token_type_ids": torch.zeros(2, 6, dtype=torch.long),
    "decoder_input_ids": torch.ones(2, 6, dtype=torch.long), "decoder_attention_mask": torch.ones(2, 6),
    "decoder_inputs_embeds": torch.zeros(2, 6, 32),
}


@pytest.mark.parametrize("name", sorted(hf.CARRIED))
def test_a_carried_argument_gives_eagers_answer(name):
    """Eager attention reads none of these (the mask carries windows and packing): qkv-softmax with
    the argument equals eager with it."""
    layer, (q, k, v) = _llama_layer().double(), _heads()
    kwargs = {name: CARRIED_VALUES[name]}
    ours, _ = AttentionInterface._global_mapping["qkv-softmax"](layer, q, k, v, None, scaling=0.3, **kwargs)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    mask = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~causal, torch.finfo(torch.float64).min)
    theirs, _ = eager_attention_forward(layer, q, k, v, mask[None, None], scaling=0.3, **kwargs)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


# a value of each argument qkv's kernels do not compute, as a model passes it
REFUSED_VALUES = {
    "softcap": 50.0, "s_aux": torch.zeros(4), "sinks": torch.zeros(1, 4, 1, 1), "position_bias": torch.zeros(1, 4, 6, 6),
    "indices": torch.zeros(2, 6, 3, dtype=torch.int32), "block_indices": torch.zeros(2, 1, 6, 2, dtype=torch.long),
    "cache": object(), "an_argument_of_tomorrow": torch.zeros(1),
}


@pytest.mark.parametrize("impl", ["qkv-softmax", "qkv-performer"])
@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_an_argument_no_kernel_computes_is_refused_by_name(impl, name):
    assert set(hf.UNIMPLEMENTED) <= set(REFUSED_VALUES)
    layer, (q, k, v) = _llama_layer().double(), _heads()
    attention = AttentionInterface._global_mapping[impl]
    with pytest.raises(ValueError) as e:
        attention(layer, q, k, v, None, scaling=0.3, **{name: REFUSED_VALUES[name]})
    said = str(e.value)
    assert f"{name}=" in said and impl in said and repr(impl[len(hf.PREFIX):]) in said and "LlamaAttention" in said
    attention(layer, q, k, v, None, scaling=0.3, **{name: None})  # None: the argument is not given


def test_a_window_or_packing_the_mask_does_not_hold_is_refused():
    """Without a full mask the carried patterns would be dropped: a window shorter than the keys and
    packed sequences are refused by name (a window as long as the keys restricts nothing: runs)."""
    layer, (q, k, v) = _llama_layer().double(), _heads()
    attention = AttentionInterface._global_mapping["qkv-softmax"]
    with pytest.raises(ValueError, match=r"LlamaAttention passes sliding_window=2 for 6 keys"):
        attention(layer, q, k, v, None, scaling=0.3, sliding_window=2)
    with pytest.raises(ValueError, match=r"cu_seq_lens_k= for 2 packed sequences"):
        attention(layer, q, k, v, None, scaling=0.3, cu_seq_lens_k=torch.tensor([0, 2, 6]))
    attention(layer, q, k, v, None, scaling=0.3, sliding_window=6)


def _deepseek_v32(topk):
    torch.manual_seed(0)
    config = transformers.DeepseekV32Config(
        vocab_size=40, hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=8, q_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, head_dim=4, index_topk=topk, index_head_dim=8, index_n_heads=2,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, max_position_embeddings=32,
        mlp_layer_types=["dense"], layer_types=["indexed_attention"])
    return transformers.DeepseekV32ForCausalLM(config).eval()


def test_deepseek_v32_sparse_indices_are_refused_not_dropped():
    """DeepSeek V3.2's indexer keeps each query's top-k keys: eager folds them into its mask, and the
    answer differs from dense attention; a qkv kernel gets them as ``indices=`` and says so."""
    ids = torch.randint(1, 40, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    sparse, dense = _deepseek_v32(topk=3), _deepseek_v32(topk=8)  # the same weights; top-8 of 8 keys: all
    with torch.no_grad():
        gap = (sparse(ids, attention_mask=mask).logits - dense(ids, attention_mask=mask).logits).abs().max()
    assert gap > 1e-3  # the indices change the answer: ignoring them would be a wrong number
    sparse.set_attn_implementation("qkv-softmax")
    with pytest.raises(ValueError, match=r"DeepseekV32Attention passes indices=.*'softmax' kernel"), torch.no_grad():
        sparse(ids, attention_mask=mask)


def test_a_sliding_window_is_honoured_by_softmax_and_refused_by_the_others():
    """Mistral passes ``sliding_window=`` and builds its mask with the window: qkv-softmax (full
    masks) equals eager past the window; a kernel that takes padding masks only names the window."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        sliding_window=3)
    model = transformers.MistralForCausalLM(config).eval()
    ids = torch.randint(1, 40, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    logits = {}
    for impl in ("eager", "qkv-softmax"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            logits[impl] = model(ids, attention_mask=mask).logits
    real = mask.bool()  # a padding position attends to no key: what it holds is no one's answer
    torch.testing.assert_close(logits["qkv-softmax"][real], logits["eager"][real], atol=1e-5, rtol=0)
    tokens = {}
    for impl in ("eager", "qkv-softmax"):  # decoding past the window under the KV cache: one query a step
        model.set_attn_implementation(impl)
        with torch.no_grad():
            tokens[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(tokens["qkv-softmax"], tokens["eager"])
    model.set_attn_implementation("qkv-performer")
    with pytest.raises(ValueError, match=r"sliding_window=3.*'performer' takes key-padding masks only"), torch.no_grad():
        model(ids, attention_mask=mask)


def test_a_model_that_forwards_its_inputs_still_runs():
    """BART's layers pass the model's inputs (``decoder_input_ids``) along to attention: carried, and
    qkv-softmax gives eager's logits."""
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                                     decoder_ffn_dim=24, max_position_embeddings=32)
    model = transformers.BartForConditionalGeneration(config).eval()
    ids = torch.randint(4, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    logits = {}
    for impl in ("eager", "qkv-softmax"):
        model.set_attn_implementation(impl)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits[impl] = model(input_ids=ids, decoder_input_ids=ids).logits
    torch.testing.assert_close(logits["qkv-softmax"], logits["eager"], atol=1e-5, rtol=0)


def test_packed_sequences_travel_in_the_mask():
    """A packed batch (position_ids restarting, cu_seq_lens_* as a flattening collator gives them):
    the mask keeps each sequence to itself, so qkv-softmax gives each sequence's logits alone; a
    kernel that takes padding masks only refuses the packed pattern."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 40, (1, 10), generator=torch.Generator().manual_seed(1))
    packed = dict(position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]), cu_seq_lens_q=torch.tensor([0, 4, 10]),
                  cu_seq_lens_k=torch.tensor([0, 4, 10]), max_length_q=6, max_length_k=6,
                  use_cache=False)  # as in training: transformers reads packing from position_ids without a cache
    model.set_attn_implementation("qkv-softmax")
    with torch.no_grad():
        together = model(ids, **packed).logits
        alone = torch.cat([model(ids[:, :4]).logits, model(ids[:, 4:]).logits], dim=1)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    model.set_attn_implementation("qkv-performer")
    with pytest.raises(ValueError, match="'performer' takes key-padding masks only"), torch.no_grad():
        model(ids, **packed)
    model.set_attn_implementation("qkv-softmax")  # with a cache transformers builds no packed mask: refused
    with pytest.raises(ValueError, match=r"cu_seq_lens_q= for 2 packed sequences.*use_cache=False"), torch.no_grad():
        model(ids, **{**packed, "use_cache": True})
