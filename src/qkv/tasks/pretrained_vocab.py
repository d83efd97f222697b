"""A pretrained checkpoint's tokenizer as a qkv vocabulary (docs/contracts.md vocab API).

A Hugging Face checkpoint carries its tokenizer in ``tokenizer.json`` (all-MiniLM-L6-v2's is BERT's
uncased WordPiece: lower-casing and accent stripping, then the longest vocabulary piece first, ``##``
marking a word's continuation; Devlin et al. 2019, §3; Wu et al. 2016). It is read by the
``tokenizers`` library (the ``hf`` extra), not by code of ours, so that ids match the ones the
checkpoint was trained with. The padding and truncation a ``tokenizer.json`` may carry are turned
off: a task cuts and pads its own rows.

A language model's tokenizer (SmolLM2's byte-level BPE, ``qkv data fetch smollm2``) has none of
BERT's specials: its sequence specials are the ``bos_token``/``eos_token``/``pad_token``/``unk_token``
that ``tokenizer_config.json`` beside it names (transformers' file), and ``cls_id``/``sep_id``/
``mask_id`` are None (``wordpiece`` False): a task that frames rows BERT's way refuses it.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["CheckpointTokenizer"]

#: BERT's special tokens, which a WordPiece checkpoint's vocabulary must hold
SPECIALS = {"pad_id": "[PAD]", "unk_id": "[UNK]", "cls_id": "[CLS]", "sep_id": "[SEP]", "mask_id": "[MASK]"}
#: a language model's specials: attribute -> its key in ``tokenizer_config.json``
SEQUENCE_SPECIALS = {"pad_id": "pad_token", "unk_id": "unk_token", "bos_id": "bos_token", "eos_id": "eos_token"}


class CheckpointTokenizer:
    """The tokenizer of a checkpoint directory (or a ``tokenizer.json`` file), with ``encode``,
    ``decode``, ``size``, ``words`` and the special ids: BERT's ``pad_id``, ``unk_id``, ``cls_id``,
    ``sep_id``, ``mask_id`` when its vocabulary holds them all (``wordpiece``; no sequence specials:
    ``bos_id = eos_id = -1``), else a language model's ``pad_id``, ``unk_id``, ``bos_id``,
    ``eos_id`` from ``tokenizer_config.json`` (-1 for one it does not name) and no BERT framing
    (``cls_id = sep_id = mask_id = None``).

    ``encode(text)`` gives the pieces' ids without special tokens; ``path`` is the resolved file.
    """

    bos_id = eos_id = -1
    cls_id: Optional[int] = None
    sep_id: Optional[int] = None
    mask_id: Optional[int] = None

    def __init__(self, path: Union[str, Path]) -> None:
        if not isinstance(path, (str, Path)):
            raise TypeError(f"tokenizer must be a checkpoint directory or a tokenizer.json path, got {type(path).__name__}")
        path = Path(path).expanduser()
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer: {file} does not exist; expected a checkpoint directory holding "
                                    f"tokenizer.json (e.g. `qkv data fetch minilm`) or the file itself")
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError("a checkpoint's tokenizer needs the `tokenizers` library: pip install 'qkv[hf]'") from e
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 - the library raises its own exception type for a bad file
            raise ValueError(f"tokenizer: {file} is not a tokenizers file ({e})") from None
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.path = file.resolve()
        bert = {attr: self._tokenizer.token_to_id(token) for attr, token in SPECIALS.items()}
        self.wordpiece = all(index is not None for index in bert.values())
        if self.wordpiece:
            for attr, index in bert.items():
                setattr(self, attr, index)
        else:
            for attr, index in self._sequence_specials(file).items():
                setattr(self, attr, index)

    def _sequence_specials(self, file: Path) -> Dict[str, int]:
        """A language model's special ids, from the ``tokenizer_config.json`` beside ``file``."""
        config_file = file.parent / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        except (OSError, ValueError) as e:
            raise ValueError(f"tokenizer: {config_file} is not a JSON object ({e})") from None
        if not isinstance(config, dict):
            raise ValueError(f"tokenizer: {config_file} is not a JSON object")
        ids = {}
        for attr, key in SEQUENCE_SPECIALS.items():
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token  # an AddedToken written out
            index = self._tokenizer.token_to_id(token) if isinstance(token, str) else None
            if token is not None and index is None:
                raise ValueError(f"tokenizer: {config_file} names {key}={token!r}, which {file.name} does not hold")
            ids[attr] = -1 if index is None else index
        return ids

    @property
    def size(self) -> int:
        """Number of ids (special and added tokens included)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.size

    @property
    def special_ids(self) -> Tuple[int, ...]:
        """Ids never selected for the masked LM nor drawn as random replacements."""
        attrs = SPECIALS if self.wordpiece else SEQUENCE_SPECIALS
        return tuple(dict.fromkeys(i for i in (getattr(self, attr) for attr in attrs) if i is not None and i >= 0))

    @cached_property
    def words(self) -> List[str]:
        """The token of every id (``words[i]``), for plots and decoding one piece at a time."""
        return [self._tokenizer.id_to_token(i) or f"<{i}>" for i in range(self.size)]

    def encode(self, text: str) -> List[int]:
        """The pieces of ``text``, as ids, without special tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """``encode`` over many texts (the library's parallel batch encoder)."""
        return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Any) -> str:
        """The text of ``ids`` (a list or a 1-D tensor), special tokens dropped, pieces joined."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.size]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the vocabulary of size {self.size}")
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"CheckpointTokenizer({str(self.path)!r}, size={self.size})"
