"""Seeds that are the same in every process, on every machine and in every Python version: what
makes a task's batches a pure function of ``(seed, split, step, rank)`` and a model's random
redraws reproducible."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["stable_seed"]


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from ``parts`` that is the same in every process and Python version
    (``hash()`` of a str is salted per process, so it cannot be used)."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
