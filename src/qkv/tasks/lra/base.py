"""What the Long Range Arena tasks share (``qkv.tasks.lra``): :class:`LRATask` (examples ->
padded batches, the fixed held-out sets, accuracy and cross-entropy), the option check, the
epoch-permutation walk of a fixed example list and the pixel-attention picture of the image tasks."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.tasks.base import Task, check_batch_args, check_positive_int, check_split, stable_seed, vocab_hints

__all__ = ["LRATask", "int_option", "epoch_positions", "pixel_view"]


def int_option(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` (the option ``name``) checked to be an int >= ``minimum``."""
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
        """Config fields the task determines: vocabulary, classes (as ``num_labels`` too), length, the
        classification head (and the image's shape)."""
        hints: Dict[str, Any] = {**(vocab_hints(self.vocab) if self.vocab is not None else {}),
                                 "vocab_size": self.vocab_size, "n_classes": self.n_classes, "num_labels": self.n_classes,
                                 "max_len": self.max_len, "head": "classification"}
        if self.image_size is not None:
            hints["image_size"] = tuple(self.image_size)
        return hints

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0,
                  world_size: int = 1) -> Dict[str, Tensor]:
        """``batch_size`` examples of ``split``: a pure function of the arguments."""
        check_batch_args(split, batch_size, step, rank, world_size)
        return self.collate(self._draw(split, batch_size, seed, step, rank, world_size))

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The fixed held-out examples of ``split`` in order, ``batch_size`` at a time."""
        check_split(split)
        check_positive_int("batch_size", batch_size)
        n = self._held_out_size(split)
        if max_examples is not None:
            n = min(n, int_option("max_examples", max_examples, 0))
        examples = self._held_out(split, n)
        for first in range(0, n, batch_size):
            yield self.collate(examples[first:first + batch_size])

    eval_batch_size = 32

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Any]:
        """Hits and cross-entropy of ``model``'s ``logits (B, n_classes)`` on one batch."""
        labels = batch["labels"]
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float()
        if logits.shape != (len(labels), self.n_classes):
            raise ValueError(f"model logits must be (B, {self.n_classes}), got {tuple(logits.shape)}")
        return {"correct": int((logits.argmax(-1) == labels).sum()),
                "nll": F.cross_entropy(logits, labels, reduction="sum").item(), "examples": len(labels)}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``accuracy``, ``loss`` (cross-entropy, nats) and ``examples`` over the held-out set."""
        n = totals.get("examples", 0)
        return {"accuracy": totals.get("correct", 0) / max(n, 1), "loss": totals.get("nll", 0.0) / max(n, 1),
                "examples": float(n)}

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
        from ..views import run_with_weights

        out = run_with_weights(model, batch, meta_keys=("labels",))
        n = min(len(tokens), max_len)
        layers = [w[:, :, :n, :n].detach().float().cpu() for w in out.weights]
        return AttentionView.from_weights(layers, x_labels=tokens[:n], y_labels=tokens[:n],
                                          title=f"{type(model).__name__}: self-attention (first {n} tokens)",
                                          caption=caption)


def epoch_positions(n: int, key: tuple, batch_size: int, step: int, rank: int, world_size: int) -> List[int]:
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


def pixel_view(model: torch.nn.Module, task: LRATask, image: np.ndarray, label: int, names: Sequence[str]) -> Any:
    """For three query pixels (rows 1/4, 1/2, 3/4 down the middle column), every layer's and head's
    weights over the image, each an ``(H, W)`` map; the input image is the first panel."""
    from qkv.viz import AttentionView
    from ..views import run_with_weights

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
