"""Pointer-network tasks (Vinyals et al. 2015, arXiv:1506.03134): outputs are positions of the input.

* ``pointer-sort`` — real numbers in ``[0, 1)``; the target is the permutation that sorts them
  ascending.
* ``convex-hull`` — points uniform in the unit square; the target is the convex hull's vertices
  counter-clockwise, starting at the vertex with the smallest input index, solved exactly by
  Andrew's monotone chain (collinear points on an edge are not vertices).

Batches (``kind == "pointer"``): ``inputs (B, n, d) float``, ``input_mask (B, n) bool`` (right
padding), ``labels (B, T) long`` — input indices, then ``n`` (END, ``n`` the padded length), then
``-100``. A batch is a pure function of ``(seed, split, step, rank, world_size)``; the held-out sets
are fixed. Metrics from ``model.generate(inputs, input_mask=...)`` (greedy): ``exact_match``
(whole output sequence right), and for the hull ``area_coverage`` (area of the predicted polygon
over the true hull's, 0 for an invalid polygon, averaged) and ``valid`` (share of predictions that
are simple polygons of 3+ distinct inputs), the measures of Vinyals et al. Table 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import IGNORE_INDEX, Task, _check_batch_args, _check_positive_int, _check_split, _model_device, stable_seed

__all__ = ["PointerTask", "PointerSortTask", "ConvexHullTask", "convex_hull", "polygon_area", "is_simple_polygon"]

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

    def __init__(self, *, min_len: int, max_len: int, eval_size: int = 1000) -> None:
        _check_positive_int("min_len", min_len)
        _check_positive_int("max_len", max_len)
        _check_positive_int("eval_size", eval_size)
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
        _check_batch_args(split, batch_size, step, rank, world_size)
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, seed, split, step, rank, world_size))
        return self.collate([self._draw(g) for _ in range(batch_size)])

    def eval_examples(self, split: str, max_examples: Optional[int] = None) -> List[Example]:
        """The fixed held-out examples of ``split``."""
        _check_split(split)
        if split not in self._eval_cache:
            g = torch.Generator().manual_seed(stable_seed(self.registry_name, "eval", split, self.min_len, self.max_len))
            self._eval_cache[split] = [self._draw(g) for _ in range(self.eval_size)]
        return self._eval_cache[split][:max_examples]

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        _check_positive_int("batch_size", batch_size)
        examples = self.eval_examples(split, max_examples)
        for first in range(0, len(examples), batch_size):
            yield self.collate(examples[first : first + batch_size])

    def _extra_metrics(self, examples: Sequence[Example], predictions: Sequence[List[int]]) -> Dict[str, float]:
        return {}

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, split: str = "test", max_examples: Optional[int] = None, batch_size: int = 128) -> Dict[str, float]:
        """``exact_match`` and ``loss`` (teacher forced) over the held-out set, plus the task's metrics."""
        was_training = getattr(model, "training", False)
        model.eval()
        device = _model_device(model)
        examples = self.eval_examples(split, max_examples)
        predictions: List[List[int]] = []
        total_loss, n_batches = 0.0, 0
        try:
            for first in range(0, len(examples), batch_size):
                chunk = examples[first : first + batch_size]
                batch = {k: v.to(device) for k, v in self.collate(chunk).items()}
                total_loss += float(model(**batch).loss)
                n_batches += 1
                n = batch["inputs"].shape[1]
                ids = model.generate(batch["inputs"], input_mask=batch["input_mask"])
                for row in ids.tolist():
                    predictions.append(row[: row.index(n)] if n in row else [i for i in row if 0 <= i < n])
        finally:
            model.train(was_training)
        exact = sum(p == t for p, (_, t) in zip(predictions, examples)) / max(len(examples), 1)
        metrics = {"exact_match": exact, "loss": total_loss / max(n_batches, 1), "examples": float(len(examples))}
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

    @torch.no_grad()
    def visualize(self, model: torch.nn.Module, path: Union[str, Path], text: Optional[str] = None) -> Path:
        """The pointer distribution of every output step over the inputs (and END), as a heat map.

        ``text`` gives the inputs (see :meth:`parse_inputs`); otherwise the first test example.
        Tasks with a geometric picture (the hull) add a panel with the points, the true outputs
        (dashed) and the predicted ones (solid). Returns the PNG path.
        """
        from qkv import viz

        if text:
            points = self.parse_inputs(text)
            target = self.solve(points)
        else:
            points, target = self.eval_examples("test", 1)[0]
        n = points.shape[0]
        device = _model_device(model)
        was_training = getattr(model, "training", False)
        model.eval()
        try:
            ids, w = model.generate(points.unsqueeze(0).to(device), return_weights=True)
        finally:
            model.train(was_training)
        row, w = ids[0].cpu().tolist(), w[0].float().cpu()  # (T,), (T, n + 1)
        steps = len(row) if n not in row else row.index(n) + 1
        predicted = [i for i in row[:steps] if 0 <= i < n]
        fmt = (lambda p: f"{p[0]:.2f}") if self.d_input == 1 else (lambda p: f"({p[0]:.2f},{p[1]:.2f})")
        x_labels = [f"{j}: {fmt(p)}" for j, p in enumerate(points.tolist())] + ["END"]
        y_labels = [f"step {t + 1} -> {'END' if i == n else i}" for t, i in enumerate(row[:steps])]
        plt = viz.pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(max(5.0, 0.45 * (n + 1) + 2.5) + 5.0, max(3.5, 0.35 * steps + 2.0)))
        ax = axes[0]
        im = ax.imshow(w[:steps].numpy(), cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xticks(range(n + 1))
        ax.set_xticklabels(x_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(steps))
        ax.set_yticklabels(y_labels, fontsize=7)
        ax.set_xlabel("input position (pointed at)")
        ax.set_title(f"pointer distributions p(C_i | C_<i, P); target {target}", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.04)
        if not self._draw_solution(axes[1], points, predicted, target):
            axes[1].axis("off")
            axes[1].text(0.0, 0.5, f"inputs: {[round(v, 3) for v in points[:, 0].tolist()]}\n"
                         f"predicted: {predicted}\ntarget:    {target}\n"
                         f"{'correct' if predicted == target else 'wrong'}", family="monospace", fontsize=8, va="center")
        fig.suptitle(f"{type(model).__name__} on {self.registry_name}", fontsize=9)
        return viz.save_figure(fig, path, dpi=110)

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
        pts = points.tolist()
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color="black", zorder=3)
        for j, (x, y) in enumerate(pts):
            ax.annotate(str(j), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
        for idx, style, label in ((target, dict(color="tab:green", ls="--", lw=2.5, alpha=0.6), "true hull"),
                                  (predicted, dict(color="tab:red", ls="-", lw=1.2), "predicted")):
            if idx:
                loop = idx + idx[:1]
                ax.plot([pts[i][0] for i in loop], [pts[i][1] for i in loop], label=label, **style)
        ax.set_aspect("equal")
        ax.legend(fontsize=7, loc="best")
        ok = predicted == target
        ax.set_title(f"points, true hull and predicted polygon ({'exact' if ok else 'not exact'})", fontsize=8)
        return True

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
