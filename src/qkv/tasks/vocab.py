"""Vocabularies: characters (with special tokens) and bytes.

Every vocabulary has ``encode(str) -> list[int]``, ``decode(ids) -> str``, ``size`` and the ids
of its special tokens ``pad_id``, ``bos_id``, ``eos_id`` (docs/contracts.md).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Sequence, Union

import torch

__all__ = ["CharVocab", "ByteVocab", "WordVocab", "vocab_to_dict", "vocab_from_dict"]

Ids = Union[Sequence[int], torch.Tensor]


def _as_list(ids: Ids) -> List[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
        return ids.tolist()
    return [int(i) for i in ids]


class CharVocab:
    """Characters plus four specials: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3.

    Args:
        chars: the characters (any iterable of 1-char strings, e.g. a whole text); duplicates are
            dropped and the rest sorted, so the same characters always give the same ids.
    """

    SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(self, chars: Iterable[str]) -> None:
        alphabet = sorted(set(chars))
        for c in alphabet:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"chars must be single characters, got {c!r}")
        self.chars: List[str] = alphabet
        self._index: Dict[str, int] = {c: i + len(self.SPECIALS) for i, c in enumerate(alphabet)}

    @property
    def size(self) -> int:
        """Number of ids (specials included)."""
        return len(self.SPECIALS) + len(self.chars)

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> List[int]:
        """One id per character; a character outside the vocabulary becomes ``unk_id``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [self._index.get(c, self.unk_id) for c in text]

    def unknown(self, text: str) -> List[str]:
        """The distinct characters of ``text`` outside the vocabulary (in order of appearance):
        ``encode`` would turn each into ``<unk>``."""
        return list(dict.fromkeys(c for c in text if c not in self._index))

    def decode(self, ids: Ids, skip_special: bool = True) -> str:
        """The text of ``ids`` (a list or a 1-D tensor); specials are dropped unless
        ``skip_special=False`` (then written as ``<pad>``, ``<bos>``, ...)."""
        out = []
        n_special = len(self.SPECIALS)
        for i in _as_list(ids):
            if not 0 <= i < self.size:
                raise ValueError(f"id {i} is outside the vocabulary of size {self.size}")
            if i >= n_special:
                out.append(self.chars[i - n_special])
            elif not skip_special:
                out.append(self.SPECIALS[i])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharVocab(size={self.size}, chars={''.join(self.chars)!r})"


class ByteVocab:
    """The 256 byte values (ids 0-255) plus ``<pad>`` 256, ``<bos>`` 257, ``<eos>`` 258.

    ``encode`` takes a str (encoded as UTF-8) or bytes; ``decode`` returns UTF-8 text with
    undecodable bytes replaced (a block cut mid-character decodes without error).
    """

    pad_id, bos_id, eos_id = 256, 257, 258
    size = 259

    def __len__(self) -> int:
        return self.size

    def encode(self, text: Union[str, bytes]) -> List[int]:
        """One id per UTF-8 byte."""
        if isinstance(text, str):
            text = text.encode("utf-8")
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
        return list(text)

    def decode(self, ids: Ids, skip_special: bool = True) -> str:
        """The UTF-8 text of the byte ids; specials dropped (or shown when ``skip_special=False``)."""
        data = bytearray()
        out: List[str] = []
        names = {self.pad_id: "<pad>", self.bos_id: "<bos>", self.eos_id: "<eos>"}
        for i in _as_list(ids):
            if not 0 <= i < self.size:
                raise ValueError(f"id {i} is outside the vocabulary of size {self.size}")
            if i < 256:
                data.append(i)
            elif not skip_special:
                out.append(data.decode("utf-8", errors="replace") + names[i])
                data = bytearray()
        out.append(data.decode("utf-8", errors="replace"))
        return "".join(out)

    def __repr__(self) -> str:
        return "ByteVocab(size=259)"


class WordVocab:
    """Words with ``<pad>`` 0 and ``<unk>`` 1, in the order given (docs/contracts.md vocab API;
    no sequence specials, so ``bos_id = eos_id = -1``).

    Args:
        words: the vocabulary (duplicates are the caller's business).
        split: text -> words, for ``encode`` (default: on white space).
    """

    pad_id, unk_id = 0, 1
    bos_id = eos_id = -1

    def __init__(self, words: Sequence[str], split: Callable[[str], List[str]] = str.split) -> None:
        self.words = ["<pad>", "<unk>"] + list(words)
        self._index = {w: i for i, w in enumerate(self.words)}
        self._split = split

    @property
    def size(self) -> int:
        return len(self.words)

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> List[int]:
        """One id per word of ``split(text)`` (``<unk>`` for unknown words)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [self._index.get(w, self.unk_id) for w in self._split(text)]

    def decode(self, ids: Any) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return " ".join(self.words[i] for i in ids if i != self.pad_id)


def vocab_to_dict(vocab: Any) -> Any:
    """A JSON-able description of ``vocab`` (``vocab.json`` beside a saved model), or None for a
    vocabulary of another kind. ``vocab_from_dict`` builds it back."""
    if isinstance(vocab, CharVocab):
        return {"type": "char", "chars": vocab.chars, "specials": list(vocab.SPECIALS)}
    if isinstance(vocab, ByteVocab):
        return {"type": "byte", "size": vocab.size}
    if isinstance(vocab, WordVocab):
        # the ids and words in full; a task's own tokenizer is not serialised (loaded: white space)
        split = "whitespace" if vocab._split is str.split else "task"
        return {"type": "word", "words": vocab.words[2:], "split": split, "class": type(vocab).__name__}
    return None


def vocab_from_dict(data: Dict[str, Any]) -> Any:
    """The vocabulary ``vocab_to_dict`` described (a word vocabulary splits on white space)."""
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "char":
        return CharVocab(data["chars"])
    if kind == "byte":
        return ByteVocab()
    if kind == "word":
        return WordVocab(data["words"])
    raise ValueError(f"vocabulary description must have type 'char', 'byte' or 'word', got {kind!r}")
