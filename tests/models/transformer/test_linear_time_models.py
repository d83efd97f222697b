"""The linear-time Transformer models: LinearTransformer generates as an RNN (stepwise == parallel,
fixed-size state), Performer redraws its features on the trainer's schedule, Linformer is BERT
with the linformer kernel (layerwise sharing, padding, save/load), the Quaternion Transformer
uses a quarter of the weights and trains."""

from __future__ import annotations

import pytest
import torch

from qkv.attention import LinearState
from qkv.blocks import QuaternionLinear
from qkv.models import (BERT, BERTConfig, GPT, GPTConfig, LinearTransformer, Linformer, Performer, PerformerEncoder,
                        QuaternionEncoder, QuaternionTransformer, Transformer)
from qkv.models.base import QKVModel

SMALL = dict(n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0)


def state_bytes(state):
    """Bytes of every tensor in a StackState (KV caches, LinearState sums)."""
    total = 0
    for layer in state.layers:
        s = layer.self_attn
        for t in (vars(s).values() if not isinstance(s, tuple) else s):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("cls", [LinearTransformer, Performer])
def test_stepwise_generation_equals_parallel_forward(cls):
    torch.manual_seed(0)
    # LinearTransformer: sinusoids, no limit (max_len 8 < 20 positions); Performer: learned positions
    model = cls.from_config(dict(vocab_size=13, max_len=8 if cls is LinearTransformer else 32, **SMALL)).eval()
    ids = torch.randint(13, (2, 20))
    full = model(ids).logits  # (B, L, V), parallel (chunked) causal form
    state, steps = None, []
    for t in range(ids.shape[1]):
        out = model(ids[:, t:t + 1], state=state, return_state=True)
        steps.append(out.logits)
        state = out.state
        assert all(isinstance(layer.self_attn, LinearState) for layer in state.layers)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # greedy generate: every generated token is the argmax of the parallel forward at its position
    gen = model.generate(ids[:, :3], max_new_tokens=15, temperature=0)
    logits = model(gen).logits
    assert torch.equal(gen[:, 3:], logits[:, 2:-1].argmax(-1))


def test_models_use_the_positions_of_their_papers():
    """Linear Transformer: Vaswani's sinusoids (Katharopoulos et al.'s experiments); Performer: the
    Transformer's learned absolute positions; adaptive span: learned relative position embeddings
    on the keys, one table for the stack (Sukhbaatar et al. 2019, §2) — none of them ``none``."""
    from qkv.models import AdaptiveSpanTransformer

    assert LinearTransformer.from_config(dict(vocab_size=13, **SMALL)).config.positional == "sinusoidal"
    assert Performer.from_config(dict(vocab_size=13, nb_features=8, **SMALL)).config.positional == "learned"
    span = AdaptiveSpanTransformer.from_config(dict(vocab_size=13, max_span=8, **SMALL))
    kernels = [block.self_attn.kernel for block in span.stack.layers]
    assert kernels[0].key_pe is not None and all(k.key_pe is kernels[0].key_pe for k in kernels)


def test_rnn_state_has_a_fixed_size_while_the_kv_cache_grows():
    torch.manual_seed(0)
    linear = LinearTransformer.from_config(dict(vocab_size=13, max_len=8, **SMALL)).eval()
    gpt = GPT(GPTConfig(vocab_size=13, max_len=64, positional="sinusoidal", **SMALL)).eval()
    sizes = {"linear": [], "gpt": []}
    for name, model in (("linear", linear), ("gpt", gpt)):
        state = None
        for t in range(40):
            out = model(torch.tensor([[t % 13]]), state=state, return_state=True)
            state = out.state
            sizes[name].append(state_bytes(state))
    assert len(set(sizes["linear"])) == 1 and sizes["linear"][0] > 0
    E = 16 // 2  # head size
    # layers x B x H x (S (E, E) + Z (E) + at most a log scale) float32
    assert 2 * 1 * 2 * (E * E + E) * 4 <= sizes["linear"][0] <= 2 * 1 * 2 * (E * E + E + 1) * 4
    assert sizes["gpt"][-1] == 40 * sizes["gpt"][0]  # the KV cache holds every position


def test_performer_redraws_features_on_the_trainer_schedule():
    config = dict(vocab_size=13, max_len=8, redraw_every=3, nb_features=8, **SMALL)
    torch.manual_seed(0)
    a = Performer.from_config(config)
    kernels = [block.self_attn.kernel for block in a.stack.layers]
    before = [k.projection.clone() for k in kernels]
    for step in (0, 1, 2):
        a.set_step(step)
    assert all(torch.equal(k.projection, b) for k, b in zip(kernels, before))
    a.set_step(3)
    after = [k.projection.clone() for k in kernels]
    assert not any(torch.equal(x, y) for x, y in zip(after, before))
    assert not torch.equal(after[0], after[1])  # each layer draws its own
    torch.manual_seed(1)
    b = Performer.from_config(config)
    b.set_step(3)  # the draw at a step is a pure function of (seed, step, layer): exact resume redraws the same
    assert all(torch.equal(k.projection, x) for k, x in zip((blk.self_attn.kernel for blk in b.stack.layers), after))
    enc = PerformerEncoder.from_config(dict(vocab_size=13, max_len=8, redraw_every=2, nb_features=8, num_labels=3, **SMALL))
    p0 = enc.stack.layers[0].self_attn.kernel.projection.clone()
    enc.set_step(2)
    assert not torch.equal(enc.stack.layers[0].self_attn.kernel.projection, p0)
    with pytest.warns(UserWarning, match="forms no attention-weight matrix"):  # FAVOR+ has no weights to drop
        enc = PerformerEncoder.from_config(dict(vocab_size=13, attention_dropout=0.1, **SMALL))
    assert enc.stack.layers[0].self_attn.kernel.dropout == 0.0


def train_classifier(model, steps=60, lr=3e-3):
    """A toy task: the class is the token at position 2 (5 or 6); padding at the end of some rows."""
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        ids = torch.randint(7, 13, (16, 10), generator=g)
        labels = torch.randint(2, (16,), generator=g)
        ids[:, 2] = 5 + labels
        ids[:, 0] = 1  # [CLS]
        mask = torch.ones(16, 10, dtype=torch.bool)
        mask[::2, 8:] = False
        loss = model(ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("cls, extra", [(Linformer, {"k": 4, "sharing": "layerwise"}), (QuaternionEncoder, {}),
                                        (PerformerEncoder, {"nb_features": 16})])
def test_encoder_classifiers_train_and_round_trip(cls, extra, tmp_path):
    torch.manual_seed(0)
    model = cls.from_config(dict(vocab_size=13, max_len=10, num_labels=2, attention_dropout=0.0, **SMALL, **extra))
    losses = train_classifier(model)
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = QKVModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(13, (2, 10))
    assert type(loaded) is cls and torch.equal(loaded(ids).logits, model(ids).logits)


def test_linformer_model_sharing_and_padding():
    base = dict(vocab_size=13, max_len=12, k=4, num_labels=2, **SMALL)
    counts = {s: sum(p.numel() for p in Linformer.from_config({**base, "sharing": s}).parameters())
              for s in ("headwise", "key-value", "layerwise")}
    assert counts["headwise"] - counts["key-value"] == 2 * 4 * 12  # one (k, n) per layer fewer
    assert counts["key-value"] - counts["layerwise"] == 4 * 12  # one for the stack
    model = Linformer.from_config({**base, "sharing": "layerwise"}).eval()
    assert model.config.attention_kwargs == {"seq_len": 12, "k": 4, "sharing": "layerwise"}
    ids = torch.randint(2, 13, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 6:] = False
    out = model(ids, attention_mask=mask).logits
    ids2 = ids.clone()
    ids2[0, 6:] = 3  # padding content cannot matter
    torch.testing.assert_close(model(ids2, attention_mask=mask).logits, out)
    torch.testing.assert_close(model(ids[:1, :6]).logits, out[:1])  # = the unpadded shorter input
    with pytest.raises(ValueError, match="beyond max_len=12"):
        model(torch.randint(13, (1, 13)))


def test_quaternion_models_have_a_quarter_of_the_weights():
    cfg = dict(vocab_size=13, max_len=10, num_labels=2, **SMALL)
    real, quat = BERT(BERTConfig(head="classification", **cfg)), QuaternionEncoder.from_config(cfg)

    def layer_weights(m):
        return sum(p.numel() for n, p in m.named_parameters()
                   if ("proj" in n or ".ff.w" in n) and "bias" not in n)

    assert layer_weights(real) == 4 * layer_weights(quat)
    total_real, total_quat = (sum(p.numel() for p in m.parameters()) for m in (real, quat))
    assert total_real - total_quat == layer_weights(real) * 3 // 4
    torch.manual_seed(0)
    qt = QuaternionTransformer.from_config(dict(vocab_size=13, **SMALL))
    layers = [m for m in qt.modules() if isinstance(m, QuaternionLinear)]
    assert len(layers) == 2 * (4 + 2) + 2 * (4 + 4 + 2)  # encoder (self, FFN) + decoder (self, cross, FFN), 2 layers each
    # the quaternion initialisation survives the Transformer's Xavier initialisation: r-parts ~ |w| cos(theta)
    w = qt.encoder.layers[0].ff.w1
    sigma = (2 * (4 + 8)) ** -0.5
    assert float(w.weight_r.detach().square().mean()) < 3 * sigma ** 2
    src = torch.randint(3, 13, (4, 6))
    tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), src], 1)
    opt = torch.optim.Adam(qt.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = qt(src, tgt[:, :-1], labels=tgt[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert isinstance(qt, Transformer) and qt.generate(src[:1], max_new_tokens=4).shape[0] == 1
