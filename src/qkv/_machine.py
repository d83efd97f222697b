"""The machine a run trains on: its physical cores, the load other work puts on them, and how many
threads torch should use."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Callable, Optional

__all__ = ["physical_cores", "default_threads", "load_average", "set_threads", "announce"]


def physical_cores() -> int:
    """Physical CPU cores (distinct (package, core) pairs of /proc/cpuinfo), else ``os.cpu_count()``."""
    try:
        cores, package = set(), "0"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                package = value.strip()
            elif key == "core id":
                cores.add((package, value.strip()))
        if cores:
            return min(len(cores), os.cpu_count() or len(cores))
    except OSError:
        pass
    return os.cpu_count() or 1


def default_threads(cores: int, load: float) -> int:
    """torch threads when ``--threads`` is not given: the ``cores`` that other work leaves free by
    the 1-minute ``load`` average (rounded), at least 1.

    torch's intra-op threads meet at the end of every operation, so one thread that another
    process keeps off its core stalls the others: on the shared 2-core machine of issue 20 (load
    about 7) an update of the main job took 2-5 s with 2 threads and 0.40 s with 1. An idle machine
    keeps every physical core.
    """
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    busy = math.floor(max(load, 0.0) + 0.5)  # cores' worth of other runnable work
    return max(1, min(cores, cores - busy))


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


def announce(message: str) -> None:
    """Tell the person at the terminal (stderr, ``qkv: message``), apart from a command's output."""
    print(f"qkv: {message}", file=sys.stderr)


def set_threads(threads: Optional[int], warn_load: bool = False, say: Callable[[str], None] = announce) -> int:
    """Set torch's threads: ``threads`` when given, else ``default_threads`` of this machine
    (``warn_load``: ``say`` so when the load leaves fewer threads than cores)."""
    import torch

    n = threads
    if n is None:
        cores, load = physical_cores(), load_average()
        n = default_threads(cores, load)
        if warn_load and n < cores:
            say(f"the load average is {load:.1f} on {cores} cores: training with {n} thread(s), "
                "which a busy machine runs faster (--threads N to choose)")
    torch.set_num_threads(n)
    return n
