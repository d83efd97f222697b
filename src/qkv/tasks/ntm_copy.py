"""The NTM copy task (Graves, Wayne, Danihelka 2014, arXiv:1410.5401, §4.1).

The model reads a sequence of ``L`` random ``width``-bit vectors, then a delimiter, and must
then write the sequence back from memory with no further input::

    step        1 .. L          L+1          L+2 .. 2L+1
    inputs      bits, 0         0.., 1       zeros
    labels      -               -            the bits
    label_mask  False           False        True

Batches: ``inputs (B, 2L+1, width+1)`` float (last channel = delimiter), ``labels (B, 2L+1, width)``
float bits, ``label_mask (B, 2L+1)`` bool. One ``L`` per batch, drawn uniformly from
``min_len..max_len`` by ``(seed, split, step, rank)``, so no batch needs padding. Training and
held-out sequences come from disjoint seeds. ``evaluate`` reports, for each length in
``eval_lengths`` (default ``max_len`` and longer, to test generalisation beyond training), the
mean number of wrong bits per sequence (``bit_errors@L``; outputs thresholded at 0.5) and the
share of sequences copied exactly (``exact@L``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import Task, check_batch_args, check_positive_int, check_split, stable_seed

__all__ = ["NTMCopy", "copy_batch"]


def copy_batch(bits: Tensor) -> Dict[str, Tensor]:
    """The copy-task batch of ``bits (B, L, width)`` (see the module docstring for the layout)."""
    B, L, W = bits.shape
    T = 2 * L + 1
    inputs = torch.zeros(B, T, W + 1)
    inputs[:, :L, :W] = bits
    inputs[:, L, W] = 1.0  # the delimiter
    labels = torch.zeros(B, T, W)
    labels[:, L + 1 :] = bits
    label_mask = torch.zeros(B, T, dtype=torch.bool)
    label_mask[:, L + 1 :] = True
    return {"inputs": inputs, "labels": labels, "label_mask": label_mask}


@register("task", "ntm-copy")
class NTMCopy(Task):
    """Copy a sequence of random bit vectors after a delimiter (Graves et al. 2014).

    Args:
        width: bits per vector (Graves et al.: 8).
        min_len, max_len: training lengths (Graves et al.: 1..20).
        eval_lengths: lengths of the held-out sets (default ``(max_len, 2 max_len, 3 max_len)``).
        eval_size: sequences per held-out length.
    """

    kind = "sequence"
    vocab = None

    def __init__(self, *, width: int = 8, min_len: int = 1, max_len: int = 10,
                 eval_lengths: Optional[Sequence[int]] = None, eval_size: int = 64) -> None:
        for name, value in (("width", width), ("min_len", min_len), ("max_len", max_len), ("eval_size", eval_size)):
            check_positive_int(name, value)
        if max_len < min_len:
            raise ValueError(f"max_len must be >= min_len = {min_len}, got {max_len}")
        self.width, self.min_len, self.max_len, self.eval_size = width, min_len, max_len, eval_size
        self.eval_lengths: Tuple[int, ...] = tuple(eval_lengths) if eval_lengths is not None else (max_len, 2 * max_len, 3 * max_len)
        for L in self.eval_lengths:
            check_positive_int("eval_lengths[i]", L)

    def _bits(self, n: int, length: int, *key) -> Tensor:
        g = torch.Generator().manual_seed(stable_seed("ntm-copy", *key))
        return torch.randint(0, 2, (n, length, self.width), generator=g).float()

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """``batch_size`` sequences of one length drawn by ``(seed, split, step)``."""
        check_batch_args(split, batch_size, step, rank, world_size)
        g = torch.Generator().manual_seed(stable_seed("ntm-copy-length", seed, split, step))
        length = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))  # the same on every rank
        return copy_batch(self._bits(batch_size, length, seed, split, step, rank, world_size))

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None, length: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The fixed held-out sequences of ``split`` at ``length`` (default ``max_len``)."""
        check_split(split)
        check_positive_int("batch_size", batch_size)
        length = self.max_len if length is None else length
        n = self.eval_size if max_examples is None else min(self.eval_size, max_examples)
        bits = self._bits(n, length, "eval", split)
        for first in range(0, n, batch_size):
            yield copy_batch(bits[first : first + batch_size])

    def eval_inputs(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """The held-out batches at each length of ``eval_lengths``, each with its ``length``."""
        for length in self.eval_lengths:
            for batch in self.eval_batches(split, batch_size, max_examples, length=length):
                yield {**batch, "length": length}

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The wrong bits of each sequence, by length."""
        logits = model(inputs=batch["inputs"]).logits
        wrong = ((logits > 0).float() != batch["labels"]) & batch["label_mask"].unsqueeze(-1)  # (B, T, W)
        return {f"errors@{batch['length']}": [wrong.sum((1, 2)).float().cpu()]}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``bit_errors@L`` and ``exact@L`` for each ``L`` in ``eval_lengths`` (see the module docstring)."""
        metrics: Dict[str, float] = {}
        for length in self.eval_lengths:
            errors = torch.cat(totals.get(f"errors@{length}", []))
            metrics[f"bit_errors@{length}"] = errors.mean().item()
            metrics[f"exact@{length}"] = (errors == 0).float().mean().item()
        return metrics

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` training sequences as rows of bits."""
        bits = self.get_batch("train", n, 0)["labels"]
        return [{"bits": str(b[b.abs().sum(-1) > 0].int().tolist())} for b in bits]

    def __repr__(self) -> str:
        return f"NTMCopy(width={self.width}, lengths {self.min_len}..{self.max_len}, eval {self.eval_lengths})"

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Write and read weightings while copying one held-out sequence (``text``: its length)."""
        from .views import ntm_view

        try:
            length = self.max_len if text is None else int(text)
        except ValueError:
            raise ValueError(f"--text for ntm-copy is the length of the sequence to copy, an int; got {text!r}") from None
        check_positive_int("length", length)
        batch = next(self.eval_batches("test", 1, max_examples=1, length=length))
        return ntm_view(model, batch, length)
