"""GAT coefficients against a loop over the edge list (and nothing across non-edges), segment
softmax, and squeeze-and-excitation against its equation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from qkv.models.pooling.graph_attention import GATConfig, GraphAttention, GraphAttentionLayer, add_self_loops, segment_softmax
from qkv.models.pooling.squeeze_excitation import SECNN, SECNNConfig, SqueezeExcitation

torch.manual_seed(0)

# a small directed graph src -> dst (node 4 has no incoming edge except its self-loop)
EDGES = torch.tensor([[0, 1, 2, 3, 1, 0, 2], [1, 0, 1, 1, 2, 3, 3]])
N = 5


def test_segment_softmax_matches_loop():
    scores = torch.randn(7, 2, dtype=torch.float64)
    index = EDGES[1]
    out = segment_softmax(scores, index, N)
    for e in range(7):
        group = [f for f in range(7) if index[f] == index[e]]
        for k in range(2):
            ref = math.exp(scores[e, k]) / sum(math.exp(scores[f, k]) for f in group)
            assert abs(out[e, k].item() - ref) < 1e-12
    big = segment_softmax(torch.full((3,), 1e4), torch.tensor([0, 0, 1]), 2)  # no overflow
    assert torch.allclose(big, torch.tensor([0.5, 0.5, 1.0]))


@pytest.mark.parametrize("concat", [True, False])
def test_gat_layer_matches_loop_over_edges(concat):
    layer = GraphAttentionLayer(3, 4, n_heads=2, concat=concat).double()
    x = torch.randn(N, 3, dtype=torch.float64)
    edges = add_self_loops(EDGES, N)
    out, alpha, _ = layer(x, edges)
    Wh = (x @ layer.W.weight.t()).view(N, 2, 4)  # W h, per head
    ref_out = torch.zeros(N, 2, 4, dtype=torch.float64)
    for i in range(N):
        incoming = [e for e in range(edges.shape[1]) if edges[1, e] == i]
        for k in range(2):
            # e_ij = LeakyReLU(a^T [W h_i || W h_j]) with a = [a_dst; a_src]
            a = torch.cat([layer.a_dst[k], layer.a_src[k]])
            e = [F.leaky_relu(a @ torch.cat([Wh[i, k], Wh[edges[0, f], k]]), 0.2) for f in incoming]
            z = sum(torch.exp(v) for v in e)
            for f, v in zip(incoming, e):
                assert abs(alpha[f, k].item() - (torch.exp(v) / z).item()) < 1e-10
                ref_out[i, k] += torch.exp(v) / z * Wh[edges[0, f], k]
    ref = ref_out.reshape(N, 8) if concat else ref_out.mean(1)
    assert torch.allclose(out, ref + layer.bias, atol=1e-10)


def test_mean_aggregation_is_the_average_of_the_neighbours():
    # the GCN-style baseline: a_ij = 1 / |N(i)|, h'_i = mean over j in N(i) of W h_j
    layer = GraphAttentionLayer(3, 4, n_heads=2, aggregation="mean").double()
    x = torch.randn(N, 3, dtype=torch.float64)
    edges = add_self_loops(EDGES, N)
    out, alpha, _ = layer(x, edges)
    Wh = (x @ layer.W.weight.t()).view(N, 2, 4)
    for i in range(N):
        sources = [int(edges[0, e]) for e in range(edges.shape[1]) if edges[1, e] == i]
        assert torch.allclose(out[i], Wh[sources].mean(0).reshape(8) + layer.bias, atol=1e-10)
    deg = torch.zeros(N, dtype=torch.float64).index_add_(0, edges[1], torch.ones(edges.shape[1], dtype=torch.float64))
    assert torch.allclose(alpha, (1 / deg[edges[1]]).unsqueeze(1).expand(-1, 2))
    with pytest.raises(ValueError, match="aggregation"):
        GraphAttentionLayer(3, 4, aggregation="sum")
    model = GraphAttention(GATConfig(in_dim=3, hidden_dim=4, n_heads=2, n_classes=2, aggregation="mean"))
    assert model(x=torch.randn(N, 3), edge_index=EDGES).logits.shape == (N, 2)


def test_gat_no_attention_across_non_edges():
    model = GraphAttention(GATConfig(in_dim=3, hidden_dim=4, n_heads=2, n_layers=1, n_classes=2, dropout=0.0)).double().eval()
    x = torch.randn(N, 3, dtype=torch.float64)
    out = model(x=x, edge_index=EDGES)
    # node 1's in-neighbours are 0, 2, 3 and itself; changing node 4 changes nothing at node 1
    x2 = x.clone()
    x2[4] = torch.randn(3, dtype=torch.float64) * 10
    out2 = model(x=x2, edge_index=EDGES)
    assert torch.allclose(out.logits[:4], out2.logits[:4])
    assert not torch.allclose(out.logits[4], out2.logits[4])
    # changing an in-neighbour of node 1 changes it
    x3 = x.clone()
    x3[3] += 1
    assert not torch.allclose(out.logits[1], model(x=x3, edge_index=EDGES).logits[1])


def test_gat_model_weights_and_loss():
    model = GraphAttention(GATConfig(in_dim=3, hidden_dim=4, n_heads=3, n_out_heads=2, n_classes=2))
    labels = torch.tensor([0, 1, -100, -100, 1])
    out = model(x=torch.randn(N, 3), edge_index=EDGES, labels=labels, need_weights=True)
    assert out.logits.shape == (N, 2) and out.loss.dim() == 0
    alpha = out.weights[0]["alpha"]
    assert alpha.shape == (7 + N, 3)
    per_node = torch.zeros(N, 3).index_add_(0, out.weights[0]["edge_index"][1], alpha)
    assert torch.allclose(per_node, torch.ones(N, 3), atol=1e-6)
    with pytest.raises(ValueError, match="edge_index"):
        model(x=torch.randn(N, 3), edge_index=torch.tensor([[0, 9], [1, 1]]))
    with pytest.raises(ValueError, match="edge_index"):
        model(x=torch.randn(N, 3), edge_index=EDGES.t().contiguous())


def test_squeeze_excitation_matches_equation():
    se = SqueezeExcitation(6, reduction=2).double()
    u = torch.randn(2, 6, 3, 4, dtype=torch.float64)
    out, s, _ = se(u)
    for b in range(2):
        z = torch.stack([u[b, c].mean() for c in range(6)])  # z_c = (1/HW) sum u_c(i, j)
        ref_s = torch.sigmoid(se.W2(torch.relu(se.W1(z))))
        assert torch.allclose(s[b], ref_s)
        for c in range(6):
            assert torch.allclose(out[b, c], ref_s[c] * u[b, c])  # x~_c = s_c u_c
    with pytest.raises(ValueError, match="channels"):
        se(torch.randn(2, 5, 3, 4, dtype=torch.float64))


@pytest.mark.parametrize("use_se", [True, False])
def test_se_cnn_shapes(use_se):
    model = SECNN(SECNNConfig(channels=(4, 8), use_se=use_se))
    out = model(images=torch.rand(3, 1, 28, 28), labels=torch.tensor([1, 2, 3]), need_weights=True)
    assert out.logits.shape == (3, 10) and out.loss.dim() == 0
    assert [w.shape for w in out.weights] == ([(3, 4), (3, 8)] if use_se else [])
    with pytest.raises(ValueError, match="in_channels"):
        model(images=torch.rand(3, 3, 28, 28))
