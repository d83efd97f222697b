"""AdaptiveSpanTransformer (Sukhbaatar et al. 2019): segments continued through the span cache equal
one pass, the span penalty in the loss, clamping, reports and the qkv command end to end."""

from __future__ import annotations

import json

import pytest
import torch

from qkv.cli import main
from qkv.models.base import QKVModel
from qkv.models.transformer.adaptive_span import AdaptiveSpanTransformer, AdaptiveSpanTransformerConfig

V = 29


def model(**overrides) -> AdaptiveSpanTransformer:
    values = dict(vocab_size=V, n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0, max_span=8, ramp=2.0,
                  init_span=3.0)
    values.update(overrides)
    torch.manual_seed(0)
    return AdaptiveSpanTransformer(AdaptiveSpanTransformerConfig(**values)).eval()


def ids(B, L, seed=1):
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dynamic", [False, True])
def test_segments_through_the_cache_equal_one_pass(dynamic):
    """Each position looks S back across segment boundaries: segment by segment with the state
    equals one pass over the concatenation (the span, not the segment, limits the context)."""
    m = model(dynamic=dynamic)
    with torch.no_grad():
        if not dynamic:
            for kernel, z in zip(m.kernels(), ([1.0, 5.5], [8.0, 2.5])):
                kernel.span.copy_(torch.tensor(z) / 8)
    x = ids(2, 30)
    full = m(x).logits
    state, parts = None, []
    for a, b in [(0, 7), (7, 8), (8, 20), (20, 30)]:
        out = m(x[:, a:b], state=state, return_state=True)
        state, parts = out.state, parts + [out.logits]
        assert all(layer.self_attn.length <= 7 for layer in state.layers)  # the last S - 1 keys
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_the_span_penalty_joins_the_training_loss_only():
    m = model(span_loss_coef=0.01).train()
    x = ids(2, 12)
    out = m(x, labels=x)
    penalty = sum(k.spans().mean() for k in m.kernels())  # sum over layers of the mean over heads
    torch.testing.assert_close(out.aux["span_penalty"], penalty.detach())
    torch.testing.assert_close(out.loss, out.aux["lm_loss"] + 0.01 * penalty)
    out.loss.backward()
    assert all((k.span.grad != 0).all() for k in m.kernels())
    m.eval()
    evaluated = m(x, labels=x)
    torch.testing.assert_close(evaluated.loss, evaluated.aux["lm_loss"])


def test_set_step_clamps_spans_and_reports(tmp_path):
    m = model()
    with torch.no_grad():
        m.kernels()[0].span.fill_(-0.3)
        m.kernels()[1].span.fill_(1.4)
    m.set_step(3)
    assert m.spans().tolist() == [[0.0, 0.0], [8.0, 8.0]]
    assert [k.current_span() for k in m.kernels()] == [2, 8]  # ceil(max z + R), at most S
    cost = m.attention_cost()
    assert cost["computed"] == pytest.approx((2 + 8) / 16)
    assert cost["per_head"] == pytest.approx((2 + 2 + 8 + 8) / 4 / 8)
    report = m.eval_report()
    assert report["span_l1_h0"] == 8.0 and report["mean_span"] == 4.0
    assert m.visualize(tmp_path / "spans.png").read_bytes()[:4] == b"\x89PNG"


def test_carried_cache_is_detached_and_exported():
    m = model().train()
    x = ids(2, 10)
    state = m(x, labels=x, return_state=True).state
    assert all(not b.self_attn.key.requires_grad for b in state.layers)
    again = m.import_state(m.export_state(state))
    assert again.position == 10 and torch.equal(again.layers[1].self_attn.value, state.layers[1].self_attn.value)
    assert m.import_state({}) is None and m.export_state(None) == {}
    with pytest.raises(ValueError, match="cache.0.key"):
        m.import_state({"position": torch.tensor(3)})


def test_save_load_and_bad_config(tmp_path):
    m = model()
    m.save_pretrained(tmp_path)
    loaded = QKVModel.from_pretrained(tmp_path).eval()
    x = ids(1, 9)
    assert type(loaded) is AdaptiveSpanTransformer and torch.equal(loaded(x).logits, m(x).logits)
    with pytest.raises(ValueError, match="init_span"):
        AdaptiveSpanTransformerConfig(max_span=8, init_span=9.0)
    with pytest.raises(ValueError, match="attention must be 'adaptive-span'"):
        AdaptiveSpanTransformerConfig(attention="softmax")


def test_qkv_train_eval_viz_report_spans(tmp_path, monkeypatch, capsys, train_argv):
    texts = tmp_path / "data" / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    run = tmp_path / "run"
    sets = ["n_layers=2", "d_model=16", "n_heads=2", "d_ff=32", "max_span=24", "ramp=2", "task.block_size=16",
            "task.stream=true"]
    argv = train_argv("adaptive-span", "shakespeare-char", run, steps=3, batch_size=4)
    for s in sets:
        argv += ["--set", s]
    assert main(argv + ["--save-every", "2"]) == 0
    # the span cache is carried between batches and checkpointed: resuming continues it exactly
    assert main(argv[:6] + ["--steps", "4"] + argv[8:] + ["--save-every", "2", "--resume"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--max-examples", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"bpc", "span_l0_h0", "span_l1_h1", "attention_cost_computed"} <= set(report)
    assert main(["viz", str(run), "--text", "To be, or"]) == 0
    assert (run / "attention-model.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["generate", str(run), "--prompt", "To", "--max-new-tokens", "4"]) == 0
