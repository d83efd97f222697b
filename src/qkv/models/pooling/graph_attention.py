"""Graph attention networks — Velickovic, Cucurull, Casanova, Romero, Lio, Bengio, "Graph
Attention Networks", ICLR 2018, arXiv:1710.10903.

Each node attends over its neighbours only::

    e_ij    = LeakyReLU(a^T [W h_i || W h_j])           for each edge j -> i
    a_ij    = softmax_{j in N(i)} e_ij                   (segment softmax over i's incoming edges)
    h'_i    = sigma(sum_{j in N(i)} a_ij W h_j)
    heads:  || over k of h'^k_i (hidden layers), mean over k (the last layer)

The softmax is computed on the edge list (``scatter_reduce`` max, ``index_add_`` sums): memory and
time are ``O(E)``, never an ``N x N`` matrix, and a pair of nodes without an edge gets no
weight at all. ``a^T [W h_i || W h_j]`` is split as ``a_dst^T W h_i + a_src^T W h_j`` so each
node's half is computed once.

Deviations: self-loops are added to the edge list (the paper's ``N(i)`` includes ``i``); edges
``(2, E)`` are directed ``src -> dst`` (an undirected graph lists both directions).

Baseline: ``aggregation="mean"`` replaces ``a_ij`` by the constant ``1 / |N(i)|`` (mean
aggregation over the neighbours, the GCN-style propagation the paper compares against; its
"Const-GAT" of §3.3), with everything else unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...registry import register
from ...types import AttentionOutput
from ..base import ModelOutput, QKVModel

AGGREGATIONS = ("attention", "mean")

__all__ = ["segment_softmax", "add_self_loops", "GraphAttentionLayer", "GATConfig", "GraphAttention"]


def segment_softmax(scores: Tensor, index: Tensor, n_segments: int) -> Tensor:
    """Softmax of ``scores (E, ...)`` within each group of rows sharing ``index (E,)`` -> ``(E, ...)``.

    ``out_e = exp(s_e - max_g) / sum_{e' in g} exp(s_e' - max_g)`` for the group ``g = index[e]``;
    the per-group max keeps ``exp`` from overflowing.
    """
    shape = (n_segments,) + scores.shape[1:]
    idx = index.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)  # (E, ...)
    group_max = scores.new_full(shape, torch.finfo(scores.dtype).min).scatter_reduce(0, idx, scores, "amax")  # (G, ...)
    exp = (scores - group_max.gather(0, idx)).exp()  # (E, ...)
    denom = scores.new_zeros(shape).index_add_(0, index, exp)  # (G, ...)
    return exp / denom.gather(0, idx)


def add_self_loops(edge_index: Tensor, n_nodes: int) -> Tensor:
    """``edge_index (2, E)`` with the loops ``i -> i`` added for every node (existing loops dropped first)."""
    keep = edge_index[0] != edge_index[1]
    loops = torch.arange(n_nodes, device=edge_index.device).expand(2, -1)  # (2, N)
    return torch.cat([edge_index[:, keep], loops], 1)


def _check_graph(x: Tensor, edge_index: Tensor) -> None:
    _checks.tensor("x", x, ndim=2, floating=True)
    _checks.tensor("edge_index", edge_index, ndim=2)
    if edge_index.shape[0] != 2 or edge_index.dtype != torch.long:
        raise ValueError(f"edge_index must be (2, E) long (src, dst), got {tuple(edge_index.shape)} {edge_index.dtype}")
    if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= x.shape[0]):
        raise ValueError(f"edge_index holds node ids outside [0, {x.shape[0]})")


class GraphAttentionLayer(nn.Module):
    """One multi-head GAT layer: ``h'_i = ||_k sum_{j in N(i)} a^k_ij W^k h_j`` (or the mean over ``k``).

    Args:
        in_dim: ``F``; out_dim: ``F'`` per head; n_heads: ``K``; concat: concatenate the heads
        (``K F'`` outputs) or average them (``F'``); negative_slope: of the LeakyReLU (paper: 0.2);
        dropout: on the attention coefficients (paper: 0.6); aggregation: ``"attention"`` (the
        paper's ``a_ij``) or ``"mean"`` (``a_ij = 1 / |N(i)|``, the mean-aggregation baseline).
    Call ``layer(x (N, F), edge_index (2, E))`` (edges ``src -> dst``, self-loops included by the
    caller) -> ``AttentionOutput(h' (N, K F') or (N, F'), a (E, K), None)``. Cost ``O(E K F' + N K F F')``.
    """

    def __init__(self, in_dim: int, out_dim: int, n_heads: int = 1, concat: bool = True, negative_slope: float = 0.2,
                 dropout: float = 0.0, aggregation: str = "attention") -> None:
        super().__init__()
        for name, v in (("in_dim", in_dim), ("out_dim", out_dim), ("n_heads", n_heads)):
            _checks.positive_int(name, v)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        self.n_heads, self.out_dim, self.concat, self.aggregation = n_heads, out_dim, concat, aggregation
        self.negative_slope, self.dropout = negative_slope, dropout
        self.W = nn.Linear(in_dim, n_heads * out_dim, bias=False)
        # a = [a_dst; a_src], one per head
        self.a_dst = nn.Parameter(torch.empty(n_heads, out_dim))
        self.a_src = nn.Parameter(torch.empty(n_heads, out_dim))
        self.bias = nn.Parameter(torch.zeros(n_heads * out_dim if concat else out_dim))
        nn.init.xavier_uniform_(self.W.weight)
        nn.init.xavier_uniform_(self.a_dst)
        nn.init.xavier_uniform_(self.a_src)

    def forward(self, x: Tensor, edge_index: Tensor) -> AttentionOutput:
        _check_graph(x, edge_index)
        N, K, Fo = x.shape[0], self.n_heads, self.out_dim
        src, dst = edge_index  # (E,), (E,)
        Wh = self.W(x).view(N, K, Fo)  # (N, K, F')
        # e_ij = LeakyReLU(a^T [W h_i || W h_j]) = LeakyReLU(a_dst . W h_i + a_src . W h_j), edge j -> i
        e = F.leaky_relu((Wh * self.a_dst).sum(-1)[dst] + (Wh * self.a_src).sum(-1)[src], self.negative_slope)  # (E, K)
        if self.aggregation == "mean":  # a_ij = 1 / |N(i)|: the mean-aggregation baseline
            a = segment_softmax(torch.zeros_like(e), dst, N)  # (E, K)
        else:  # a_ij = softmax over the incoming edges of i
            a = segment_softmax(e, dst, N)  # (E, K)
        a_drop = F.dropout(a, self.dropout, self.training)
        # h'_i = sum_j a_ij W h_j
        out = Wh.new_zeros(N, K, Fo).index_add_(0, dst, a_drop.unsqueeze(-1) * Wh[src])  # (N, K, F')
        out = out.reshape(N, K * Fo) if self.concat else out.mean(1)  # (N, K F') or (N, F')
        return AttentionOutput(out + self.bias, a, None)


@dataclass
class GATConfig:
    in_dim: int = 34  # node features F (karate: one-hot node ids)
    hidden_dim: int = 8  # F' per head in the hidden layers (paper: 8)
    n_heads: int = 8  # heads in the hidden layers, concatenated (paper: 8)
    n_out_heads: int = 1  # heads in the output layer, averaged (paper: 1 on Cora, 6 on PPI)
    n_layers: int = 2  # GAT layers (the last one is the classifier)
    n_classes: int = 2  # node classes
    dropout: float = 0.6  # dropout on inputs and attention coefficients (paper: 0.6)
    negative_slope: float = 0.2  # LeakyReLU slope in e_ij (paper: 0.2)
    aggregation: str = "attention"  # or "mean": a_ij = 1 / |N(i)| (the GCN-style baseline)


@register("model", "gat")
class GraphAttention(QKVModel):
    """Graph attention network for node classification (Velickovic et al. 2018): ELU between
    layers, heads concatenated in hidden layers and averaged in the output layer.

    ``forward(x (N, in_dim), edge_index (2, E) long, labels (N,) or None (-100 = unlabelled),
    need_weights=False)`` -> ``ModelOutput(loss, logits (N, n_classes), weights
    [{"edge_index": (2, E'), "alpha": (E', K)} per layer], E' with self-loops)``.
    """

    config_class = GATConfig
    suggested_tasks = ('karate',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 200, "batch_size": 1, "lr": 5e-3, "warmup": 0, "weight_decay": 5e-4, "schedule": "constant"}

    def __init__(self, config: GATConfig) -> None:
        super().__init__(config)
        _checks.positive_int("n_layers", config.n_layers)
        layers = []
        d = config.in_dim
        for _ in range(config.n_layers - 1):
            layers.append(GraphAttentionLayer(d, config.hidden_dim, config.n_heads, True, config.negative_slope, config.dropout,
                                              config.aggregation))
            d = config.hidden_dim * config.n_heads
        layers.append(GraphAttentionLayer(d, config.n_classes, config.n_out_heads, False, config.negative_slope, config.dropout,
                                          config.aggregation))
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor, edge_index: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        _check_graph(x, edge_index)
        edges = add_self_loops(edge_index, x.shape[0])  # (2, E + N)
        h = x
        weights: List[dict] = []
        for i, layer in enumerate(self.layers):
            h = F.dropout(h, self.config.dropout, self.training)
            h, alpha, _ = layer(h, edges)
            if i < len(self.layers) - 1:
                h = F.elu(h)
            weights.append({"edge_index": edges, "alpha": alpha})
        loss = None if labels is None else F.cross_entropy(h, labels, ignore_index=-100)
        return ModelOutput(loss=loss, logits=h, weights=weights if need_weights else None)
