"""Pointer-network tasks (Vinyals et al. 2015, arXiv:1506.03134): outputs are positions of the input.

* ``pointer-sort`` — real numbers in ``[0, 1)``; the target is the permutation that sorts them
  ascending.
* ``convex-hull`` — points uniform in the unit square; the target is the convex hull's vertices
  counter-clockwise, starting at the vertex with the smallest input index, solved exactly by
  Andrew's monotone chain (collinear points on an edge are not vertices).
* ``tsp`` — planar symmetric travelling salesman: the optimal closed tour from point 0, solved
  exactly by Held–Karp dynamic programming (``O(2^n n^2)``, so small ``n``); of its two directions
  the one whose second point has the smaller index. Metrics: ``tour_ratio`` (predicted tour
  length / optimal, over valid tours) and ``valid``; the decoder may end only after visiting every
  point (Vinyals et al. constrain the search to valid tours).
* ``delaunay`` — the Delaunay triangulation as the paper outputs it, a sequence of triangles,
  each a triple of input indices: ascending within a triangle, triangles in lexicographic order.
  Solved exactly by the empty-circumcircle test over all triples (``O(n^4)``, points in general
  position with probability 1). Metric: ``triangle_coverage`` (share of the true triangles among the
  predicted ones, Vinyals et al. Table 2).

Batches (``kind == "pointer"``): ``inputs (B, n, d) float``, ``input_mask (B, n) bool`` (right
padding), ``labels (B, T) long`` — input indices, then ``n`` (END, ``n`` the padded length), then
``-100``. A batch is a pure function of ``(seed, split, step, rank, world_size)``; the held-out sets
are fixed. Metrics from ``model.generate(inputs, input_mask=...)`` (greedy): ``exact_match``
(whole output sequence right), and for the hull ``area_coverage`` (area of the predicted polygon
over the true hull's, 0 for an invalid polygon, averaged) and ``valid`` (share of predictions that
are simple polygons of 3+ distinct inputs), the measures of Vinyals et al. Table 1.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from qkv._nn import evaluating, module_device
from qkv._plot import pyplot, save_figure
from qkv.registry import register
from qkv.tasks.base import IGNORE_INDEX, Task, check_batch_args, check_positive_int, check_split, stable_seed

__all__ = ["PointerTask", "PointerSortTask", "ConvexHullTask", "TSPTask", "DelaunayTask", "convex_hull", "polygon_area",
           "is_simple_polygon", "held_karp", "tour_length", "nearest_neighbour_tour", "delaunay_triangles"]

Example = Tuple[Tensor, List[int]]


def _cross(o: Sequence[float], a: Sequence[float], b: Sequence[float]) -> float:
    """z of ``(a - o) x (b - o)``: > 0 for a counter-clockwise turn ``o -> a -> b``."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def convex_hull(points: Sequence[Sequence[float]]) -> List[int]:
    """Indices of the convex hull's vertices, counter-clockwise, starting at the smallest index.

    Andrew's monotone chain, ``O(n log n)``: sort by ``(x, y)``, build the lower and the upper
    chain keeping only left turns (``cross > 0``; collinear points are dropped).
    """
    pts = [tuple(map(float, p)) for p in points]
    if len(pts) < 3:
        return list(range(len(pts)))
    order = sorted(range(len(pts)), key=lambda i: pts[i])
    lower: List[int] = []
    for i in order:
        while len(lower) >= 2 and _cross(pts[lower[-2]], pts[lower[-1]], pts[i]) <= 0:
            lower.pop()
        lower.append(i)
    upper: List[int] = []
    for i in reversed(order):
        while len(upper) >= 2 and _cross(pts[upper[-2]], pts[upper[-1]], pts[i]) <= 0:
            upper.pop()
        upper.append(i)
    hull = lower[:-1] + upper[:-1]  # counter-clockwise
    first = hull.index(min(hull))
    return hull[first:] + hull[:first]


def polygon_area(points: Sequence[Sequence[float]]) -> float:
    """Unsigned area by the shoelace formula ``|sum_i (x_i y_{i+1} - x_{i+1} y_i)| / 2``."""
    n = len(points)
    s = sum(points[i][0] * points[(i + 1) % n][1] - points[(i + 1) % n][0] * points[i][1] for i in range(n))
    return abs(s) / 2.0


def _segments_cross(p1, p2, p3, p4) -> bool:
    d1, d2 = _cross(p3, p4, p1), _cross(p3, p4, p2)
    d3, d4 = _cross(p1, p2, p3), _cross(p1, p2, p4)
    return (d1 > 0) != (d2 > 0) and (d3 > 0) != (d4 > 0) and d1 != 0 and d2 != 0 and d3 != 0 and d4 != 0


def is_simple_polygon(points: Sequence[Sequence[float]]) -> bool:
    """True when the closed polygon has 3+ vertices and no two non-adjacent edges cross."""
    n = len(points)
    if n < 3:
        return False
    edges = [(points[i], points[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        for j in range(i + 2, n):
            if i == 0 and j == n - 1:
                continue  # adjacent through the closing edge
            if _segments_cross(*edges[i], *edges[j]):
                return False
    return True


class PointerTask(Task):
    """Base of the pointer tasks: subclasses implement :meth:`sample` ``(generator) -> (points (n, d), target)``.

    Args:
        min_len, max_len: number of input elements (inclusive range).
        eval_size: size of each fixed held-out set.
    """

    kind = "pointer"
    d_input = 1
    repeats = False  # whether an output may point at an input twice (Delaunay triangles share vertices)
    point_all = False  # whether a valid output visits every input (TSP): END only after all

    def model_hints(self) -> Dict[str, Any]:
        """The number of features of an input point."""
        return {"d_input": self.d_input}

    def __init__(self, *, min_len: int, max_len: int, eval_size: int = 1000) -> None:
        check_positive_int("min_len", min_len)
        check_positive_int("max_len", max_len)
        check_positive_int("eval_size", eval_size)
        if max_len < min_len:
            raise ValueError(f"max_len must be >= min_len = {min_len}, got {max_len}")
        self.min_len, self.max_len, self.eval_size = min_len, max_len, eval_size
        self._eval_cache: Dict[str, List[Example]] = {}

    def sample(self, g: torch.Generator) -> Example:
        raise NotImplementedError  # abstract: subclasses implement it

    def _draw(self, g: torch.Generator) -> Example:
        return self.sample(g)

    def _length(self, g: torch.Generator) -> int:
        return int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))

    def collate(self, examples: Sequence[Example]) -> Dict[str, Tensor]:
        """``inputs (B, n, d)``, ``input_mask (B, n)``, ``labels (B, T)`` (END = ``n``, then ``-100``)."""
        if not examples:
            raise ValueError("examples must not be empty")
        B = len(examples)
        n = max(p.shape[0] for p, _ in examples)
        T = max(len(t) for _, t in examples) + 1
        inputs = torch.zeros(B, n, self.d_input)
        mask = torch.zeros(B, n, dtype=torch.bool)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        for b, (points, target) in enumerate(examples):
            inputs[b, : points.shape[0]] = points
            mask[b, : points.shape[0]] = True
            labels[b, : len(target) + 1] = torch.tensor(list(target) + [n], dtype=torch.long)
        return {"inputs": inputs, "input_mask": mask, "labels": labels}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """A fresh batch of ``split``, a pure function of the arguments."""
        check_batch_args(split, batch_size, step, rank, world_size)
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, seed, split, step, rank, world_size))
        return self.collate([self._draw(g) for _ in range(batch_size)])

    def eval_examples(self, split: str, max_examples: Optional[int] = None) -> List[Example]:
        """The fixed held-out examples of ``split``."""
        check_split(split)
        if split not in self._eval_cache:
            g = torch.Generator().manual_seed(stable_seed(self.registry_name, "eval", split, self.min_len, self.max_len))
            self._eval_cache[split] = [self._draw(g) for _ in range(self.eval_size)]
        return self._eval_cache[split][:max_examples]

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        check_positive_int("batch_size", batch_size)
        examples = self.eval_examples(split, max_examples)
        for first in range(0, len(examples), batch_size):
            yield self.collate(examples[first : first + batch_size])

    def _extra_metrics(self, examples: Sequence[Example], predictions: Sequence[List[int]]) -> Dict[str, float]:
        return {}

    def _generate_options(self, n: int) -> Dict[str, object]:
        """Decoding constraints of this task for ``n`` (padded) inputs, beyond ``generate``'s defaults."""
        options: Dict[str, object] = {"forbid_repeats": False} if self.repeats else {}
        if self.point_all:
            options["point_all"] = True
        return options

    eval_batch_size = 128

    def eval_inputs(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """The held-out batches, each with its ``examples`` (points, target) for the metrics."""
        examples = self.eval_examples(split, max_examples)
        for first in range(0, len(examples), batch_size):
            chunk = examples[first : first + batch_size]
            yield {**self.collate(chunk), "examples": chunk}

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The teacher-forced loss and the generated outputs of one batch."""
        examples = batch.pop("examples")
        loss = float(model(**batch).loss)
        n = batch["inputs"].shape[1]
        ids = model.generate(batch["inputs"], input_mask=batch["input_mask"], **self._generate_options(n))
        predictions = [row[: row.index(n)] if n in row else [i for i in row if 0 <= i < n] for row in ids.tolist()]
        return {"loss": loss, "batches": 1, "examples": examples, "predictions": predictions}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``exact_match`` and ``loss`` (teacher forced) over the held-out set, plus the task's metrics."""
        examples, predictions = totals.get("examples", []), totals.get("predictions", [])
        exact = sum(p == t for p, (_, t) in zip(predictions, examples)) / max(len(examples), 1)
        metrics = {"exact_match": exact, "loss": totals.get("loss", 0.0) / max(totals.get("batches", 0), 1),
                   "examples": float(len(examples))}
        metrics.update(self._extra_metrics(examples, predictions))
        return metrics

    def parse_inputs(self, text: str) -> Tensor:
        """Inputs written as text: numbers (``"0.3 0.9 0.1"``) for ``d_input == 1``, ``x,y`` pairs
        separated by spaces (``"0.1,0.2 0.8,0.3 0.5,0.9"``) for points. Returns ``(n, d_input)``."""
        try:
            if self.d_input == 1:
                rows = [[float(v)] for v in text.replace(",", " ").replace(";", " ").split()]
            else:
                rows = [[float(v) for v in item.split(",")] for item in text.replace(";", " ").split()]
        except ValueError as err:
            raise ValueError(f"could not read {text!r} as inputs of {self.d_input} number(s) each: {err}") from None
        if not rows or any(len(r) != self.d_input for r in rows):
            want = "numbers separated by spaces" if self.d_input == 1 else f"{self.d_input} comma-separated numbers per point, points separated by spaces"
            raise ValueError(f"inputs must be {want}, got {text!r}")
        return torch.tensor(rows)

    def _draw_solution(self, ax, points: Tensor, predicted: List[int], target: List[int]) -> bool:
        """Draw the inputs with the predicted and true outputs on ``ax``; False if the task has no such picture."""
        return False

    def _pointed(self, model: torch.nn.Module, text: Optional[str]):
        """Generate the outputs for ``text``'s inputs (or the first test example): the points, the
        target, the pointer distributions ``(steps, n + 1)``, the predicted outputs and axis labels."""
        if text:
            points = self.parse_inputs(text)
            target = self.solve(points)
        else:
            points, target = self.eval_examples("test", 1)[0]
        n = points.shape[0]
        with evaluating(model):
            ids, w = model.generate(points.unsqueeze(0).to(module_device(model)), return_weights=True, **self._generate_options(n))
        row, w = ids[0].cpu().tolist(), w[0].float().cpu()  # (T,), (T, n + 1)
        steps = len(row) if n not in row else row.index(n) + 1
        predicted = [i for i in row[:steps] if 0 <= i < n]
        fmt = (lambda p: f"{p[0]:.2f}") if self.d_input == 1 else (lambda p: f"({p[0]:.2f},{p[1]:.2f})")
        x_labels = [f"{j}: {fmt(p)}" for j, p in enumerate(points.tolist())] + ["END"]
        y_labels = [f"step {t + 1} -> {'END' if i == n else i}" for t, i in enumerate(row[:steps])]
        return points, target, w[:steps], steps, predicted, x_labels, y_labels

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """The pointer distributions of every output step over the inputs and END (``qkv viz --html``)."""
        from qkv.viz import AttentionView

        _, target, w, _, predicted, x_labels, y_labels = self._pointed(model, text)
        return AttentionView([("pointer", w)], x_labels=x_labels, y_labels=y_labels,
                             title=f"{type(model).__name__}: p(C_i | C_<i, P) over the inputs",
                             caption=f"target {target}, predicted {predicted}")

    @torch.no_grad()
    def visualize(self, model: torch.nn.Module, path: Union[str, Path], text: Optional[str] = None) -> Path:
        """The pointer distribution of every output step over the inputs (and END), as a heat map.

        ``text`` gives the inputs (see :meth:`parse_inputs`); otherwise the first test example.
        Tasks with a geometric picture (the hull) add a panel with the points, the true outputs
        (dashed) and the predicted ones (solid). Returns the PNG path.
        """
        points, target, w, steps, predicted, x_labels, y_labels = self._pointed(model, text)
        n = points.shape[0]
        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(max(5.0, 0.45 * (n + 1) + 2.5) + 5.0, max(3.5, 0.35 * steps + 2.0)))
        ax = axes[0]
        im = ax.imshow(w[:steps].numpy(), cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xticks(range(n + 1))
        ax.set_xticklabels(x_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(steps))
        ax.set_yticklabels(y_labels, fontsize=7)
        pointer = getattr(getattr(model, "config", None), "output", "pointer") == "pointer"
        ax.set_xlabel("input position (pointed at)" if pointer else "input position (dictionary class)")
        ax.set_title(f"{'pointer' if pointer else 'output-dictionary'} distributions p(C_i | C_<i, P); target {target}",
                     fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.04)
        if not self._draw_solution(axes[1], points, predicted, target):
            axes[1].axis("off")
            axes[1].text(0.0, 0.5, f"inputs: {[round(v, 3) for v in points[:, 0].tolist()]}\n"
                         f"predicted: {predicted}\ntarget:    {target}\n"
                         f"{'correct' if predicted == target else 'wrong'}", family="monospace", fontsize=8, va="center")
        fig.suptitle(f"{type(model).__name__} on {self.registry_name}", fontsize=9)
        return save_figure(fig, path, dpi=110)

    def solve(self, points: Tensor) -> List[int]:
        """The target output for ``points (n, d_input)``."""
        raise NotImplementedError  # abstract: subclasses implement it

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, "examples"))
        out = []
        for _ in range(n):
            points, target = self._draw(g)
            out.append({"inputs": str([[round(v, 3) for v in p] for p in points.tolist()]), "target": str(target)})
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry_name!r}, kind='pointer', n={self.min_len}..{self.max_len})"


@register("task", "pointer-sort")
class PointerSortTask(PointerTask):
    """Sort real numbers by pointing: ``[0.7, 0.1, 0.4] -> [1, 2, 0]`` (indices in ascending order).

    Args:
        min_len, max_len: how many numbers (default 5-10).
        eval_size: size of each fixed held-out set.
    """

    d_input = 1

    def __init__(self, *, min_len: int = 5, max_len: int = 10, eval_size: int = 1000) -> None:
        super().__init__(min_len=min_len, max_len=max_len, eval_size=eval_size)

    def sample(self, g: torch.Generator) -> Example:
        x = torch.rand(self._length(g), 1, generator=g)  # (n, 1)
        return x, self.solve(x)

    def solve(self, points: Tensor) -> List[int]:
        return torch.argsort(points[:, 0], stable=True).tolist()


@register("task", "convex-hull")
class ConvexHullTask(PointerTask):
    """Planar convex hull by pointing: the hull's vertices counter-clockwise from the smallest index.

    Args:
        min_len, max_len: how many points, uniform in the unit square (default 5-10; Vinyals et
            al. trained on 5-50).
        eval_size: size of each fixed held-out set.
    """

    d_input = 2

    def __init__(self, *, min_len: int = 5, max_len: int = 10, eval_size: int = 1000) -> None:
        if isinstance(min_len, int) and not isinstance(min_len, bool) and min_len < 3:
            raise ValueError(f"min_len must be >= 3 (a hull needs three points), got {min_len}")
        super().__init__(min_len=min_len, max_len=max_len, eval_size=eval_size)

    def sample(self, g: torch.Generator) -> Example:
        points = torch.rand(self._length(g), 2, generator=g)  # (n, 2)
        return points, convex_hull(points.tolist())

    def solve(self, points: Tensor) -> List[int]:
        return convex_hull(points.tolist())

    def _draw_solution(self, ax, points: Tensor, predicted: List[int], target: List[int]) -> bool:
        return _draw_polygons(ax, points, [predicted], [target], "hull")

    def _extra_metrics(self, examples: Sequence[Example], predictions: Sequence[List[int]]) -> Dict[str, float]:
        """``area_coverage`` (predicted polygon area / hull area, 0 if invalid) and ``valid``."""
        coverage, valid = 0.0, 0
        for (points, target), pred in zip(examples, predictions):
            pts = points.tolist()
            if len(set(pred)) != len(pred) or any(not 0 <= i < len(pts) for i in pred):
                continue
            polygon = [pts[i] for i in pred]
            if not is_simple_polygon(polygon):
                continue
            valid += 1
            coverage += polygon_area(polygon) / polygon_area([pts[i] for i in target])
        n = max(len(examples), 1)
        return {"area_coverage": coverage / n, "valid": valid / n}


# ------------------------------------------------------------------------------ TSP


def _distances(points: Sequence[Sequence[float]]) -> np.ndarray:
    p = np.asarray(points, dtype=np.float64).reshape(len(points), -1)
    return np.sqrt(((p[:, None, :] - p[None, :, :]) ** 2).sum(-1))  # (n, n)


def tour_length(points: Sequence[Sequence[float]], tour: Sequence[int]) -> float:
    """Length of the closed tour ``tour[0] -> tour[1] -> ... -> tour[0]``."""
    d = _distances(points)
    return float(sum(d[tour[i], tour[(i + 1) % len(tour)]] for i in range(len(tour)))) if len(tour) > 1 else 0.0


@lru_cache(maxsize=32)
def _masks_by_size(m: int) -> Tuple[np.ndarray, ...]:
    """The subsets of ``m`` cities as bit masks, grouped by their size (index = size)."""
    masks = np.arange(1 << m)
    sizes = np.array([bin(x).count("1") for x in range(1 << m)])
    return tuple(masks[sizes == s] for s in range(m + 1))


def _canonical(tour: List[int]) -> List[int]:
    """The tour from 0 in the direction whose second point has the smaller index."""
    start = tour.index(0)
    tour = tour[start:] + tour[:start]
    return tour if len(tour) < 3 or tour[1] < tour[-1] else [0] + tour[1:][::-1]


def held_karp(points: Sequence[Sequence[float]]) -> Tuple[float, List[int]]:
    """The optimal closed tour through ``points`` and its length (Held & Karp 1962); see
    :func:`held_karp_batch`. Returns ``(length, tour)``."""
    lengths, tours = held_karp_batch(np.asarray(points, dtype=np.float64).reshape(1, len(points), 2))
    return float(lengths[0]), tours[0]


def held_karp_batch(points: np.ndarray) -> Tuple[np.ndarray, List[List[int]]]:
    """Optimal tours of ``B`` instances of ``n`` planar points, ``points (B, n, 2)``.

    ``C(S, j)``, the shortest path from point 0 through the set ``S`` ending at ``j in S``:
    ``C({j}, j) = d(0, j)``, ``C(S, j) = min_{k in S - {j}} C(S - {j}, k) + d(k, j)``; the tour is
    ``min_j C({1..n-1}, j) + d(j, 0)``, ``O(2^n n^2)``. All subsets of one size and all instances
    are computed at once (numpy). Returns the lengths ``(B,)`` and the tours, each from 0 in the
    direction whose second point has the smaller index.
    """
    points = np.asarray(points, dtype=np.float64)
    B, n = points.shape[:2]
    if n <= 3:
        return np.array([tour_length(p, list(range(n))) for p in points]), [list(range(n)) for _ in range(B)]
    d = np.sqrt(((points[:, :, None, :] - points[:, None, :, :]) ** 2).sum(-1))  # (B, n, n)
    m = n - 1  # cities 1..n-1 as bits 0..m-1
    cost = np.full((B, 1 << m, m), np.inf)
    parent = np.full((B, 1 << m, m), -1, dtype=np.int8)
    cost[:, 1 << np.arange(m), np.arange(m)] = d[:, 0, 1:]
    for masks in _masks_by_size(m)[2:]:
        for j in range(m):
            with_j = masks[(masks >> j) & 1 == 1]  # (M,)
            cand = cost[:, with_j ^ (1 << j)] + d[:, None, 1:, j + 1]  # (B, M, m): ... -> k -> j
            k = cand.argmin(-1)  # (B, M)
            cost[:, with_j, j] = np.take_along_axis(cand, k[..., None], -1)[..., 0]
            parent[:, with_j, j] = k
    full = (1 << m) - 1
    closing = cost[:, full] + d[:, 1:, 0]  # (B, m)
    last = closing.argmin(-1)
    tours = []
    for b in range(B):
        j, mask, tour = int(last[b]), full, []
        while j >= 0:
            tour.append(j + 1)
            j, mask = int(parent[b, mask, j]), mask ^ (1 << j)
        tours.append(_canonical([0] + tour[::-1]))
    return closing[np.arange(B), last], tours


def nearest_neighbour_tour(points: Sequence[Sequence[float]]) -> List[int]:
    """The greedy tour: from point 0 always to the nearest unvisited point (a baseline)."""
    d = _distances(points)
    tour, left = [0], set(range(1, len(points)))
    while left:
        nxt = min(left, key=lambda j: (d[tour[-1], j], j))
        tour.append(nxt)
        left.remove(nxt)
    return tour


@register("task", "tsp")
class TSPTask(PointerTask):
    """Planar travelling salesman by pointing: the optimal tour from point 0 (exact, Held–Karp).

    Args:
        min_len, max_len: how many points, uniform in the unit square (default 5-10; exact
            solutions cost ``O(2^n n^2)``, so keep ``max_len`` small).
        eval_size: size of each fixed held-out set.
        train_size: size of the fixed training set (solved once, on the first training batch).
    """

    d_input = 2
    point_all = True

    def __init__(self, *, min_len: int = 5, max_len: int = 10, eval_size: int = 1000, train_size: int = 10000) -> None:
        if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 14:
            raise ValueError(f"max_len must be <= 14 (exact Held-Karp costs O(2^n n^2)), got {max_len}")
        check_positive_int("train_size", train_size)
        super().__init__(min_len=min_len, max_len=max_len, eval_size=eval_size)
        self.train_size = train_size

    def sample(self, g: torch.Generator) -> Example:
        return self._instances(g, 1)[0]

    def _instances(self, g: torch.Generator, count: int) -> List[Example]:
        """``count`` random instances, solved together (one batched Held–Karp per length)."""
        points = [torch.rand(self._length(g), 2, generator=g) for _ in range(count)]
        tours: List[Optional[List[int]]] = [None] * count
        for n in sorted({len(p) for p in points}):
            which = [i for i, p in enumerate(points) if len(p) == n]
            for first in range(0, len(which), 256):  # bounded memory: 256 x 2^(n-1) x (n-1)
                chunk = which[first : first + 256]
                _, solved = held_karp_batch(torch.stack([points[i] for i in chunk]).double().numpy())
                for i, tour in zip(chunk, solved):
                    tours[i] = tour
        return [(p, t) for p, t in zip(points, tours)]

    def _pool(self) -> List[Example]:
        """The fixed training set (``train_size`` solved instances, as Vinyals et al.'s), built once."""
        if "train" not in self._eval_cache:
            g = torch.Generator().manual_seed(stable_seed(self.registry_name, "train-pool", self.min_len, self.max_len))
            self._eval_cache["train"] = self._instances(g, self.train_size)
        return self._eval_cache["train"]

    def eval_examples(self, split: str, max_examples: Optional[int] = None) -> List[Example]:
        check_split(split)
        if split == "train":
            return self._pool()[:max_examples]
        if split not in self._eval_cache:
            g = torch.Generator().manual_seed(stable_seed(self.registry_name, "eval", split, self.min_len, self.max_len))
            self._eval_cache[split] = self._instances(g, self.eval_size)
        return self._eval_cache[split][:max_examples]

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """Training batches draw from the fixed training set; held-out splits as the base class."""
        if split != "train":
            return super().get_batch(split, batch_size, step, seed=seed, rank=rank, world_size=world_size)
        check_batch_args(split, batch_size, step, rank, world_size)
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, seed, split, step, rank, world_size))
        pool = self._pool()
        return self.collate([pool[int(i)] for i in torch.randint(len(pool), (batch_size,), generator=g)])

    def solve(self, points: Tensor) -> List[int]:
        return held_karp(points.tolist())[1]

    def _extra_metrics(self, examples: Sequence[Example], predictions: Sequence[List[int]]) -> Dict[str, float]:
        """``valid`` (a permutation of all points) and ``tour_ratio`` (length / optimal, over the valid ones)."""
        ratios = []
        for (points, target), pred in zip(examples, predictions):
            pts = points.tolist()
            if sorted(pred) == list(range(len(pts))):
                ratios.append(tour_length(pts, pred) / tour_length(pts, target))
        return {"valid": len(ratios) / max(len(examples), 1), "tour_ratio": float(np.mean(ratios)) if ratios else float("nan")}

    def _draw_solution(self, ax, points: Tensor, predicted: List[int], target: List[int]) -> bool:
        return _draw_polygons(ax, points, [predicted], [target], "tour")


def _draw_polygons(ax, points: Tensor, predicted: List[List[int]], target: List[List[int]], what: str) -> bool:
    """The points with their indices, the true closed polygons (dashed) and the predicted ones (solid)."""
    pts = points.tolist()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color="black", zorder=3)
    for j, (x, y) in enumerate(pts):
        ax.annotate(str(j), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    for loops, style, label in ((target, dict(color="tab:green", ls="--", lw=2.5, alpha=0.6), f"true {what}"),
                                (predicted, dict(color="tab:red", ls="-", lw=1.2), "predicted")):
        for n, idx in enumerate(i for i in loops if i):
            loop = idx + idx[:1]
            ax.plot([pts[i][0] for i in loop], [pts[i][1] for i in loop], label=label if n == 0 else None, **style)
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)  # clear of the points
    ax.set_title(f"points, true {what} and prediction ({'exact' if predicted == target else 'not exact'})", fontsize=8)
    return True


# ------------------------------------------------------------------------------ Delaunay


def delaunay_triangles(points: Sequence[Sequence[float]]) -> List[Tuple[int, int, int]]:
    """The Delaunay triangulation of planar ``points``: the triangles ``(i, j, k)``, ``i < j < k``,
    whose circumcircle holds no other point, in lexicographic order.

    Every triple is tested at once with the in-circle determinant: for a counter-clockwise
    ``(a, b, c)``, ``p`` lies strictly inside the circumcircle iff
    ``det [[a - p, |a - p|^2], [b - p, |b - p|^2], [c - p, |c - p|^2]] > 0``. Collinear triples
    are not triangles. Exact for points in general position (no four on a circle).
    """
    p = np.asarray(points, dtype=np.float64).reshape(len(points), 2)
    n = len(p)
    if n < 3:
        return []
    tri = np.array([(i, j, k) for i in range(n) for j in range(i + 1, n) for k in range(j + 1, n)])  # (T, 3)
    a, b, c = p[tri[:, 0]], p[tri[:, 1]], p[tri[:, 2]]
    orient = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])  # (T,)
    rel = p[None, None, :, :] - np.stack([a, b, c], 1)[:, :, None, :]  # (T, 3, n, 2): vertex -> point
    rel = -rel  # vertex - point
    lift = (rel ** 2).sum(-1, keepdims=True)  # (T, 3, n, 1)
    m = np.concatenate([rel, lift], -1)  # (T, 3, n, 3)
    det = np.linalg.det(np.moveaxis(m, 2, 1))  # (T, n): rows are the three vertices
    inside = det * np.sign(orient)[:, None] > 1e-12  # ccw orientation makes "inside" positive
    empty = ~inside.any(1) & (np.abs(orient) > 1e-12)
    return [tuple(int(v) for v in t) for t in tri[empty]]


@register("task", "delaunay")
class DelaunayTask(PointerTask):
    """Delaunay triangulation by pointing: the triangles as index triples, ``i < j < k``, sorted.

    Args:
        min_len, max_len: how many points, uniform in the unit square (default 5-10; Vinyals et
            al. used 5-50).
        eval_size: size of each fixed held-out set.
    """

    d_input = 2
    repeats = True

    def __init__(self, *, min_len: int = 5, max_len: int = 10, eval_size: int = 1000) -> None:
        if isinstance(min_len, int) and not isinstance(min_len, bool) and min_len < 3:
            raise ValueError(f"min_len must be >= 3 (a triangle needs three points), got {min_len}")
        super().__init__(min_len=min_len, max_len=max_len, eval_size=eval_size)

    def sample(self, g: torch.Generator) -> Example:
        points = torch.rand(self._length(g), 2, generator=g)  # (n, 2)
        return points, self.solve(points)

    def solve(self, points: Tensor) -> List[int]:
        return [i for t in delaunay_triangles(points.tolist()) for i in t]

    def _generate_options(self, n: int) -> Dict[str, object]:
        # at most 2n - 5 triangles for n >= 3 points (Euler), three indices each, then END
        return {"forbid_repeats": False, "max_new_tokens": 3 * max(2 * n - 5, 1) + 1}

    def _extra_metrics(self, examples: Sequence[Example], predictions: Sequence[List[int]]) -> Dict[str, float]:
        """``triangle_coverage``: the share of the true triangles the prediction lists (as vertex sets)."""
        coverage = 0.0
        for (_, target), pred in zip(examples, predictions):
            true = {frozenset(target[i : i + 3]) for i in range(0, len(target), 3)}
            got = {frozenset(pred[i : i + 3]) for i in range(0, len(pred) - 2, 3)}
            coverage += len(true & got) / max(len(true), 1)
        return {"triangle_coverage": coverage / max(len(examples), 1)}

    def _draw_solution(self, ax, points: Tensor, predicted: List[int], target: List[int]) -> bool:
        def triangles(idx: List[int]) -> List[List[int]]:
            return [list(idx[t : t + 3]) for t in range(0, len(idx) - 2, 3)]

        return _draw_polygons(ax, points, triangles(predicted), triangles(target), "triangulation")
