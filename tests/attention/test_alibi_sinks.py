"""ALiBi (Press et al. 2022), attention sinks (GPT-OSS) and logit soft-capping (Gemma 2): the score
knobs of the kernels that form their scores (softmax, window) against their literal equations in
float64, their gradients, stepwise decoding == one call, padding, and the refusals."""

import math

import pytest
import torch

import qkv
from qkv import masks
from qkv.alibi import alibi_slopes
from qkv.models import GPT, GPTConfig
from qkv.registry import lookup

B, H, L, E = 2, 3, 6, 4
KERNELS = [("softmax", {}), ("window", {"radius": 2, "block": 2}), ("local-1d", {"block": 2, "memory": 1})]
MODS = [dict(alibi=True), dict(softcap=0.7), dict(sinks=True), dict(alibi=True, softcap=0.7, sinks=True)]


def qkv_tensors(seed=0, length=L):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, E, dtype=torch.float64, generator=g) for _ in range(3)]


def kernel(name, knobs, causal, **mods):
    k = qkv.build_attention(name, causal=causal, n_heads=H, **knobs, **mods).double()
    if k.sinks is not None:
        with torch.no_grad():
            k.sinks.copy_(torch.tensor([0.3, -1.0, 2.0]))
    return k


def literal(q, k, v, attn, alibi=False, softcap=None, sinks=None):
    """out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(s_h)) over the keys j of the kernel's
    pattern, s_ij = c tanh(q.k / sqrt(d) / c) - m_h |i - j|."""
    out = torch.zeros_like(q)
    slopes = alibi_slopes(H)
    pattern = attn.pattern(q.shape[2], k.shape[2])
    allowed = masks.materialize(pattern, q.shape[2], k.shape[2]) if pattern is not None else torch.ones(
        q.shape[2], k.shape[2], dtype=torch.bool)
    for b in range(q.shape[0]):
        for h in range(H):
            for i in range(q.shape[2]):
                keys = [j for j in range(k.shape[2]) if allowed[i, j]]
                scores = []
                for j in keys:
                    s = float(q[b, h, i] @ k[b, h, j]) / math.sqrt(E)
                    if softcap is not None:
                        s = softcap * math.tanh(s / softcap)
                    if alibi:
                        s -= slopes[h] * abs(i - j)
                    scores.append(math.exp(s))
                denominator = sum(scores) + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
                for e, j in zip(scores, keys):
                    out[b, h, i] += e / denominator * v[b, h, j]
    return out


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [2 ** -1, 2 ** -2, 2 ** -3, 2 ** -4, 2 ** -5, 2 ** -6, 2 ** -7, 2 ** -8]
    # not a power of two: the 4 slopes of 4 heads, then every other slope of 8 heads
    assert alibi_slopes(6) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    with pytest.raises(ValueError, match="n_heads"):
        alibi_slopes(0)


@pytest.mark.parametrize("name,knobs", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mods", MODS, ids=lambda m: "+".join(m))
def test_score_knobs_against_their_literal_equations(name, knobs, causal, need_weights, mods):
    q, k, v = qkv_tensors()
    attn = kernel(name, knobs, causal, **mods)
    out = attn(q, k, v, need_weights=need_weights)
    ref = literal(q, k, v, attn, mods.get("alibi", False), mods.get("softcap"),
                  None if attn.sinks is None else attn.sinks.detach())
    torch.testing.assert_close(out.output, ref, rtol=1e-12, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(out.weights @ v, ref, rtol=1e-12, atol=1e-12)
        total = out.weights.sum(-1)
        assert ((total < 1) if attn.sinks is not None else torch.isclose(total, torch.ones_like(total))).all()


@pytest.mark.parametrize("name,knobs", KERNELS)
@pytest.mark.parametrize("mods", MODS, ids=lambda m: "+".join(m))
def test_gradients_of_the_score_knobs(name, knobs, mods):
    q, k, v = (t[:1, :, :4].requires_grad_() for t in qkv_tensors(1))
    attn = kernel(name, knobs, True, **mods)
    params = (q, k, v) + ((attn.sinks,) if attn.sinks is not None else ())

    def f(q, k, v, *sinks):  # sinks: the kernel's own parameter, perturbed in place by gradcheck
        return attn(q, k, v, need_weights=False).output

    assert torch.autograd.gradcheck(f, params)
    if attn.sinks is not None:  # the sink is learned: it receives a gradient through the model
        attn.sinks.grad = None
        attn(q, k, v).output.sum().backward()
        assert attn.sinks.grad is not None and attn.sinks.grad.abs().sum() > 0


@pytest.mark.parametrize("name,knobs", KERNELS)
@pytest.mark.parametrize("mods", MODS, ids=lambda m: "+".join(m))
def test_stepwise_decoding_equals_one_call(name, knobs, mods):
    q, k, v = qkv_tensors(2, length=7)
    attn = kernel(name, knobs, True, **mods)
    whole = attn(q, k, v).output
    state, outs = None, []
    for a, b in ((0, 3), (3, 4), (4, 7)):
        res = attn(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], state=state, return_state=True)
        outs.append(res.output)
        state = res.state
    torch.testing.assert_close(torch.cat(outs, dim=2), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,knobs", KERNELS)
def test_a_row_padded_in_front_equals_the_row_alone(name, knobs):
    q, k, v = qkv_tensors(3)
    attn = kernel(name, knobs, True, alibi=True, softcap=2.0, sinks=True)
    pad = 2  # a multiple of local-1d's block: its blocks sit at absolute positions
    padded = [torch.cat([torch.randn(B, H, pad, E, dtype=torch.float64), t], dim=2) for t in (q, k, v)]
    mask = torch.ones(B, L + pad, dtype=torch.bool)
    mask[:, :pad] = False
    out = attn(*padded, mask=mask).output
    torch.testing.assert_close(out[:, :, pad:], attn(q, k, v).output, rtol=1e-12, atol=1e-12)
    assert (out[:, :, :pad] == 0).all()  # a query with no allowed key: zeros (not the sink's NaN)


def test_the_knobs_are_checked_and_other_kernels_refuse_them():
    with pytest.raises(ValueError, match="softcap must be a positive number"):
        qkv.build_attention("softmax", softcap=0.0)
    with pytest.raises(TypeError, match="alibi must be a bool"):
        qkv.build_attention("window", radius=2, alibi=1)
    with pytest.raises(ValueError, match="sinks=True learns one logit per head: give n_heads"):
        qkv.build_attention("softmax", sinks=True)
    for name in ("linear", "performer", "lsh", "strided"):
        with pytest.raises(TypeError, match="softcap"):
            qkv.MultiHeadAttention(8, 2, name, causal=True, softcap=5.0)
    mha = qkv.MultiHeadAttention(8, 2, "softmax", sinks=True, softcap=5.0)  # n_heads filled in
    assert mha.kernel.sinks.shape == (2,) and "kernel.sinks" in dict(mha.named_parameters())


TINY = dict(vocab_size=30, n_layers=2, d_model=12, n_heads=3, d_ff=24, max_len=16, dropout=0.0)


@pytest.mark.parametrize("attention", ["softmax", "window", "local-1d"])
def test_positional_alibi_is_a_stack_field(attention):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, attention=attention, positional="alibi")).double().eval()
    assert all(block.self_attn.kernel.alibi for block in model.stack.layers)
    assert not any("position" in n for n, _ in model.named_parameters())  # nothing added to the embeddings
    ids = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(ids).logits
        first = model(ids[:, :5], return_state=True)
        step = model(ids[:, 5:], state=first.state).logits
        torch.testing.assert_close(torch.cat([first.logits, step], dim=1), whole, rtol=1e-10, atol=1e-10)
        # a row padded in front equals the row alone: the bias sees distances only (an anchored kernel,
        # local-1d, refuses left padding in the GPT)
        if not model.stack.layers[0].self_attn.kernel.anchored:
            mask = torch.tensor([[False, False] + [True] * 9] * 2)
            padded = model(torch.cat([ids[:, :2], ids], dim=1), attention_mask=mask).logits[:, 2:]
            torch.testing.assert_close(padded, whole, rtol=1e-10, atol=1e-10)
        # the bias changes the model: without it (no positions at all) the logits differ
        for block in model.stack.layers:
            block.self_attn.kernel.alibi = False
        assert not torch.allclose(model(ids).logits, whole)


@pytest.mark.parametrize("attention", ["linear", "performer", "lsh", "strided"])
def test_positional_alibi_refuses_kernels_without_scores_by_name(attention):
    with pytest.raises(ValueError, match=f"positional='alibi'.*attention '{attention}' forms no score"):
        GPT(GPTConfig(**TINY, attention=attention, positional="alibi"))


def test_alibi_is_a_set_away_on_the_command_line(shakespeare_cache, train_argv):
    from qkv.cli import main

    run = shakespeare_cache / "run"
    assert main(train_argv("gpt", "shakespeare-char", run, "--set", "positional=alibi", "--set", "n_layers=1",
                           "--set", "d_model=8", "--set", "n_heads=2", "--set", "d_ff=8", "--set", "task.block_size=8",
                           "--threads", "1", steps=1)) == 0
    model = GPT.from_pretrained(run / "model")
    assert model.config.positional == "alibi" and model.stack.layers[0].self_attn.kernel.alibi


def test_context_parallelism_refuses_alibi_and_sinks():
    """Its strategies call a kernel on blocks of keys, where the distances and the sink's share would be a block's."""
    from qkv.parallel.model import Sharding

    with pytest.raises(ValueError, match="attention 'softmax' adds ALiBi's bias or a sink logit"):
        Sharding(GPT(GPTConfig(**TINY, positional="alibi")))
    with pytest.raises(ValueError, match="attention 'window' adds ALiBi's bias or a sink logit"):
        Sharding(GPT(GPTConfig(**TINY, attention="window", attention_kwargs={"sinks": True})))


def test_score_knobs_survive_qkvs_format_and_are_refused_by_transformers_llama(tmp_path):
    from qkv.models import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=20, n_layers=1, d_model=8, n_heads=2, n_kv_heads=1, d_ff=8, max_len=16,
                              attention_kwargs={"sinks": True, "softcap": 5.0}))
    with torch.no_grad():
        model.stack.layers[0].self_attn.kernel.sinks.copy_(torch.tensor([0.5, -0.5]))
    model.save_pretrained(tmp_path / "qkv")
    again = Llama.from_pretrained(tmp_path / "qkv")
    assert torch.equal(again.stack.layers[0].self_attn.kernel.sinks, model.stack.layers[0].self_attn.kernel.sinks)
    with pytest.raises(ValueError, match=r"attention_kwargs \['sinks', 'softcap'\] change the scores"):
        model.save_pretrained(tmp_path / "hf", format="huggingface")
