"""Translation on real data: English (King James Version) to Spanish (Reina-Valera 1909).

The two Bibles share the KJV versification, so verse ``i`` of one translates verse ``i`` of the
other (:func:`qkv.tasks.data.load_bible`). Metrics: BLEU (sacrebleu's corpus BLEU of the greedy
output), exact match, and teacher-forced character accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from qkv.registry import register
from qkv.tasks.base import SPLITS, PairsSeq2SeqTask, split_of
from qkv.tasks.data import load_bible
from qkv.tasks.vocab import CharVocab

__all__ = ["BibleEnEs"]


@register("task", "bible-en-es")
class BibleEnEs(PairsSeq2SeqTask):
    """Character-level translation of KJV verses into Reina-Valera 1909 Spanish (BLEU).

    Pairs whose sides both have at most ``max_chars`` characters are kept (10,212 of 31,084
    at the default 100). A verse's split is a hash of its reference (testament and entry index):
    90% train, 5% valid, 5% test, the same for every ``max_chars``; a valid/test verse whose
    English text already occurs in train (or, for test, in valid) is dropped. One character
    vocabulary is shared by both sides.

    Args:
        max_chars: longest source and target kept, in characters.
        cache_dir: data cache (default ``$QKV_DATA`` or ``~/.cache/qkv``; ``qkv data fetch bible``).
    """

    def __init__(self, *, max_chars: int = 100, cache_dir: Optional[Union[str, Path]] = None) -> None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int):
            raise TypeError(f"max_chars must be an int, got {type(max_chars).__name__}")
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.max_chars = max_chars
        splits: Dict[str, List[Tuple[str, str]]] = {name: [] for name in SPLITS}
        chars = set()
        for verse in load_bible(cache_dir):
            if len(verse.en) <= max_chars and len(verse.es) <= max_chars:
                splits[split_of(verse.ref, (0.9, 0.05, 0.05))].append((verse.en, verse.es))
                chars.update(verse.en, verse.es)
        # Some verses repeat word for word ("And the LORD spake unto Moses, saying,"): a held-out
        # pair whose source is also an earlier split's source is dropped, so nothing leaks.
        seen = {en for en, _ in splits["train"]}
        for name in ("valid", "test"):
            splits[name] = [(en, es) for en, es in splits[name] if en not in seen]
            seen.update(en for en, _ in splits[name])
        self.vocab = CharVocab(chars)
        super().__init__(splits)

    @property
    def max_target_len(self) -> int:
        """A kept Spanish verse has at most ``max_chars`` characters (one token each)."""
        return self.max_chars

    def _extra_metrics(self, hypotheses: List[str], references: List[str]) -> Dict[str, float]:
        """Corpus BLEU (sacrebleu, 13a tokenisation), 0-100."""
        try:
            import sacrebleu
        except ImportError as err:  # a declared dependency; imported here to keep `import qkv` light
            raise ImportError("bible-en-es reports BLEU with sacrebleu: pip install sacrebleu") from err
        return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score}
