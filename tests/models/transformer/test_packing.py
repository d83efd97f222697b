"""Packed sequences in transformers' convention (``DataCollatorWithFlattening``: documents
concatenated in one row, ``position_ids`` restarting at 0 at each): a model called with them gives
each document exactly what it gives that document alone — for every causal kernel, in the llama
model and in the GPT, float64."""

import pytest
import torch

import qkv
from qkv.models import GPT, GPTConfig, Llama, LlamaConfig
from qkv.registry import lookup

CAUSAL = [n for n in qkv.list_attention() if lookup("attention", n).supports_causal]
LENGTHS = (5, 3, 8)  # three documents in one row of 16


def build(model, name, **kw):
    torch.manual_seed(0)
    common = dict(vocab_size=30, n_layers=2, d_model=16, n_heads=2, d_ff=24, max_len=16, dropout=0.0, attention=name)
    if model == "llama":
        return Llama(LlamaConfig(**common, n_kv_heads=1, **kw)).double().eval()
    return GPT(GPTConfig(**common, **kw)).double().eval()


def packed_row(lengths, seed=3):
    ids = torch.randint(0, 30, (1, sum(lengths)), generator=torch.Generator().manual_seed(seed))
    position_ids = torch.cat([torch.arange(n) for n in lengths]).view(1, -1)
    return ids, position_ids


@pytest.mark.parametrize("model", ["llama", "gpt"])
@pytest.mark.parametrize("name", CAUSAL)
def test_a_packed_row_gives_each_document_what_it_gets_alone(model, name):
    net = build(model, name)
    ids, position_ids = packed_row(LENGTHS)
    with torch.no_grad():
        packed = net(ids, position_ids=position_ids).logits
        start = 0
        for n in LENGTHS:
            alone = net(ids[:, start:start + n]).logits
            torch.testing.assert_close(packed[:, start:start + n], alone, rtol=1e-9, atol=1e-9)
            start += n
    # without position_ids the documents see each other: the test could fail
    assert not torch.allclose(net(ids).logits[:, LENGTHS[0]:], packed[:, LENGTHS[0]:])


@pytest.mark.parametrize("name", ["softmax", "window", "gla", "linear"])
def test_packed_gradients_equal_those_of_the_documents_alone(name):
    net = build("llama", name)
    ids, position_ids = packed_row(LENGTHS)
    labels = torch.roll(ids, -1, dims=1)  # any targets: position t's label, no shift inside
    net(ids, labels=labels, position_ids=position_ids).loss.mul(sum(LENGTHS)).backward()  # a sum over the tokens
    packed = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    start = 0
    for n in LENGTHS:
        net(ids[:, start:start + n], labels=labels[:, start:start + n]).loss.mul(n).backward()
        start += n
    for a, b in zip(packed, (p.grad for p in net.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_position_ids_with_a_mask_are_positions_only():
    """A left-padded batch: position_ids restart at the first real token, the mask says which keys are real."""
    net = build("gpt", "softmax")
    ids, _ = packed_row((6,))
    mask = torch.tensor([[False, False, True, True, True, True]])
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = net(ids, attention_mask=mask, position_ids=position_ids).logits[:, 2:]
        alone = net(ids[:, 2:]).logits
    torch.testing.assert_close(padded, alone, rtol=1e-9, atol=1e-9)


def test_a_kernel_state_refuses_packed_documents():
    kernel = qkv.build_attention("softmax", causal=True)
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="position_ids .packed documents. with state"):
        kernel(q, q, q, position_ids=torch.tensor([[0, 1, 0, 1]]), return_state=True)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        kernel(q, q, q, position_ids=torch.zeros(1, 4))
    with pytest.raises(ValueError, match="must cover the keys of a self-attention row"):
        kernel(q, q, q, position_ids=torch.tensor([[0, 1, 0]]))


def test_a_packed_run_prints_its_gain_over_padding(shakespeare_cache, train_argv, capsys):
    """--set task.pack=true: the run counts the document pieces of its training rows and prints the
    useful tokens per second gained over one padded row per piece."""
    from qkv.cli import main

    texts = shakespeare_cache / "data" / "shakespeare" / "texts"
    for i in range(40):  # short texts before the fixture's Hamlet (file-name order): windows of 64 cross them
        (texts / f"a{i:02d}_gut.txt").write_text(f"SONNET {i}\n\nShall I compare thee?\n")
    run = shakespeare_cache / "run"
    assert main(train_argv("llama", "shakespeare-char", run, "--set", "task.pack=true", "--set", "task.block_size=64",
                           "--set", "n_layers=1", "--set", "d_model=8", "--set", "n_heads=2", "--set", "n_kv_heads=1",
                           "--set", "d_ff=8", "--threads", "1", steps=3, batch_size=8)) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("packing:"))
    rows, pieces = int(line.split(" rows hold ")[0].split()[-1]), int(line.split(" rows hold ")[1].split()[0])
    assert rows == 24 and pieces > rows  # some windows hold several texts
    assert f"{pieces / rows:.3f}x" in line and f"cost {pieces * 64} tokens" in line
