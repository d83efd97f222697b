"""What every task shares: batches as a pure function of ``(seed, split, step, rank)``, fixed
held-out sets, and the metrics (docs/contracts.md, "Batches are a pure function of the step").

Two families:

- :class:`LanguageModelTask` (``kind == "lm"``): one long token stream cut into contiguous
  train/valid/test parts; batches are random windows ``input_ids (B, L)`` with next-token
  ``labels (B, L)``; metrics loss, bits per character and perplexity.
- :class:`Seq2SeqTask` (``kind == "seq2seq"``): ``(source, target)`` string pairs; batches are
  ``src_ids (B, S)``, ``src_mask (B, S)``, ``tgt_ids (B, T)`` (BOS + target) and ``labels (B, T)``
  (target + EOS, ``-100`` padding); metrics exact match from greedy ``model.generate`` and token
  accuracy from teacher-forced logits. :class:`GeneratedSeq2SeqTask` draws pairs from a seeded
  generator, :class:`PairsSeq2SeqTask` from a fixed list.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv._nn import evaluating, module_device
from qkv._seeding import stable_seed

if TYPE_CHECKING:
    from qkv.viz import AttentionView

__all__ = [
    "SPLITS",
    "IGNORE_INDEX",
    "Task",
    "LanguageModelTask",
    "Seq2SeqTask",
    "GeneratedSeq2SeqTask",
    "PairsSeq2SeqTask",
    "stable_seed",
    "split_of",
    "check_split",
    "check_positive_int",
    "check_batch_args",
    "logits_of",
    "to_device",
    "vocab_hints",
]

SPLITS = ("train", "valid", "test")
IGNORE_INDEX = -100


def split_of(key: str, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
    """The split that ``key`` belongs to, by a hash of the key: the same key is always in the
    same split, so the splits never overlap. ``fractions`` are the train/valid/test shares."""
    u = stable_seed("split", key) / 2.0**63  # uniform in [0, 1)
    if u < fractions[0]:
        return "train"
    return "valid" if u < fractions[0] + fractions[1] else "test"


# ---- the helpers every task uses (one copy; tasks import them from here)


def check_split(split: str) -> None:
    """Refuses a ``split`` that is not one of :data:`SPLITS`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def check_positive_int(name: str, value: Any) -> None:
    """Refuses a ``value`` (the option ``name``) that is not an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_batch_args(split: str, batch_size: int, step: int, rank: int, world_size: int) -> None:
    """Refuses arguments of ``get_batch`` out of their ranges, naming the argument."""
    check_split(split)
    check_positive_int("batch_size", batch_size)
    check_positive_int("world_size", world_size)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")


def logits_of(out: Any, labels: Tensor) -> Tensor:
    """``out.logits`` checked to be ``(B, T, V)`` with ``(B, T)`` matching ``labels``."""
    logits = getattr(out, "logits", None)
    if logits is None:
        raise TypeError(f"the model's output has no .logits (got {type(out).__name__})")
    if logits.dim() != 3 or logits.shape[:2] != labels.shape:
        raise ValueError(f"model logits must be (B, T, V) with (B, T) = {tuple(labels.shape)}, got {tuple(logits.shape)}")
    return logits


def vocab_hints(vocab: Any) -> Dict[str, Any]:
    """The config fields a vocabulary determines: its size (as ``vocab_size`` and, for encoder-decoder
    models, ``src_vocab_size``/``tgt_vocab_size``) and its special ids ``pad_id``, ``bos_id``,
    ``eos_id`` (docs/contracts.md: every vocabulary has them). For a task's ``model_hints``."""
    return {"vocab_size": vocab.size, "src_vocab_size": vocab.size, "tgt_vocab_size": vocab.size,
            "pad_id": vocab.pad_id, "bos_id": vocab.bos_id, "eos_id": vocab.eos_id}


def to_device(batch: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    """``batch`` with its tensors on ``device`` (other items, e.g. reference strings, as they are)."""
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


class Task:
    """Base class: a task yields batches and knows its metric (see the module docstring).

    Beside the batches and the metric, the hooks the trainer, ``qkv viz``/``generate`` and
    ``qkv train`` call are declared here with defaults that do nothing (docs/contracts.md):
    ``model_hints`` (config fields the data determines), ``attention_view`` (a labelled view of
    what a model attends to), ``visualize`` (a picture of the task's own), ``write_samples``
    (samples that are pictures), ``stream`` and ``input_key``/``variants``.
    """

    kind: str = ""
    registry_name: str = ""
    #: encodes and decodes the task's tokens (``size``, ``pad_id``, ``bos_id``, ``eos_id``); None: no tokens
    vocab: Any = None
    #: True when each batch continues the previous one row by row (``LanguageModelTask(stream=True)``):
    #: the trainer then carries the state of a model that ``carries_state``.
    stream: bool = False
    #: the batch key of the model input these batches hold (e.g. ``"doc"``); None: not declared.
    input_key: Optional[str] = None
    #: the same data in another form for a model that reads another key: ``{model input key: task
    #: name}`` (``qkv.tasks.task_for_model``; ``bbc-news`` is ``bbc-news-tokens`` for token-id models).
    variants: Dict[str, str] = {}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """The batch of ``rank`` at ``step``: a pure function of the arguments."""
        raise NotImplementedError  # abstract: subclasses implement it

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The fixed held-out set of ``split``, in order (at most ``max_examples`` examples)."""
        raise NotImplementedError  # abstract: subclasses implement it

    # ----------------------------------------------------------------------------- the metrics

    #: how many held-out examples ``evaluate`` scores at a time (``batch_size=`` overrides it)
    eval_batch_size: int = 64

    def evaluate(self, model: torch.nn.Module, split: str = "test", max_examples: Optional[int] = None,
                 batch_size: Optional[int] = None) -> Dict[str, float]:
        """The task's metrics of ``model`` on the held-out set of ``split`` (at most ``max_examples``).

        The one template of every task: with the model in eval mode and without gradients (its mode
        given back afterwards), each batch of :meth:`eval_inputs` is moved to the model's device
        and scored by :meth:`score_batch`; the scores are added up over the batches (numbers add,
        lists concatenate) and :meth:`summarize` turns the totals into the metrics. On a ``stream``
        task a model that ``carries_state`` gets, with each batch, the state the previous batch
        left (``state=``, ``return_state=True``; ``score_batch`` hands it on as the score
        ``"state"``, which is passed on, not added up).
        """
        batch_size = self.eval_batch_size if batch_size is None else batch_size
        carry = self.stream and getattr(model, "carries_state", False)
        state = None
        totals: Dict[str, Any] = {}
        with evaluating(model):
            device = module_device(model)
            for batch in self.eval_inputs(split, batch_size, max_examples):
                batch = to_device(batch, device)
                if carry:  # each segment continues the previous one: pass the model's memory on
                    batch.update(state=state, return_state=True)
                scores = self.score_batch(model, batch)
                state = scores.pop("state", None)
                for key, value in scores.items():
                    totals[key] = totals[key] + value if key in totals else value
        return self.summarize(totals)

    def eval_inputs(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """What :meth:`evaluate` scores, batch by batch: by default :meth:`eval_batches`; a task
        whose scores need more than the tensors adds items of its own (e.g. the reference strings),
        which :meth:`score_batch` takes out before it calls the model."""
        return self.eval_batches(split, batch_size, max_examples)

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The scores of one batch of :meth:`eval_inputs` (on the model's device): sums, counts or
        lists, added up over the batches by :meth:`evaluate`."""
        raise NotImplementedError  # abstract: subclasses implement it

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """The metrics from the scores added up over every held-out batch (empty: no batch)."""
        raise NotImplementedError  # abstract: subclasses implement it

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` raw examples to show (from the train split)."""
        raise NotImplementedError  # abstract: subclasses implement it

    # ----------------------------------------------------------------------------- hooks (no-op defaults)

    def model_hints(self) -> Dict[str, Any]:
        """Config fields the data determines, by name: the vocabulary's size and special ids
        (``vocab_hints``), the classes, the lengths, the head a many-headed model reads the task
        with (``head``, e.g. ``"lm"``), an image's size. ``qkv train`` fills the ones a model's
        config has, under the preset and the user's ``--set``; this is the only way a task sets a
        model's config. Default: none."""
        return {}

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Optional["AttentionView"]:
        """What ``model`` attends to on one input (``text``: the input to show, default a held-out
        example), labelled with what the inputs really are (``qkv viz``; helpers in
        ``qkv.tasks.views``). Default: None, and ``qkv.viz.attention_view`` labels ``"lm"`` and
        ``"seq2seq"`` tasks with their tokens."""
        return None

    def visualize(self, model: torch.nn.Module, path: Union[str, os.PathLike], text: Optional[str] = None) -> Optional[Path]:
        """A richer picture of the task's own (e.g. images under their attention) written to the
        PNG ``path``, which ``qkv viz`` prefers to the attention grid; returns the path written.
        Default: None (the attention grid is drawn)."""
        return None

    def write_samples(self, model: torch.nn.Module, path: Union[str, os.PathLike], n: int = 16, seed: int = 0,
                      options: Optional[Dict[str, Any]] = None) -> Optional[Path]:
        """For a task whose samples are pictures: draw ``n`` samples of ``model`` (``options``: the
        ``--set key=value`` strings) to the PNG ``path`` for ``qkv generate``; returns the path
        written. Default: None (samples are text, decoded by ``qkv generate``)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry_name!r}, kind={self.kind!r}, vocab size {self.vocab.size})"


# --------------------------------------------------------------------------- language modelling


class LanguageModelTask(Task):
    """Next-token prediction over one token stream split into contiguous parts.

    Args:
        tokens: ``(N,)`` int64, the whole stream; the first ``fractions[0]`` of it is train,
            then valid, then test (contiguous, so no window crosses splits).
        vocab: encodes/decodes the tokens.
        block_size: window length L.
        fractions: train/valid/test shares of the stream.
        stream: contiguous streams instead of random windows (Transformer-XL's training): the
            split is cut into ``B * world_size`` equal streams (row ``b`` of rank ``r`` reads stream
            ``r B + b``) and the ``t``-th batch holds segment ``t`` of each stream (wrapping at the
            end), so every batch continues the previous one row by row — still a pure function of
            the step. Held-out batches and ``evaluate`` likewise read ``B`` streams segment by
            segment, passing a model that ``carries_state`` its state from one segment to the next.
        pack: packed documents (transformers' ``DataCollatorWithFlattening``): every batch also
            holds ``position_ids (B, L)`` restarting at 0 where a document (of ``documents``) starts
            inside a window — and at each window's start — and ``labels`` -100 at a document's last
            token (its next token is another document's); a model keeps each document to itself.
            ``packing()`` counts the real tokens of the training batches drawn so far against the
            padded tokens of one row per document piece (what padding would have cost).
        documents: ``(D,)`` sorted stream offsets where documents start (plays, pages); needed by ``pack``.
    """

    kind = "lm"

    def __init__(self, tokens: Tensor, vocab: Any, block_size: int, fractions: Tuple[float, float, float] = (0.9, 0.05, 0.05),
                 stream: bool = False, pack: bool = False, documents: Optional[Tensor] = None) -> None:
        check_positive_int("block_size", block_size)
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
        for name, flag in (("stream", stream), ("pack", pack)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if pack and stream:
            raise ValueError("pack=True with stream=True: packed rows start documents afresh, streams carry a state "
                             "across segments; choose one")
        if pack and documents is None:
            raise ValueError(f"pack=True needs the stream's document boundaries; {type(self).__name__} has none")
        self.vocab = vocab
        self.block_size = block_size
        self.stream = stream
        self.pack = pack
        self._packed = {"rows": 0, "pieces": 0, "tokens": 0}  # the training batches drawn (``packing``)
        n = tokens.numel()
        cut1 = int(n * fractions[0])
        cut2 = cut1 + int(n * fractions[1])
        self._splits = {"train": tokens[:cut1], "valid": tokens[cut1:cut2], "test": tokens[cut2:]}
        self._starts = {}  # split -> sorted document starts inside it, 0 included
        if documents is not None:
            for name, (lo, hi) in (("train", (0, cut1)), ("valid", (cut1, cut2)), ("test", (cut2, n))):
                inside = documents[(documents > lo) & (documents < hi)] - lo
                self._starts[name] = torch.cat([torch.zeros(1, dtype=torch.long), inside.long()])
        for name, part in self._splits.items():
            if part.numel() < block_size + 1:
                raise ValueError(
                    f"the {name} split has {part.numel()} tokens, fewer than block_size + 1 = {block_size + 1}; "
                    "use a smaller block_size"
                )

    def model_hints(self) -> Dict[str, Any]:
        """The vocabulary, positions for a window (at least 64) and the language-model head."""
        return {**vocab_hints(self.vocab), "max_len": max(self.block_size, 64), "head": "lm"}

    def split_tokens(self, split: str) -> Tensor:
        """``(N_split,)`` the tokens of one split."""
        check_split(split)
        return self._splits[split]

    def _stream_index(self, data: Tensor, n_streams: int, rows: Tensor, segment: int) -> Tensor:
        """``(len(rows), L)`` token indices of segment ``segment`` (mod the segments there are) of
        streams ``rows`` when ``data`` is cut into ``n_streams`` contiguous streams."""
        stream_len = (data.numel() - 1) // n_streams
        n_segments = stream_len // self.block_size
        if n_segments < 1:
            raise ValueError(f"{n_streams} streams of {stream_len} tokens are shorter than block_size={self.block_size}; "
                             f"use fewer streams (batch_size) or a smaller block_size")
        starts = rows * stream_len + (segment % n_segments) * self.block_size  # (B,)
        return starts[:, None] + torch.arange(self.block_size)  # (B, L)

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """Random windows: ``input_ids (B, L)`` and ``labels (B, L)`` (the next tokens); with
        ``stream=True`` segment ``step`` of the rank's contiguous streams (``seed`` unused)."""
        check_batch_args(split, batch_size, step, rank, world_size)
        data = self._splits[split]
        if self.stream:
            index = self._stream_index(data, batch_size * world_size, rank * batch_size + torch.arange(batch_size), step)
            return {"input_ids": data[index], "labels": data[index + 1]}
        g = torch.Generator().manual_seed(stable_seed(seed, split, step, rank, world_size))
        starts = torch.randint(0, data.numel() - self.block_size, (batch_size,), generator=g)  # (B,)
        index = starts[:, None] + torch.arange(self.block_size)  # (B, L)
        batch = self._packed_batch(split, index)
        if self.pack and split == "train":
            self._packed["rows"] += batch["position_ids"].shape[0]
            self._packed["pieces"] += int((batch["position_ids"] == 0).sum())
            self._packed["tokens"] += batch["position_ids"].numel()
        return batch

    def _packed_batch(self, split: str, index: Tensor) -> Dict[str, Tensor]:
        """The windows ``index (B, L)`` of a split: ``input_ids``, ``labels`` (the next tokens) and,
        with ``pack``, ``position_ids`` counted from each document's start (or the window's) and
        ``labels`` -100 at each document's last token."""
        data = self._splits[split]
        batch = {"input_ids": data[index], "labels": data[index + 1]}
        if not self.pack:
            return batch
        starts = self._starts[split]
        last = starts[torch.searchsorted(starts, index, right=True) - 1]  # the start of each token's document
        begin = torch.maximum(last, index[:, :1])  # ... or of its window
        ends = torch.isin(index + 1, starts)  # the next token opens another document
        return {**batch, "labels": batch["labels"].masked_fill(ends, -100), "position_ids": index - begin}

    def packing(self) -> Dict[str, float]:
        """Packing's gain over padding, from the training batches drawn so far: ``rows`` packed,
        ``pieces`` (documents or parts of one in them: padding would give each a row of ``L``),
        ``real`` tokens, ``padded`` tokens (``pieces L``) and ``gain`` = padded / real, the factor
        on useful tokens per second at equal cost per token."""
        rows, pieces, real = self._packed["rows"], self._packed["pieces"], self._packed["tokens"]
        padded = pieces * self.block_size
        return {"rows": rows, "pieces": pieces, "real": real, "padded": padded, "gain": padded / max(real, 1)}

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """Consecutive non-overlapping windows covering the split (at most ``max_examples``); with
        ``stream=True`` the segments of ``batch_size`` contiguous streams, one batch per segment."""
        check_split(split)
        check_positive_int("batch_size", batch_size)
        data = self._splits[split]
        if self.stream:
            n_streams = max(1, min(batch_size, (data.numel() - 1) // self.block_size))
            n_segments = (data.numel() - 1) // n_streams // self.block_size
            if max_examples is not None:
                n_segments = min(n_segments, max(1, max_examples // n_streams))
            for t in range(n_segments):
                index = self._stream_index(data, n_streams, torch.arange(n_streams), t)
                yield {"input_ids": data[index], "labels": data[index + 1]}
            return
        n_blocks = (data.numel() - 1) // self.block_size
        if max_examples is not None:
            n_blocks = min(n_blocks, max_examples)
        for first in range(0, n_blocks, batch_size):
            starts = torch.arange(first, min(first + batch_size, n_blocks)) * self.block_size  # (B,)
            index = starts[:, None] + torch.arange(self.block_size)  # (B, L)
            yield self._packed_batch(split, index)

    # ---- metrics: cross-entropy over the held-out windows

    eval_batch_size = 32

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        out = model(**batch)
        logits = logits_of(out, batch["labels"])
        # sum in float32 whatever the model's dtype
        nll = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), reduction="sum").item()
        return {"nll": nll, "tokens": int((batch["labels"] != -100).sum()), "state": getattr(out, "state", None)}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``loss`` (nats per token), ``bpc`` (bits per token: characters or bytes), ``perplexity``
        and ``tokens`` (how many were scored)."""
        count = totals.get("tokens", 0)
        loss = totals.get("nll", 0.0) / max(count, 1)
        return {"loss": loss, "bpc": loss / math.log(2), "perplexity": math.exp(min(loss, 700.0)), "tokens": float(count)}

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """The first ``n`` windows of the train split, decoded."""
        data = self._splits["train"]
        return [{"text": self.vocab.decode(data[i * self.block_size : (i + 1) * self.block_size])} for i in range(n)]

    def view_text(self, max_tokens: int, search: int = 100_000) -> str:
        """A held-out passage of at most ``max_tokens`` tokens to show (``qkv viz``'s default input).

        The first paragraph of the test split that starts after a blank line within its first
        ``search`` tokens (in a play: a speaker's name and the start of the line), else the split's
        start; cut after its last whole word when the next token would split one. Deterministic.
        """
        check_positive_int("max_tokens", max_tokens)
        data = self._splits["test"]
        newline = self.vocab.encode("\n")
        start = 0
        if len(newline) == 1:  # a character or byte vocabulary: find "\n\n"
            is_nl = data[:search] == newline[0]  # (search,)
            blank = torch.nonzero(is_nl[:-1] & is_nl[1:]).flatten()
            if blank.numel():
                start = int(blank[0]) + 2
                while start < data.numel() and int(data[start]) == newline[0]:
                    start += 1
        ids = data[start : start + max_tokens].tolist()
        text = self.vocab.decode(ids)
        after = data[start + max_tokens : start + max_tokens + 1].tolist()
        if after and not self.vocab.decode(after).isspace():  # the cut splits a word: drop its start
            last_space = max(text.rfind(" "), text.rfind("\n"))
            if last_space >= len(text) // 2:
                text = text[:last_space]
        return text.rstrip()


# --------------------------------------------------------------------------- sequence to sequence


class Seq2SeqTask(Task):
    """Base of string-to-string tasks; subclasses say where ``(source, target)`` pairs come from
    (``_train_pairs`` for a training batch, ``_eval_pairs`` for the fixed held-out set)."""

    kind = "seq2seq"
    vocab: Any

    def _train_pairs(self, split: str, batch_size: int, step: int, seed: int, rank: int, world_size: int) -> List[Tuple[str, str]]:
        raise NotImplementedError  # abstract: subclasses implement it

    def model_hints(self) -> Dict[str, Any]:
        """The vocabulary, shared by source and target."""
        return vocab_hints(self.vocab)

    def _eval_pairs(self, split: str) -> List[Tuple[str, str]]:
        raise NotImplementedError  # abstract: subclasses implement it

    # ---- batches

    def collate(self, pairs: Sequence[Tuple[str, str]]) -> Dict[str, Tensor]:
        """Pad ``pairs`` into a batch.

        Returns:
            src_ids ``(B, S)`` long (``pad_id`` padding), src_mask ``(B, S)`` bool (True = token),
            tgt_ids ``(B, T)`` long (``<bos>`` + target, ``pad_id`` padding),
            labels ``(B, T)`` long (target + ``<eos>``, ``-100`` padding), T = longest target + 1.
        """
        if not pairs:
            raise ValueError("pairs must not be empty")
        v = self.vocab
        sources = [v.encode(s) for s, _ in pairs]
        targets = [v.encode(t) for _, t in pairs]
        B, S, T = len(pairs), max(1, max(map(len, sources))), max(map(len, targets)) + 1
        src_ids = torch.full((B, S), v.pad_id, dtype=torch.long)
        src_mask = torch.zeros((B, S), dtype=torch.bool)
        tgt_ids = torch.full((B, T), v.pad_id, dtype=torch.long)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        for b, (src, tgt) in enumerate(zip(sources, targets)):
            src_ids[b, : len(src)] = torch.tensor(src, dtype=torch.long)
            src_mask[b, : len(src)] = True
            tgt_ids[b, : len(tgt) + 1] = torch.tensor([v.bos_id] + tgt, dtype=torch.long)
            labels[b, : len(tgt) + 1] = torch.tensor(tgt + [v.eos_id], dtype=torch.long)
        return {"src_ids": src_ids, "src_mask": src_mask, "tgt_ids": tgt_ids, "labels": labels}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> Dict[str, Tensor]:
        """A batch of pairs of ``split`` (see :meth:`collate` for the keys and shapes)."""
        check_batch_args(split, batch_size, step, rank, world_size)
        return self.collate(self._train_pairs(split, batch_size, step, seed, rank, world_size))

    def eval_pairs(self, split: str, max_examples: Optional[int] = None) -> List[Tuple[str, str]]:
        """The fixed held-out pairs of ``split`` (the first ``max_examples`` of them)."""
        check_split(split)
        pairs = self._eval_pairs(split)
        return pairs if max_examples is None else pairs[:max_examples]

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The held-out pairs of ``split`` in fixed order, ``batch_size`` at a time."""
        check_positive_int("batch_size", batch_size)
        pairs = self.eval_pairs(split, max_examples)
        for first in range(0, len(pairs), batch_size):
            yield self.collate(pairs[first : first + batch_size])

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` training pairs as ``{"source", "target"}``."""
        check_positive_int("n", n)
        return [{"source": s, "target": t} for s, t in self._train_pairs("train", n, 0, 0, 0, 1)]

    @property
    def max_target_len(self) -> int:
        """The most tokens a target of this task has (``<eos>`` not counted): generation that has
        not ended by then never will (``qkv translate``, ``qkv viz``). By default the longest
        held-out target; a task that knows its bound says it."""
        longest = max((len(self.vocab.encode(t)) for split in ("valid", "test") for _, t in self.eval_pairs(split)), default=0)
        return max(1, longest)

    # ---- metrics

    def decode_generated(self, ids: Sequence[int]) -> str:
        """Text of one generated row: a leading ``<bos>`` dropped, cut at the first ``<eos>``."""
        ids = list(ids)
        v = self.vocab
        if ids and ids[0] == v.bos_id:
            ids = ids[1:]
        if v.eos_id in ids:
            ids = ids[: ids.index(v.eos_id)]
        return v.decode([i for i in ids if i != v.pad_id])

    def _extra_metrics(self, hypotheses: List[str], references: List[str]) -> Dict[str, float]:
        """Task-specific metrics over the whole held-out set (e.g. BLEU); none by default."""
        return {}

    def eval_inputs(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """The held-out batches with their pairs' targets as ``references`` (strings)."""
        pairs = self.eval_pairs(split, max_examples)
        for first in range(0, len(pairs), batch_size):
            chunk = pairs[first : first + batch_size]
            yield {**self.collate(chunk), "references": [t for _, t in chunk]}

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Any]) -> Dict[str, Any]:
        """Teacher forcing and greedy generation on one batch.

        The model is called as ``model(**batch)`` (its ``.logits`` ``(B, T, V)`` give the loss
        and the token accuracy) and as ``model.generate(src_ids, src_mask=src_mask,
        max_new_tokens=T)`` for exact match; a generated row may start with ``<bos>`` and is
        read up to its first ``<eos>``.
        """
        references = batch.pop("references")
        labels = batch["labels"]
        logits = logits_of(model(**batch), labels)
        keep = labels != IGNORE_INDEX
        scores = {
            "correct_tokens": ((logits.argmax(-1) == labels) & keep).sum().item(),
            "tokens": keep.sum().item(),
            "nll": F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum").item(),
        }
        generated = model.generate(batch["src_ids"], src_mask=batch["src_mask"], max_new_tokens=labels.shape[1])
        rows = generated.tolist() if isinstance(generated, Tensor) else list(generated)
        if len(rows) != len(references):
            raise ValueError(f"model.generate returned {len(rows)} rows for a batch of {len(references)}")
        return {**scores, "hypotheses": [self.decode_generated(row) for row in rows], "references": references}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """``exact_match`` (share of targets generated exactly), ``token_accuracy`` (teacher
        forced, EOS included), ``loss`` (nats per target token), ``examples`` (count), plus the
        task's own metrics (:meth:`_extra_metrics`)."""
        hypotheses, references = totals.get("hypotheses", []), totals.get("references", [])
        n, n_tokens = len(references), totals.get("tokens", 0)
        metrics = {
            "exact_match": sum(h == r for h, r in zip(hypotheses, references)) / max(n, 1),
            "token_accuracy": totals.get("correct_tokens", 0) / max(n_tokens, 1),
            "loss": totals.get("nll", 0.0) / max(n_tokens, 1),
            "examples": float(n),
        }
        metrics.update(self._extra_metrics(hypotheses, references))
        return metrics


class GeneratedSeq2SeqTask(Seq2SeqTask):
    """Pairs drawn from a seeded generator; the split of a pair is a hash of its source string,
    so train, valid and test never share a source.

    Subclasses implement :meth:`sample` (one pair from a ``random.Random``).

    Args:
        eval_size: size of each fixed held-out set (duplicates removed, so it can be smaller
            when the task has fewer distinct sources).
        fractions: train/valid/test shares of the source space.
    """

    def __init__(self, eval_size: int = 1000, fractions: Tuple[float, float, float] = (0.8, 0.1, 0.1)) -> None:
        check_positive_int("eval_size", eval_size)
        self.eval_size = eval_size
        self.fractions = fractions
        self._eval_cache: Dict[str, List[Tuple[str, str]]] = {}

    def sample(self, rng: random.Random) -> Tuple[str, str]:
        """One ``(source, target)`` pair, using only ``rng`` for randomness."""
        raise NotImplementedError  # abstract: subclasses implement it

    def _sample_in(self, split: str, rng: random.Random, max_tries: int = 10_000) -> Optional[Tuple[str, str]]:
        for _ in range(max_tries):
            source, target = self.sample(rng)
            if split_of(source, self.fractions) == split:
                return source, target
        return None

    def _train_pairs(self, split: str, batch_size: int, step: int, seed: int, rank: int, world_size: int) -> List[Tuple[str, str]]:
        rng = random.Random(stable_seed(self.registry_name, seed, split, step, rank, world_size))
        pairs = []
        for _ in range(batch_size):
            pair = self._sample_in(split, rng)
            if pair is None:
                raise ValueError(f"{self.registry_name}: found no {split} example in 10,000 draws; the options leave too few distinct sources")
            pairs.append(pair)
        return pairs

    def _eval_pairs(self, split: str) -> List[Tuple[str, str]]:
        if split not in self._eval_cache:
            rng = random.Random(stable_seed(self.registry_name, "eval", split))
            seen: Dict[str, str] = {}
            stale = 0  # draws in a row that found no new source: the space is exhausted
            for _ in range(20 * self.eval_size):
                if len(seen) == self.eval_size or stale > max(200, 10 * len(seen)):
                    break
                pair = self._sample_in(split, rng, max_tries=100)
                if pair is not None and pair[0] not in seen:
                    seen[pair[0]] = pair[1]
                    stale = 0
                else:
                    stale += 1
            self._eval_cache[split] = list(seen.items())
        return self._eval_cache[split]


class PairsSeq2SeqTask(Seq2SeqTask):
    """Pairs from a fixed list, already assigned to splits.

    Training batches walk a fresh permutation of the split each epoch; position
    ``p = (step * world_size + rank) * batch_size + j`` is example ``perm_e[p mod n]`` of epoch
    ``e = p // n``, so ranks never draw the same example in the same step and every example is
    seen once per epoch.
    """

    def __init__(self, splits: Dict[str, List[Tuple[str, str]]]) -> None:
        for name in SPLITS:
            if not splits.get(name):
                raise ValueError(f"the {name} split is empty; the data set is too small for this task's filters")
        self._pairs = splits
        self._last_permutation: Tuple[Any, List[int]] = (None, [])  # a cache; batches stay pure

    def _permutation(self, seed: int, split: str, epoch: int) -> List[int]:
        key = (seed, split, epoch)
        if self._last_permutation[0] != key:
            g = torch.Generator().manual_seed(stable_seed(self.registry_name, seed, split, epoch))
            self._last_permutation = (key, torch.randperm(len(self._pairs[split]), generator=g).tolist())
        return self._last_permutation[1]

    def _train_pairs(self, split: str, batch_size: int, step: int, seed: int, rank: int, world_size: int) -> List[Tuple[str, str]]:
        pairs = self._pairs[split]
        n = len(pairs)
        first = (step * world_size + rank) * batch_size
        out = []
        for p in range(first, first + batch_size):
            out.append(pairs[self._permutation(seed, split, p // n)[p % n]])
        return out

    def _eval_pairs(self, split: str) -> List[Tuple[str, str]]:
        return self._pairs[split]

    @property
    def max_target_len(self) -> int:
        """The longest target of any split, in tokens (see :attr:`Seq2SeqTask.max_target_len`)."""
        if not hasattr(self, "_max_target_len"):
            self._max_target_len = max(1, max(len(self.vocab.encode(t)) for pairs in self._pairs.values() for _, t in pairs))
        return self._max_target_len
