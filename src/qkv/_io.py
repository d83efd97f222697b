"""Atomic writes: a reader never sees a half-written file or directory, and a crash mid-write
leaves the previous version in place.

A file: a temporary file in the same directory, fsynced, ``os.replace``-d over it (``atomic_path``).
A directory of files that belong together (a model's ``config.json`` and ``model.safetensors``):
a sibling directory ``.NAME.new-TOKEN`` is filled and fsynced, then swapped with ``NAME`` in one
step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames, ``NAME`` to ``.NAME.old-TOKEN``
then the new one to ``NAME``), and the old one removed (``atomic_directory``). A process killed
between the two renames leaves ``NAME`` absent and a complete new directory beside it:
``settle_directory``, called before every read and write of such a directory, finishes that swap,
and removes what writers that died left (their ``.NAME.new-*`` / ``.NAME.old-*`` siblings).
Two writers that make the same new directory at once both succeed, one after the other (the
second swaps its directory with the first's).

A place that cannot be written (no space left, a quota, a read-only file system, no permission)
is the user's to fix: every writer here turns that ``OSError`` into one ``UserError`` line naming
the path (``unwritable``), the path left as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator, Union

from ._errors import UserError

__all__ = ["atomic_path", "atomic_write", "atomic_write_text", "atomic_directory", "atomic_folder", "settle_directory",
           "output_file", "output_folder", "unwritable", "owner_token", "owner_is_dead"]

#: why a place cannot be written, for the errors that are the user's to fix, and what to do
_UNWRITABLE = {
    errno.ENOSPC: ("no space left on the device", "free some space or write elsewhere"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space or write elsewhere"),
    errno.EROFS: ("the file system is read-only", "write elsewhere"),
    errno.EACCES: ("permission denied", "write elsewhere or change its permissions"),
    errno.EPERM: ("permission denied", "write elsewhere or change its permissions"),
}


#: how many ``unwritable`` blocks this thread is in: the outermost one names the path the user asked for
_DEPTH = threading.local()


@contextlib.contextmanager
def unwritable(path: Union[str, os.PathLike]) -> Iterator[None]:
    """Inside the block, an ``OSError`` that says ``path``'s place cannot be written (``ENOSPC``,
    ``EDQUOT``, ``EROFS``, ``EACCES``, ``EPERM``) becomes one ``UserError`` line naming ``path``
    and what to do; any other error passes. Nested blocks (a file written inside a directory being
    written) leave it to the outermost, which names what the user asked for, not a temporary file."""
    depth = getattr(_DEPTH, "value", 0)
    _DEPTH.value = depth + 1
    try:
        yield
    except OSError as e:
        if e.errno not in _UNWRITABLE or depth:
            raise
        why, advice = _UNWRITABLE[e.errno]
        elsewhere = e.filename and not str(e.filename).startswith(str(Path(os.path.abspath(path)).parent))
        named = f" ({e.filename})" if elsewhere else ""
        raise UserError(f"cannot write {path}: {why}{named}; {advice}, then retry") from None
    finally:
        _DEPTH.value = depth


@contextlib.contextmanager
def atomic_path(path: Union[str, os.PathLike]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``."""
    path = Path(path)
    with unwritable(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; give the result the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        with unwritable(path):
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


# ----------------------------------------------------------------------------- whole directories


def owner_token() -> str:
    """``HOST-PID-RANDOM``: who made a temporary file or folder (a sibling of ``atomic_directory``,
    a data set's staging folder), put in its name so that only a dead writer's is removed."""
    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def owner_is_dead(token: str) -> bool:
    """Whether the process that named something ``token`` (``owner_token``; anything may follow
    it) has died; False for another host's (a shared file system) or a name not made so."""
    host, _, rest = token.partition("-")
    pid = rest.partition("-")[0]
    if host != hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8] or not pid.isdigit():
        return False  # another machine's (a shared file system), or not ours: leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _siblings(path: Path, kind: str) -> Iterator[tuple]:
    """``(sibling path, token)`` for every ``.NAME.<kind>-TOKEN`` beside ``path``."""
    prefix = f".{path.name}.{kind}-"
    try:
        entries = os.listdir(path.parent)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(prefix):
            yield path.parent / entry, entry[len(prefix):]


def settle_directory(path: Union[str, os.PathLike]) -> Path:
    """Finish what a writer of ``atomic_directory(path)`` killed mid-swap left, and return ``path``:
    when ``path`` is absent beside a ``.NAME.old-TOKEN`` (killed between the two renames), its
    complete ``.NAME.new-TOKEN`` becomes ``path`` (or, lacking it, the old one goes back); the old
    directories of finished swaps and the temporary ones of dead writers are removed. Where the
    parent cannot be written, the complete new directory is returned to be read as it is."""
    path = Path(path)
    for old, token in list(_siblings(path, "old")):
        new = old.with_name(f".{path.name}.new-{token}")
        if not path.exists():
            try:
                os.rename(new if new.is_dir() else old, path)
            except FileNotFoundError:  # the writer (or another reader) finished it meanwhile
                pass
            except OSError:  # a read-only place: read the complete new directory where it is
                return new if new.is_dir() else old
        if path.exists() and old.exists():
            shutil.rmtree(old, ignore_errors=True)
    for new, token in list(_siblings(path, "new")):
        if owner_is_dead(token):
            shutil.rmtree(new, ignore_errors=True)
    return path


def _fsync_tree(directory: Path) -> None:
    for root, dirs, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _carry_over(old: Path, new: Path) -> None:
    """Hard-link (else copy) into ``new`` the entries of ``old`` that ``new`` does not have: the
    files a directory held beside what its writer rewrites (a run's ``vocab.json``) are kept."""
    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    for entry in os.listdir(old):
        if entry.endswith(".tmp") and entry.startswith("."):  # a dead atomic_path writer's temporary file
            continue
        source, target = old / entry, new / entry
        if os.path.lexists(target):
            continue
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_dir():
            shutil.copytree(source, target, symlinks=True, copy_function=link)
        else:
            link(str(source), str(target))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: Union[str, os.PathLike], keep_others: bool = True) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path`` to fill; when the block ends without an
    exception, what ``path`` held and the block did not write is carried over (hard links; not with
    ``keep_others=False``), and the new directory replaces ``path`` as a whole (see the module's docstring): a reader, or a process
    killed at any point, finds the old directory or the new one, never a mix. If the block fails,
    ``path`` is untouched and the temporary directory removed. A file at ``path`` is a ``UserError``.
    """
    path = Path(path)
    if path.is_symlink() and path.is_dir():
        path = Path(os.path.realpath(path))  # replace what the link points to, keep the link
    path = Path(os.path.abspath(path))
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} is a file, not a directory")
    with unwritable(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        settle_directory(path)
        token = owner_token()
        new = path.with_name(f".{path.name}.new-{token}")
        new.mkdir()
    try:
        with unwritable(path):
            yield new
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(new, (path.stat().st_mode & 0o7777) if path.is_dir() else 0o777 & ~umask)
            if keep_others and path.is_dir():
                _carry_over(path, new)
            _fsync_tree(new)
            try:
                cwd = os.getcwd()
            except OSError:
                cwd = ""
            inside = cwd == str(path) or cwd.startswith(str(path) + os.sep)
            _put_in_place(new, path, token)
            _fsync_dir(path.parent)
            if inside and os.path.isdir(cwd):  # the process stood in the old directory: stand in the new one
                os.chdir(cwd)
    finally:
        # after an exchange ``new`` holds the old directory; after two renames ``.old-TOKEN`` does
        shutil.rmtree(new, ignore_errors=True)
        shutil.rmtree(path.with_name(f".{path.name}.old-{token}"), ignore_errors=True)


def _put_in_place(new: Path, path: Path, token: str) -> None:
    """``new`` becomes ``path``: renamed when ``path`` is absent, else swapped with it (one
    exchange, or two renames that ``settle_directory`` finishes after a kill). Another writer may
    make ``path`` between the look and the rename (two first saves at once): the rename then
    finds it, and the swap is done instead (the later writer's directory wins, whole)."""
    for _ in range(8):  # each turn another writer made or removed path meanwhile
        if not path.exists():
            try:
                os.rename(new, path)
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                continue  # made meanwhile: swap with it
        try:
            if _exchange(new, path):
                return
        except FileNotFoundError:  # removed meanwhile (a reader settling a swap): rename again
            continue
        old = path.with_name(f".{path.name}.old-{token}")
        try:
            os.rename(path, old)
        except FileNotFoundError:
            continue
        try:
            os.rename(new, path)
        except FileNotFoundError:  # a reader's settle_directory finished the swap
            if not path.is_dir():
                raise
        return
    raise OSError(errno.EBUSY, "other writers kept replacing it", str(path))


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
    """``atomic_directory(path, keep_others=False)`` for an output folder that must be new, empty,
    or one that ``replaceable(path)`` accepts (e.g. an earlier export of the same kind): anything
    else is a ``UserError`` raised before anything is written. ``path`` appears only complete, and
    on failure it is as it was."""
    path = Path(path)
    output_folder(path, str(path))
    if path.exists() and any(path.iterdir()) and not replaceable(path):
        shown = sorted(p.name for p in path.iterdir())
        listed = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
        raise UserError(f"{path} already holds other files ({listed}); choose a new or empty folder")
    with atomic_directory(path, keep_others=False) as new:
        yield new
