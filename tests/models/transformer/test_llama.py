"""The llama model: a preset of the shared stack with rotary positions, RMSNorm, SwiGLU, grouped
queries and no biases — every kernel by name, cached generation, left padding, the parts as
--set fields of other models, and its config's checks."""

import pytest
import torch

import qkv
from qkv.cli import main
from qkv.models import GPT, GPTConfig, Llama, LlamaConfig, Transformer, TransformerConfig
from qkv.registry import lookup

TINY = dict(vocab_size=40, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, max_len=32)


def tiny(**kw):
    torch.manual_seed(0)
    return Llama(LlamaConfig(**{**TINY, **kw})).eval()


def test_llama_is_the_shared_stack_with_todays_parts():
    model = tiny()
    block = model.stack.layers[0]
    assert type(block.res_self.norm).__name__ == "RMSNorm" and type(model.stack.final_norm).__name__ == "RMSNorm"
    assert type(block.ff).__name__ == "GatedFeedForward" and block.ff.activation == "silu"
    assert block.self_attn.k_proj.weight.shape == (16, 32) and block.self_attn.rotary is model.stack.rotary
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.lm_head.weight is model.stack.embed.token.weight  # tied (SmolLM2)
    assert tiny(tie_embeddings=False).lm_head.weight is not tiny(tie_embeddings=False).stack.embed.token.weight
    assert qkv.Llama is Llama and lookup("model", "llama") is Llama


CAUSAL = [n for n in qkv.list_attention() if lookup("attention", n).supports_causal]


@pytest.mark.parametrize("name", CAUSAL)
def test_every_causal_kernel_trains_and_generates_inside_llama(name):
    model = tiny(attention=name).train()
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    out = model(ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.stack.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    model.eval()
    if lookup("attention", name).supports_state:
        cached = model.generate(ids[:, :4], 6, temperature=0)
        assert torch.equal(cached, model.generate(ids[:, :4], 6, temperature=0, use_cache=False))


def test_stepwise_logits_equal_the_parallel_pass():
    model = tiny()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(2))
    parallel = model(ids).logits
    state, steps = None, []
    for t in range(9):
        out = model(ids[:, t:t + 1], state=state, return_state=True)
        state = out.state
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), parallel, rtol=1e-5, atol=1e-5)
    cache = state.layers[0].self_attn
    assert cache.key.shape == (2, 2, 9, 8)  # per key/value head: 2 of the 4 query heads' worth


def test_left_padded_rows_generate_as_alone():
    model = tiny()
    a = torch.tensor([[5, 6, 7, 8, 9]])
    b = torch.tensor([[11, 12, 13]])
    batch = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    both = model.generate(batch, 5, temperature=0, attention_mask=mask)
    assert torch.equal(both[0], model.generate(a, 5, temperature=0)[0])
    assert torch.equal(both[1, 2:], model.generate(b, 5, temperature=0)[0])


def test_sliding_window_is_the_window_kernel():
    config = LlamaConfig(**TINY, sliding_window=4)
    assert config.attention == "window" and config.attention_kwargs == {"radius": 3}
    assert LlamaConfig(**{**TINY, "sliding_window": 4, "attention": "window"}).attention_kwargs["radius"] == 3
    model = tiny(sliding_window=4)
    ids = torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(3))
    full = tiny()
    full.load_state_dict(model.state_dict())
    # each layer's last position sees its 4 last inputs: through 2 layers, the last 7 tokens; the tokens
    # before them do not change its logits
    changed = ids.clone()
    changed[0, :5] = (changed[0, :5] + 1) % 40
    torch.testing.assert_close(model(changed).logits[0, -1], model(ids).logits[0, -1])
    assert not torch.allclose(full(changed).logits[0, -1], full(ids).logits[0, -1])
    with pytest.raises(ValueError, match="attention must be 'softmax' or 'window'"):
        LlamaConfig(**TINY, sliding_window=4, attention="linear")
    with pytest.raises(ValueError, match="disagrees with sliding_window"):
        LlamaConfig(**TINY, sliding_window=4, attention_kwargs={"radius": 1})


@pytest.mark.parametrize("field,value,message", [
    ("n_kv_heads", 3, "n_kv_heads .3. must divide n_heads .4."),
    ("norm", "batchnorm", "norm must be one of"),
    ("glu", "yes", "glu must be a bool"),
    ("rope_theta", 1.0, "rope_theta must be a number > 1"),
    ("rope_scaling", {"rope_type": "longrope"}, "rope_type must be one of"),
    ("rope_scaling", {"rope_type": "linear"}, "needs"),
    ("d_head", 0, "d_head must be"),
    ("qkv_bias", 1, "qkv_bias must be a bool"),
    ("sliding_window", 0, "sliding_window must be"),
])
def test_bad_fields_are_refused_in_one_line(field, value, message):
    with pytest.raises((ValueError, TypeError), match=message):
        LlamaConfig(**{**TINY, field: value})


def test_the_parts_are_fields_of_every_stack_model():
    """GPT with rotary, RMSNorm, GeGLU, multi-query attention, qk-norm and q/k/v biases only; an
    encoder-decoder Transformer with grouped queries in self- and cross-attention."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=30, n_layers=1, d_model=16, n_heads=4, d_ff=24, max_len=16, positional="rotary",
                        norm="rmsnorm", glu=True, activation="gelu", n_kv_heads=1, qk_norm=True, bias=False,
                        qkv_bias=True)).eval()
    attn = gpt.stack.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.out_proj.bias is None and attn.k_proj.out_features == 4
    ids = torch.randint(0, 30, (1, 7))
    assert torch.equal(gpt.generate(ids, 4, temperature=0), gpt.generate(ids, 4, temperature=0, use_cache=False))
    t = Transformer(TransformerConfig(vocab_size=20, n_layers=1, d_model=16, n_heads=4, d_ff=24,
                                      n_kv_heads=2, positional="rotary", norm="rmsnorm"))
    src, tgt = torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
    out = t(src_ids=src, tgt_ids=tgt, labels=tgt)
    assert torch.isfinite(out.loss) and t.decoder.layers[0].cross_attn.k_proj.out_features == 8


def test_rotary_positions_follow_position_ids():
    """A row's logits do not depend on where its positions start counting when it is shifted
    with them (rotary scores see distances only)."""
    model = tiny()
    ids = torch.randint(0, 40, (1, 6), generator=torch.Generator().manual_seed(4))
    shifted = model(ids, position_ids=torch.arange(10, 16).unsqueeze(0)).logits
    torch.testing.assert_close(shifted, model(ids).logits, rtol=1e-4, atol=1e-5)


def test_rotary_refuses_a_layer_loop_without_positions():
    from qkv.models import UniversalTransformerLM, UniversalTransformerLMConfig
    with pytest.raises(ValueError, match="rotary"):
        UniversalTransformerLM(UniversalTransformerLMConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=16,
                                                            positional="rotary"))


def test_llama_trains_from_the_command_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "llama", "--task", "shakespeare-char", "--attention", "linear", "--steps", "2",
                 "--batch-size", "2", "--eval-every", "0", "--eval-max-examples", "4", "--eval-batches", "1",
                 "--threads", "1", "--out", str(run), "--progress", "false", "--set", "n_layers=1"]) == 0, \
        capsys.readouterr().err
    assert main(["generate", str(run), "--prompt", "a", "--max-new-tokens", "4"]) == 0, capsys.readouterr().err


def test_context_parallelism_refuses_rotary_positions():
    from qkv.parallel.model import Sharding
    with pytest.raises(ValueError, match="context parallelism does not shard rotary positions"):
        Sharding(tiny())


def test_gradient_checkpointing_passes_the_positions():
    model = tiny().train()
    again = tiny(gradient_checkpointing=True).train()
    again.load_state_dict(model.state_dict())
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(5))
    for m in (model, again):
        m(ids, labels=ids).loss.backward()
    grads = [m.stack.layers[0].self_attn.q_proj.weight.grad for m in (model, again)]
    torch.testing.assert_close(grads[0], grads[1])
