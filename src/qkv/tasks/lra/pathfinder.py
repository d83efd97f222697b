"""LRA Pathfinder (Linsley et al. 2018; Tay et al. 2020, §2.2.5): the image generator, written
from the paper, and the ``pathfinder`` task."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import check_batch_args, check_positive_int
from qkv.tasks.lra.base import LRATask, int_option, pixel_view

__all__ = ["PathfinderImage", "pathfinder_image", "Pathfinder"]


@dataclass
class PathfinderImage:
    """One Pathfinder image: ``image (size, size)`` uint8, the two dots' centres ``(row, col)``,
    whether they sit on one path (``label`` 1) or on two (0), and the link radius: two path pixels
    within this Chebyshev distance belong to one path (the dashes' gaps are narrower), pixels of
    different paths are always farther apart."""

    image: np.ndarray
    dots: Tuple[Tuple[int, int], Tuple[int, int]]
    label: int
    link_radius: int


def _dilate(mask: np.ndarray, r: int) -> np.ndarray:
    """Pixels within Chebyshev distance ``r`` of ``mask``."""
    H, W = mask.shape
    padded = np.pad(mask, r)
    out = np.zeros_like(mask)
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            out |= padded[dy:dy + H, dx:dx + W]
    return out


def _dot(center: Tuple[int, int]) -> List[Tuple[int, int]]:
    """The 3x3 square of a dot."""
    y, x = center
    return [(y + dy, x + dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]


#: the most dashes ``_grow_path`` draws while growing one path (its ``budget``): no path is longer
MAX_DASHES = 100


def _grow_path(rng: np.random.Generator, free: np.ndarray, n_dashes: int, dash: float, gap: float, max_turn: float,
               dots: bool, tries: int = 20, budget: int = MAX_DASHES) -> Optional[List[List[Tuple[int, int]]]]:
    """A dashed curved path of ``n_dashes`` dashes on the free pixels, or None.

    From a random free start and direction, each dash is a straight segment of ``dash`` pixels
    (rasterised every half pixel, so its pixels are 8-connected), followed by a ``gap``-pixel
    jump; the direction turns by ``U(-max_turn, max_turn)`` before each dash (the contour's
    curvature). A dash that leaves the canvas or meets a taken pixel is drawn again (4 tries),
    else the path backs up one dash (depth-first, ``budget`` dashes in all); with ``dots``, both
    ends must leave room for a 3x3 dot.
    """
    size = free.shape[0]
    steps = max(1, math.ceil(dash / 0.5))
    starts = np.argwhere(free[2:-2, 2:-2]) + 2
    if len(starts) == 0:
        return None

    def ok(pixels) -> bool:
        return all(0 < y < size - 1 and 0 < x < size - 1 and free[y, x] for y, x in pixels)

    for _ in range(tries):
        y0, x0 = starts[rng.integers(len(starts))] + rng.uniform(-0.5, 0.5, 2)
        dashes: List[List[Tuple[int, int]]] = []
        calls = 0

        def grow(y: float, x: float, angle: float, i: int) -> bool:
            nonlocal calls
            if i == n_dashes:
                return not dots or ok(_dot(dashes[-1][-1]))
            for _ in range(4 if i else 1):
                calls += 1
                if calls > budget:
                    return False
                turn = rng.uniform(-max_turn, max_turn) if i else 0.0
                s, c = math.sin(angle + turn), math.cos(angle + turn)
                y1, x1 = y + dash * s, x + dash * c
                pixels = [(int(y + (y1 - y) * t / steps + 0.5), int(x + (x1 - x) * t / steps + 0.5)) for t in range(steps + 1)]
                if ok(pixels) and (i or not dots or ok(_dot(pixels[0]))):
                    dashes.append(pixels)
                    if grow(y1 + gap * s, x1 + gap * c, angle + turn, i + 1):
                        return True
                    dashes.pop()
            return False

        if grow(y0, x0, rng.uniform(0, 2 * math.pi), 0):
            return dashes
    return None


def pathfinder_image(rng: np.random.Generator, *, size: int = 32, contour_length: int = 14, n_distractors: int = 3,
                     distractor_length: int = 4, dash: float = 2.0, gap: float = 1.5, max_turn_degrees: float = 45.0,
                     label: Optional[int] = None, max_tries: int = 500) -> PathfinderImage:
    """One Pathfinder image, drawn as Linsley et al. 2018 describe (§3, "Pathfinder"; LRA's 32x32 setting).

    Two long dashed curved paths of ``contour_length`` dashes each and ``n_distractors`` short
    distractor paths ("snakes") of ``distractor_length`` dashes, on a black ``size x size``
    canvas, every path white (255), none closer than ``link_radius + 1`` pixels (Chebyshev) to
    another. Two 3x3 dots mark path ends: for a positive (``label`` 1) both ends of the first
    long path, for a negative (0) one end of each long path — so both classes show the same
    number of paths of the same lengths, and only connectivity tells them apart.
    ``label=None`` draws it (a fair coin).
    """
    link_radius = int(math.floor(gap)) + 1  # the widest jump between two dashes of one path, in pixels
    label = int(rng.integers(2)) if label is None else int(label)
    turn = math.radians(max_turn_degrees)
    for _ in range(max_tries):
        free = np.ones((size, size), dtype=bool)
        paths = []
        for k in range(2 + n_distractors):
            long = k < 2
            path = _grow_path(rng, free, contour_length if long else distractor_length, dash, gap, turn, dots=long)
            if path is None:
                break
            taken = np.zeros((size, size), dtype=bool)
            for pixel in (p for d in path for p in d):
                taken[pixel] = True
            if long:  # room for a dot at either end, whichever gets one
                for pixel in _dot(path[0][0]) + _dot(path[-1][-1]):
                    taken[pixel] = True
            free &= ~_dilate(taken, link_radius)  # the next paths keep link_radius + 1 pixels away
            paths.append(path)
        else:
            image = np.zeros((size, size), dtype=np.uint8)
            for pixel in (p for path in paths for d in path for p in d):
                image[pixel] = 255
            ends = [(paths[0][0][0], paths[0][-1][-1]), (paths[1][0][0], paths[1][-1][-1])]
            if label == 1:
                dots = ends[0]
            else:
                dots = (ends[0][int(rng.integers(2))], ends[1][int(rng.integers(2))])
            for center in dots:
                for pixel in _dot(center):
                    image[pixel] = 255
            return PathfinderImage(image, (tuple(map(int, dots[0])), tuple(map(int, dots[1]))), label, link_radius)
    raise ValueError(f"pathfinder: could not place {2 + n_distractors} paths on a {size}x{size} canvas in {max_tries} "
                     f"tries; use fewer or shorter paths (contour_length={contour_length}, n_distractors={n_distractors})")


@register("task", "pathfinder", "lra-pathfinder")
class Pathfinder(LRATask):
    """LRA Pathfinder: are the two dots joined by a dashed path? 32x32 images as 1,024-pixel sequences (Linsley et al. 2018).

    Args:
        size: image side (LRA: 32; the sequence is ``size**2`` pixels in raster order).
        contour_length: dashes per long path — the difficulty knob (Linsley et al.'s three levels
            are 6, 9 and 14 ``curv_baseline``/``curv_contour_length_9``/``_14``; the LRA ports
            commonly train on 14).
        n_distractors: short distractor paths; distractor_length: their dashes.
        eval_size: examples in each fixed held-out set.
        cache_images: training images kept in memory (drawing one takes milliseconds; every
            kernel of ``qkv bench lra`` reads the same batches, so they are drawn once).
        train_size: ``None`` (default): every training batch is freshly drawn, an endless stream;
            ``N``: the training split is a fixed set of ``N`` images (as LRA's is),
            drawn once and read in a fresh order every epoch (the order set by the seed), so that
            a long run draws ``N`` images, not one per example (32x32 images take ~30 ms each).

    Batches: ``input_ids (B, size**2)`` pixel intensities 0-255 (black 0, paths and dots 255), ``labels``.
    """

    n_classes = 2

    def __init__(self, *, size: int = 32, contour_length: int = 14, n_distractors: int = 3, distractor_length: int = 4,
                 eval_size: int = 2000, cache_images: int = 20_000, train_size: Optional[int] = None) -> None:
        self.size = int_option("size", size, 8)
        self.contour_length = int_option("contour_length", contour_length, 2)
        self.n_distractors = int_option("n_distractors", n_distractors, 0)
        self.distractor_length = int_option("distractor_length", distractor_length)
        for name in ("contour_length", "distractor_length"):  # a longer path is never grown: drawing would only fail, slowly
            if getattr(self, name) > MAX_DASHES:
                raise ValueError(f"{name} must be at most {MAX_DASHES} dashes (the longest path the images are drawn "
                                 f"with), got {getattr(self, name):,}")
        self.eval_size = int_option("eval_size", eval_size)
        self.cache_images = int_option("cache_images", cache_images, 0)
        self.train_size = None if train_size is None else int_option("train_size", train_size)
        self._pool: Dict[int, tuple] = {}  # the fixed training set's images drawn so far, by index
        self._orders: "OrderedDict[tuple, np.ndarray]" = OrderedDict()  # (seed, epoch) -> that epoch's order
        self.max_len = self.size * self.size
        self.image_size = (self.size, self.size)
        self._held: Dict[str, List[tuple]] = {}
        self._cache: "OrderedDict[tuple, List[tuple]]" = OrderedDict()  # batches drawn: a pure function of the key
        self._cached = 0

    @property
    def vocab_size(self) -> int:
        return 256  # pixel intensities

    def _options_key(self) -> tuple:
        return (self.size, self.contour_length, self.n_distractors, self.distractor_length)

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0,
                  world_size: int = 1) -> Dict[str, Tensor]:
        """As every task's, the images of one batch kept (least recently used first out) up to ``cache_images``."""
        check_batch_args(split, batch_size, step, rank, world_size)
        key = (split, batch_size, step, seed, rank, world_size)
        examples = self._cache.get(key)
        if examples is None:
            examples = self._draw(split, batch_size, seed, step, rank, world_size)
            self._cache[key] = examples
            self._cached += len(examples)
            while self._cached > self.cache_images and self._cache:
                self._cached -= len(self._cache.popitem(last=False)[1])
        else:
            self._cache.move_to_end(key)
        return self.collate(examples)

    def draw(self, rng: np.random.Generator) -> PathfinderImage:
        """One image of this task's settings."""
        return pathfinder_image(rng, size=self.size, contour_length=self.contour_length,
                                n_distractors=self.n_distractors, distractor_length=self.distractor_length)

    def _example(self, seed: int) -> tuple:
        drawn = self.draw(np.random.default_rng(seed))
        return drawn.image, drawn.label

    def _draw(self, split, n, seed, step, rank, world_size):
        if split == "train" and self.train_size is not None:
            return [self._pooled(seed, ((step * world_size) + rank) * n + j) for j in range(n)]
        return [self._example(self._rng_seed(seed, split, step, rank, world_size, j)) for j in range(n)]

    def _pooled(self, seed: int, position: int) -> tuple:
        """The training example at ``position`` of run ``seed``'s stream over the fixed training set:
        epoch ``position // train_size`` reads the set in its own seeded order."""
        epoch, at = divmod(position, self.train_size)
        key = (seed, epoch)
        order = self._orders.get(key)
        if order is None:
            order = np.random.default_rng(self._rng_seed("order", seed, epoch)).permutation(self.train_size)
            self._orders[key] = order
            while len(self._orders) > 4:  # a run reads one epoch at a time
                self._orders.popitem(last=False)
        index = int(order[at])
        if index not in self._pool:  # the set is the same for every seed: only its order differs
            self._pool[index] = self._example(self._rng_seed("train-set", index))
        return self._pool[index]

    def _held_out(self, split, n):
        held = self._held.setdefault(split, [])
        while len(held) < n:
            held.append(self._example(self._rng_seed("held-out", split, len(held))))
        return held[:n]

    def _held_out_size(self, split):
        return self.eval_size

    def collate(self, examples):
        images = np.stack([image for image, _ in examples]).reshape(len(examples), -1)  # (B, size**2), raster order
        return {"input_ids": torch.from_numpy(images.astype(np.int64)), "labels": torch.tensor([y for _, y in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training images drawn as text (``#`` path, ``.`` background) with their labels."""
        check_positive_int("n", n)
        return [{"input": "\n".join("".join("#" if v else "." for v in row) for row in image), "label": label}
                for image, label in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Where a few pixels of a held-out image look: per layer and head, a ``size x size`` map."""
        return pixel_view(model, self, *self._held_out("test", 1)[0], names=("not connected", "connected"))
