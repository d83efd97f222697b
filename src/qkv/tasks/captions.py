"""``digit-captions``: caption a strip of 2–4 real MNIST digits with its digit sequence.

A small stand-in for the image-captioning experiments of Xu et al. 2015 ("Show, Attend and Tell",
arXiv:1502.03044): the caption of an image is the sequence of the digits written in it, left to
right, so a good attention map moves along the strip one digit per output word.

Images are the 5,000 MNIST digits of ``qkv.tasks.data.load_mnist`` (``qkv data fetch mnist``). Each
digit belongs to one split by a hash of its index (80/10/10), so test strips contain only digits
never seen in training. A strip is a ``28 x 28 * max_digits`` canvas; ``k`` digits (``k`` uniform
in ``[min_digits, max_digits]``) are pasted side by side from a random horizontal offset.

Batches (``kind == "captioning"``): ``images (B, 1, 28, 28 * max_digits)`` float in ``[0, 1]``,
``tgt_ids (B, T)`` (``<bos>`` + caption), ``labels (B, T)`` (caption + ``<eos>``, ``-100``
padding). Metrics: ``exact_match`` of the greedy ``model.generate(images, max_new_tokens=T)``,
teacher-forced ``token_accuracy`` and ``loss``.
"""

from __future__ import annotations

import string
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv._nn import evaluating, module_device
from qkv._plot import pyplot, save_figure
from qkv.registry import register
from qkv.tasks.base import (IGNORE_INDEX, Task, check_batch_args, check_positive_int, check_split, split_of, stable_seed,
                            vocab_hints)
from qkv.tasks.data import load_mnist
from qkv.tasks.vocab import CharVocab

__all__ = ["DigitCaptionsTask"]

Strip = Tuple[List[int], int]  # (MNIST indices of the digits, horizontal offset)


@register("task", "digit-captions")
class DigitCaptionsTask(Task):
    """Caption strips of 2–4 real MNIST digits with the digit sequence (``"4 7 1" -> "471"``).

    Args:
        min_digits, max_digits: digits per strip (inclusive range).
        eval_size: size of each fixed held-out set.
        cache_dir: data cache (default ``$QKV_DATA`` or ``~/.cache/qkv``).
    """

    kind = "captioning"

    def model_hints(self) -> Dict[str, Any]:
        """The captions' vocabulary (digits and the specials)."""
        return vocab_hints(self.vocab)

    def __init__(self, *, min_digits: int = 2, max_digits: int = 4, eval_size: int = 500,
                 cache_dir: Optional[Union[str, Path]] = None) -> None:
        for name, value in (("min_digits", min_digits), ("max_digits", max_digits), ("eval_size", eval_size)):
            check_positive_int(name, value)
        if max_digits < min_digits:
            raise ValueError(f"max_digits must be >= min_digits = {min_digits}, got {max_digits}")
        self.min_digits, self.max_digits, self.eval_size = min_digits, max_digits, eval_size
        self.cache_dir = cache_dir
        self.vocab = CharVocab(string.digits)
        self.width = 28 * max_digits

    @cached_property
    def _data(self) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
        images, labels = load_mnist(self.cache_dir)  # (N, 28, 28) uint8, (N,)
        split_index = {s: [] for s in ("train", "valid", "test")}
        for i in range(images.shape[0]):
            split_index[split_of(f"mnist-{i}")].append(i)
        return images.float().div_(255.0), labels, {s: torch.tensor(v) for s, v in split_index.items()}

    def _strip(self, split: str, g: torch.Generator) -> Strip:
        pool = self._data[2][split]
        k = int(torch.randint(self.min_digits, self.max_digits + 1, (1,), generator=g))
        idx = pool[torch.randint(0, pool.numel(), (k,), generator=g)].tolist()
        offset = int(torch.randint(0, self.width - 28 * k + 1, (1,), generator=g))
        return idx, offset

    def collate(self, strips: List[Strip]) -> Dict[str, Tensor]:
        """Render strips and pad captions (keys and shapes in the module docstring)."""
        images, labels, _ = self._data
        v = self.vocab
        B = len(strips)
        canvas = torch.zeros(B, 1, 28, self.width)
        captions = []
        for b, (idx, offset) in enumerate(strips):
            for j, i in enumerate(idx):
                canvas[b, 0, :, offset + 28 * j : offset + 28 * (j + 1)] = images[i]
            captions.append(v.encode("".join(str(int(labels[i])) for i in idx)))
        T = max(map(len, captions)) + 1
        tgt_ids = torch.full((B, T), v.pad_id, dtype=torch.long)
        tgt_labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        for b, cap in enumerate(captions):
            tgt_ids[b, : len(cap) + 1] = torch.tensor([v.bos_id] + cap)
            tgt_labels[b, : len(cap) + 1] = torch.tensor(cap + [v.eos_id])
        return {"images": canvas, "tgt_ids": tgt_ids, "labels": tgt_labels}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """A batch of fresh strips of ``split``, a pure function of the arguments."""
        check_batch_args(split, batch_size, step, rank, world_size)
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, seed, split, step, rank, world_size))
        return self.collate([self._strip(split, g) for _ in range(batch_size)])

    def eval_strips(self, split: str, max_examples: Optional[int] = None) -> List[Strip]:
        """The fixed held-out strips of ``split``."""
        check_split(split)
        g = torch.Generator().manual_seed(stable_seed(self.registry_name, "eval", split, self.min_digits, self.max_digits))
        return [self._strip(split, g) for _ in range(self.eval_size)][:max_examples]

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        check_positive_int("batch_size", batch_size)
        strips = self.eval_strips(split, max_examples)
        for first in range(0, len(strips), batch_size):
            yield self.collate(strips[first : first + batch_size])

    def caption(self, ids: List[int]) -> str:
        """The caption of one generated row (read up to ``<eos>``)."""
        v = self.vocab
        if v.eos_id in ids:
            ids = ids[: ids.index(v.eos_id)]
        return v.decode([i for i in ids if i not in (v.pad_id, v.bos_id)])

    eval_batch_size = 100

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Any]:
        """Teacher-forced token scores and greedy captions of one batch."""
        labels = batch["labels"]
        logits = model(**batch).logits  # (B, T, V)
        keep = labels != IGNORE_INDEX
        generated = model.generate(batch["images"], max_new_tokens=labels.shape[1])
        rows = list(zip(generated.tolist(), labels.tolist()))
        return {
            "correct": int(((logits.argmax(-1) == labels) & keep).sum()),
            "tokens": int(keep.sum()),
            "nll": float(F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")),
            "exact": sum(self.caption(row) == self.caption([i for i in lab if i != IGNORE_INDEX]) for row, lab in rows),
            "captions": len(rows),
        }

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``exact_match`` (greedy captions), ``token_accuracy`` and ``loss`` (teacher forced)."""
        n, tokens = totals.get("captions", 0), totals.get("tokens", 0)
        return {"exact_match": totals.get("exact", 0) / max(n, 1), "token_accuracy": totals.get("correct", 0) / max(tokens, 1),
                "loss": totals.get("nll", 0.0) / max(tokens, 1), "examples": float(n)}

    def strip_of(self, digits: str, split: str = "test") -> Strip:
        """A strip showing ``digits`` (e.g. ``"471"``), each the first image of that digit in ``split``."""
        check_split(split)
        if not digits or not digits.isdigit() or not 1 <= len(digits) <= self.max_digits:
            raise ValueError(f"digits must be 1 to {self.max_digits} decimal digits (e.g. '471'), got {digits!r}")
        _, labels, splits = self._data
        pool = splits[split]
        idx = [int(pool[labels[pool] == int(d)][0]) for d in digits]
        return idx, 0

    def _caption(self, model: torch.nn.Module, strips: List[Strip]):
        """Caption ``strips`` greedily: images ``(B, 1, H, W)``, ids ``(B, T)``, the attention
        ``(B, T, Hg Wg)`` over the CNN grid and the grid's ``(Hg, Wg)``, all on the CPU."""
        images = self.collate(strips)["images"].to(module_device(model))
        with evaluating(model):
            ids, w = model.generate(images, max_new_tokens=self.max_digits + 1, return_weights=True)
            _, grid = model.encode(images[:1])
        return images.cpu(), ids.cpu(), w.cpu(), grid

    @torch.no_grad()
    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """The attention of each generated word over the CNN's feature grid (``qkv viz --html``);
        ``text``: digits such as ``"471"`` to draw a strip of (default: the first test strip)."""
        from qkv.viz import AttentionView

        strip = self.strip_of(text.strip()) if text else self.eval_strips("test", 1)[0]
        _, ids, w, (Hg, Wg) = self._caption(model, [strip])
        row = [i for i in ids[0].tolist() if i != self.vocab.pad_id]
        words = [self.vocab.decode([i], skip_special=False) for i in row][: w.shape[1]]
        cells = [f"r{r}c{c}" for r in range(Hg) for c in range(Wg)]
        _, labels, _ = self._data
        truth = "".join(str(int(labels[i])) for i in strip[0])
        return AttentionView([("attention over the grid", w[0, : len(words)].float().cpu())], x_labels=cells,
                             y_labels=words, title=f"{type(model).__name__}: alpha_t over the {Hg} x {Wg} feature grid",
                             caption=f"strip of {truth}; caption {self.caption(ids[0].tolist()) or '-'}")

    @torch.no_grad()
    def visualize(self, model: torch.nn.Module, path: Union[str, Path], text: Optional[str] = None, n: int = 3,
                  max_words: Optional[int] = None, title: Optional[str] = None) -> Path:
        """Xu et al.-style figure: each strip, then the attention over the CNN grid for each generated digit.

        ``text`` (digits such as ``"471"``) draws one strip of held-out images of those digits;
        otherwise the first ``n`` test strips. Each panel overlays ``alpha_t`` (upsampled from the
        ``Hg x Wg`` grid to the image) for the ``t``-th generated word. Returns the PNG path.
        """
        strips = [self.strip_of(text.strip())] if text else self.eval_strips("test", n)
        images, ids, w, (Hg, Wg) = self._caption(model, strips)
        rows = [ids[b].tolist() for b in range(len(strips))]
        words_of = [[self.vocab.decode([i], skip_special=False) for i in row if i != self.vocab.pad_id][:w.shape[1]]
                    for row in rows]
        # a column per generated word of the longest caption (at most max_words), beside the input
        cols = 1 + max(1, min(max_words or self.max_digits + 1, max(len(words) for words in words_of)))
        plt = pyplot()
        fig, axes = plt.subplots(len(strips), cols, figsize=(2.6 * cols, 1.0 * len(strips) + 0.6), squeeze=False)
        for b, (row, words) in enumerate(zip(rows, words_of)):
            axes[b, 0].imshow(images[b, 0].numpy(), cmap="gray")
            said = f"caption: {self.caption(row)}" if words else "no word generated"
            axes[b, 0].set_title(f"input ({said})", fontsize=7)
            for t in range(cols - 1):
                ax = axes[b, t + 1]
                if t >= len(words):
                    ax.set_visible(False)  # no word here (the caption ended): no panel, not a bare copy
                    continue
                ax.imshow(images[b, 0].numpy(), cmap="gray")
                att = w[b, t].float().reshape(1, 1, Hg, Wg)
                up = F.interpolate(att, size=tuple(images.shape[-2:]), mode="nearest")[0, 0]
                ax.imshow(up.numpy(), cmap="hot", alpha=0.55)
                ax.set_title(f"word {t + 1}: {words[t]}", fontsize=7)
            for ax in axes[b]:
                ax.axis("off")
        fig.suptitle(title or f"{type(model).__name__}: attention over the {Hg} x {Wg} feature grid for each generated word",
                     fontsize=9)
        return save_figure(fig, path, dpi=110)

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        _, labels, _ = self._data
        return [{"digits": str(idx), "offset": str(off), "caption": "".join(str(int(labels[i])) for i in idx)}
                for idx, off in self.eval_strips("train", n)]

    def __repr__(self) -> str:
        return f"DigitCaptionsTask('digit-captions', digits={self.min_digits}..{self.max_digits})"
