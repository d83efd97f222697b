"""Shared benchmark helpers: timing, peak-memory measurement, machine description, log–log fits,
and writing results (JSON, markdown tables, log–log plots).

Every benchmark in ``qkv.bench`` measures through these functions, so that all results are taken
and written the same way and always carry the machine they were taken on (design.md §6).

Timing: ``time_steps`` runs a step once or more to warm up, then a number of timed repeats
(``torch.cuda.synchronize`` around each on GPU) and reports the median.

Peak memory: ``peak_memory`` runs a step once and returns the peak bytes of tensor storage that
the step allocated and still held at one moment:

* on CUDA, ``torch.cuda.max_memory_allocated`` minus what was allocated before the step;
* on CPU, an ``AllocationTracker`` — a ``TorchDispatchMode`` that sees every ATen operator
  (forward and backward: autograd dispatches below it), adds the byte size of each storage an
  operator *creates* (outputs that alias an input — views, in-place and ``out=`` ops — are not
  new memory) and subtracts it when the storage is freed (a ``weakref.finalize`` on the storage).
  The tracked number is therefore the live set of tensors the step produced: activations saved
  for backward, temporaries, gradients — exactly what grows as O(n^2) for an explicit attention
  matrix and as O(n) for a fused or blocked kernel. Scratch buffers that a fused operator
  allocates internally and frees before returning (e.g. the per-thread tiles of the CPU flash
  kernel) are invisible to it; they are bounded by the tile size, not by the sequence length.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._errors import UserError
from .._io import atomic_write_text
from .._plot import pyplot, save_figure
from .._values import guess_value

__all__ = [
    "AllocationTracker", "Timing", "time_steps", "time_interleaved", "peak_memory", "describe_machine",
    "machine_line", "fit_loglog", "markdown_table", "write_json", "write_markdown", "plot_loglog",
    "resolve_device", "synchronize", "timed_once", "parse_value", "now_iso", "MAX_LENGTH", "check_lengths",
    "check_range",
]

#: the longest sequence any benchmark is asked to measure (64 x the longest default, 16,384)
MAX_LENGTH = 1 << 20


# --------------------------------------------------------------------------------------------
# Devices and timing


def resolve_device(name: str) -> torch.device:
    """``"cpu"`` or ``"cuda"`` (``"cuda:1"``) as a ``torch.device``; clear error without CUDA."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device must be 'cpu' or 'cuda[:index]', got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device must be 'cpu' or 'cuda[:index]', got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was given but torch.cuda.is_available() is False on this machine")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU), so wall-clock times cover the whole step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """Wall-clock seconds of repeated runs of one step."""

    times: List[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    def as_dict(self) -> Dict[str, Any]:
        return {"median_s": self.median, "min_s": self.best, "repeats": len(self.times), "times_s": self.times}


def _repeats_for(seconds_per_step: float, min_repeats: int, max_repeats: int, target_seconds: float) -> int:
    """As many repeats as fit in ``target_seconds``, clipped to ``[min_repeats, max_repeats]``."""
    fit = int(target_seconds / max(seconds_per_step, 1e-9))
    return max(min_repeats, min(max_repeats, fit))


def timed_once(step: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one run of ``step()`` (synchronised on GPU)."""
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


def time_steps(step: Callable[[], Any], device: torch.device, *, warmup: int = 1, min_repeats: int = 3,
               max_repeats: int = 20, target_seconds: float = 2.0, estimate: Optional[float] = None) -> Timing:
    """Time ``step()``: ``warmup`` untimed runs, then repeats until ~``target_seconds`` are spent.

    The number of repeats is chosen from the last warm-up run — or from ``estimate`` (seconds per
    step) when the caller has already warmed the step up and passes ``warmup=0`` — at least
    ``min_repeats``, at most ``max_repeats``. Report ``Timing.median``: the median is robust to a
    neighbour process stealing a core for one repeat.
    """
    if warmup < 0 or min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"need warmup >= 0 and 1 <= min_repeats <= max_repeats, got {warmup}, {min_repeats}, {max_repeats}")
    if warmup == 0 and estimate is None:
        raise ValueError("time_steps with warmup=0 needs estimate= (seconds per step from the caller's own warm-up)")
    last = estimate if estimate is not None else 0.0
    for _ in range(warmup):
        last = timed_once(step, device)
    timing = Timing()
    for _ in range(_repeats_for(last, min_repeats, max_repeats, target_seconds)):
        timing.times.append(timed_once(step, device))
    return timing


def round_ratio(a: Timing, b: Timing) -> float:
    """The median over rounds of ``a``'s time over ``b``'s in the same round (``time_interleaved``
    runs both in each round): a drift of the machine's speed between rounds, which moves both
    medians, cancels here."""
    if len(a.times) != len(b.times) or not a.times:
        raise ValueError(f"round_ratio needs timings of the same rounds, got {len(a.times)} and {len(b.times)} repeats")
    return statistics.median(x / y for x, y in zip(a.times, b.times))


def time_interleaved(steps: Mapping[str, Callable[[], Any]], device: torch.device, *, warmup: int = 1,
                     min_repeats: int = 5, max_repeats: int = 30, target_seconds: float = 3.0) -> Dict[str, Timing]:
    """Time several steps that are to be compared, alternating them repeat by repeat.

    On a shared machine load comes and goes; timing A then B in rounds (the order rotating each
    round) exposes both to the same load, so their ratio is steadier than timing A's repeats and
    then B's.
    """
    names = list(steps)
    if not names:
        raise ValueError("time_interleaved needs at least one step")
    per_round = 0.0
    for _ in range(warmup):
        per_round = sum(timed_once(steps[n], device) for n in names)
    timings = {n: Timing() for n in names}
    for r in range(_repeats_for(per_round, min_repeats, max_repeats, target_seconds)):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            timings[n].times.append(timed_once(steps[n], device))
    return timings


# --------------------------------------------------------------------------------------------
# Peak memory


class AllocationTracker(TorchDispatchMode):
    """Track the live bytes of tensor storages created by ATen operators while the mode is on.

    ``peak`` is the largest number of such bytes alive at one moment; ``live`` what is alive now.
    Storages that existed before the mode was entered (inputs, parameters) are never counted;
    outputs that share storage with an input of the same operator (views, in-place ops) are not
    new memory and are not counted either.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: Dict[int, int] = {}  # storage data_ptr -> bytes

    def _release(self, key: int, nbytes: int) -> None:
        if self._tracked.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._tracked:
                continue
            self._tracked[key] = nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_memory(step: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes of tensor memory allocated by one run of ``step()`` (see the module docstring).

    Run ``step`` at least once before, so that one-time allocations (caches, lazy buffers) are not
    attributed to it.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before)
    with AllocationTracker() as tracker:
        step()
    return tracker.peak


# --------------------------------------------------------------------------------------------
# Machine description


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_machine(device: torch.device) -> Dict[str, Any]:
    """What the results were measured on: CPU model, cores, threads, torch, device, load."""
    info: Dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    try:
        # Load averages over 1, 5, 15 min at the start: > cores means other processes shared the machine.
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def machine_line(machine: Mapping[str, Any]) -> str:
    """One line for markdown headers and printed tables."""
    load = machine.get("load_average")
    load_text = f", load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}" if load else ""
    return (f"{machine['cpu']} ({machine['cores']} cores, {machine['torch_threads']} torch threads), "
            f"device {machine['device_name']}, torch {machine['torch']}, python {machine['python']}{load_text}")


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


# --------------------------------------------------------------------------------------------
# Fits


def fit_loglog(xs: Sequence[float], ys: Sequence[float]) -> Dict[str, float]:
    """Least-squares fit of ``log y = a log x + b``: ``y ~ C x^a``.

    Returns ``{"exponent": a, "coefficient": C, "r2": R^2}`` (R^2 of the fit in log space).
    Needs at least two points with distinct positive ``x`` and positive ``y``.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length, got {len(xs)} and {len(ys)}")
    if len(xs) < 2 or any(not (x > 0 and math.isfinite(x)) for x in xs) or any(not (y > 0 and math.isfinite(y)) for y in ys):
        raise ValueError(f"fit_loglog needs >= 2 points with finite positive x and y, got xs={list(xs)}, ys={list(ys)}")
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys)]
    n = len(pts)
    mx = sum(a for a, _ in pts) / n
    my = sum(b for _, b in pts) / n
    sxx = sum((a - mx) ** 2 for a, _ in pts)
    if sxx == 0:
        raise ValueError(f"fit_loglog needs at least two distinct x values, got {list(xs)}")
    slope = sum((a - mx) * (b - my) for a, b in pts) / sxx
    intercept = my - slope * mx
    ss_res = sum((b - (slope * a + intercept)) ** 2 for a, b in pts)
    ss_tot = sum((b - my) ** 2 for _, b in pts)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {"exponent": slope, "coefficient": math.exp(intercept), "r2": r2}


# --------------------------------------------------------------------------------------------
# Writing results


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats are written as given (format them before)."""
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, payload: Mapping[str, Any]) -> Path:
    """``payload`` as indented JSON, written atomically (a reader sees the old file or the new one)."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def write_markdown(path: Path, title: str, machine: Mapping[str, Any], command: str, date: str,
                   sections: Sequence[str]) -> Path:
    """A markdown report: title, machine line, command, date, then the given sections; written
    atomically (a run killed while writing leaves the old report whole)."""
    head = [f"# {title}", "", f"- machine: {machine_line(machine)}", f"- command: `{command}`", f"- date: {date}", ""]
    return atomic_write_text(path, "\n".join(head) + "\n" + "\n\n".join(sections) + "\n")


def plot_loglog(path: Path, series: Mapping[str, Mapping[str, Sequence[float]]], *, title: str,
                panels: Sequence[tuple[str, str]], machine: Mapping[str, Any]) -> Path:
    """Log–log plot, one panel per ``(key, y label)`` of ``panels``, one line per series.

    ``series[name]`` holds ``"x"`` and each panel key as equal-length lists; a ``f"{key}_label"``
    entry, when present, replaces the legend entry for that panel (e.g. with the fitted slope).
    """
    fig, axes = pyplot().subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    for ax, (key, ylabel) in zip(axes[0], panels):
        for name, s in series.items():
            pts = [(x, y) for x, y in zip(s["x"], s[key]) if y is not None and y > 0]
            if not pts:
                continue
            ax.loglog(*zip(*pts), marker="o", label=s.get(f"{key}_label", name))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n{machine_line(machine)}", fontsize=8)
    return save_figure(fig, path, dpi=120)


def check_lengths(flag: str, lengths: Sequence[int], minimum: int = 1, maximum: int = MAX_LENGTH) -> List[int]:
    """``lengths`` as given, or a ``UserError`` naming ``flag`` when one is outside ``[minimum, maximum]``."""
    for L in lengths:
        if not minimum <= L <= maximum:
            raise UserError(f"{flag} must be {minimum:,} to {maximum:,} tokens, got {L:,}")
    return list(lengths)


def check_range(flag: str, value: float, minimum: float, maximum: Optional[float] = None,
                below_maximum: bool = False) -> float:
    """``value``, or a ``UserError`` naming ``flag`` when it is below ``minimum`` or above ``maximum``
    (``below_maximum``: ``maximum`` itself excluded)."""
    too_big = maximum is not None and (value >= maximum if below_maximum else value > maximum)
    if value < minimum or too_big:
        upper = "" if maximum is None else f" and {'<' if below_maximum else '<='} {maximum}"
        raise UserError(f"{flag} must be >= {minimum}{upper}, got {value}")
    return value


def parse_value(text: str) -> Any:
    """A command-line value of no declared type (``qkv._values.guess_value``, the untyped case of
    the one parser): a bool, None, a Python or JSON literal, else the text itself."""
    return guess_value(text)
