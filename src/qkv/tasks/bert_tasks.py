"""BERT's tasks on the BBC News articles (Devlin et al. 2019, "BERT: Pre-training of Deep
Bidirectional Transformers for Language Understanding", arXiv:1810.04805, §3.1 and §3.2).

``bert-pretrain`` (kind ``"pretraining"``): the two pre-training tasks at once. An example is a
pair of text spans ``[CLS] A [SEP] B [SEP]`` with segment ids 0 for ``[CLS] A [SEP]`` and 1 for
``B [SEP]``; ``A`` is a run of consecutive sentences of an article, ``B`` is the text that follows
it (IsNext, ``next_sentence_label = 0``) with probability 0.5, else a run of sentences from
another article (NotNext, ``1``); each span takes about half of ``max_len`` and the pair is cut
to ``max_len`` tokens by trimming the longer span (BERT's ``truncate_seq_pair``; ``A`` loses its
start and ``B`` its end, so that an IsNext pair stays adjacent). Then 15% of the word tokens are selected for the
masked LM and replaced 80/10/10 by ``[MASK]`` / a random word / themselves
(:func:`mask_tokens`). Pairs come from the ``bbc-news`` training
articles only (valid/test from theirs), so fine-tuning never evaluates on pre-training text.

``bbc-news-tokens`` (kind ``"classification"``): the ``bbc-news`` topic classification in the
form BERT reads: ``[CLS]`` + the article's first ``max_len - 2`` words + ``[SEP]``, with
``attention_mask``; the same article split and the same vocabulary as ``bert-pretrain``, so a
pre-trained run fine-tunes on it (``qkv train bert --task bbc-news --init RUN``: ``bbc-news``
becomes this task for a model that reads ``input_ids``, see ``BBCNews.variants``). With
``tokenizer=`` a pretrained checkpoint's tokenizer (``qkv.tasks.pretrained_vocab``) cuts the raw
article into its WordPiece ids instead, so that a Hugging Face checkpoint reads the ids it was
trained on (``qkv train bert --task bbc-news --init MINILM_DIR`` sets it).

Deviation: words (lower-cased ``[a-z0-9']+`` runs, :func:`qkv.tasks.bbc.tokenize`), the
``max_vocab`` most frequent training words seen at least ``min_count`` times, instead of
WordPiece; ``[UNK]`` is never a masked-LM target (it would be an easy, meaningless prediction).
"""

from __future__ import annotations

import collections
from functools import lru_cache
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv import _checks
from qkv.registry import register
from qkv.tasks.base import (IGNORE_INDEX, SPLITS, Task, check_batch_args, check_positive_int, check_split, stable_seed,
                            vocab_hints)
from qkv.tasks.bbc import CLASSES, load_bbc, tokenize
from qkv.tasks.classify import TensorTask, split_indices
from qkv.tasks.pretrained_vocab import CheckpointTokenizer
from qkv.tasks.vocab import WordVocab

__all__ = ["BertVocab", "bert_vocab", "BertPretrainTask", "BBCNewsTokens", "mask_tokens"]


def mask_tokens(input_ids: Tensor, vocab_size: int, mask_id: int, special_ids: Sequence[int], prob: float = 0.15,
                generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
    """BERT's masked-LM corruption (Devlin et al. 2019, §3.1).

    Each non-special token is selected with probability ``prob``; a selected token becomes
    ``[MASK]`` with probability 0.8, a random token (uniform over the non-special ids) with
    probability 0.1, and stays unchanged with probability 0.1. Special tokens are never selected.

    Args:
        input_ids: ``(B, L)`` integer ids in ``[0, vocab_size)``.
        mask_id: the ``[MASK]`` id (treated as special).
        special_ids: ids never selected nor drawn as replacements (``[CLS]``, ``[SEP]``, ``[PAD]``...).
    Returns:
        ``(inputs, labels)``: the corrupted ids ``(B, L)``, and the original ids at the selected
        positions with ``-100`` elsewhere ``(B, L)``.
    """
    _checks.token_ids("input_ids", input_ids, vocab_size)
    _checks.positive_int("mask_id", mask_id, allow_zero=True)
    if mask_id >= vocab_size:
        raise ValueError(f"mask_id={mask_id} is outside the vocabulary of size {vocab_size}")
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 <= prob <= 1:
        raise ValueError(f"prob must be in [0, 1], got {prob!r}")
    special = torch.tensor(sorted({int(i) for i in special_ids} | {mask_id}), dtype=torch.long)
    if (special < 0).any() or (special >= vocab_size).any():
        raise ValueError(f"special_ids must lie in [0, {vocab_size}), got {sorted(int(i) for i in special_ids)}")
    device = input_ids.device
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[special] = False
    replacements = allowed.nonzero().squeeze(1)  # the ids a random replacement draws from
    if len(replacements) == 0:
        raise ValueError("every id is special: there is nothing to mask")

    def uniform(shape):  # U(0, 1) draws on the CPU generator, moved to the ids' device
        return torch.rand(shape, generator=generator).to(device)

    shape = input_ids.shape
    selected = (uniform(shape) < prob) & ~torch.isin(input_ids, special.to(device))  # (B, L)
    action = uniform(shape)  # < 0.8: [MASK]; [0.8, 0.9): random token; >= 0.9: unchanged
    random_ids = replacements[torch.randint(len(replacements), shape, generator=generator)].to(device)
    inputs = torch.where(selected & (action < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids.to(input_ids.dtype), inputs)
    labels = input_ids.masked_fill(~selected, IGNORE_INDEX)
    return inputs, labels


class BertVocab(WordVocab):
    """Words with BERT's specials: ``<pad>`` 0, ``<unk>`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4."""

    cls_id, sep_id, mask_id = 2, 3, 4

    def __init__(self, words: Sequence[str]) -> None:
        super().__init__(["[CLS]", "[SEP]", "[MASK]"] + list(words),
                         split=lambda text: [w for sentence in tokenize(text) for w in sentence])

    @property
    def special_ids(self) -> Tuple[int, ...]:
        """Ids never selected for the masked LM nor drawn as random replacements."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)


@lru_cache(maxsize=2)
def _cached_articles(cache_dir: Optional[str]):
    return _articles(cache_dir, load_bbc(cache_dir))


def _articles(cache_dir: Optional[str], articles: Optional[List[Tuple[str, str]]]):
    """Tokenised articles, their classes and the ``bbc-news`` split (the same partition); the
    cached articles are read and tokenised once per process."""
    if articles is None:
        return _cached_articles(cache_dir)
    unknown = sorted({c for _, c in articles} - set(CLASSES))
    if unknown:
        raise ValueError(f"article classes must be in {CLASSES}, got {unknown}")
    docs = [tokenize(text) for text, _ in articles]
    labels = torch.tensor([CLASSES.index(c) for _, c in articles])
    return docs, labels, split_indices(len(articles), key="bbc-news")


def bert_vocab(docs: List[List[List[str]]], train: Tensor, min_count: int, max_vocab: int) -> BertVocab:
    """The ``max_vocab`` most frequent words of the training articles seen ``min_count`` times."""
    counts = collections.Counter(w for i in train.tolist() for s in docs[i] for w in s)
    kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))[:max_vocab]
    return BertVocab(kept)


def _check_options(**options: int) -> None:
    for name, value in options.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@register("task", "bert-pretrain")
class BertPretrainTask(Task):
    """BERT pre-training on BBC News sentence pairs: masked LM (15%, 80/10/10) + next-sentence prediction.

    Args:
        max_len: tokens per pair, ``[CLS]``/``[SEP]`` included; mask_prob: share of word tokens
        selected for the masked LM; min_count, max_vocab: the vocabulary (as ``bbc-news-tokens``);
        eval_size: pairs in each held-out set; cache_dir; articles: ``[(text, class)]`` fixtures.

    Batches: ``input_ids``, ``token_type_ids``, ``attention_mask`` (True = real token), ``labels``
    (masked-LM targets, -100 elsewhere), all ``(B, L)`` with ``L`` the batch's longest pair, and
    ``next_sentence_label (B,)`` (0 IsNext, 1 NotNext). Metrics: ``mlm_accuracy`` (argmax at the
    selected positions), ``nsp_accuracy``, ``mlm_loss``, ``nsp_loss``, ``loss`` (their sum).
    """

    kind = "pretraining"

    def __init__(self, *, max_len: int = 64, mask_prob: float = 0.15, min_count: int = 3, max_vocab: int = 5000,
                 eval_size: int = 512, cache_dir: Optional[str] = None,
                 articles: Optional[List[Tuple[str, str]]] = None) -> None:
        _check_options(max_len=max_len, min_count=min_count, max_vocab=max_vocab, eval_size=eval_size)
        if max_len < 5:
            raise ValueError(f"max_len must be >= 5 ([CLS] A [SEP] B [SEP]), got {max_len}")
        if isinstance(mask_prob, bool) or not isinstance(mask_prob, (int, float)) or not 0 < mask_prob <= 1:
            raise ValueError(f"mask_prob must be in (0, 1], got {mask_prob!r}")
        self.max_len, self.mask_prob, self.eval_size = max_len, float(mask_prob), eval_size
        docs, _, parts = _articles(cache_dir, articles)
        self.vocab = bert_vocab(docs, parts["train"], min_count, max_vocab)
        index = self.vocab._index
        self._docs: Dict[str, List[List[List[int]]]] = {}
        for split in SPLITS:
            encoded = [[[index.get(w, self.vocab.unk_id) for w in s] for s in docs[i]] for i in parts[split].tolist()]
            self._docs[split] = [d for d in encoded if len(d) >= 2]  # a pair needs two sentences
            if len(self._docs[split]) < 2:
                raise ValueError(f"bert-pretrain: the {split} split has fewer than 2 articles with 2 sentences")

    def model_hints(self) -> Dict[str, object]:
        return {**vocab_hints(self.vocab), "head": "pretraining", "max_len": self.max_len, "mlm_logits": "selected"}

    # ------------------------------------------------------------------------------ examples

    def _span(self, doc: List[List[int]], start: int, budget: int) -> List[int]:
        """Consecutive sentences of ``doc`` from ``start`` until ``budget`` tokens are reached."""
        out: List[int] = []
        for sentence in doc[start:]:
            out += sentence
            if len(out) >= budget:
                break
        return out

    def _pair(self, split: str, g: torch.Generator) -> Tuple[List[int], List[int], int]:
        """One ``(A, B, is_random)`` pair drawn with ``g``, cut to fit ``max_len``."""
        docs = self._docs[split]

        def draw(n: int) -> int:
            return int(torch.randint(n, (), generator=g))

        budget = self.max_len - 3  # [CLS] A [SEP] B [SEP]
        d = draw(len(docs))
        doc = docs[d]
        cut = 1 + draw(len(doc) - 1)  # A ends before sentence `cut`, where an IsNext B starts
        a: List[int] = []
        for sentence in reversed(doc[:cut]):  # A: the sentences before `cut`, about half the budget
            a = sentence + a
            if len(a) >= budget // 2:
                break
        not_next = bool(torch.rand((), generator=g) < 0.5)
        if not_next:
            other = draw(len(docs) - 1)
            other += other >= d  # another article
            b_doc, b_start = docs[other], draw(len(docs[other]))
        else:
            b_doc, b_start = doc, cut
        b = self._span(b_doc, b_start, budget - min(len(a), budget // 2))
        # BERT's truncate_seq_pair: trim the longer span (A at its start, B at its end, so that an
        # IsNext pair stays adjacent)
        while len(a) + len(b) > budget:
            if len(a) > len(b):
                a.pop(0)
            else:
                b.pop()
        return a, b, int(not_next)

    def _batch(self, split: str, batch_size: int, g: torch.Generator) -> Dict[str, Tensor]:
        v = self.vocab
        pairs = [self._pair(split, g) for _ in range(batch_size)]
        L = max(len(a) + len(b) + 3 for a, b, _ in pairs)
        ids = torch.full((batch_size, L), v.pad_id, dtype=torch.long)
        types = torch.zeros(batch_size, L, dtype=torch.long)
        for n, (a, b, _) in enumerate(pairs):
            row = [v.cls_id] + a + [v.sep_id] + b + [v.sep_id]
            ids[n, : len(row)] = torch.tensor(row)
            types[n, len(a) + 2 : len(row)] = 1  # segment B: B [SEP]
        inputs, labels = mask_tokens(ids, v.size, v.mask_id, v.special_ids, prob=self.mask_prob, generator=g)
        return {"input_ids": inputs, "token_type_ids": types, "attention_mask": ids != v.pad_id, "labels": labels,
                "next_sentence_label": torch.tensor([nn for _, _, nn in pairs])}

    def get_batch(self, split: str, batch_size: int, step: int, *, seed: int = 0, rank: int = 0,
                  world_size: int = 1) -> Dict[str, Tensor]:
        """``batch_size`` fresh pairs (and their masking): a pure function of the arguments."""
        check_batch_args(split, batch_size, step, rank, world_size)
        g = torch.Generator().manual_seed(stable_seed("bert-pretrain", seed, split, step, rank, world_size))
        return self._batch(split, batch_size, g)

    @lru_cache(maxsize=4)
    def _held_out(self, split: str, batch_size: int) -> Tuple[Dict[str, Tensor], ...]:
        g = torch.Generator().manual_seed(stable_seed("bert-pretrain-eval", split))
        sizes = [min(batch_size, self.eval_size - first) for first in range(0, self.eval_size, batch_size)]
        return tuple(self._batch(split, n, g) for n in sizes)

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention on the first held-out sentence pair, masked tokens included (``qkv viz``)."""
        from .views import token_view

        batch = {k: t[:1] for k, t in next(self.eval_batches("test", 1)).items()}
        nsp = "IsNext" if int(batch["next_sentence_label"][0]) == 0 else "NotNext"
        return token_view(model, batch, lambda i: self.vocab.words[i],
                          caption=f"a held-out pair ({nsp}); [MASK]ed as in training",
                          meta_keys=("labels", "next_sentence_label"))

    def eval_batches(self, split: str, batch_size: int, max_examples: Optional[int] = None) -> Iterator[Dict[str, Tensor]]:
        """The fixed held-out pairs of ``split`` (``eval_size`` of them, the same every call)."""
        check_split(split)
        check_positive_int("batch_size", batch_size)
        left = self.eval_size if max_examples is None else min(self.eval_size, max_examples)
        for batch in self._held_out(split, batch_size):
            if left <= 0:
                break
            n = min(left, len(batch["next_sentence_label"]))
            yield {k: t[:n] for k, t in batch.items()}
            left -= n

    def score_batch(self, model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Any]:
        """Masked-LM and next-sentence hits and losses of one batch."""
        out = model(**batch)
        labels, nsp = batch["labels"], batch["next_sentence_label"]
        picked = labels != IGNORE_INDEX
        # (M, V) at the selected positions (mlm_logits="selected" gives just those)
        logits = (out.logits if out.logits.dim() == 2 else out.logits[picked]).float()
        nsp_logits = out.aux["nsp_logits"].float()
        return {"mlm_hit": int((logits.argmax(-1) == labels[picked]).sum()),
                "mlm_loss": float(F.cross_entropy(logits, labels[picked], reduction="sum")),
                "mlm_n": int(picked.sum()),
                "nsp_hit": int((nsp_logits.argmax(-1) == nsp).sum()),
                "nsp_loss": float(F.cross_entropy(nsp_logits, nsp, reduction="sum")),
                "nsp_n": len(nsp)}

    def summarize(self, totals: Dict[str, Any]) -> Dict[str, float]:
        """Masked-LM and next-sentence accuracy and loss over the held-out pairs."""
        mlm_n, nsp_n = max(totals.get("mlm_n", 0), 1), totals.get("nsp_n", 0)
        mlm, nsp = totals.get("mlm_loss", 0.0) / mlm_n, totals.get("nsp_loss", 0.0) / max(nsp_n, 1)
        return {"mlm_accuracy": totals.get("mlm_hit", 0) / mlm_n, "nsp_accuracy": totals.get("nsp_hit", 0) / max(nsp_n, 1),
                "mlm_loss": mlm, "nsp_loss": nsp, "loss": mlm + nsp, "examples": float(nsp_n)}

    def examples(self, n: int = 5) -> List[Dict[str, str]]:
        """``n`` training pairs as text (before masking) and their IsNext/NotNext label."""
        check_positive_int("n", n)
        g = torch.Generator().manual_seed(stable_seed("bert-pretrain-examples"))
        words = self.vocab.words
        out = []
        for _ in range(n):
            a, b, not_next = self._pair("train", g)
            text = " ".join(["[CLS]"] + [words[i] for i in a] + ["[SEP]"] + [words[i] for i in b] + ["[SEP]"])
            out.append({"text": text, "next_sentence": "NotNext" if not_next else "IsNext"})
        return out


@register("task", "bbc-news-tokens")
class BBCNewsTokens(TensorTask):
    """BBC News topic classification (5 classes) as token ids for BERT: [CLS] first words [SEP].

    Args:
        max_len: tokens per article, ``[CLS]``/``[SEP]`` included (the first ``max_len - 2``
        words, headline first); min_count, max_vocab: the vocabulary (as ``bert-pretrain``);
        cache_dir; articles: ``[(text, class)]`` fixtures; tokenizer: a checkpoint directory (or
        its ``tokenizer.json``) whose tokenizer gives the ids instead (``[CLS]`` + the article's
        first ``max_len - 2`` pieces + ``[SEP]``; min_count and max_vocab then play no part).

    Batches: ``input_ids (B, max_len)``, ``attention_mask (B, max_len)``, ``labels (B,)``.
    Metrics: ``accuracy``, ``loss``.
    """

    class_names = CLASSES  # label i is CLASSES[i] (an export's id2label)

    def __init__(self, *, max_len: int = 64, min_count: int = 3, max_vocab: int = 5000, cache_dir: Optional[str] = None,
                 articles: Optional[List[Tuple[str, str]]] = None, tokenizer: Optional[str] = None) -> None:
        _check_options(max_len=max_len, min_count=min_count, max_vocab=max_vocab)
        if max_len < 3:
            raise ValueError(f"max_len must be >= 3 ([CLS] word [SEP]), got {max_len}")
        self.max_len = max_len
        self.num_labels = len(CLASSES)
        docs, labels, parts = _articles(cache_dir, articles)
        if tokenizer is None:
            self.vocab = bert_vocab(docs, parts["train"], min_count, max_vocab)
            index, unk = self.vocab._index, self.vocab.unk_id
            pieces = [[index.get(w, unk) for s in doc for w in s] for doc in docs]
        else:
            self.vocab = CheckpointTokenizer(tokenizer)
            if not self.vocab.wordpiece:
                raise ValueError(f"tokenizer={tokenizer!r} has no [PAD], [UNK], [CLS], [SEP], [MASK]; bbc-news frames "
                                 f"rows BERT's way: expected a BERT WordPiece tokenizer")
            texts = [text for text, _ in (load_bbc(cache_dir) if articles is None else articles)]
            pieces = self.vocab.encode_batch(texts)
        v = self.vocab
        ids = torch.full((len(docs), max_len), v.pad_id, dtype=torch.long)
        for n, row in enumerate(pieces):
            row = [v.cls_id] + row[: max_len - 2] + [v.sep_id]
            ids[n, : len(row)] = torch.tensor(row)
        self._splits = {split: {"input_ids": ids[parts[split]], "attention_mask": ids[parts[split]] != v.pad_id,
                                "labels": labels[parts[split]]} for split in SPLITS}
        self._check_splits()

    def model_hints(self) -> Dict[str, object]:
        return {**super().model_hints(), "num_labels": self.num_labels, "max_len": self.max_len}

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Self-attention on ``text`` (``qkv viz --text``; default: the first held-out article),
        framed ``[CLS] .. [SEP]`` as the task frames articles and cut to ``max_len`` tokens, specials
        included (the view's ``cut`` says when it was longer); the axes are its tokens."""
        from .views import token_view

        v = self.vocab
        if text is not None:
            pieces, caption = v.encode(text), "the given text"
        else:
            row = self._take("test", torch.arange(1))
            n = int(row["attention_mask"][0].sum())
            pieces = row["input_ids"][0, 1 : n - 1].tolist()
            caption = f"a held-out article: {CLASSES[int(row['labels'][0])]}"
        limit = min(max_len, getattr(getattr(model, "config", None), "max_len", max_len))
        kept = pieces[: max(limit - 2, 1)]
        ids = torch.tensor([[v.cls_id, *kept, v.sep_id]])
        view = token_view(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)},
                          lambda i: v.words[i], caption=caption)
        if len(kept) < len(pieces):
            view.cut = (len(kept) + 2, len(pieces) + 2)
        return view
