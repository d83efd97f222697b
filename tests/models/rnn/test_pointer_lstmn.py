"""PointerNetwork (Vinyals 2015) and LSTMN (Cheng 2016) against literal loops."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.models.rnn.lstmn import LSTMN, LSTMNConfig, LSTMNEncoder
from qkv.models.rnn.pointer import PointerNetwork, PointerNetworkConfig
from qkv.tasks.pointer_tasks import PointerSortTask
from qkv.train import TrainConfig, Trainer


def pointer_batch():
    g = torch.Generator().manual_seed(0)
    inputs = torch.rand(3, 6, 2, generator=g, dtype=torch.float64)
    mask = torch.arange(6) < torch.tensor([[6], [4], [5]])
    labels = torch.tensor([[0, 3, 5, 6, -100], [1, 0, 2, 3, 6], [4, 6, -100, -100, -100]])
    return inputs, mask, labels


def make_pointer():
    torch.manual_seed(0)
    return PointerNetwork(PointerNetworkConfig(d_input=2, d_embed=5, d_hidden=7, attn_dim=4)).double()


def test_pointer_matches_loop_and_outputs_distributions():
    model = make_pointer()
    inputs, mask, labels = pointer_batch()
    out = model(inputs, labels=labels, input_mask=mask, need_weights=True)
    assert out.logits.shape == (3, 5, 7)
    # distributions over the unmasked inputs plus END
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 5, dtype=torch.float64))
    assert (out.weights * ~torch.cat([mask, torch.ones(3, 1, dtype=torch.bool)], 1).unsqueeze(1)).abs().max() == 0
    sc = model.score
    with torch.no_grad():
        for b in range(3):
            n = int(mask[b].sum())
            x = model.embed(inputs[b, :n])  # (n, E)
            enc, (h, c) = model.encoder(x[None])
            e = torch.cat([enc[0], model.end_key[None]])  # e_1..e_n, e_END
            h, c = h[0], c[0]
            inp = model.start[None]
            for i in range(labels.shape[1]):
                h, c = model.decoder(inp, (h, c))  # d_i
                u = [float(sc.v.weight[0] @ torch.tanh(sc.W1.weight @ h[0] + sc.W2.weight @ e[j] + sc.W2.bias))
                     for j in range(n + 1)]
                # u_ij = v^T tanh(W1 e_j + W2 d_i); END sits at the padded length 6
                got = torch.cat([out.logits[b, i, :n], out.logits[b, i, 6:]])
                torch.testing.assert_close(got, torch.tensor(u, dtype=torch.float64), atol=1e-9, rtol=1e-7)
                z = sum(math.exp(v) for v in u)
                torch.testing.assert_close(out.weights[b, i, :n], torch.tensor([math.exp(v) / z for v in u[:n]], dtype=torch.float64))
                j = int(labels[b, i])
                inp = x[j][None] if 0 <= j < n else model.start[None]


def test_pointer_generate_forbids_repeats_and_stops():
    model = make_pointer().eval()
    inputs, mask, _ = pointer_batch()
    ids, w = model.generate(inputs, input_mask=mask, return_weights=True)
    for b in range(3):
        n = int(mask[b].sum())
        row = [i for i in ids[b].tolist() if i >= 0]
        picked = [i for i in row if i != 6]
        assert len(picked) == len(set(picked)) and all(i < n for i in picked)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_pointer_learns_to_sort_a_little(tmp_path):
    task = PointerSortTask(min_len=4, max_len=5, eval_size=100)
    torch.manual_seed(0)
    model = PointerNetwork(PointerNetworkConfig(d_input=1, d_embed=16, d_hidden=32, attn_dim=16))
    before = task.evaluate(model, "valid")["loss"]
    Trainer(model, task, TrainConfig(steps=150, batch_size=64, lr=1e-2, warmup=10, eval_batches=0, eval_max_examples=64,
                                     out_dir=str(tmp_path), progress=False, tensorboard=False)).fit()
    after = task.evaluate(model, "valid")
    assert after["loss"] < 0.5 * before


def test_pointer_bad_inputs():
    model = make_pointer()
    inputs, mask, labels = pointer_batch()
    with pytest.raises(ValueError, match="labels"):
        model(inputs, labels=None)
    with pytest.raises(ValueError, match="labels"):
        model(inputs, labels=labels + 10, input_mask=mask)
    with pytest.raises(ValueError, match="d_input"):
        model(inputs[..., :1], labels=labels)
    with pytest.raises(ValueError, match="input_mask"):
        model(inputs, labels=labels, input_mask=mask.flip(1))


# -------------------------------------------------- PointerNetwork, output="vocabulary" (the seq2seq baseline)


def make_vocabulary(max_inputs=8):
    torch.manual_seed(0)
    config = PointerNetworkConfig(d_input=2, d_embed=5, d_hidden=7, attn_dim=4, output="vocabulary", max_inputs=max_inputs)
    return PointerNetwork(config).double()


def test_vocabulary_matches_loop():
    """Vinyals et al.'s +ATTENTION baseline written plainly: one example, one decoder step at a time."""
    model = make_vocabulary()
    inputs, mask, labels = pointer_batch()
    out = model(inputs, labels=labels, input_mask=mask, need_weights=True)
    assert out.logits.shape == (3, 5, 7) and out.weights.shape == (3, 5, 7)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 5, dtype=torch.float64))
    sc, K = model.score, model.config.max_inputs  # END is class K
    low = torch.finfo(torch.float64).min
    with torch.no_grad():
        for b in range(3):
            n = int(mask[b].sum())
            x = model.embed(inputs[b, :n])  # (n, E)
            enc, (h, c) = model.encoder(x[None])
            e, h, c = enc[0], h[0], c[0]  # e_1 .. e_n
            inp = model.start[None]
            for i in range(labels.shape[1]):
                h, c = model.decoder(inp, (h, c))  # d_i
                # a_ij = softmax_j v^T tanh(W1 d_i + W2 e_j) over the n real inputs
                s = [float(sc.v.weight[0] @ torch.tanh(sc.W1.weight @ h[0] + sc.W2.weight @ e[j] + sc.W2.bias))
                     for j in range(n)]
                a = [math.exp(v) / sum(math.exp(w) for w in s) for v in s]
                ctx = sum(a_j * e_j for a_j, e_j in zip(a, e))  # c_i = sum_j a_ij e_j
                z = model.out.weight @ torch.cat([h[0], ctx]) + model.out.bias  # W_o [d_i; c_i] + b_o, K + 1 classes
                # columns 0..n-1: classes 0..n-1; padded columns at finfo.min; END (class K) at the padded length 6
                torch.testing.assert_close(out.logits[b, i, :n], z[:n], atol=1e-9, rtol=1e-7)
                torch.testing.assert_close(out.logits[b, i, 6], z[K], atol=1e-9, rtol=1e-7)
                assert bool((out.logits[b, i, n:6] == low).all())
                offered = torch.cat([z[:n], z[K:]])
                torch.testing.assert_close(torch.cat([out.weights[b, i, :n], out.weights[b, i, 6:]]), torch.softmax(offered, 0))
                j = int(labels[b, i])  # the previous output CLASS is fed back, END (6) as class K
                inp = model.class_embed.weight[K if j == 6 else j][None] if 0 <= j <= 6 else model.start[None]
    # the pointer mode's parameters are not all here, and the baseline's are not in pointer mode
    names = dict(model.named_parameters())
    assert "end_key" not in names and {"out.weight", "class_embed.weight"} <= set(names)
    assert "class_embed.weight" not in dict(make_pointer().named_parameters())


def test_vocabulary_gradients_and_no_leak_through_padding():
    model = make_vocabulary()
    inputs, mask, labels = pointer_batch()
    inputs = inputs.clone().requires_grad_(True)
    out = model(inputs, labels=labels, input_mask=mask)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert inputs.grad[~mask].abs().max() == 0  # padded inputs reach nothing
    noisy = torch.where(mask.unsqueeze(-1), inputs.detach(), torch.randn_like(inputs) * 100)
    with torch.no_grad():
        again = model(noisy, labels=labels, input_mask=mask)
    torch.testing.assert_close(again.logits, out.logits.detach(), atol=0, rtol=0)
    # each example alone gives its rows of the padded batch
    with torch.no_grad():
        for b in range(3):
            n = int(mask[b].sum())
            alone = labels[b : b + 1].masked_fill(labels[b : b + 1] == 6, n)
            single = model(inputs[b : b + 1, :n].detach(), labels=alone).logits[0]
            torch.testing.assert_close(single[:, :n], out.logits[b, :, :n].detach())
            torch.testing.assert_close(single[:, n], out.logits[b, :, 6].detach())


def test_vocabulary_generate_is_valid_and_its_own_teacher_forced_argmax():
    model = make_vocabulary().eval()
    inputs, mask, _ = pointer_batch()
    ids = model.generate(inputs, input_mask=mask)  # forbid_repeats by default
    for b in range(3):
        n = int(mask[b].sum())
        row = [i for i in ids[b].tolist() if i >= 0]
        picked = [i for i in row if i != 6]
        assert len(picked) == len(set(picked)) and all(i < n for i in picked)
    tours = model.generate(inputs, input_mask=mask, point_all=True)
    for b in range(3):
        n = int(mask[b].sum())
        assert sorted(tours[b, :n].tolist()) == list(range(n)) and int(tours[b, n]) == 6  # a permutation, then END
    # unconstrained greedy decoding = the argmax of the forward pass teacher forced with its own outputs
    ids, w = model.generate(inputs, input_mask=mask, forbid_repeats=False, return_weights=True)
    labels = ids.masked_fill(ids < 0, -100)
    out = model(inputs, labels=labels, input_mask=mask, need_weights=True)
    valid = labels != -100
    assert torch.equal(out.logits.argmax(-1)[valid], ids[valid])
    torch.testing.assert_close(out.weights[valid], w[valid])


def test_vocabulary_bad_config_and_too_long_inputs():
    with pytest.raises(ValueError, match="output"):
        PointerNetwork(PointerNetworkConfig(output="x"))
    with pytest.raises(ValueError, match="max_inputs"):
        PointerNetwork(PointerNetworkConfig(output="vocabulary", max_inputs=0))
    with pytest.raises(ValueError, match="max_inputs"):
        PointerNetwork(PointerNetworkConfig(max_inputs=0))
    model = make_vocabulary(max_inputs=5)
    inputs, mask, labels = pointer_batch()  # 6 inputs
    with pytest.raises(ValueError, match="6 elements.*max_inputs=5"):
        model(inputs, labels=labels, input_mask=mask)
    with pytest.raises(ValueError, match="6 elements.*max_inputs=5"):
        model.generate(inputs, input_mask=mask)
    model(inputs[:, :5], labels=labels.clamp(max=5))  # max_inputs inputs are fine
    make_pointer()(inputs, labels=labels, input_mask=mask)  # the pointer has no dictionary to outgrow


def test_vocabulary_learns_to_sort_a_little(tmp_path):
    task = PointerSortTask(min_len=4, max_len=5, eval_size=64)
    torch.manual_seed(0)
    model = PointerNetwork(PointerNetworkConfig(d_input=1, d_embed=16, d_hidden=32, attn_dim=16, output="vocabulary",
                                                max_inputs=5))
    before = task.evaluate(model, "valid")["loss"]
    Trainer(model, task, TrainConfig(steps=40, batch_size=32, lr=1e-2, warmup=5, eval_batches=0, eval_max_examples=32,
                                     out_dir=str(tmp_path), progress=False, tensorboard=False)).fit()
    after = task.evaluate(model, "valid")
    assert after["loss"] < 0.8 * before


def test_vocabulary_from_the_command_line(tmp_path, train_argv, capsys):
    from qkv.cli import main
    from qkv.models import QKVModel

    tiny = ["--set", "d_embed=8", "--set", "d_hidden=8", "--set", "attn_dim=4"]
    run = tmp_path / "run"
    assert main(train_argv("pointer-network", "convex-hull", run, "--set", "output=vocabulary", *tiny,
                           steps=3, batch_size=4)) == 0
    model = QKVModel.from_pretrained(run / "model")
    assert model.config.output == "vocabulary" and model.config.max_inputs == 50
    picture = tmp_path / "hull.png"  # qkv viz draws the output distributions as for the pointer
    assert main(["viz", str(run), "--text", "0.1,0.1 0.9,0.2 0.5,0.9 0.5,0.4", "--out", str(picture), "--threads", "1"]) == 0
    assert picture.stat().st_size > 1000
    capsys.readouterr()
    assert main(train_argv("pointer-network", "convex-hull", tmp_path / "bad", "--set", "output=wrong", *tiny)) == 2
    assert "output must be one of ('pointer', 'vocabulary'), got 'wrong'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- LSTMN


def lstmn_reference(enc: LSTMNEncoder, x, mask=None, span=None):
    """Cheng et al. 2016 written plainly: one example, one tape slot at a time; with ``span`` only
    the newest ``span`` real (unmasked) slots of the tape are attended."""
    B, L, D = x.shape
    H = enc.hidden_size
    sc = enc.attention.score
    W_x, W_ht = sc.W1.weight[:, :D], sc.W1.weight[:, D:]  # W1 [x; h~] = W_x x + W_h~ h~
    outs, weights = [], []
    for b in range(B):
        tape_h, tape_c, ok = [torch.zeros(H, dtype=x.dtype)], [torch.zeros(H, dtype=x.dtype)], [True]
        h_tilde = torch.zeros(H, dtype=x.dtype)
        hs, ws = [], []
        for t in range(L):
            # a_i^t = v^T tanh(W_h h_i + W_x x_t + W_h~ h~_{t-1})
            a = [float(sc.v.weight[0] @ torch.tanh(sc.W2.weight @ h_i + sc.W2.bias + W_x @ x[b, t] + W_ht @ h_tilde))
                 for h_i in tape_h]
            real = [i for i, k in enumerate(ok) if k]
            kept = set(real if span is None else real[-span:])
            ex = [math.exp(v) if i in kept else 0.0 for i, v in enumerate(a)]
            s = [v / sum(ex) for v in ex]
            read = sum(s_i * h_i for s_i, h_i in zip(s, tape_h))
            c_tilde = sum(s_i * c_i for s_i, c_i in zip(s, tape_c))
            g = enc.gates.weight @ torch.cat([read, x[b, t]]) + enc.gates.bias
            if mask is None or bool(mask[b, t]):
                h_tilde = read  # a masked step does not move h~
            i, f, o, c_hat = g[:H], g[H : 2 * H], g[2 * H : 3 * H], g[3 * H :]
            c = torch.sigmoid(f) * c_tilde + torch.sigmoid(i) * torch.tanh(c_hat)
            h = torch.sigmoid(o) * torch.tanh(c)
            hs.append(h)
            ws.append(torch.tensor(s + [0.0] * (L - t), dtype=x.dtype))
            tape_h.append(h)
            tape_c.append(c)
            ok.append(True if mask is None else bool(mask[b, t]))
        outs.append(torch.stack(hs))
        weights.append(torch.stack(ws))
    return torch.stack(outs), torch.stack(weights)


def test_lstmn_tape_attention_matches_loop():
    torch.manual_seed(0)
    enc = LSTMNEncoder(3, 5, attn_dim=4).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    out = enc(x)
    with torch.no_grad():
        ref_h, ref_w = lstmn_reference(enc, x)
    torch.testing.assert_close(out.outputs, ref_h)
    torch.testing.assert_close(out.weights, ref_w)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(2, 6, dtype=torch.float64))
    torch.testing.assert_close(out.final[0], out.outputs[:, -1])


def test_lstmn_masked_steps_change_nothing():
    torch.manual_seed(0)
    enc = LSTMNEncoder(3, 5, attn_dim=4).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    mask = torch.tensor([[True] * 6, [True, True, False, True, False, False]])
    out = enc(x, mask)
    with torch.no_grad():
        ref_h, ref_w = lstmn_reference(enc, x, mask)
    torch.testing.assert_close(out.outputs, ref_h)
    torch.testing.assert_close(out.weights, ref_w)
    noisy = torch.where(mask.unsqueeze(-1), x, torch.randn_like(x))
    out2 = enc(noisy, mask)
    keep = mask.unsqueeze(-1)
    torch.testing.assert_close(out.outputs * keep, out2.outputs * keep)
    torch.testing.assert_close(out.final[0], out2.final[0])
    torch.testing.assert_close(out.final[0][1], out.outputs[1, 3])  # last unmasked step


@pytest.mark.parametrize("span", [1, 2, 4])
def test_lstmn_memory_span_attends_to_the_last_slots_only(span):
    torch.manual_seed(0)
    enc = LSTMNEncoder(3, 5, attn_dim=4, memory_span=span).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    mask = torch.tensor([[True] * 6, [True, False, True, True, False, True]])
    for m in (None, mask):
        out = enc(x, m)
        with torch.no_grad():
            ref_h, ref_w = lstmn_reference(enc, x, m, span=span)
        torch.testing.assert_close(out.outputs, ref_h)
        torch.testing.assert_close(out.weights, ref_w)
        assert int((out.weights > 0).sum(-1).max()) == span
    # span 1: the tape read is the previous state, i.e. an LSTM step
    if span == 1:
        w = enc(x).weights
        torch.testing.assert_close(w, torch.eye(6, 7, dtype=torch.float64).expand(2, 6, 7))
    # a span covering the whole tape changes nothing
    full = LSTMNEncoder(3, 5, attn_dim=4).double()
    full.load_state_dict(enc.state_dict())
    wide = LSTMNEncoder(3, 5, attn_dim=4, memory_span=7).double()
    wide.load_state_dict(enc.state_dict())
    torch.testing.assert_close(wide(x, mask).outputs, full(x, mask).outputs)
    with pytest.raises(ValueError, match="memory_span"):
        LSTMNEncoder(3, 5, memory_span=0)
    model = LSTMN(LSTMNConfig(vocab_size=20, d_embed=8, d_hidden=8, attn_dim=4, memory_span=span))
    assert model.lstmn.memory_span == span


def test_lstmn_model_lm_and_classifier():
    torch.manual_seed(0)
    ids = torch.randint(1, 20, (2, 7))
    lm = LSTMN(LSTMNConfig(vocab_size=20, d_embed=8, d_hidden=8, attn_dim=4))
    out = lm(ids, labels=ids, need_weights=True)
    assert out.logits.shape == (2, 7, 20) and out.weights.shape == (2, 7, 8)
    out.loss.backward()
    clf = LSTMN(LSTMNConfig(vocab_size=20, d_embed=8, d_hidden=8, attn_dim=4, n_classes=3))
    out = clf(ids, labels=torch.tensor([0, 2]), attention_mask=torch.ones(2, 7, dtype=torch.bool))
    assert out.logits.shape == (2, 3) and out.loss.dim() == 0
    with pytest.raises(ValueError, match="labels"):
        clf(ids, labels=torch.tensor([0, 2, 1]))
    with pytest.raises(TypeError, match="input_ids"):
        clf(ids.float())
    with pytest.raises(ValueError, match="input_size"):
        LSTMNEncoder(3, 5)(torch.randn(1, 2, 4))
    with pytest.raises(ValueError, match="mask"):
        LSTMNEncoder(3, 5)(torch.randn(1, 2, 3), torch.ones(1, 3, dtype=torch.bool))


def test_lstmn_generates_what_its_forward_predicts():
    """Greedy generation (top_k=1) picks, at each step, the argmax of the forward pass on the prefix."""
    torch.manual_seed(0)
    model = LSTMN(LSTMNConfig(vocab_size=11, d_embed=8, d_hidden=8, attn_dim=8)).eval()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = model.generate(prompt, max_new_tokens=4, top_k=1)
    assert out.shape == (2, 7) and torch.equal(out[:, :3], prompt)
    for t in range(3, 7):
        assert torch.equal(out[:, t], model(input_ids=out[:, :t]).logits[:, -1].argmax(-1))
    classifier = LSTMN(LSTMNConfig(vocab_size=11, d_embed=8, d_hidden=8, attn_dim=8, n_classes=3))
    with pytest.raises(ValueError, match="classifier"):
        classifier.generate(prompt, max_new_tokens=2)
