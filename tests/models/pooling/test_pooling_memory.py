"""Attention pooling and memory models against literal references (loops over the paper's
equations), masks over padding, bad inputs, and tiny training runs."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.models.base import QKVModel
from qkv.models.pooling.han import FlatGRU, FlatGRUConfig, HANConfig, HierarchicalAttentionNetwork
from qkv.models.memory.memnet import EndToEndMemoryNetwork, MemoryNetworkConfig, position_encoding
from qkv.models.pooling.nadaraya_watson import NadarayaWatson, NadarayaWatsonConfig
from qkv.models.pooling.sets import AttentionMIL, AttentionMILConfig, AttentionPooling, DeepSets, DeepSetsConfig
from qkv.models.memory.stacked_attention import StackedAttention, StackedAttentionConfig
from qkv.train import TrainConfig, Trainer

torch.manual_seed(0)


def _bags(B=3, K=5, D=6):
    x = torch.randn(B, K, D, dtype=torch.float64)
    mask = torch.ones(B, K, dtype=torch.bool)
    mask[0, 3:] = False
    mask[-1, 1:] = False
    return x, mask


# --------------------------------------------------------------------------- MIL pooling


@pytest.mark.parametrize("gated", [False, True])
def test_attention_pooling_matches_loop(gated):
    pool = AttentionPooling(input_dim=6, hidden_dim=4, gated=gated).double()
    h, mask = _bags()
    z, a, _ = pool(h, mask)
    V, U, w = pool.V, pool.U, pool.w.weight[0]
    for b in range(h.shape[0]):
        ks = [k for k in range(h.shape[1]) if mask[b, k]]
        # a_k = exp(w^T tanh(V h_k) [* sigma(U h_k)]) / sum_j ...
        logits = []
        for k in ks:
            t = torch.tanh(V.weight @ h[b, k] + V.bias)
            if gated:
                t = t * torch.sigmoid(U.weight @ h[b, k] + U.bias)
            logits.append(torch.dot(w, t))
        denom = sum(torch.exp(e) for e in logits)
        ref_a = torch.zeros(h.shape[1], dtype=torch.float64)
        for k, e in zip(ks, logits):
            ref_a[k] = torch.exp(e) / denom
        assert torch.allclose(a[b], ref_a, atol=1e-10)
        ref_z = sum(ref_a[k] * h[b, k] for k in ks)
        assert torch.allclose(z[b], ref_z, atol=1e-10)


def test_attention_pooling_gradcheck():
    pool = AttentionPooling(input_dim=3, hidden_dim=2, gated=True).double()
    h, mask = _bags(2, 4, 3)
    h.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: pool(x, mask).output, (h,))


@pytest.mark.parametrize("pooling", ["mean", "max", "attention", "gated"])
def test_mil_padding_changes_nothing(pooling):
    model = AttentionMIL(AttentionMILConfig(encoder="mlp", input_dim=6, d_model=8, hidden_dim=4, pooling=pooling)).double().eval()
    x, mask = _bags()
    out = model(bags=x, mask=mask, need_weights=True)
    noisy = x.clone()
    noisy[~mask] = torch.randn(int((~mask).sum()), 6, dtype=torch.float64) * 100
    out2 = model(bags=noisy, mask=mask, need_weights=True)
    assert torch.allclose(out.logits, out2.logits, atol=1e-10)
    if pooling in ("attention", "gated"):
        assert out.weights.shape == (3, 5)
        assert torch.all(out.weights[~mask] == 0)
        assert torch.allclose(out.weights.sum(-1), torch.ones(3, dtype=torch.float64))
    else:
        assert out.weights is None
    # a bag is a set: permuting its real instances changes nothing
    perm = torch.tensor([2, 1, 0, 3, 4])
    out3 = model(bags=x[:, perm], mask=mask[:, perm])
    assert torch.allclose(out.logits[0], out3.logits[0], atol=1e-10)


def test_deep_sets_is_sum_of_phi():
    model = DeepSets(DeepSetsConfig(encoder="mlp", input_dim=6, d_model=8, hidden_dim=5)).double().eval()
    x, mask = _bags()
    out = model(bags=x, mask=mask, labels=torch.tensor([0, 1, 0]))
    for b in range(3):
        s = sum(model.phi.net(x[b, k]) for k in range(5) if mask[b, k])
        assert torch.allclose(out.logits[b], model.rho(s), atol=1e-10)
    assert out.loss.dim() == 0


def test_mil_bad_inputs():
    model = AttentionMIL(AttentionMILConfig(encoder="mlp", input_dim=6, d_model=8))
    with pytest.raises(ValueError, match="bags"):
        model(bags=torch.randn(2, 3, 5))
    with pytest.raises(TypeError, match="mask"):
        model(bags=torch.randn(2, 3, 6), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="pooling"):
        AttentionMIL(AttentionMILConfig(pooling="sum"))
    with pytest.raises(ValueError, match="encoder"):
        AttentionMIL(AttentionMILConfig(encoder="resnet"))


def test_mil_lenet_shapes():
    model = AttentionMIL(AttentionMILConfig(d_model=16, hidden_dim=8))
    out = model(bags=torch.rand(2, 4, 1, 28, 28), mask=torch.ones(2, 4, dtype=torch.bool), labels=torch.tensor([0, 1]),
                need_weights=True)
    assert out.logits.shape == (2, 2) and out.weights.shape == (2, 4) and out.loss.dim() == 0


# --------------------------------------------------------------------------- memory networks


def test_position_encoding_matches_formula():
    lengths = torch.tensor([3, 5])
    d, J_max = 4, 6
    l = position_encoding(lengths, J_max, d)
    for n, J in enumerate(lengths.tolist()):
        for j in range(1, J_max + 1):
            for k in range(1, d + 1):
                ref = (1 - j / J) - (k / d) * (1 - 2 * j / J) if j <= J else 0.0
                assert abs(l[n, j - 1, k - 1].item() - ref) < 1e-6


def _story(B=2, S=4, J=3, V=12):
    story = torch.randint(1, V, (B, S, J))
    story[0, 1, 2] = 0  # a shorter sentence
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[0, 3] = False
    story[0, 3] = 0
    query = torch.randint(1, V, (B, 2))
    return story, mask, query


def _bow(ids, E, pe=True):
    """sum_j l_j * E x_j, literally."""
    J = int((ids != 0).sum())
    d = E.shape[1]
    out = torch.zeros(d, dtype=E.dtype)
    for j, w in enumerate(ids.tolist(), start=1):
        if w == 0:
            continue
        l = torch.tensor([(1 - j / J) - (k / d) * (1 - 2 * j / J) for k in range(1, d + 1)], dtype=E.dtype) if pe else 1
        out = out + l * E[w]
    return out


def test_memory_network_hops_match_loop():
    cfg = MemoryNetworkConfig(vocab_size=12, d_model=5, n_hops=3, max_sentences=4)
    model = EndToEndMemoryNetwork(cfg).double()
    story, mask, query = _story()
    out = model(story=story, query=query, story_mask=mask, need_weights=True)
    E = [e.weight for e in model.embeddings]
    T = [t.weight for t in model.temporal]
    for b in range(2):
        real = [i for i in range(4) if mask[b, i]]
        n = len(real)
        u = _bow(query[b], E[0])
        for k in range(1, 4):
            # m_i with A^k = E_{k-1}, c_i with C^k = E_k; T_A(i) counts back from the last sentence
            m = [_bow(story[b, i], E[k - 1]) + T[k - 1][n - 1 - i] for i in real]
            c = [_bow(story[b, i], E[k]) + T[k][n - 1 - i] for i in real]
            e = torch.stack([u @ mi for mi in m])
            p = torch.exp(e) / torch.exp(e).sum()
            assert torch.allclose(out.weights[k - 1][b, real], p, atol=1e-10)
            assert torch.all(out.weights[k - 1][b, [i for i in range(4) if not mask[b, i]]] == 0)
            o = sum(pi * ci for pi, ci in zip(p, c))
            u = u + o
        assert torch.allclose(out.logits[b], E[3] @ u, atol=1e-10)  # W^T = C^K


def test_memory_network_padding_changes_nothing():
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, d_model=6, n_hops=2, max_sentences=6)).eval()
    story, mask, query = _story()
    out = model(story=story, query=query, story_mask=mask)
    noisy = story.clone()
    noisy[0, 3] = torch.tensor([5, 6, 7])  # a padded (masked) sentence gets words
    assert torch.allclose(out.logits, model(story=noisy, query=query, story_mask=mask).logits)
    # more padding sentences at the end change nothing either
    longer = torch.cat([story, torch.zeros(2, 2, 3, dtype=torch.long)], 1)
    longer_mask = torch.cat([mask, torch.zeros(2, 2, dtype=torch.bool)], 1)
    assert torch.allclose(out.logits, model(story=longer, query=query, story_mask=longer_mask).logits, atol=1e-6)


def test_memory_network_bad_inputs():
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, max_sentences=3))
    story, mask, query = _story()
    with pytest.raises(ValueError, match="max_sentences"):
        model(story=story, query=query, story_mask=mask)
    with pytest.raises(TypeError, match="story"):
        model(story=story.float(), query=query)
    with pytest.raises(ValueError, match="batch size"):
        model(story=story[:, :3], query=query[:1])


# layer-wise tying and linear start (Sukhbaatar et al. 2015, §2.2 and §4.2)
def _reference(model, story, mask, query, layer_wise, linear):
    """Sukhbaatar et al. §2 written out per example and hop."""
    E = [e.weight for e in model.embeddings]
    T = [t.weight for t in model.temporal]
    K = model.config.n_hops
    logits, weights = [], [[] for _ in range(K)]
    for b in range(story.shape[0]):
        real = [i for i in range(story.shape[1]) if mask[b, i]]
        n = len(real)
        u = _bow(query[b], E[2] if layer_wise else E[0])  # u^1 = B q
        for k in range(1, K + 1):
            a, c = (0, 1) if layer_wise else (k - 1, k)  # A^k = A, C^k = C  |  A^k = E_{k-1}, C^k = E_k
            m = [_bow(story[b, i], E[a]) + T[a][n - 1 - i] for i in real]
            cs = [_bow(story[b, i], E[c]) + T[c][n - 1 - i] for i in real]
            e = torch.stack([u @ mi for mi in m])
            p = e if linear else torch.exp(e) / torch.exp(e).sum()
            row = torch.zeros(story.shape[1], dtype=e.dtype)
            row[real] = p
            weights[k - 1].append(row)
            o = sum(pi * ci for pi, ci in zip(p, cs))
            u = (model.H.weight @ u if layer_wise else u) + o  # u^{k+1} = H u^k + o^k
        logits.append(E[-1] @ u)  # W u^{K+1}
    return torch.stack(logits), [torch.stack(w) for w in weights]


@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("tying", ["adjacent", "layer-wise"])
def test_tyings_and_linear_start_match_loops(tying, linear):
    torch.manual_seed(0)
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, d_model=5, n_hops=3, max_sentences=4, tying=tying,
                                                      linear_start=linear)).double()
    story, mask, query = _story()
    out = model(story=story, query=query, story_mask=mask, need_weights=True)
    with torch.no_grad():
        logits, weights = _reference(model, story, mask, query, tying == "layer-wise", linear)
    torch.testing.assert_close(out.logits, logits)
    for got, want in zip(out.weights, weights):
        torch.testing.assert_close(got, want)
    if tying == "layer-wise":
        # one A, one C, B and W for every hop, however many hops
        deeper = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, d_model=5, n_hops=6, max_sentences=4, tying=tying))
        assert len(deeper.embeddings) == 4 and len(deeper.temporal) == 2 and deeper.H is not None
        assert sum(p.numel() for p in deeper.parameters()) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="tying"):
        EndToEndMemoryNetwork(MemoryNetworkConfig(tying="global"))


def test_linear_start_ends_when_validation_loss_stops_falling():
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, linear_start=True))
    assert bool(model.linear_phase)
    for loss in (3.0, 2.5, 2.4):
        model.on_evaluate({"valid_loss": loss})
        assert bool(model.linear_phase)
    model.on_evaluate({"valid_loss": 2.45})  # did not fall: the softmax is back for good
    assert not bool(model.linear_phase)
    model.on_evaluate({"valid_loss": 0.1})
    assert not bool(model.linear_phase)
    # the phase is state: saved and loaded with the weights
    fresh = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, linear_start=True))
    fresh.load_state_dict(model.state_dict())
    assert not bool(fresh.linear_phase)
    story, mask, query = _story()
    p = fresh(story=story, query=query, story_mask=mask, need_weights=True).weights[0]
    torch.testing.assert_close(p.sum(-1), torch.ones(2))


def test_trainer_reports_evaluations_to_the_model(tmp_path):
    from qkv.tasks import build_task

    task = build_task("babi-single")
    torch.manual_seed(0)
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=task.vocab.size, d_model=8, n_hops=2,
                                                      max_sentences=task.max_sentences, linear_start=True))
    seen = []
    model.on_evaluate = lambda metrics: seen.append(metrics["valid_loss"])
    Trainer(model, task, TrainConfig(steps=4, batch_size=8, eval_every=2, eval_batches=1, eval_max_examples=8,
                                     out_dir=str(tmp_path), progress=False, tensorboard=False)).fit()
    assert len(seen) == 2


def test_stacked_attention_matches_loop():
    cfg = StackedAttentionConfig(vocab_size=12, d_model=5, d_attention=3, n_layers=2, max_sentences=4)
    model = StackedAttention(cfg).double()
    story, mask, query = _story()
    out = model(story=story, query=query, story_mask=mask, need_weights=True)
    Es, Eq, age = model.story_embedding.weight, model.query_embedding.weight, model.age.weight
    for b in range(2):
        real = [i for i in range(4) if mask[b, i]]
        n = len(real)
        v = [_bow(story[b, i], Es) + age[n - 1 - i] for i in real]
        u = _bow(query[b], Eq)
        for k, layer in enumerate(model.layers):
            s = layer.score
            # h_i = tanh(W_I v_i + W_Q u + b); p = softmax(W_P h_i)
            e = torch.stack([s.v.weight[0] @ torch.tanh(s.W2.weight @ vi + s.W2.bias + s.W1.weight @ u) for vi in v])
            p = torch.softmax(e, 0)
            assert torch.allclose(out.weights[k][b, real], p, atol=1e-10)
            u = sum(pi * vi for pi, vi in zip(p, v)) + u  # u^k = v~^k + u^{k-1}
        assert torch.allclose(out.logits[b], model.answer(u), atol=1e-10)


# --------------------------------------------------------------------------- HAN


def _doc():
    doc = torch.tensor([[[3, 4, 5, 0], [6, 7, 0, 0], [0, 0, 0, 0]],
                        [[8, 9, 10, 11], [0, 0, 0, 0], [0, 0, 0, 0]]])
    return doc


def test_han_attention_matches_loop():
    model = HierarchicalAttentionNetwork(HANConfig(vocab_size=12, d_embed=4, d_hidden=3, d_attention=5, n_classes=3,
                                                   dropout=0.0)).double().eval()
    doc = _doc()
    out = model(doc=doc, need_weights=True)
    wa, sa = model.word_attention, model.sentence_attention
    for b in range(2):
        sent_vecs = []
        n_sent = int((doc[b] != 0).any(-1).sum())
        for i in range(n_sent):
            words = doc[b, i][doc[b, i] != 0]
            h, _ = model.word_gru(model.embedding(words).unsqueeze(0))  # (1, T, 2H), no padding at all
            h = h[0]
            # u_it = tanh(W_w h_it + b_w); a_it = softmax(u_it^T u_w)
            e = torch.stack([wa.w.weight[0] @ torch.tanh(wa.V.weight @ h[t] + wa.V.bias) for t in range(len(words))])
            a = torch.softmax(e, 0)
            assert torch.allclose(out.weights["word"][b, i, : len(words)], a, atol=1e-8)
            assert torch.all(out.weights["word"][b, i, len(words):] == 0)
            sent_vecs.append(sum(a[t] * h[t] for t in range(len(words))))
        hs, _ = model.sentence_gru(torch.stack(sent_vecs).unsqueeze(0))
        hs = hs[0]
        e = torch.stack([sa.w.weight[0] @ torch.tanh(sa.V.weight @ hs[i] + sa.V.bias) for i in range(n_sent)])
        a = torch.softmax(e, 0)
        assert torch.allclose(out.weights["sentence"][b, :n_sent], a, atol=1e-8)
        v = sum(a[i] * hs[i] for i in range(n_sent))
        assert torch.allclose(out.logits[b], model.classifier(v), atol=1e-8)


@pytest.mark.parametrize("cls,cfg", [(HierarchicalAttentionNetwork, HANConfig), (FlatGRU, FlatGRUConfig)])
def test_document_padding_changes_nothing(cls, cfg):
    model = cls(cfg(vocab_size=12, d_embed=4, d_hidden=3, n_classes=3)).eval()
    doc = _doc()
    out = model(doc=doc, labels=torch.tensor([0, 2]))
    padded = torch.zeros(2, 5, 6, dtype=torch.long)
    padded[:, :3, :4] = doc
    assert torch.allclose(out.logits, model(doc=padded).logits, atol=1e-6)
    with pytest.raises(TypeError, match="doc"):
        model(doc=doc.float())


# --------------------------------------------------------------------------- Nadaraya–Watson


@pytest.mark.parametrize("kernel", ["fixed", "learned"])
def test_nadaraya_watson_matches_loop(kernel):
    model = NadarayaWatson(NadarayaWatsonConfig(kernel=kernel, bandwidth=0.5)).double()
    x = torch.tensor([0.3, 1.7], dtype=torch.float64)
    keys = torch.rand(2, 5, dtype=torch.float64) * 3
    values = torch.randn(2, 5, dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 0] = False
    out = model(x=x, keys=keys, values=values, mask=mask, labels=torch.zeros(2, dtype=torch.float64), need_weights=True)
    w = 2.0  # 1 / bandwidth
    for b in range(2):
        ks = [i for i in range(5) if mask[b, i]]
        e = [math.exp(-((x[b] - keys[b, i]).item() * w) ** 2 / 2) for i in ks]
        ref = sum(ei * values[b, i].item() for ei, i in zip(e, ks)) / sum(e)
        assert abs(out.logits[b].item() - ref) < 1e-10
    assert out.weights[1, 0] == 0
    assert (model.w.requires_grad) == (kernel == "learned")
    with pytest.raises(ValueError, match="kernel"):
        NadarayaWatson(NadarayaWatsonConfig(kernel="box"))


def test_save_load_roundtrip(tmp_path):
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=12, d_model=6, n_hops=2, max_sentences=6)).eval()
    model.save_pretrained(tmp_path)
    loaded = QKVModel.from_pretrained(tmp_path).eval()
    story, mask, query = _story()
    assert torch.equal(model(story=story, query=query, story_mask=mask).logits,
                       loaded(story=story, query=query, story_mask=mask).logits)


def test_memory_network_learns_tiny_babi(tmp_path):
    from qkv.tasks.babi import BabiSingle
    from qkv.train import TrainConfig, Trainer
    task = BabiSingle(n_train=500, n_valid=50, n_test=100, max_sentences=4)
    torch.manual_seed(0)
    model = EndToEndMemoryNetwork(MemoryNetworkConfig(vocab_size=task.vocab.size, d_model=20, n_hops=2,
                                                      max_sentences=task.max_sentences))
    before = task.evaluate(model, "test")["accuracy"]
    cfg = TrainConfig(steps=300, batch_size=32, lr=1e-2, warmup=10, weight_decay=0.0, eval_batches=0,
                      out_dir=str(tmp_path), progress=False, tensorboard=False, grad_clip=40.0)
    Trainer(model, task, cfg).fit()
    after = task.evaluate(model, "test")["accuracy"]
    assert after > max(0.7, before + 0.4), (before, after)
