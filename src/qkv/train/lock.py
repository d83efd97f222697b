"""The run lock (``qkv._lock``): one writer per run directory. It lives on the lowest floor so that
``qkv data fetch`` (``qkv.tasks.data``) holds the same lock on a data set's folder."""

from .._lock import LOCK_FILE, RunLock, RunLockError

__all__ = ["RunLock", "RunLockError", "LOCK_FILE"]
