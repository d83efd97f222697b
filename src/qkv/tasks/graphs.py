"""Node classification on Zachary's karate club (Zachary 1977), as shipped by ``networkx``.

34 members, 78 friendships; after the club split each member joined Mr. Hi's club or the
Officer's (``G.nodes[i]["club"]``): two classes. Semi-supervised as in GAT/GCN papers: a few
labelled members per class train (the two leaders, nodes 0 and 33, among them), the others are
split between valid and test. Features are one-hot node ids (the graph carries no attributes).

Batches are the whole graph: ``x (34, 34)`` float, ``edge_index (2, 156)`` long (both directions),
``labels (34,)`` long with ``-100`` on the nodes outside the split. ``evaluate`` gives the
``accuracy`` on the split's nodes.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import Task, check_batch_args, check_split, stable_seed

__all__ = ["KarateClub", "karate_graph"]


def karate_graph() -> Dict[str, Tensor]:
    """``edge_index (2, 2E)`` (both directions) and ``labels (34,)`` (0 = Mr. Hi, 1 = Officer)."""
    try:
        import networkx as nx
    except ImportError:  # networkx is optional: only this task needs it
        raise ImportError("the karate task needs networkx: pip install networkx") from None
    G = nx.karate_club_graph()
    edges = torch.tensor(list(G.edges()), dtype=torch.long).t()  # (2, E)
    edge_index = torch.cat([edges, edges.flip(0)], 1)  # (2, 2E)
    labels = torch.tensor([0 if G.nodes[i]["club"] == "Mr. Hi" else 1 for i in range(G.number_of_nodes())])
    return {"edge_index": edge_index, "labels": labels}


@register("task", "karate")
class KarateClub(Task):
    """Semi-supervised node classification on the karate club (which club did a member join?).

    Args:
        labelled_per_class: training nodes per class (the leaders 0 and 33 always among them).
        seed: draws the other labelled nodes and the valid/test split of the rest.
    """

    kind = "node-classification"
    vocab = None

    def __init__(self, *, labelled_per_class: int = 3, seed: int = 0) -> None:
        if isinstance(labelled_per_class, bool) or not isinstance(labelled_per_class, int) or not 1 <= labelled_per_class <= 15:
            raise ValueError(f"labelled_per_class must be an int in [1, 15], got {labelled_per_class!r}")
        graph = karate_graph()
        self.edge_index, self.labels = graph["edge_index"], graph["labels"]
        N = len(self.labels)
        self.x = torch.eye(N)  # one-hot node ids, (N, N)
        g = torch.Generator().manual_seed(stable_seed("karate", seed))
        leaders = {0: 0, 1: 33}
        train: List[int] = []
        for c in (0, 1):
            others = [i for i in range(N) if self.labels[i] == c and i != leaders[c]]
            pick = torch.randperm(len(others), generator=g)[: labelled_per_class - 1].tolist()
            train += [leaders[c]] + [others[p] for p in pick]
        rest = [i for i in range(N) if i not in train]
        rest = [rest[p] for p in torch.randperm(len(rest), generator=g).tolist()]
        half = len(rest) // 2
        self.nodes = {"train": torch.tensor(sorted(train)), "valid": torch.tensor(sorted(rest[:half])),
                      "test": torch.tensor(sorted(rest[half:]))}

    def _graph(self, split: str) -> Dict[str, Tensor]:
        labels = torch.full_like(self.labels, -100)
        labels[self.nodes[split]] = self.labels[self.nodes[split]]
        return {"x": self.x, "edge_index": self.edge_index, "labels": labels}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """The whole graph with the labels of ``split`` (``batch_size`` is ignored: one graph)."""
        check_batch_args(split, batch_size, step, rank, world_size)
        return self._graph(split)

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        check_split(split)
        yield self._graph(split)

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Any]:
        """``accuracy`` over the labelled nodes of the split (the graph is one batch)."""
        logits = model(**batch).logits.cpu()
        labels = batch["labels"].cpu()
        nodes = labels != -100  # the split's nodes
        return {"accuracy": (logits[nodes].argmax(-1) == labels[nodes]).float().mean().item(), "nodes": float(nodes.sum())}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        return {"accuracy": totals["accuracy"], "nodes": totals["nodes"]}

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        return [{"node": str(i), "club": str(int(self.labels[i]))} for i in range(min(n, len(self.labels)))]

    def __repr__(self) -> str:
        return f"KarateClub(train {len(self.nodes['train'])}, valid {len(self.nodes['valid'])}, test {len(self.nodes['test'])} nodes)"

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Every layer's and head's edge weights on the club graph (``qkv viz``)."""
        from .views import graph_view

        names = [f"{i} ({int(c)})" for i, c in enumerate(self.labels.tolist())]
        return graph_view(model, self._graph("test"), names)
