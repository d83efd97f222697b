"""Atomic file writes: a reader never sees a half-written file, and a crash mid-write leaves the
previous version in place (temp file in the same directory, fsync, ``os.replace``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path: Union[str, os.PathLike]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; give the result the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
