"""qkv bench generation --model: a saved Llama with each kernel. The decoding step it times is the
one ``generate`` takes; a state extended past the prefill holds what a real prefill of a periodic
prompt holds (first layer: keys depend on the token and its position only); the state's growth and
the largest context in a budget are computed from the states."""

import json

import pytest
import torch

from qkv import Llama
from qkv.bench import main
from qkv.bench.generation import (decode_step, extend_state, largest_context, load_model, parse_bytes, prefill,
                                  with_attention)
from qkv.types import KVCache, LinearState, RecurrentState

SIZES = dict(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_len=64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama") / "model"
    Llama.from_config(SIZES).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("attention", ["softmax", "linear", "gla", "window"])
@torch.no_grad()
def test_decode_step_is_generates_step(saved, attention):
    """From a real prefill, the benchmark's step gives the logits generate computes for the next
    token (its own _next_logits, with its cache) and those of reading the whole sequence again."""
    source = load_model(str(saved))
    torch.manual_seed(0)
    model, changed = with_attention(source, attention)
    assert (model is source) == (attention == "softmax") and not changed["dropped"]
    prompt = torch.randint(50, (2, 11), generator=torch.Generator().manual_seed(1))
    logits, state = prefill(model, prompt)
    token = logits.argmax(-1, keepdim=True)
    step_logits, after = decode_step(model, token, state)
    assert after.position == 12
    ids = model.generate(prompt, 2, temperature=0)
    assert torch.equal(ids[:, 11:], torch.cat([token, step_logits.argmax(-1, keepdim=True)], 1))
    first, cache = model._next_logits(prompt, None, None, None, None, True)
    assert torch.equal(first, logits)
    theirs, _ = model._next_logits(ids[:, :12], cache, None, None, None, True)
    torch.testing.assert_close(step_logits, theirs, rtol=0, atol=0)
    torch.testing.assert_close(step_logits, model(ids[:, :12]).logits[:, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", ["softmax", "window", "linear", "gla"])
def test_extended_state_is_a_periodic_prompts(saved, attention):
    """A prefill of P tokens extended to L = 4 P: the first layer's KV cache equals a real prefill's of
    the prompt repeated 4 times (keys turned to their own positions), a recurrent state keeps its
    sums with its count at L; the next step then writes position L, as after the real prompt."""
    model, _ = with_attention(load_model(str(saved)), attention, {"radius": 5} if attention == "window" else None)
    P, L = 8, 32
    base = torch.randint(50, (1, P), generator=torch.Generator().manual_seed(2))
    _, short = prefill(model, base)
    _, real = prefill(model, base.repeat(1, L // P))
    extended = extend_state(short, L, model.stack.rotary)
    assert extended.position == real.position == L
    ours, theirs = extended.layers[0].self_attn, real.layers[0].self_attn
    assert type(ours) is type(theirs)
    if isinstance(ours, KVCache):
        assert (ours.offset, ours.length) == (theirs.offset, theirs.length)
        assert ours.length == (L if attention == "softmax" else 5)  # window: the last radius keys
        torch.testing.assert_close(ours.key, theirs.key, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.value, theirs.value, rtol=0, atol=0)
        # the cycled keys were turned: without the rotation they would not match
        assert attention == "window" or not torch.allclose(ours.key[..., P:2 * P, :], ours.key[..., :P, :], atol=1e-3)
    else:
        assert isinstance(ours, (LinearState, RecurrentState)) and ours.length == theirs.length == L
        assert torch.equal(ours.S, short.layers[0].self_attn.S)
    token = base[:, :1]
    _, a = decode_step(model, token, extended)
    _, b = decode_step(model, token, real)
    assert a.position == b.position == L + 1
    if isinstance(ours, KVCache):  # the new token's key, at position L, is the same in both
        torch.testing.assert_close(a.layers[0].self_attn.key[..., -1, :], b.layers[0].self_attn.key[..., -1, :],
                                   rtol=1e-5, atol=1e-5)


def test_extended_lolcats_state_moves_its_window_and_sums(saved):
    """LoLCATs' state (linear sums + a bounded window cache) extended to L: the window cache equals a
    real prefill's of the repeated prompt (keys turned to their positions), the sums count L - W + 1 keys."""
    model, changed = with_attention(load_model(str(saved)), "linear-window", {"window": 4})
    assert changed["fresh"]  # the window factors and feature maps: not in the checkpoint
    P, L = 8, 32
    base = torch.randint(50, (1, P), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, short = prefill(model, base)
        _, real = prefill(model, base.repeat(1, L // P))
    ours, theirs = extend_state(short, L, model.stack.rotary).layers[0].self_attn, real.layers[0].self_attn
    assert (ours.cache.offset, ours.cache.length) == (theirs.cache.offset, theirs.cache.length) == (L - 3, 3)
    torch.testing.assert_close(ours.cache.key, theirs.cache.key, rtol=1e-5, atol=1e-5)
    assert ours.sums.length == theirs.sums.length == L - 3
    assert torch.equal(ours.sums.S, short.layers[0].self_attn.sums.S)


def test_extend_state_refuses():
    with pytest.raises(TypeError, match="StackState"):
        extend_state(None, 4)
    model = Llama.from_config(SIZES).eval()
    _, state = prefill(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="context must be an int >= the prefill's 4"):
        extend_state(state, 3)


def test_parse_bytes_and_largest_context():
    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("500 MB") == 5 * 10**8 and parse_bytes("1e3") == 1000
    for bad in ("lots", "4 GiBs", "0", "-1GB", ""):
        with pytest.raises(ValueError, match="memory size"):
            parse_bytes(bad)
    assert largest_context(1000, 100, 80, 8, 10) == 10 + (1000 - 100 - 80) // 8
    assert largest_context(1000, 100, 80, 0, 10) is None  # a state that does not grow
    assert largest_context(100, 90, 80, 0, 10) == 0  # the weights and the state exceed the budget
    assert largest_context(100, 90, 80, 8, 10) == 1 and largest_context(100, 120, 0, 8, 10) == 0


def test_generation_bench_model(saved, tmp_path):
    """The command on a saved Llama: softmax's cache grows by its keys and values per token, linear's
    state not at all ("unbounded by the state"); rows past --prefill-tokens say how they were built."""
    assert main(["generation", "--model", str(saved), "--attention", "softmax", "linear", "--contexts", "8", "32",
                 "--prefill-tokens", "16", "--memory-budget", "1MiB", "--target-seconds", "0", "--threads", "1",
                 "--no-plot", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "generation.json").read_text())
    softmax, linear = results["models"]["softmax"], results["models"]["linear"]
    per_token = 2 * 2 * 2 * 8 * 4  # K and V, 2 layers, 2 key/value heads of 8 floats
    assert [p["state_bytes"] for p in softmax["points"]] == [8 * per_token, 32 * per_token]
    assert {p["state_growth_bytes_per_token"] for p in softmax["points"]} == {per_token}
    assert softmax["largest_context"] == 32 + (2**20 - softmax["weights_bytes"] - 32 * per_token) // per_token
    fresh = Llama.from_config(SIZES)  # float32 parameters (tied: one table) and the rotary frequencies (float64)
    assert softmax["weights_bytes"] == sum(t.numel() * t.element_size() for t in [*fresh.parameters(), *fresh.buffers()])
    assert linear["largest_context"] is None and "unbounded by the state" in linear["largest_context_note"]
    assert linear["points"][0]["state_bytes"] == linear["points"][1]["state_bytes"] > 0
    built = [p["state_built"] for p in softmax["points"]]
    assert built == ["real prefill of 8 tokens", "real prefill of 16 tokens, extended to 32 positions (extend_state)"]
    assert softmax["points"][1]["prefill_tokens"] == 16 and softmax["points"][1]["prefill_tokens_per_s"] > 0
    report = (tmp_path / "generation.md").read_text()
    assert "unbounded by the state" in report and "extended to 32 positions" in report


def test_generation_bench_model_default_variants(saved, tmp_path):
    """Without --attention: the model's own kernel and softmax (a saved linear model here)."""
    linear, _ = with_attention(load_model(str(saved)), "linear")
    linear.save_pretrained(tmp_path / "linear")
    assert main(["generation", "--model", str(tmp_path / "linear"), "--contexts", "4", "--target-seconds", "0",
                 "--threads", "1", "--no-plot", "--out", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "generation.json").read_text())
    assert list(results["models"]) == ["linear", "softmax"] and results["config"]["own_attention"] == "linear"


def test_generation_bench_real_smollm2(tmp_path):
    """The real SmolLM2-135M when cached: softmax's cache grows by 30 layers x K and V x 3 heads x 64 floats a token."""
    from qkv.tasks.data import smollm2_dir

    try:
        smollm2_dir()
    except FileNotFoundError:
        pytest.skip("SmolLM2 is not cached (qkv data fetch smollm2)")
    assert main(["generation", "--model", "smollm2", "--attention", "softmax", "linear", "--contexts", "8", "16",
                 "--prefill-tokens", "8", "--target-seconds", "0", "--threads", "1", "--no-plot",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "generation.json").read_text())
    softmax = results["models"]["softmax"]
    assert [p["state_bytes"] for p in softmax["points"]] == [L * 30 * 2 * 3 * 64 * 4 for L in (8, 16)]
    assert results["models"]["linear"]["largest_context"] is None
