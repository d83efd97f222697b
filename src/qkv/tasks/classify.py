"""Tasks whose examples are fixed tensors: one row per example, split into train/valid/test.

:class:`TensorTask` holds, for each split, a dict of tensors that share their first dimension
``N`` (the model's ``forward`` keyword arguments, ``labels`` included). Training batches walk a
fresh permutation of the split each epoch (position ``p = (step * world_size + rank) * B + j`` is
example ``perm_e[p mod N]`` of epoch ``e = p // N``), so a batch is a pure function of
``(seed, split, step, rank)`` and ranks never share an example in a step (docs/contracts.md).
Held-out batches are the split in order.

:class:`TensorTask` scores ``kind == "classification"`` (``logits (B, C)``, ``labels (B,)``:
accuracy and cross-entropy); subclasses add metrics through :meth:`TensorTask._metrics`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.tasks.base import SPLITS, Task, check_batch_args, check_positive_int, check_split, stable_seed, vocab_hints

__all__ = ["TensorTask", "split_indices", "binary_auc"]


def split_indices(n: int, fractions=(0.8, 0.1, 0.1), seed: int = 0, key: str = "") -> Dict[str, Tensor]:
    """A seeded random partition of ``range(n)`` into train/valid/test index tensors."""
    g = torch.Generator().manual_seed(stable_seed("split", key, seed, n))
    perm = torch.randperm(n, generator=g)
    cut1 = int(round(n * fractions[0]))
    cut2 = cut1 + int(round(n * fractions[1]))
    return {"train": perm[:cut1], "valid": perm[cut1:cut2], "test": perm[cut2:]}


class TensorTask(Task):
    """Base of tasks whose splits are dicts of equal-length tensors (see the module docstring).

    Subclasses fill ``self._splits = {split: {name: (N, ...) tensor}}`` (``labels`` included) and
    may override :meth:`_metrics` (extra metrics from the concatenated outputs of a held-out pass).
    """

    kind = "classification"
    vocab: Any = None
    #: stored keys used by the metrics only (e.g. instance labels); never passed to the model.
    meta_keys: tuple = ()
    _splits: Dict[str, Dict[str, Tensor]]

    def model_hints(self) -> Dict[str, Any]:
        """The vocabulary (when the examples are tokens) and, for a classification task, the
        classification head of a many-headed model."""
        hints = vocab_hints(self.vocab) if self.vocab is not None else {}
        if self.kind == "classification":
            hints["head"] = "classification"
        return hints

    def _check_splits(self) -> None:
        for split in SPLITS:
            part = self._splits.get(split)
            if not part or len(next(iter(part.values()))) == 0:
                raise ValueError(f"{self.registry_name}: the {split} split is empty")
            sizes = {name: len(t) for name, t in part.items()}
            if len(set(sizes.values())) != 1:
                raise ValueError(f"{self.registry_name}: the {split} tensors differ in length: {sizes}")

    def size(self, split: str) -> int:
        """Number of examples in ``split``."""
        check_split(split)
        return len(self._splits[split]["labels"])

    @lru_cache(maxsize=8)
    def _permutation(self, seed: int, split: str, epoch: int) -> Tensor:
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, seed, split, epoch))
        return torch.randperm(self.size(split), generator=g)

    def _take(self, split: str, index: Tensor, meta: bool = False) -> Dict[str, Tensor]:
        return {name: t[index] for name, t in self._splits[split].items() if meta or name not in self.meta_keys}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """``batch_size`` examples of ``split``: a pure function of the arguments."""
        check_batch_args(split, batch_size, step, rank, world_size)
        n = self.size(split)
        first = (step * world_size + rank) * batch_size
        positions = range(first, first + batch_size)
        index = torch.stack([self._permutation(seed, split, p // n)[p % n] for p in positions])  # (B,)
        return self._take(split, index)

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The examples of ``split`` in order, ``batch_size`` at a time (at most ``max_examples``)."""
        check_split(split)
        check_positive_int("batch_size", batch_size)
        n = self.size(split) if max_examples is None else min(self.size(split), max_examples)
        for first in range(0, n, batch_size):
            yield self._take(split, torch.arange(first, min(first + batch_size, n)))

    def _eval_batches_with_meta(self, split: str, batch_size: int, max_examples: Optional[int]) -> Iterator[Dict[str, Tensor]]:
        n = self.size(split) if max_examples is None else min(self.size(split), max_examples)
        for first in range(0, n, batch_size):
            yield self._take(split, torch.arange(first, min(first + batch_size, n)), meta=True)

    def _metrics(self, outputs: List[Any], batches: List[Dict[str, Tensor]]) -> Dict[str, float]:
        """Metrics of the held-out pass (``batches`` include the meta keys); default accuracy and
        cross-entropy of ``logits (B, C)``."""
        logits = torch.cat([o.logits.float() for o in outputs])  # (N, C)
        labels = torch.cat([b["labels"] for b in batches])  # (N,)
        return {
            "accuracy": (logits.argmax(-1) == labels).float().mean().item(),
            "loss": F.cross_entropy(logits, labels).item(),
            "examples": float(len(labels)),
        }

    def eval_inputs(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The held-out batches with the meta keys the metrics read."""
        check_split(split)
        return self._eval_batches_with_meta(split, batch_size, max_examples)

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Any]:
        """The model's output (on the CPU) and the batch, kept for :meth:`_metrics`."""
        out = model(**{k: v for k, v in batch.items() if k not in self.meta_keys}, need_weights=True)
        return {"outputs": [_to_cpu(out)], "batches": [{k: v.cpu() for k, v in batch.items()}]}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        return self._metrics(totals.get("outputs", []), totals.get("batches", []))

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` training examples, their tensors' shapes and labels."""
        check_positive_int("n", n)
        batch = self._take("train", torch.arange(min(n, self.size("train"))))
        return [{k: str(v[i].tolist() if v[i].numel() == 1 else tuple(v[i].shape)) for k, v in batch.items()}
                for i in range(len(batch["labels"]))]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry_name!r}, kind={self.kind!r}, train {self.size('train')})"


def _to_cpu(out: Any) -> Any:
    """A ``ModelOutput`` with its tensors (and lists of tensors) moved to the CPU."""
    def move(x: Any) -> Any:
        if isinstance(x, Tensor):
            return x.detach().cpu()
        if isinstance(x, (list, tuple)):
            return type(x)(move(v) for v in x)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x
    for name in ("loss", "logits", "weights"):
        if hasattr(out, name):
            setattr(out, name, move(getattr(out, name)))
    return out


def binary_auc(scores: Tensor, targets: Tensor) -> float:
    """Area under the ROC curve of ``scores (N,)`` for binary ``targets (N,)`` (Mann–Whitney U,
    ties counted one half); NaN when one class is absent."""
    scores, targets = scores.double().flatten(), targets.bool().flatten()
    pos, neg = scores[targets], scores[~targets]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return ((greater + 0.5 * ties) / (len(pos) * len(neg))).item()
