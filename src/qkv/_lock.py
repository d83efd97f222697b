"""One writer per directory (a run, a data set being fetched): an advisory OS lock on ``DIR/.lock``.

``RunLock(directory)`` takes an exclusive ``flock`` on ``directory/.lock`` and writes its holder
(pid, host, command, start time) into the file, so that a second writer is refused with one line
naming the first. The kernel drops the lock when its process ends, however it ends (``kill -9``
included), so nothing is left to clean: a stale ``.lock`` file holds no lock. The lock is re-entrant
within a process (the ``qkv train`` command and the ``Trainer`` it runs both hold it). With
``wait=True`` a second writer waits for the first instead (``qkv data fetch`` of the same data set
twice at once: the second finds the first's files).

On platforms without ``fcntl`` (Windows) the lock is a no-op.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from ._errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["RunLock", "RunLockError", "LOCK_FILE"]

LOCK_FILE = ".lock"

#: this process's held locks: resolved directory -> [file descriptor, depth]
_HELD: Dict[str, list] = {}
_GUARD = threading.Lock()


class RunLockError(UserError):
    """Another process holds the run directory's lock (a ``UserError``: the ``qkv`` command prints
    it as one line)."""


def _holder_text(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "another process (it has not written its name yet)"
    if not isinstance(info, dict):
        return "another process"
    since = info.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} (`{info.get('command', '?')}`, since {when})"


class RunLock:
    """Hold ``directory``'s writer lock for a ``with`` block (creating the directory if needed).

    Raises ``RunLockError`` (a ``qkv.UserError``, so a ``ValueError``) at once, without waiting, when
    another process holds it; with ``wait=True`` it says so on stderr and waits for it instead.
    """

    def __init__(self, directory: str | os.PathLike, command: Optional[str] = None, wait: bool = False) -> None:
        self.directory = Path(directory)
        self.command = command if command is not None else " ".join(["qkv" if i == 0 else a for i, a in enumerate(sys.argv)])
        self.wait = bool(wait)
        self._key: Optional[str] = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def acquire(self) -> "RunLock":
        if self._key is not None:
            raise RuntimeError(f"RunLock({str(self.directory)!r}) is already acquired by this object")
        self.directory.mkdir(parents=True, exist_ok=True)
        key = str(self.directory.resolve())
        with _GUARD:
            if key in _HELD:  # this process holds it already: nest
                _HELD[key][1] += 1
                self._key = key
                return self
            if fcntl is None:  # pragma: no cover
                _HELD[key] = [None, 1]
                self._key = key
                return self
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                if not self.wait:
                    os.close(fd)
                    raise RunLockError(f"{self.directory} is being written by {_holder_text(self.path)}; "
                                       "wait for it to finish or stop it, then retry") from None
                print(f"qkv: {self.directory} is being written by {_holder_text(self.path)}; waiting for it",
                      file=sys.stderr, flush=True)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
            info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command, "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            _HELD[key] = [fd, 1]
            self._key = key
        return self

    def release(self) -> None:
        key, self._key = self._key, None
        if key is None:
            return
        with _GUARD:
            entry = _HELD[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _HELD[key]
                if entry[0] is not None:
                    os.close(entry[0])  # closing the descriptor drops the flock

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
