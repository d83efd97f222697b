"""ShowAttendTell (Xu et al. 2015): soft step against a literal loop, penalty, hard attention's REINFORCE."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.models.rnn.show_attend_tell import ShowAttendTell, ShowAttendTellConfig

V = 8


def make(attention="soft", **kw):
    torch.manual_seed(0)
    cfg = ShowAttendTellConfig(vocab_size=V, channels=(4, 6), d_embed=5, d_hidden=7, attn_dim=4, attention=attention, **kw)
    return ShowAttendTell(cfg).double()


def data():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 1, 8, 12, generator=g, dtype=torch.float64)
    tgt = torch.tensor([[1, 4, 5, 6], [1, 7, 3, 0]])
    labels = torch.tensor([[4, 5, 6, 2], [7, 3, 2, -100]])
    return images, tgt, labels


def test_soft_step_matches_loop_and_penalty():
    model = make("soft", doubly_stochastic=0.5)
    images, tgt, labels = data()
    out = model(images, tgt, labels=labels, need_weights=True)
    a, grid = model.encode(images)
    assert grid == (2, 3) and out.weights.shape == (2, 4, 6)
    sc = model.attention.score
    with torch.no_grad():
        for b in range(2):
            h = torch.tanh(model.init_h.weight @ a[b].mean(0) + model.init_h.bias)  # h_0 = tanh(f_init(mean a))
            c = torch.tanh(model.init_c.weight @ a[b].mean(0) + model.init_c.bias)
            for t in range(4):
                # e_ti = v^T tanh(W a_i + U h_{t-1}); alpha = softmax(e); z = beta sum alpha_i a_i
                e = [float(sc.v.weight[0] @ torch.tanh(sc.W1.weight @ h + sc.W2.weight @ a_i + sc.W2.bias)) for a_i in a[b]]
                z_ = sum(math.exp(x) for x in e)
                alpha = torch.tensor([math.exp(x) / z_ for x in e], dtype=torch.float64)
                torch.testing.assert_close(out.weights[b, t], alpha)
                beta = torch.sigmoid(model.f_beta.weight[0] @ h + model.f_beta.bias[0])
                z = beta * (alpha @ a[b])
                emb = model.embed.weight[tgt[b, t]]
                hh, cc = model.lstm(torch.cat([emb, z])[None], (h[None], c[None]))
                h, c = hh[0], cc[0]
                # p(y_t) ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))
                logits = model.L_o(emb + model.L_h(h) + model.L_z(z))
                torch.testing.assert_close(out.logits[b, t], logits)
    keep = (labels != -100).double()
    coverage = (out.weights * keep.unsqueeze(-1)).sum(1)  # sum_t alpha_ti over real steps
    penalty = ((1 - coverage) ** 2).sum(1).mean()
    torch.testing.assert_close(out.aux["doubly_stochastic"], penalty.detach())
    torch.testing.assert_close(out.loss, out.aux["nll"] + 0.5 * penalty)


def test_hard_attention_selects_one_cell_and_is_argmax_in_eval():
    model = make("hard")
    images, tgt, labels = data()
    model.eval()
    out1 = model(images, tgt, labels=labels)
    out2 = model(images, tgt, labels=labels)
    torch.testing.assert_close(out1.logits, out2.logits)  # deterministic argmax in eval
    assert "reinforce" not in out1.aux
    model.train()
    out = model(images, tgt, labels=labels)
    out.loss.backward()
    assert "reinforce" in out.aux
    # the score learns only through the REINFORCE term; the CNN through the likelihood
    assert model.attention.score.v.weight.grad.abs().sum() > 0
    assert model.cnn[0].weight.grad.abs().sum() > 0


def test_hard_attention_estimator_reduces_loss_on_a_toy():
    # two grid cells: the left one shows the class (bright or dim), the right one noise; only
    # REINFORCE can teach the score to select the left cell
    torch.manual_seed(0)
    model = ShowAttendTell(ShowAttendTellConfig(vocab_size=6, channels=(8,), d_embed=8, d_hidden=16, attn_dim=8,
                                                attention="hard", entropy_bonus=0.001, hard_mix=0.0))
    g = torch.Generator().manual_seed(0)
    n = 64
    cls = torch.randint(0, 2, (n,), generator=g)
    images = torch.zeros(n, 1, 2, 4)
    images[:, 0, :, :2] = (0.2 + 0.8 * cls.double()).view(n, 1, 1).float()  # left cell: the class
    images[:, 0, :, 2:] = 4 * torch.rand(n, 2, 2, generator=g)  # right cell: loud noise (drowns the mean)
    tgt = torch.stack([torch.ones(n, dtype=torch.long), 4 + cls], 1)  # bos, word
    labels = torch.stack([4 + cls, torch.full((n,), 2)], 1)  # word, eos
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def evaluate():
        model.eval()
        with torch.no_grad():
            a, _ = model.encode(images)
            h, _ = model.init_state(a)
            left = model.attention(h, a).state.probs[:, 0].mean()  # p(select the informative cell) at step 1
            return float(model(images, tgt, labels=labels).aux["nll"]), float(left)

    nll_before, left_before = evaluate()
    for _ in range(150):
        model.train()
        loss = model(images, tgt, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    nll_after, left_after = evaluate()
    assert nll_after < 0.5 * nll_before
    assert left_after > left_before + 0.2  # REINFORCE moved the attention to the informative cell
    assert model.attention.baseline_steps > 0


def test_hard_mix_reads_the_expected_context_and_skips_reinforce():
    """Xu et al. §4.1: a caption whose s~ is set to its expected value reads z_t = sum_i alpha_ti a_i."""
    model = make("hard", hard_mix=1.0).train()
    images, tgt, labels = data()
    out = model(images, tgt, labels=labels, need_weights=True)
    assert "reinforce" not in out.aux and int(model.attention.baseline_steps) == 0
    a, _ = model.encode(images)
    sc = model.attention.score
    with torch.no_grad():
        for b in range(2):
            h = torch.tanh(model.init_h.weight @ a[b].mean(0) + model.init_h.bias)
            c = torch.tanh(model.init_c.weight @ a[b].mean(0) + model.init_c.bias)
            for t in range(4):
                e = torch.stack([sc.v.weight[0] @ torch.tanh(sc.W1.weight @ h + sc.W2.weight @ a_i + sc.W2.bias) for a_i in a[b]])
                alpha = torch.softmax(e, 0)
                torch.testing.assert_close(out.weights[b, t], alpha)
                z = alpha @ a[b]  # no gate beta: the expected value of a_{s_t}
                emb = model.embed.weight[tgt[b, t]]
                hh, cc = model.lstm(torch.cat([emb, z])[None], (h[None], c[None]))
                h, c = hh[0], cc[0]
                torch.testing.assert_close(out.logits[b, t], model.L_o(emb + model.L_h(h) + model.L_z(z)))
    out.loss.backward()  # the attention learns by backpropagation through the expected context
    assert model.attention.score.v.weight.grad.abs().sum() > 0
    torch.testing.assert_close(out.loss, out.aux["nll"])
    with pytest.raises(ValueError, match="hard_mix"):
        make("hard", hard_mix=1.5)


def test_reinforce_estimator_has_the_sign_and_scale_of_the_true_gradient():
    """d/de E_{s ~ softmax(e)}[R(s)] = p_i (R_i - E[R]); the REINFORCE loss's gradient is minus a
    Monte Carlo estimate of it (descending the loss ascends the expected reward)."""
    from qkv.attention.alignment import HardAttention

    torch.manual_seed(0)
    att = HardAttention("dot").double().train()
    keys = torch.eye(3, dtype=torch.float64).unsqueeze(0)  # e_i = q_i (dot score of a unit key)
    logits = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    R = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    B = 40000
    scale = keys.shape[-1] ** 0.5 if getattr(att.score, "scaled", False) else 1.0
    out = att((logits * scale).expand(B, 3), keys.expand(B, 3, 3))
    sample = out.state
    p = torch.softmax(sample.probs[0].log(), 0).detach()
    loss = att.reinforce_loss(R[sample.index], sample, baseline=None)
    (grad,) = torch.autograd.grad(loss, logits)
    true = p * (R - (p * R).sum())  # gradient of the expected reward w.r.t. the scores
    torch.testing.assert_close(sample.probs[0], torch.softmax(logits, 0).detach())
    torch.testing.assert_close(-grad, true, atol=0.08, rtol=0.0)


def test_beam_one_equals_greedy():
    model = make("soft").eval()
    images, _, _ = data()
    greedy, w = model.generate(images, max_new_tokens=5, return_weights=True)
    torch.testing.assert_close(model.generate(images, max_new_tokens=5, beam_size=1), greedy)
    ids, wb = model.generate(images, max_new_tokens=5, beam_size=3, return_weights=True)
    assert ids.shape[0] == 2 and wb.shape[:2] == ids.shape and wb.shape[2] == 6


def test_bad_inputs_name_the_argument():
    model = make("soft")
    images, tgt, labels = data()
    with pytest.raises(ValueError, match="images"):
        model(images[:, :, :2, :2], tgt)
    with pytest.raises(ValueError, match="images"):
        model(images.repeat(1, 3, 1, 1), tgt)
    with pytest.raises(ValueError, match="labels"):
        model(images, tgt, labels=labels[:, :2])
    with pytest.raises(ValueError, match="tgt_ids"):
        model(images, tgt + V)
    with pytest.raises(ValueError, match="attention"):
        make("medium")
