"""Tests of alignment attention (SoftAttention, HardAttention, LocalAttention) against the
equations of Bahdanau 2014, Luong 2015 and Xu 2015 written as loops, plus masks, gradients,
properties and bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from qkv import masks, scores
from qkv.attention.alignment import HardAttention, HardAttentionSample, LocalAttention, SoftAttention

B, M, N, DQ, DK, DV, H = 2, 3, 6, 3, 4, 5, 7


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The tensors here are tiny: intra-op threads only add synchronisation (which costs ~20 ms
    # per op when the 2 shared cores are busy).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _data(dtype=torch.float64, seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, M, DQ, generator=g, dtype=dtype)
    k = torch.randn(B, n, DK, generator=g, dtype=dtype)
    v = torch.randn(B, n, DV, generator=g, dtype=dtype)
    return q, k, v


def _soft(score="additive", **kw):
    torch.manual_seed(0)
    return SoftAttention(score, query_dim=DQ, key_dim=DK, hidden_dim=H, **kw).double()


def _softmax_over(e_row: torch.Tensor, allowed) -> torch.Tensor:
    """a_i = exp(e_i) / sum_{j allowed} exp(e_j) for i allowed, 0 elsewhere (loop form)."""
    a = torch.zeros_like(e_row)
    idx = [i for i in range(e_row.shape[0]) if allowed[i]]
    if not idx:
        return a
    z = sum(torch.exp(e_row[j]) for j in idx)
    for i in idx:
        a[i] = torch.exp(e_row[i]) / z
    return a


# ----------------------------------------------------------------------------- soft


def test_soft_matches_loop_reference_with_mask():
    att = _soft()
    q, k, v = _data()
    mask = masks.padding_mask(torch.tensor([4, 6]), N)
    out = att(q, k, v, mask=mask)
    sc = att.score
    W1, W2, b2, vv = sc.W1.weight, sc.W2.weight, sc.W2.bias, sc.v.weight[0]
    for b in range(B):
        for t in range(M):
            # e_ti = v^T tanh(W1 s_t + W2 h_i + b)
            e = torch.stack([vv @ torch.tanh(W1 @ q[b, t] + W2 @ k[b, i] + b2) for i in range(N)])
            a = _softmax_over(e, mask[b])
            c = sum(a[i] * v[b, i] for i in range(N))  # c_t = sum_i a_ti v_i
            torch.testing.assert_close(out.weights[b, t], a)
            torch.testing.assert_close(out.output[b, t], c)
    assert out.state is None


def test_soft_single_query_shapes_and_default_values():
    att = _soft("general")
    q, k, _ = _data()
    out = att(q[:, 0], k)
    assert out.output.shape == (B, DK) and out.weights.shape == (B, N)
    full = att(q, k, k)
    torch.testing.assert_close(out.output, full.output[:, 0])
    torch.testing.assert_close(out.weights, full.weights[:, 0])


def test_soft_three_d_mask_equals_key_padding():
    att = _soft()
    q, k, v = _data()
    pad = masks.padding_mask(torch.tensor([3, 5]), N)
    a = att(q, k, v, mask=pad)
    b = att(q, k, v, mask=pad[:, None, :].expand(B, M, N))
    torch.testing.assert_close(a.output, b.output)
    torch.testing.assert_close(a.weights, b.weights)


def test_soft_gradcheck_masked():
    att = _soft()
    q, k, v = _data()
    mask = torch.rand(B, M, N, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[1, 2] = False  # a fully masked row: zeros, and a zero (not NaN) gradient
    for x in (q, k, v):
        x.requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k, v: att(q, k, v, mask=mask).output, (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: att(q, k, v, mask=mask).weights, (q, k, v))


@pytest.mark.parametrize("cls", ["soft", "local-m", "local-p"])
def test_no_leak_through_mask(cls):
    if cls == "soft":
        att = _soft()
        extra = {}
    else:
        torch.manual_seed(0)
        mode = "monotonic" if cls == "local-m" else "predictive"
        att = LocalAttention("general", window=2, mode=mode, query_dim=DQ, key_dim=DK).double()
        extra = {"position": torch.tensor([[2, 3, 4], [1, 2, 3]])} if mode == "monotonic" else {}
    q, k, v = _data()
    lengths = torch.tensor([4, 5])
    mask = masks.padding_mask(lengths, N)
    out = att(q, k, v, mask=mask, **extra)
    k2, v2 = k.clone(), v.clone()
    k2[~mask] = 1e3 * torch.randn_like(k2[~mask])
    v2[~mask] = 1e3 * torch.randn_like(v2[~mask])
    out2 = att(q, k2, v2, mask=mask, **extra)
    torch.testing.assert_close(out.output, out2.output)
    torch.testing.assert_close(out.weights, out2.weights)
    assert (out.weights.masked_select(~mask[:, None, :].expand(B, M, N)) == 0).all()


@pytest.mark.parametrize("which", ["soft", "hard", "local-m", "local-p"])
def test_fully_masked_rows_are_zero_not_nan(which):
    torch.manual_seed(0)
    kw = dict(query_dim=DQ, key_dim=DK, hidden_dim=H)
    extra = {}
    if which == "soft":
        att = SoftAttention(**kw)
    elif which == "hard":
        att = HardAttention(**kw)
    else:
        mode = "monotonic" if which == "local-m" else "predictive"
        att = LocalAttention("additive", window=1, mode=mode, **kw)
        extra = {"position": torch.tensor([0, 3])} if mode == "monotonic" else {}
    q, k, v = _data(torch.float32)
    mask = masks.padding_mask(torch.tensor([0, 4]), N)
    q.requires_grad_()
    out = att(q, k, v, mask=mask, **extra)
    assert torch.isfinite(out.output).all() and torch.isfinite(out.weights).all()
    assert (out.output[0] == 0).all() and (out.weights[0] == 0).all()
    total = out.output.sum() + out.weights.sum()
    if which == "hard":
        assert (out.state.log_prob[0] == 0).all() and (out.state.entropy[0] == 0).all()
        total = total + out.state.log_prob.sum() + out.state.entropy.sum()
    total.backward()
    assert torch.isfinite(q.grad).all()


def test_soft_custom_callable_score():
    att = SoftAttention(lambda s, h: -(s.unsqueeze(2) - h.unsqueeze(1)).pow(2).sum(-1))  # Nadaraya-Watson-like
    q, k, v = _data(n=N)
    q = q[..., :1].expand(B, M, DK).contiguous()
    out = att(q, k, v)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(B, M, dtype=torch.float64))
    bad = SoftAttention(lambda s, h: s @ h.transpose(1, 2)[..., :2])
    with pytest.raises(ValueError, match="score returned"):
        bad(q, k, v)


def test_soft_accepts_a_score_module():
    sc = scores.build("general", query_dim=DQ, key_dim=DK)
    att = SoftAttention(sc)
    assert att.score is sc and any(p is sc.W.weight for p in att.parameters())
    with pytest.raises(ValueError, match="hidden_dim"):
        SoftAttention(sc, hidden_dim=4)


_PROP_ATT = _soft("general")


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3), m=st.integers(1, 3), n=st.integers(1, 7), single=st.booleans(),
    three_d=st.booleans(), seed=st.integers(0, 2**16), data=st.data(),
)
def test_soft_weights_property(b, m, n, single, three_d, seed, data):
    g = torch.Generator().manual_seed(seed)
    m = 1 if single else m
    q = torch.randn(b, m, DQ, generator=g, dtype=torch.float64)
    k = torch.randn(b, n, DK, generator=g, dtype=torch.float64)
    v = torch.randn(b, n, DV, generator=g, dtype=torch.float64)
    if three_d and not single:
        mask = torch.rand(b, m, n, generator=g) > data.draw(st.floats(0.0, 1.0))
        full = mask
    else:
        lengths = torch.tensor(data.draw(st.lists(st.integers(0, n), min_size=b, max_size=b)))
        mask = masks.padding_mask(lengths, n)
        full = mask[:, None, :].expand(b, m, n)
    out = _PROP_ATT(q[:, 0] if single else q, k, v, mask=mask)
    w = out.weights.unsqueeze(1) if single else out.weights
    o = out.output.unsqueeze(1) if single else out.output
    assert w.shape == (b, m, n) and o.shape == (b, m, DV)
    assert (w[~full] == 0).all() and (w >= 0).all()
    any_key = full.any(-1)
    torch.testing.assert_close(w.sum(-1), any_key.to(w.dtype))
    assert (o[~any_key] == 0).all()
    torch.testing.assert_close(o, w @ v)


def test_soft_half_precision():
    att = SoftAttention("general", query_dim=DQ, key_dim=DK)
    q, k, v = _data(torch.float32)
    ref = att(q, k, v, mask=masks.padding_mask(torch.tensor([3, 6]), N))
    out = att.to(torch.bfloat16)(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask=masks.padding_mask(torch.tensor([3, 6]), N))
    assert out.output.dtype == torch.bfloat16
    torch.testing.assert_close(out.output.float(), ref.output, atol=0.05, rtol=0.05)


# ----------------------------------------------------------------------------- bad inputs


def test_bad_inputs():
    att = SoftAttention("general", query_dim=DQ, key_dim=DK)
    q, k, v = _data(torch.float32)
    with pytest.raises(ValueError, match="query"):
        att(q[None], k, v)
    with pytest.raises(ValueError, match="keys"):
        att(q, k[0], v)
    with pytest.raises(ValueError, match="values"):
        att(q, k, v[0])
    with pytest.raises(ValueError, match="batch"):
        att(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="values"):
        att(q, k, v[:, :-1])
    with pytest.raises(ValueError, match="query_dim"):
        att(torch.randn(B, M, DQ + 1), k, v)
    with pytest.raises(TypeError, match="dtype"):
        att(q, k, v.double())
    with pytest.raises(TypeError, match="query"):
        att(q.long(), k, v)
    with pytest.raises(TypeError, match="mask"):
        att(q, k, v, mask=torch.ones(B, N))
    with pytest.raises(TypeError, match="mask"):
        att(q, k, v, mask=[[True] * N] * B)
    with pytest.raises(ValueError, match="mask"):
        att(q, k, v, mask=torch.ones(B, N + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        att(q, k, v, mask=torch.ones(B, M + 1, N, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        att(q, k, v, mask=torch.ones(1, B, M, N, dtype=torch.bool))
    with pytest.raises(ValueError, match="Known"):
        SoftAttention("luong", query_dim=DQ, key_dim=DK)
    with pytest.raises(ValueError, match="hidden_dim"):
        SoftAttention("additive", query_dim=DQ, key_dim=DK)
    with pytest.raises(TypeError, match="score"):
        SoftAttention(3)
    with pytest.raises(TypeError, match="dropout"):
        SoftAttention("dot", dropout=0.1)


# ----------------------------------------------------------------------------- hard


def _hard(**kw):
    torch.manual_seed(0)
    return HardAttention("additive", query_dim=DQ, key_dim=DK, hidden_dim=H, **kw).double()


def test_hard_samples_are_one_hot_and_select_the_value():
    att = _hard()
    q, k, v = _data()
    mask = masks.padding_mask(torch.tensor([3, 6]), N)
    torch.manual_seed(1)
    for _ in range(20):
        out = att(q, k, v, mask=mask)
        s = out.state
        assert isinstance(s, HardAttentionSample)
        w = out.weights
        assert ((w == 0) | (w == 1)).all() and (w.sum(-1) == 1).all()
        assert (w[~mask[:, None, :].expand(B, M, N)] == 0).all()  # never a padded key
        torch.testing.assert_close(w.argmax(-1), s.index)
        torch.testing.assert_close(out.output, w @ v)
        # log p(s_t) and H[a_t] from the soft weights
        torch.testing.assert_close(s.log_prob, s.probs.gather(-1, s.index[..., None]).squeeze(-1).log())
        p = s.probs
        ent = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
        torch.testing.assert_close(s.entropy, ent)
        torch.testing.assert_close(s.probs, SoftAttention(att.score)(q, k, v, mask=mask).weights)


def test_hard_sampling_follows_the_weights():
    att = _hard()
    q, k, v = _data()
    reps = 4000
    qb, kb = q[:1, :1].expand(reps, 1, DQ), k[:1].expand(reps, N, DK)
    torch.manual_seed(2)
    out = att(qb, kb)
    freq = torch.bincount(out.state.index[:, 0], minlength=N).double() / reps
    torch.testing.assert_close(freq, out.state.probs[0, 0], atol=0.03, rtol=0)


def test_hard_eval_is_argmax_and_deterministic():
    att = _hard().eval()
    q, k, v = _data()
    mask = masks.padding_mask(torch.tensor([2, 6]), N)
    out, out2 = att(q, k, v, mask=mask), att(q, k, v, mask=mask)
    torch.testing.assert_close(out.output, out2.output)
    probs = SoftAttention(att.score)(q, k, v, mask=mask).weights
    torch.testing.assert_close(out.state.index, probs.argmax(-1))
    torch.testing.assert_close(out.weights, torch.nn.functional.one_hot(probs.argmax(-1), N).double())
    single = att(q[:, 0], k, v, mask=mask)
    assert single.output.shape == (B, DV) and single.state.index.shape == (B,) and single.state.probs.shape == (B, N)


def test_hard_gradients_reach_values_and_score_via_reinforce():
    att = _hard()
    q, k, v = _data()
    v.requires_grad_()
    out = att(q, k, v)
    out.output.sum().backward()
    assert v.grad.abs().sum() > 0
    assert all(p.grad is None for p in att.score.parameters())  # the sample is not differentiable
    loss = att.reinforce_loss(torch.randn(B, dtype=torch.float64), out.state)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in att.score.parameters())


def test_reinforce_loss_formula_and_moving_baseline():
    att = _hard(baseline_decay=0.9, entropy_bonus=0.1)
    q, k, v = _data()
    out = att(q, k, v)
    s = out.state
    r1 = torch.tensor([1.0, 3.0], dtype=torch.float64)
    # first call: baseline starts at 0 and becomes mean(R)
    loss = att.reinforce_loss(r1, s)
    ref = -((r1[:, None] - 0.0) * s.log_prob).sum() / B - 0.1 * s.entropy.sum() / B
    torch.testing.assert_close(loss, ref)
    assert float(att.reward_baseline) == pytest.approx(2.0)
    r2 = torch.tensor([[0.0, 1.0, 2.0], [4.0, 4.0, 4.0]], dtype=torch.float64)  # per-query rewards
    loss = att.reinforce_loss(r2, s)
    ref = -((r2 - 2.0) * s.log_prob).sum() / B - 0.1 * s.entropy.sum() / B
    torch.testing.assert_close(loss, ref)
    assert float(att.reward_baseline) == pytest.approx(0.9 * 2.0 + 0.1 * r2.mean().item())
    assert int(att.baseline_steps) == 2
    # other baselines leave the buffer alone; eval mode does not update it
    before = float(att.reward_baseline)
    torch.testing.assert_close(att.reinforce_loss(r1, s, baseline=None),
                               -(r1[:, None] * s.log_prob).sum() / B - 0.1 * s.entropy.sum() / B)
    torch.testing.assert_close(att.reinforce_loss(r1, s, baseline=1.5),
                               -((r1[:, None] - 1.5) * s.log_prob).sum() / B - 0.1 * s.entropy.sum() / B)
    att.eval()
    att.reinforce_loss(r1, s)
    assert float(att.reward_baseline) == before
    assert "reward_baseline" in att.state_dict()


def test_reinforce_loss_bad_inputs():
    att = _hard()
    q, k, v = _data()
    s = att(q, k, v).state
    with pytest.raises(ValueError, match="reward"):
        att.reinforce_loss(torch.zeros(B + 1, dtype=torch.float64), s)
    with pytest.raises(TypeError, match="reward"):
        att.reinforce_loss(torch.zeros(B, dtype=torch.long), s)
    with pytest.raises(TypeError, match="sample"):
        att.reinforce_loss(torch.zeros(B, dtype=torch.float64), s.log_prob)
    with pytest.raises(ValueError, match="baseline"):
        att.reinforce_loss(torch.zeros(B, dtype=torch.float64), s, baseline="learned")
    with pytest.raises(ValueError, match="baseline_decay"):
        HardAttention("dot", baseline_decay=1.5)
    with pytest.raises(ValueError, match="keys"):
        att(q, k[:, :0], v[:, :0])


def test_reinforce_learns_to_pick_the_largest_value():
    """Toy problem: the reward is the selected value; REINFORCE must learn to pick the largest."""
    torch.manual_seed(0)
    att = HardAttention("general", query_dim=1, key_dim=1, entropy_bonus=0.01)
    with torch.no_grad():
        att.score.W.weight.fill_(-0.5)  # start by preferring the smallest value
    opt = torch.optim.Adam(att.parameters(), lr=0.05)
    batch, n = 64, 5
    query = torch.ones(batch, 1)
    rewards = []
    for _ in range(200):
        keys = torch.randn(batch, n, 1)
        out = att(query, keys)  # values = keys
        reward = out.output[:, 0].detach()  # R = the selected value
        rewards.append(reward.mean().item())
        loss = att.reinforce_loss(reward, out.state)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # E[max of 5 standard normals] ~ 1.16; a uniform pick gets 0
    assert sum(rewards[-20:]) / 20 > sum(rewards[:20]) / 20 + 0.8
    assert sum(rewards[-20:]) / 20 > 0.9
    keys = torch.randn(1000, n, 1, generator=torch.Generator().manual_seed(9))
    best = keys[..., 0].argmax(-1)
    att.eval()
    assert (att(torch.ones(1000, 1), keys).state.index == best).all()
    att.train()
    probs = att(torch.ones(1000, 1), keys).state.probs  # (1000, n)
    assert probs.gather(-1, best[:, None]).mean() > 0.7  # p(largest) under the learned policy


# ----------------------------------------------------------------------------- local


def _local_reference(att: LocalAttention, q, k, v, mask, position=None):
    """Luong 2015 eqs. (10)-(11) with loops: window [p_t - D, p_t + D] clipped to the sequence and the mask."""
    D = att.window
    W = att.score.W.weight
    out_w = torch.zeros(B, M, k.shape[1], dtype=q.dtype)
    for b in range(B):
        S = int(mask[b].sum()) if mask is not None else k.shape[1]
        for t in range(M):
            if att.mode == "monotonic":
                p = int(position[b, t])
                centre = p
            else:
                z = att.v_p.weight[0] @ torch.tanh(att.W_p.weight @ q[b, t])
                p = S * torch.sigmoid(z)  # p_t = S sigmoid(v_p^T tanh(W_p s_t))
                centre = math.floor(float(p.detach()))
            allowed = [(centre - D <= i <= centre + D) and (mask is None or bool(mask[b, i])) for i in range(k.shape[1])]
            e = torch.stack([q[b, t] @ W @ k[b, i] for i in range(k.shape[1])])
            a = _softmax_over(e, allowed)
            if att.mode == "predictive":
                sigma = D / 2
                a = torch.stack([a[i] * torch.exp(-((i - p) ** 2) / (2 * sigma ** 2)) for i in range(k.shape[1])])
            out_w[b, t] = a
    return out_w, out_w @ v


@pytest.mark.parametrize("window", [0, 1, 2])
def test_local_monotonic_matches_loop_reference(window):
    torch.manual_seed(0)
    att = LocalAttention("general", window=window, mode="monotonic", query_dim=DQ, key_dim=DK).double()
    q, k, v = _data()
    mask = masks.padding_mask(torch.tensor([5, 6]), N)
    position = torch.tensor([[0, 2, 7], [1, 5, -1]])  # windows clipped at both ends
    out = att(q, k, v, mask=mask, position=position)
    w, o = _local_reference(att, q, k, v, mask, position)
    torch.testing.assert_close(out.weights, w)
    torch.testing.assert_close(out.output, o)
    # a (B,) position is shared by the queries; a 2-D query takes (B,)
    shared = att(q, k, v, mask=mask, position=torch.tensor([3, 1]))
    w, _ = _local_reference(att, q, k, v, mask, torch.tensor([[3] * M, [1] * M]))
    torch.testing.assert_close(shared.weights, w)
    one = att(q[:, 1], k, v, mask=mask, position=torch.tensor([3, 1]))
    torch.testing.assert_close(one.weights, w[:, 1])


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("window", [1, 2, 3])
def test_local_predictive_matches_loop_reference(window, masked):
    torch.manual_seed(window)
    att = LocalAttention("general", window=window, mode="predictive", query_dim=DQ, key_dim=DK).double()
    q, k, v = _data(seed=window)
    q = 3 * q  # spread p_t over the source
    mask = masks.padding_mask(torch.tensor([4, 6]), N) if masked else None
    out = att(q, k, v, mask=mask)
    w, o = _local_reference(att, q, k, v, mask)
    torch.testing.assert_close(out.weights, w)
    torch.testing.assert_close(out.output, o)
    assert (out.weights.sum(-1) <= 1 + 1e-12).all()  # the Gaussian is not renormalised
    # p_t lies in [0, S], S the per-sequence length with a padding mask
    S = mask.sum(-1, keepdim=True).double() if masked else torch.tensor(float(N))
    p = att.predict_position(q, S)
    assert ((p >= 0) & (p <= S)).all()


def test_local_monotonic_with_a_wide_window_is_soft_attention():
    torch.manual_seed(0)
    local = LocalAttention("general", window=N, mode="monotonic", query_dim=DQ, key_dim=DK).double()
    soft = SoftAttention(local.score)
    q, k, v = _data()
    mask = masks.padding_mask(torch.tensor([3, 6]), N)
    a = local(q, k, v, mask=mask, position=torch.tensor([0, 5]))
    b = soft(q, k, v, mask=mask)
    torch.testing.assert_close(a.output, b.output)
    torch.testing.assert_close(a.weights, b.weights)


def test_local_predictive_gradcheck_reaches_the_position_predictor():
    torch.manual_seed(0)
    att = LocalAttention("general", window=2, mode="predictive", query_dim=DQ, key_dim=DK).double()
    q, k, v = _data()
    mask = masks.padding_mask(torch.tensor([4, 6]), N)
    for x in (q, k, v):
        x.requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k, v: att(q, k, v, mask=mask).output, (q, k, v))
    att(q, k, v, mask=mask).output.sum().backward()
    assert att.W_p.weight.grad.abs().sum() > 0 and att.v_p.weight.grad.abs().sum() > 0


def test_local_bad_inputs():
    kw = dict(query_dim=DQ, key_dim=DK)
    q, k, v = _data(torch.float32)
    with pytest.raises(ValueError, match="window"):
        LocalAttention(window=-1, mode="monotonic", **kw)
    with pytest.raises(ValueError, match="window"):
        LocalAttention(window=0, mode="predictive", **kw)
    with pytest.raises(TypeError, match="window"):
        LocalAttention(window=1.5, **kw)
    with pytest.raises(ValueError, match="mode"):
        LocalAttention(window=2, mode="local", **kw)
    with pytest.raises(ValueError, match="query_dim"):
        LocalAttention("dot", window=2, mode="predictive")
    with pytest.raises(ValueError, match="position_dim"):
        LocalAttention(window=2, mode="monotonic", position_dim=4, **kw)
    mono = LocalAttention(window=2, mode="monotonic", **kw)
    with pytest.raises(ValueError, match="position"):
        mono(q, k, v)
    with pytest.raises(TypeError, match="position"):
        mono(q, k, v, position=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="position"):
        mono(q, k, v, position=torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="position"):
        mono(q[:, 0], k, v, position=torch.zeros(B, M, dtype=torch.long))
    with pytest.raises(TypeError, match="mask"):
        mono(q, k, v, mask=torch.ones(B, N, dtype=torch.int64), position=torch.tensor([1, 2]))
    pred = LocalAttention(window=2, mode="predictive", **kw)
    with pytest.raises(ValueError, match="position"):
        pred(q, k, v, position=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="predictive"):
        mono.predict_position(q, 5.0)
