"""Al-Rfou et al. 2018's auxiliary losses (intermediate layers on the paper's schedule, multiple
targets) against literal computations, and older ``gpt`` configs that used them loading as this
model."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from qkv.models import GPT, GPTConfig, QKVModel
from qkv.models.losses import future_loss, layer_loss_active, layer_loss_weight, lm_loss
from qkv.models.transformer.al_rfou import AlRfouConfig, AlRfouLM

V = 37


def tiny(**overrides) -> AlRfouConfig:
    values = dict(vocab_size=V, max_len=64, n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0,
                  aux_layer_losses=False, n_targets=1)  # each test turns on what it checks
    values.update(overrides)
    return AlRfouConfig(**values)


def test_layer_loss_weight_schedule():
    assert [layer_loss_weight(s, 100) for s in (0, 25, 50, 100, 150)] == [1.0, 0.75, 0.5, 0.0, 0.0]
    assert layer_loss_weight(10_000, 0) == 1.0


def test_intermediate_layer_losses_follow_schedule():
    torch.manual_seed(0)
    m = AlRfouLM(tiny(n_layers=3, aux_layer_losses=True, aux_layer_decay_steps=100, aux_schedule="linear-decay")).train()
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
    m = AlRfouLM(tiny(n_targets=K, target_weight=0.5, aux_schedule="linear-decay")).train()
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
    m = AlRfouLM(tiny(n_layers=n, n_targets=K, aux_layer_losses=True)).train()
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
        m2 = AlRfouLM(tiny(n_layers=n, n_targets=K, aux_layer_losses=True, aux_total_steps=600)).train()
        m2.load_state_dict(m.state_dict())
        m2.set_step(59, T)
        torch.testing.assert_close(m2(x, labels=labels).loss, sum(layer_loss), atol=1e-5, rtol=1e-5)
        # multiple targets without intermediate layers: the top layer's losses only
        m3 = AlRfouLM(tiny(n_layers=n, n_targets=K)).train()
        m3.load_state_dict(m.state_dict())
        torch.testing.assert_close(m3(x, labels=labels).loss, layer_loss[-1], atol=1e-5, rtol=1e-5)
        # evaluation: the top layer's next-token loss
        torch.testing.assert_close(m.eval()(x, labels=labels).loss, ce(m.lm_head(reads[-1]), 0), atol=1e-5, rtol=1e-5)


def test_trainer_tells_the_model_the_run_length(tmp_path):
    seen = []

    class Probe(AlRfouLM):
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


def test_evaluation_and_generation_are_gpts():
    torch.manual_seed(0)
    m = AlRfouLM(tiny(n_layers=3, n_targets=3, aux_layer_losses=True)).eval()
    gpt = GPT(GPTConfig(**{k: v for k, v in vars(m.config).items() if k in GPTConfig.__dataclass_fields__})).eval()
    gpt.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("target_heads.")})
    x = torch.randint(0, V, (2, 9))
    torch.testing.assert_close(m(x, labels=x).loss, gpt(x, labels=x).loss)
    assert torch.equal(m.generate(x[:, :3], 5, temperature=0.0), gpt.generate(x[:, :3], 5, temperature=0.0))


def _old_gpt_config(model: QKVModel, directory, **aux) -> None:
    """Rewrite a saved model's config.json as a ``gpt`` config of before the Al-Rfou class."""
    path = directory / "config.json"
    values = json.loads(path.read_text())
    values.update({"model_type": "gpt", "aux_layer_losses": False, "aux_schedule": "paper", "aux_total_steps": 0,
                   "aux_layer_decay_steps": 0, "n_targets": 1, "target_weight": 0.5, **aux})
    path.write_text(json.dumps(values))


def test_older_gpt_configs_load(tmp_path):
    torch.manual_seed(0)
    plain = GPT(GPTConfig(vocab_size=V, max_len=16, n_layers=2, d_model=16, n_heads=2, d_ff=32))
    plain.save_pretrained(tmp_path / "plain")
    _old_gpt_config(plain, tmp_path / "plain")
    loaded = QKVModel.from_pretrained(tmp_path / "plain")
    assert type(loaded) is GPT
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in loaded.state_dict().items())

    with_aux = AlRfouLM(tiny(n_targets=2, aux_layer_losses=True, aux_schedule="linear-decay"))
    with_aux.save_pretrained(tmp_path / "aux")
    _old_gpt_config(with_aux, tmp_path / "aux", n_targets=2, aux_layer_losses=True, aux_schedule="linear-decay")
    loaded = GPT.from_pretrained(tmp_path / "aux")
    assert type(loaded) is AlRfouLM and loaded.config == with_aux.config
    assert all(torch.equal(v, with_aux.state_dict()[k]) for k, v in loaded.state_dict().items())
    partial = GPT.from_config({"vocab_size": V, "n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32,
                               "aux_layer_losses": True})  # the other fields take GPT's old defaults
    assert type(partial) is AlRfouLM and partial.config.n_targets == 1


def test_other_gpt_models_refuse_the_auxiliary_losses():
    from qkv.models import LinearTransformer

    values = {"vocab_size": V, "n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32}
    assert type(LinearTransformer.from_config({**values, "n_targets": 1, "aux_layer_losses": False})) is LinearTransformer
    with pytest.raises(ValueError, match="al-rfou"):
        LinearTransformer.from_config({**values, "n_targets": 2})


@pytest.mark.parametrize("field,value,error", [
    ("n_targets", 0, ValueError),
    ("aux_schedule", "cosine", ValueError),
    ("aux_layer_losses", 1, TypeError),
    ("target_weight", -1.0, ValueError),
    ("aux_total_steps", -1, ValueError),
])
def test_bad_config(field, value, error):
    with pytest.raises(error, match=field):
        tiny(**{field: value})
