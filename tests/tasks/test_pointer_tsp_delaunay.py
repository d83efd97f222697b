"""tsp (exact Held-Karp tours) and delaunay (empty-circumcircle triangles) against literal
references, their metrics, and the pointer network's valid-tour decoding (Vinyals et al. 2015)."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

from qkv.models.base import ModelOutput
from qkv.models.rnn.pointer import PointerNetwork, PointerNetworkConfig
from qkv.tasks.pointer_tasks import (DelaunayTask, TSPTask, convex_hull, delaunay_triangles, held_karp, held_karp_batch,
                                     nearest_neighbour_tour, polygon_area, tour_length)


def _length(pts, tour):
    return sum(math.dist(pts[tour[i]], pts[tour[(i + 1) % len(tour)]]) for i in range(len(tour)))


def test_held_karp_is_the_brute_force_optimum():
    rng = random.Random(0)
    for n in [4, 5, 6, 7, 8] * 3:
        pts = [(rng.random(), rng.random()) for _ in range(n)]
        best = min(_length(pts, (0,) + p) for p in itertools.permutations(range(1, n)))
        length, tour = held_karp(pts)
        assert length == pytest.approx(best, abs=1e-12)
        assert _length(pts, tour) == pytest.approx(best, abs=1e-12) and tour_length(pts, tour) == pytest.approx(best)
        assert sorted(tour) == list(range(n)) and tour[0] == 0 and tour[1] < tour[-1]  # canonical direction
    batch = np.random.default_rng(0).random((5, 7, 2))
    lengths, tours = held_karp_batch(batch)
    for b in range(5):
        one = held_karp(batch[b].tolist())
        assert tours[b] == one[1] and lengths[b] == pytest.approx(one[0], abs=1e-12)
    assert held_karp([(0, 0), (1, 0), (0, 1)])[1] == [0, 1, 2]
    nn_tour = nearest_neighbour_tour(pts)
    assert sorted(nn_tour) == list(range(len(pts))) and _length(pts, nn_tour) >= best - 1e-12


def _inside_circumcircle(a, b, c, p):
    """Literal: the circumcentre from the perpendicular bisectors, then a distance comparison."""
    ax, ay = a
    bx, by = b
    cx, cy = c
    d = 2 * (ax * (by - cy) + bx * (cy - ay) + cx * (ay - by))
    ux = ((ax**2 + ay**2) * (by - cy) + (bx**2 + by**2) * (cy - ay) + (cx**2 + cy**2) * (ay - by)) / d
    uy = ((ax**2 + ay**2) * (cx - bx) + (bx**2 + by**2) * (ax - cx) + (cx**2 + cy**2) * (bx - ax)) / d
    return math.dist((ux, uy), p) < math.dist((ux, uy), a) - 1e-12


def test_delaunay_triangles_have_empty_circumcircles_and_tile_the_hull():
    rng = random.Random(1)
    for _ in range(20):
        n = rng.randint(3, 11)
        pts = [(rng.random(), rng.random()) for _ in range(n)]
        tris = delaunay_triangles(pts)
        literal = [t for t in itertools.combinations(range(n), 3)
                   if not any(_inside_circumcircle(*(pts[i] for i in t), pts[k]) for k in range(n) if k not in t)]
        assert tris == literal
        hull = convex_hull(pts)
        assert len(tris) == 2 * n - 2 - len(hull)  # Euler
        assert sum(polygon_area([pts[i] for i in t]) for t in tris) == pytest.approx(polygon_area([pts[i] for i in hull]))
        assert all(i < j < k for i, j, k in tris) and tris == sorted(tris)
    assert delaunay_triangles([(0, 0), (1, 1)]) == []


class Oracle(torch.nn.Module):
    """Answers with the task's own solution (optionally a worse tour / a missing triangle)."""

    def __init__(self, task, corrupt=False):
        super().__init__()
        self.task, self.corrupt = task, corrupt
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.options = []

    def forward(self, inputs, labels=None, input_mask=None):
        return ModelOutput(loss=self.w * 0)

    def generate(self, inputs, input_mask=None, **options):
        self.options.append(options)
        n = inputs.shape[1]
        rows = []
        for b in range(inputs.shape[0]):
            target = self.task.solve(inputs[b, : int(input_mask[b].sum())])
            if self.corrupt:
                target = target[:-3] if isinstance(self.task, DelaunayTask) else nearest_neighbour_tour(
                    inputs[b, : int(input_mask[b].sum())].tolist())
            rows.append(target + [n])
        T = max(map(len, rows))
        return torch.tensor([r + [-1] * (T - len(r)) for r in rows])


def test_tsp_task_batches_and_metrics():
    task = TSPTask(min_len=5, max_len=8, eval_size=30, train_size=50)
    batch = task.get_batch("train", 6, 2, seed=3)
    assert batch["inputs"].shape[-1] == 2
    for k, v in batch.items():
        assert torch.equal(v, task.get_batch("train", 6, 2, seed=3)[k])
    n = batch["inputs"].shape[1]
    for x, mask, row in zip(batch["inputs"], batch["input_mask"], batch["labels"]):
        m = int(mask.sum())
        tour = [i for i in row.tolist() if 0 <= i < n]
        assert row[m].item() == n and tour == held_karp(x[:m].tolist())[1]
    oracle = Oracle(task)
    perfect = task.evaluate(oracle, "test")
    assert perfect["exact_match"] == 1.0 and perfect["valid"] == 1.0 and perfect["tour_ratio"] == pytest.approx(1.0)
    assert oracle.options[0] == {"point_all": True}
    greedy = task.evaluate(Oracle(task, corrupt=True), "test")
    assert greedy["valid"] == 1.0 and greedy["tour_ratio"] > 1.0
    with pytest.raises(ValueError, match="max_len"):
        TSPTask(max_len=20)


def test_delaunay_task_batches_and_metrics():
    task = DelaunayTask(min_len=4, max_len=7, eval_size=20)
    batch = task.get_batch("train", 4, 0)
    n = batch["inputs"].shape[1]
    for x, mask, row in zip(batch["inputs"], batch["input_mask"], batch["labels"]):
        m = int(mask.sum())
        flat = [i for i in row.tolist() if 0 <= i < n]
        assert [tuple(flat[i : i + 3]) for i in range(0, len(flat), 3)] == delaunay_triangles(x[:m].tolist())
    oracle = Oracle(task)
    assert task.evaluate(oracle, "test")["triangle_coverage"] == 1.0
    assert oracle.options[0]["forbid_repeats"] is False and oracle.options[0]["max_new_tokens"] >= 3 * (2 * n - 5) + 1
    partial = task.evaluate(Oracle(task, corrupt=True), "test")
    assert 0 < partial["triangle_coverage"] < 1 and partial["exact_match"] == 0.0


def test_pointer_generate_point_all_visits_every_input_before_end():
    torch.manual_seed(0)
    model = PointerNetwork(PointerNetworkConfig(d_input=2, d_embed=8, d_hidden=8, attn_dim=8)).eval()
    point = model._point
    bonus = torch.zeros(7)
    bonus[6] = 100.0
    model._point = lambda d, keys, allowed: point(d, keys, allowed) + bonus  # a net that loves END
    inputs = torch.rand(3, 6, 2)
    mask = torch.arange(6) < torch.tensor([[6], [4], [5]])
    eager = model.generate(inputs, input_mask=mask)
    assert (eager[:, 0] == 6).all()  # without the constraint it stops at once
    ids = model.generate(inputs, input_mask=mask, point_all=True)
    for b in range(3):
        row = ids[b].tolist()
        m = int(mask[b].sum())
        assert sorted(row[:m]) == list(range(m)) and row[m] == 6
    with pytest.raises(ValueError, match="forbid_repeats"):
        model.generate(inputs, point_all=True, forbid_repeats=False)
