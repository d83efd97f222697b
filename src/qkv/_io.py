"""Atomic file writes: a reader never sees a half-written file, and a crash mid-write leaves the
previous version in place (temp file in the same directory, fsync, ``os.replace``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Union

from ._errors import UserError

__all__ = ["atomic_folder", "atomic_path", "atomic_write", "atomic_write_text", "output_file", "output_folder"]


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


def atomic_write(path: Union[str, os.PathLike], write: Callable[[str], None]) -> Path:
    """Write ``path`` atomically: ``write(tmp_path)`` fills a temporary file in the same directory,
    which is fsynced and renamed over ``path`` (``atomic_path``). If anything fails, or
    the process dies, before the rename, ``path`` keeps its old content."""
    path = Path(path)
    with atomic_path(path) as tmp:
        write(str(tmp))
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a checkpoint is an ordinary file
    return path


def atomic_write_text(path: Union[str, os.PathLike], text: str) -> Path:
    """Write a UTF-8 text file atomically (see ``atomic_write``)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def output_file(path: Union[str, os.PathLike], suffixes: Iterable[str], default: str) -> Path:
    """The file a user named for an output, checked before anything is computed or written: no
    suffix gets ``default`` (``".png"``); another suffix than ``suffixes`` (lower case, with the
    dot), an existing directory, or a file where a folder of the path should be, is a
    ``UserError`` naming the path. Returns the path that will be written."""
    path = Path(path)
    allowed = sorted(set(suffixes))
    if path.is_dir():
        raise UserError(f"{path} is a directory: give a file name, e.g. {path / ('name' + default)}")
    if not path.suffix:
        path = path.with_name(path.name + default)
    elif path.suffix.lower() not in allowed:
        raise UserError(f"{path}: cannot write a {path.suffix!r} file here; give one of {', '.join(allowed)}")
    output_folder(path.parent, str(path))
    return path


def output_folder(path: Union[str, os.PathLike], name: str = "") -> Path:
    """A folder a user named for outputs (``name``: how to call it in an error, e.g. ``"--out runs/x"``),
    checked before anything is written: the path, or the nearest part of it that exists, must be a
    folder, else a ``UserError``. Returns that existing folder (the parents are created later)."""
    path = Path(path)
    name = name or str(path)
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not folder.is_dir():
        raise UserError(f"{name}: {folder} is a file, not a folder")
    return folder


@contextlib.contextmanager
def atomic_folder(path: Union[str, os.PathLike], replaceable: Callable[[Path], bool] = lambda p: False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path`` to fill; on success it becomes ``path`` in
    one rename, so ``path`` appears only complete. An existing ``path`` must be an empty folder, or
    one that ``replaceable(path)`` accepts (e.g. an earlier export of the same kind), which is
    then replaced (renamed aside, the new one renamed in, the old one removed); anything else is a
    ``UserError`` raised before anything is written. On failure the temporary folder is removed
    and ``path`` is as it was."""
    import shutil

    path = Path(path)
    output_folder(path, str(path))
    if path.exists() and any(path.iterdir()) and not replaceable(path):
        shown = sorted(p.name for p in path.iterdir())
        listed = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
        raise UserError(f"{path} already holds other files ({listed}); choose a new or empty folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
        try:
            os.replace(tmp, path)
        except OSError:
            if old is not None:  # put the previous folder back
                os.replace(old / path.name, path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
