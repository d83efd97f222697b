"""GPT: cached generation equals uncached, stepwise equals parallel, every kernel trains, and
the Al-Rfou et al. 2018 auxiliary losses against literal computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import qkv
from qkv.models.transformer.gpt import GPT, GPTConfig
from qkv.models.losses import future_loss, layer_loss_active, layer_loss_weight, lm_loss
from qkv.registry import lookup

V = 37


def tiny(**overrides) -> GPTConfig:
    values = dict(vocab_size=V, max_len=64, n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
    values.update(overrides)
    return GPTConfig(**values)


def model(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny(**overrides)).eval()


@pytest.mark.parametrize("residual", ["pre-ln", "post-ln"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_stepwise_equals_parallel(residual, positional):
    m = model(residual=residual, positional=positional)
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    full = m(x).logits
    state, steps = None, []
    for t in range(x.shape[1]):
        out = m(x[:, t:t + 1], state=state, return_state=True)
        state = out.state
        steps.append(out.logits)
    assert state.position == 12
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_chunks_of_any_size_equal_parallel():
    m = model()
    x = torch.randint(0, V, (3, 13), generator=torch.Generator().manual_seed(2))
    full = m(x).logits
    state, parts = None, []
    for a, b in [(0, 5), (5, 6), (6, 13)]:
        out = m(x[:, a:b], state=state, return_state=True)
        state, parts = out.state, parts + [out.logits]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention,kwargs", [("softmax", {}), ("window", {"radius": 3})])
def test_cached_generation_equals_uncached(attention, kwargs):
    m = model(attention=attention, attention_kwargs=kwargs)
    prompt = torch.randint(0, V, (3, 4), generator=torch.Generator().manual_seed(3))
    greedy = m.generate(prompt, 20, temperature=0.0)
    assert greedy.shape == (3, 24) and torch.equal(greedy[:, :4], prompt)
    assert torch.equal(greedy, m.generate(prompt, 20, temperature=0.0, use_cache=False))
    sampled = [m.generate(prompt, 20, temperature=0.9, top_k=20, top_p=0.95, use_cache=use_cache,
                          generator=torch.Generator().manual_seed(7)) for use_cache in (True, False)]
    assert torch.equal(*sampled)


def test_weights_per_layer():
    m = model(n_layers=3)
    out = m(torch.randint(0, V, (2, 7)), need_weights=True)
    assert len(out.weights) == 3
    for w in out.weights:
        assert w.shape == (2, 4, 7, 7)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 7))
        assert (w.triu(1) == 0).all()  # causal


def test_tied_embeddings():
    m = model()
    assert m.lm_head.weight is m.stack.embed.token.weight
    assert not model(tie_embeddings=False).lm_head.weight is model(tie_embeddings=False).stack.embed.token.weight


def _causal_names():
    return [n for n in qkv.list_attention() if lookup("attention", n).supports_causal]


@pytest.mark.parametrize("name", sorted(qkv.list_attention()))
def test_every_kernel_trains_in_gpt(name, small_kernel_kwargs):
    cls = lookup("attention", name)
    if not cls.supports_causal:
        pytest.skip(f"attention {name!r} cannot be causal (supports_causal=False): tested in BERT")
    torch.manual_seed(0)
    m = GPT(tiny(attention=name, attention_kwargs=small_kernel_kwargs(name))).train()
    x = torch.randint(0, V, (2, 16))
    out = m(x, labels=x.roll(-1, 1))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_gradient_checkpointing_same_gradients():
    x = torch.randint(0, V, (2, 9))
    grads = []
    for ckpt in (False, True):
        m = model(gradient_checkpointing=ckpt).train()
        m(x, labels=x).loss.backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_ff_chunking_same_output():
    x = torch.randint(0, V, (2, 11))
    torch.testing.assert_close(model(ff_chunk_size=3)(x).logits, model()(x).logits)


# ----------------------------------------------------------------------------- Al-Rfou et al. 2018


def test_layer_loss_weight_schedule():
    assert [layer_loss_weight(s, 100) for s in (0, 25, 50, 100, 150)] == [1.0, 0.75, 0.5, 0.0, 0.0]
    assert layer_loss_weight(10_000, 0) == 1.0


def test_intermediate_layer_losses_follow_schedule():
    torch.manual_seed(0)
    m = GPT(tiny(n_layers=3, aux_layer_losses=True, aux_layer_decay_steps=100, aux_schedule="linear-decay")).train()
    x = torch.randint(0, V, (2, 10))
    labels = x.roll(-1, 1)
    labels[:, -1] = -100
    # literal: the LM loss read from the output of each of layers 1 and 2 through the final LN + head
    h = m.stack.embed(x)
    per_layer = []
    for block in m.stack.layers[:2]:
        h = block(h).hidden
        logits = m.lm_head(m.stack.final_norm(h))
        per_layer.append(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100))
    top = F.cross_entropy(m.eval()(x).logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    m.train()
    for step, w in [(0, 1.0), (40, 0.6), (100, 0.0), (500, 0.0)]:
        m.set_step(step)
        out = m(x, labels=labels)
        assert out.aux["layer_weight"] == pytest.approx(w)
        expected = top + w * (per_layer[0] + per_layer[1]) / 2
        torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=1e-5)
    m.eval()
    assert "layer_weight" not in m(x, labels=labels).aux  # evaluation reports the top-layer loss only


def test_multiple_target_heads_literal():
    torch.manual_seed(0)
    K = 3
    m = GPT(tiny(n_targets=K, target_weight=0.5, aux_schedule="linear-decay")).train()
    assert len(m.target_heads) == K - 1
    x = torch.randint(0, V, (2, 8))
    labels = torch.randint(0, V, (2, 8))
    labels[0, 5] = -100
    out = m(x, labels=labels)
    h = m.stack(x).hidden
    total = F.cross_entropy(m.lm_head(h).flatten(0, 1), labels.flatten(), ignore_index=-100)
    for k, head in zip(range(2, K + 1), m.target_heads):
        logits = head(h)  # (B, L, V): position t predicts labels[t + k - 1], the token k steps ahead
        terms = [F.cross_entropy(logits[b, t], labels[b, t + k - 1], reduction="none")
                 for b in range(2) for t in range(8 - k + 1) if labels[b, t + k - 1] != -100]
        assert logits.shape == (2, 8, V)
        total = total + 0.5 * torch.stack(terms).mean()
    torch.testing.assert_close(out.loss, total, atol=1e-5, rtol=1e-5)
    assert out.aux["target_loss"].dim() == 0


def test_layer_loss_active_is_the_papers_schedule():
    # Al-Rfou 2018: layer l of n stops after l / (2n) of training; the top layer never stops
    n, T = 4, 80  # layer 1 stops at step 10, layer 2 at 20, layer 3 at 30
    for step in range(T + 5):
        active = [l for l in range(1, n + 1) if layer_loss_active(l, n, step, T)]
        expected = [l for l in range(1, n) if step / T < l / (2 * n)] + [n]
        assert active == expected, step
    assert [l for l in range(1, 5) if layer_loss_active(l, 4, 10, T)] == [2, 3, 4]
    assert [l for l in range(1, 5) if layer_loss_active(l, 4, 40, T)] == [4]  # half-way: only the top
    assert all(layer_loss_active(l, 4, 10**6, 0) for l in range(1, 5))  # length unknown: all predict
    with pytest.raises(ValueError, match="layer"):
        layer_loss_active(5, 4, 0, 10)


def test_paper_losses_literal():
    """loss = sum over predicting layers l of (L_l + 0.5 sum_k L_{l,+k}); layer l < n predicts while
    step / T < l / (2n); read from a literal per-layer, per-position loop."""
    torch.manual_seed(0)
    n, K, T = 3, 3, 60
    m = GPT(tiny(n_layers=n, n_targets=K, aux_layer_losses=True)).train()
    assert m.config.aux_schedule == "paper"
    x = torch.randint(0, V, (2, 7))
    labels = torch.randint(0, V, (2, 7))
    labels[1, 2] = -100
    with torch.no_grad():
        h, reads = m.stack.embed(x), []
        for block in m.stack.layers:
            h = block(h).hidden
            reads.append(m.stack.final_norm(h))  # every layer read through the final LN

        def ce(logits, offset):  # mean over positions t with a target labels[t + offset]
            terms = [F.cross_entropy(logits[b, t], labels[b, t + offset]) for b in range(2)
                     for t in range(7 - offset) if labels[b, t + offset] != -100]
            return torch.stack(terms).mean()

        layer_loss = [ce(m.lm_head(r), 0) + sum(0.5 * ce(head(r), k - 1) for k, head in zip(range(2, K + 1), m.target_heads))
                      for r in reads]
        for step, active in [(0, [0, 1, 2]), (9, [0, 1, 2]), (10, [1, 2]), (19, [1, 2]), (20, [2]), (59, [2])]:
            m.set_step(step, T)
            out = m(x, labels=labels)
            torch.testing.assert_close(out.loss, sum(layer_loss[i] for i in active), atol=1e-5, rtol=1e-5)
            assert out.aux["active_layers"] == len(active)
        # the config's length overrides the trainer's
        m2 = GPT(tiny(n_layers=n, n_targets=K, aux_layer_losses=True, aux_total_steps=600)).train()
        m2.load_state_dict(m.state_dict())
        m2.set_step(59, T)
        torch.testing.assert_close(m2(x, labels=labels).loss, sum(layer_loss), atol=1e-5, rtol=1e-5)
        # multiple targets without intermediate layers: the top layer's losses only
        m3 = GPT(tiny(n_layers=n, n_targets=K)).train()
        m3.load_state_dict(m.state_dict())
        torch.testing.assert_close(m3(x, labels=labels).loss, layer_loss[-1], atol=1e-5, rtol=1e-5)
        # evaluation: the top layer's next-token loss
        torch.testing.assert_close(m.eval()(x, labels=labels).loss, ce(m.lm_head(reads[-1]), 0), atol=1e-5, rtol=1e-5)


def test_trainer_tells_the_model_the_run_length(tmp_path):
    seen = []

    class Probe(GPT):
        def set_step(self, step, total_steps=None):
            seen.append((step, total_steps))
            super().set_step(step, total_steps)

    from qkv.tasks.base import Task as BaseTask
    from qkv.train import TrainConfig, Trainer

    class Task(BaseTask):
        def get_batch(self, split, batch_size, step, **kw):
            g = torch.Generator().manual_seed(step)
            ids = torch.randint(0, V, (batch_size, 9), generator=g)
            return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}

        def evaluate(self, model, split="test", max_examples=None):
            return {}

    torch.manual_seed(0)
    Trainer(Probe(tiny(aux_layer_losses=True)), Task(), TrainConfig(steps=3, batch_size=2, eval_batches=0, out_dir=str(tmp_path),
                                                                   progress=False, tensorboard=False)).fit()
    assert seen == [(0, 3), (1, 3), (2, 3)]


def test_future_loss_edge_cases():
    logits = torch.randn(2, 3, V, requires_grad=True)
    labels = torch.randint(0, V, (2, 3))
    torch.testing.assert_close(future_loss(logits, labels, 1), lm_loss(logits, labels))
    assert future_loss(logits, labels, 5).item() == 0.0
    assert lm_loss(logits, torch.full((2, 3), -100)).item() == 0.0  # no target: 0, not NaN


# ----------------------------------------------------------------------------- bad input


def test_bad_inputs():
    m = model()
    with pytest.raises(ValueError, match="input_ids"):
        m(torch.randint(0, V, (2, 3, 4)))
    with pytest.raises(TypeError, match="input_ids"):
        m(torch.rand(2, 3))
    with pytest.raises(ValueError, match="input_ids"):
        m(torch.tensor([[0, V]]))
    with pytest.raises(ValueError, match="max_len"):
        m(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        m(torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        m(torch.zeros(1, 4, dtype=torch.long), labels=torch.full((1, 4), V))
    with pytest.raises(TypeError, match="state"):
        m(torch.zeros(1, 4, dtype=torch.long), state=("not", "a state"))


@pytest.mark.parametrize("field,value,error", [
    ("d_model", 30, ValueError),  # not divisible by n_heads=4
    ("n_layers", 0, ValueError),
    ("dropout", 1.5, ValueError),
    ("residual", "sandwich", ValueError),
    ("positional", "rotary?", ValueError),
    ("attention", "nope", ValueError),
    ("activation", "tanh", ValueError),
    ("attention_kwargs", [1], TypeError),
    ("n_targets", 0, ValueError),
    ("vocab_size", 2.5, TypeError),
])
def test_bad_config(field, value, error):
    with pytest.raises(error, match=field if field != "d_model" else "d_model"):
        tiny(**{field: value})


def test_unknown_kernel_kwarg_raises():
    with pytest.raises(TypeError, match="radiuss"):
        GPT(tiny(attention="window", attention_kwargs={"radiuss": 2}))


def test_training_forward_takes_the_sdpa_causal_fast_path(monkeypatch):
    """No dense mask on the causal path: SDPA is called with is_causal=True and no attn_mask."""
    import qkv.attention.softmax as softmax_module

    calls = []
    sdpa = softmax_module.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(softmax_module.F, "scaled_dot_product_attention", spy)
    m = model(n_layers=2).train()
    x = torch.randint(0, V, (2, 10))
    m(x, labels=x).loss.backward()
    assert len(calls) == 2
    assert all(c.get("is_causal") is True and c.get("attn_mask") is None for c in calls)


def test_bench_baseline_is_the_same_model():
    """``qkv bench gpt`` compares equals: the nn.TransformerEncoderLayer GPT and qkv's, same weights."""
    from qkv.bench.gpt import TorchGPT, qkv_from_torch

    torch.manual_seed(0)
    baseline = TorchGPT(V, 32, 4, 64, 2, 16, dropout=0.0).double()
    ours = qkv_from_torch(baseline, tiny(max_len=16)).double()
    ids = torch.randint(0, V, (3, 16))
    labels = ids.roll(-1, 1)
    torch.testing.assert_close(ours(ids, labels=labels).loss, baseline(ids, labels).double(), atol=1e-10, rtol=0)


def test_generation_past_learned_max_len_slides_the_context():
    m = model(max_len=16).eval()
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(0))
    cached = m.generate(prompt, 30, temperature=0.0)
    uncached = m.generate(prompt, 30, temperature=0.0, use_cache=False)
    assert cached.shape == (2, 35)
    assert torch.equal(cached, uncached)
    # the token after position 16 is the model's greedy choice given the last 16 tokens
    nxt = m(cached[:, 20 - 16:20]).logits[:, -1].argmax(-1)
    assert torch.equal(nxt, cached[:, 20])
