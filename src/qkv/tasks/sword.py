"""A reader for SWORD ``zText`` Bible modules (the format of Debian's ``sword-text-*`` packages).

A zText module stores each testament (``ot``, ``nt``) in three files:

- ``<t>.bzs`` — the *block* index: one 12-byte little-endian record per compressed block,
  ``(offset: u32, compressed_size: u32, uncompressed_size: u32)`` into ``<t>.bzz``.
- ``<t>.bzv`` — the *verse* index: one 10-byte record per entry of the versification,
  ``(block: u32, offset: u32, size: u16)``: the entry is ``size`` bytes at ``offset`` of the
  decompressed block ``block`` (``size == 0``: empty entry).
- ``<t>.bzz`` — the blocks, each compressed with zlib (``CompressType=ZIP``).

The entries follow the module's versification: entry 0 is the module heading, entry 1 the
testament heading, then for each book a book heading followed, for each chapter, by a chapter
heading and the chapter's verses. Two modules with the same versification (``KJV`` here) line up
entry for entry, which is how translation pairs are made. Entries are OSIS XML fragments;
:func:`strip_osis` turns one into plain text.
"""

from __future__ import annotations

import html
import re
import struct
import zlib
from pathlib import Path
from typing import List, Union

__all__ = ["read_ztext", "strip_osis", "is_heading"]

TESTAMENTS = ("ot", "nt")

_BLOCK = struct.Struct("<III")  # offset, compressed size, uncompressed size
_VERSE = struct.Struct("<IIH")  # block number, offset in the block, size

# Elements whose *content* is not verse text: footnotes and cross references, and editorial
# section titles (a title marked ``canonical="true"``, such as a Psalm's superscription, is text).
_NOTE = re.compile(r"<note\b[^>]*?(?<!/)>.*?</note>", re.DOTALL)
_TITLE = re.compile(r"<title\b([^>]*?)(?<!/)>(.*?)</title>", re.DOTALL)
# Start-of-chapter and start-of-book milestones (their ends, ``eID=``, close a chapter's last verse).
_CHAPTER_START = re.compile(r"<chapter\b[^>]*\bsID=")
_BOOK_START = re.compile(r"<div\b(?=[^>]*\bsID=)(?=[^>]*\btype=\"book\")")
_TAG = re.compile(r"<[^>]*>")
# USFM character markers left over from the source files (``\\nd LORD`` = name of the deity).
_USFM = re.compile(r"\\\+?[a-z]+[0-9]*\*?")
_SPACE = re.compile(r"\s+")


def read_ztext(module_dir: Union[str, Path], testament: str) -> List[str]:
    """Every entry of one testament of a zText module, in versification order.

    Args:
        module_dir: the folder that holds ``ot.bzs``, ``ot.bzv``, ``ot.bzz`` (and ``nt.*``).
        testament: ``"ot"`` or ``"nt"``.

    Returns:
        A list with one raw (OSIS markup) string per versification entry; empty entries are ``""``.

    Raises:
        ValueError: an unknown ``testament``, or index files that are inconsistent.
        FileNotFoundError: one of the three files is missing.
    """
    if testament not in TESTAMENTS:
        raise ValueError(f"testament must be one of {TESTAMENTS}, got {testament!r}")
    module_dir = Path(module_dir)
    bzs = (module_dir / f"{testament}.bzs").read_bytes()
    bzv = (module_dir / f"{testament}.bzv").read_bytes()
    bzz = (module_dir / f"{testament}.bzz").read_bytes()
    if len(bzs) % _BLOCK.size or len(bzv) % _VERSE.size:
        raise ValueError(
            f"{module_dir}: {testament}.bzs size {len(bzs)} is not a multiple of {_BLOCK.size} "
            f"or {testament}.bzv size {len(bzv)} is not a multiple of {_VERSE.size}"
        )
    blocks = [_BLOCK.unpack_from(bzs, i) for i in range(0, len(bzs), _BLOCK.size)]
    decompressed: dict[int, bytes] = {}
    entries: List[str] = []
    for position in range(0, len(bzv), _VERSE.size):
        block, offset, size = _VERSE.unpack_from(bzv, position)
        if size == 0:
            entries.append("")
            continue
        if block >= len(blocks):
            raise ValueError(f"{module_dir}: entry {position // _VERSE.size} points at block {block}, but there are {len(blocks)}")
        if block not in decompressed:
            start, compressed_size, uncompressed_size = blocks[block]
            data = zlib.decompress(bzz[start : start + compressed_size])
            if len(data) != uncompressed_size:
                raise ValueError(f"{module_dir}: block {block} decompressed to {len(data)} bytes, index says {uncompressed_size}")
            decompressed[block] = data
        entries.append(decompressed[block][offset : offset + size].decode("utf-8"))
    return entries


def is_heading(index: int, raw: str) -> bool:
    """Whether entry ``index`` (with markup ``raw``) is a module, testament, book or chapter heading."""
    return index < 2 or bool(_CHAPTER_START.search(raw) or _BOOK_START.search(raw))


def strip_osis(raw: str) -> str:
    """Plain text of one OSIS entry: notes and editorial titles dropped (canonical titles kept), other tags removed, entities
    decoded, whitespace collapsed (``'<w lemma="strong:H7225">EN el principio</w> ...'`` ->
    ``'EN el principio ...'``)."""
    text = _NOTE.sub(" ", raw)
    text = _TITLE.sub(lambda m: f" {m.group(2)} " if 'canonical="true"' in m.group(1) else " ", text)
    text = _TAG.sub("", text)
    # The pilcrow is the KJV's paragraph sign, not part of the verse.
    text = html.unescape(text).replace("\u00b6", " ")
    text = _USFM.sub(" ", text)
    return _SPACE.sub(" ", text).strip()
