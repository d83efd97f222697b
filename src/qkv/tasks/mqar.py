"""Multi-query associative recall (Arora et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models", arXiv:2312.04927, §3): the recall a language model's state must hold.

A sequence lists ``n_pairs`` key-value pairs, then asks ``n_queries`` of the keys again; after each
asked key the model must give its value::

    k17 v3 k4 v30 k9 v12 ... _ _ _ k4 v30 k17 v3 ...
    |------ n_pairs pairs ------|- gap -|-- n_queries queries --|

Keys are drawn without replacement from the first half of ``vocab_size`` symbols (``k0 ..``),
values with replacement from the second half (``v0 ..``), as in Zoology; the queries ask distinct
keys in random order, after a gap of filler tokens ``_`` that pads the sequence to ``seq_len``.
The batches are language-model batches (``kind = "lm"``): ``input_ids (B, seq_len)`` and
``labels (B, seq_len)`` that hold the value at each asked key's position (the next token) and
``-100`` everywhere else, so the loss is on the answers only. The metric is recall accuracy: the
fraction of answers whose greedy next token is the value.

Batches are a pure function of ``(seed, split, step, rank, world_size)``; a sequence's split is a
hash of its tokens (80/10/10), so train, valid and test never share a sequence, and each held-out
split is a fixed set of ``eval_size`` sequences.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F

from qkv.registry import register
from qkv.tasks.base import (IGNORE_INDEX, Task, check_batch_args, check_positive_int, check_split, logits_of,
                            split_of, stable_seed, vocab_hints)
from qkv.tasks.vocab import WordVocab

__all__ = ["MQARTask"]

FILLER = "_"


@register("task", "mqar")
class MQARTask(Task):
    """Multi-query associative recall: give the value of each key asked again (Arora et al. 2023, Zoology).

    Args:
        vocab_size: key and value symbols, half each (Zoology's vocabulary; the token table adds
            ``<pad>``, ``<unk>`` and the filler ``_``).
        n_pairs: key-value pairs listed first (at most ``vocab_size // 2``: the keys are distinct).
        n_queries: keys asked again (at most ``n_pairs``; default: all of them).
        seq_len: tokens per sequence, at least ``2 (n_pairs + n_queries)``; the rest is a gap of filler
            between the pairs and the queries (default: no gap).
        eval_size: sequences in each fixed held-out set.
    """

    kind = "lm"
    input_key = "input_ids"
    eval_batch_size = 64

    def __init__(self, *, vocab_size: int = 64, n_pairs: int = 8, n_queries: Optional[int] = None,
                 seq_len: Optional[int] = None, eval_size: int = 512) -> None:
        check_positive_int("vocab_size", vocab_size)
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (keys and values, half each), got {vocab_size}")
        check_positive_int("n_pairs", n_pairs)
        if n_pairs > vocab_size // 2:
            raise ValueError(f"n_pairs must be <= vocab_size // 2 = {vocab_size // 2} (the keys are distinct), got {n_pairs}")
        n_queries = n_pairs if n_queries is None else n_queries
        check_positive_int("n_queries", n_queries)
        if n_queries > n_pairs:
            raise ValueError(f"n_queries must be <= n_pairs = {n_pairs} (each asks a distinct key), got {n_queries}")
        least = 2 * (n_pairs + n_queries)
        seq_len = least if seq_len is None else seq_len
        check_positive_int("seq_len", seq_len)
        if seq_len < least:
            raise ValueError(f"seq_len must be >= 2 (n_pairs + n_queries) = {least}, got {seq_len}")
        check_positive_int("eval_size", eval_size)
        self.vocab_size, self.n_pairs, self.n_queries, self.seq_len = vocab_size, n_pairs, n_queries, seq_len
        self.eval_size = eval_size
        half = vocab_size // 2
        self.vocab = WordVocab([f"k{i}" for i in range(half)] + [f"v{i}" for i in range(half)] + [FILLER])
        self._first_key = self.vocab.encode("k0")[0]
        self._first_value = self.vocab.encode("v0")[0]
        self._filler = self.vocab.encode(FILLER)[0]
        self._eval_cache: Dict[str, List[List[int]]] = {}

    def model_hints(self) -> Dict[str, Any]:
        """The vocabulary, positions for a sequence (at least 64) and the language-model head."""
        return {**vocab_hints(self.vocab), "max_len": max(self.seq_len, 64), "head": "lm"}

    # ---- sequences

    def sample(self, rng: random.Random) -> List[int]:
        """One sequence of ``seq_len`` token ids, using only ``rng`` for randomness."""
        half = self.vocab_size // 2
        keys = rng.sample(range(half), self.n_pairs)
        values = [rng.randrange(half) for _ in keys]
        asked = rng.sample(range(self.n_pairs), self.n_queries)
        ids = [t for k, v in zip(keys, values) for t in (self._first_key + k, self._first_value + v)]
        ids += [self._filler] * (self.seq_len - 2 * (self.n_pairs + self.n_queries))
        ids += [t for i in asked for t in (self._first_key + keys[i], self._first_value + values[i])]
        return ids

    def _sample_in(self, split: str, rng: random.Random) -> List[int]:
        for _ in range(10_000):
            ids = self.sample(rng)
            if split_of(" ".join(map(str, ids))) == split:
                return ids
        raise ValueError(f"mqar: found no {split} sequence in 10,000 draws")  # 1 in 10 of the sequences is each held-out split's

    def labels(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` the answers of ``ids (B, L)``: the next token after each asked key, ``-100`` elsewhere."""
        labels = torch.full_like(ids, IGNORE_INDEX)
        first_query = self.seq_len - 2 * self.n_queries
        labels[:, first_query::2] = ids[:, first_query + 1::2]  # each asked key's value follows it
        return labels

    def _batch(self, rows: List[List[int]]) -> Dict[str, torch.Tensor]:
        ids = torch.tensor(rows, dtype=torch.long)  # (B, L)
        return {"input_ids": ids, "labels": self.labels(ids)}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0,
                  world_size: int = 1) -> Dict[str, torch.Tensor]:
        """``input_ids (B, seq_len)`` and ``labels (B, seq_len)`` (the answers, ``-100`` elsewhere)."""
        check_batch_args(split, batch_size, step, rank, world_size)
        rng = random.Random(stable_seed("mqar", seed, split, step, rank, world_size))
        return self._batch([self._sample_in(split, rng) for _ in range(batch_size)])

    def eval_rows(self, split: str) -> List[List[int]]:
        """The fixed held-out sequences of ``split`` (``eval_size`` of them)."""
        check_split(split)
        if split not in self._eval_cache:
            rng = random.Random(stable_seed("mqar", "eval", split))
            self._eval_cache[split] = [self._sample_in(split, rng) for _ in range(self.eval_size)]
        return self._eval_cache[split]

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, torch.Tensor]]:
        check_positive_int("batch_size", batch_size)
        rows = self.eval_rows(split)[:max_examples]
        for first in range(0, len(rows), batch_size):
            yield self._batch(rows[first:first + batch_size])

    # ---- metrics: recall accuracy on the answers

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        labels = batch["labels"]
        logits = logits_of(model(input_ids=batch["input_ids"]), labels)
        answer = labels != IGNORE_INDEX  # (B, L)
        picked = logits[answer].float()  # (answers, V)
        right = picked.argmax(-1) == labels[answer]
        return {"nll": F.cross_entropy(picked, labels[answer], reduction="sum").item(), "correct": int(right.sum()),
                "answers": int(answer.sum()),
                "sequences_right": int(right.view(-1, self.n_queries).all(-1).sum()), "sequences": labels.shape[0]}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``accuracy`` (recall: answers whose greedy token is the value), ``loss`` (nats per answer),
        ``exact`` (sequences whose every answer is right) and ``answers`` (how many were scored)."""
        answers = totals.get("answers", 0)
        return {"accuracy": totals.get("correct", 0) / max(answers, 1), "loss": totals.get("nll", 0.0) / max(answers, 1),
                "exact": totals.get("sequences_right", 0) / max(totals.get("sequences", 0), 1), "answers": float(answers)}

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` sequences of the train split, as text."""
        rng = random.Random(stable_seed("mqar", "examples"))
        return [{"text": self.vocab.decode(self._sample_in("train", rng))} for _ in range(n)]
