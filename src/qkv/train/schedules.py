"""Learning-rate schedules as ``torch.optim.lr_scheduler.LambdaLR`` factories.

Each schedule is a small callable object (not a lambda), so ``LambdaLR.state_dict()`` stores its
parameters and a checkpoint restores it exactly. The object maps the scheduler's counter ``s``
(0 before the first update, +1 after each ``scheduler.step()``) to a multiplier of the base lr;
it evaluates the formulas at the paper's 1-based ``step = s + 1``, so update number ``n`` uses
``step = n``.

- ``noam``: Vaswani et al. (2017), "Attention Is All You Need", §5.3, eq. (3):
  ``lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.
- ``warmup_cosine``: linear warm-up then half-cosine decay (Loshchilov & Hutter 2017, SGDR,
  without restarts).
- ``constant``: optional linear warm-up, then constant.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["NoamMultiplier", "WarmupCosineMultiplier", "ConstantMultiplier", "noam", "warmup_cosine", "constant", "build"]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class NoamMultiplier:
    """``factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``, Vaswani et al. (2017) eq. (3).

    With ``d_model=None`` the schedule is normalised to peak at 1 at ``step == warmup``:
    ``min(step / warmup, sqrt(warmup / step))``, so the optimizer's base lr is the peak lr.
    """

    def __init__(self, warmup: int, d_model: Optional[int] = None, factor: float = 1.0) -> None:
        self.warmup = _check_int("warmup", warmup, 1)
        self.d_model = None if d_model is None else _check_int("d_model", d_model, 1)
        self.factor = float(factor)

    def __call__(self, s: int) -> float:
        step = s + 1
        # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
        value = min(step ** -0.5, step * self.warmup ** -1.5)
        scale = self.d_model ** -0.5 if self.d_model is not None else self.warmup ** 0.5
        return self.factor * scale * value


class WarmupCosineMultiplier:
    """``step / warmup`` for ``step <= warmup``, then
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2`` with ``p = (step - warmup) / (total - warmup)``
    clipped to 1 (so the multiplier stays at ``min_ratio`` after ``total``)."""

    def __init__(self, warmup: int, total: int, min_ratio: float = 0.0) -> None:
        self.warmup = _check_int("warmup", warmup, 0)
        self.total = _check_int("total", total, 1)
        if self.total <= self.warmup:
            raise ValueError(f"total ({total}) must be larger than warmup ({warmup})")
        if not 0.0 <= float(min_ratio) <= 1.0:
            raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
        self.min_ratio = float(min_ratio)

    def __call__(self, s: int) -> float:
        step = s + 1
        if step <= self.warmup:
            return step / self.warmup
        p = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


class ConstantMultiplier:
    """``min(1, step / warmup)`` (1 throughout when ``warmup == 0``)."""

    def __init__(self, warmup: int = 0) -> None:
        self.warmup = _check_int("warmup", warmup, 0)

    def __call__(self, s: int) -> float:
        step = s + 1
        return 1.0 if self.warmup == 0 else min(1.0, step / self.warmup)


def noam(optimizer: torch.optim.Optimizer, warmup: int, d_model: Optional[int] = None, factor: float = 1.0) -> LambdaLR:
    """Noam schedule. Two readings of the optimizer's lr:

    - absolute (the paper): give ``d_model`` and set the optimizer's lr to 1.0 (or to a factor,
      as the Annotated Transformer's 2.0); the lr is then exactly eq. (3);
    - relative: leave ``d_model=None``; the lr rises linearly to the optimizer's lr at ``warmup``
      and decays as ``step^-0.5`` after (the paper's shape with its peak set by the base lr).
    """
    return LambdaLR(optimizer, NoamMultiplier(warmup, d_model, factor))


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float = 0.0) -> LambdaLR:
    """Linear warm-up over ``warmup`` steps then cosine decay to ``min_ratio * lr`` at ``total``."""
    return LambdaLR(optimizer, WarmupCosineMultiplier(warmup, total, min_ratio))


def constant(optimizer: torch.optim.Optimizer, warmup: int = 0) -> LambdaLR:
    """Constant lr after an optional linear warm-up."""
    return LambdaLR(optimizer, ConstantMultiplier(warmup))


SCHEDULES = ("noam", "cosine", "constant")


def build(name: str, optimizer: torch.optim.Optimizer, *, warmup: int, total: int) -> LambdaLR:
    """The schedule called ``name`` (one of ``SCHEDULES``) with the peak lr = the optimizer's lr;
    ``noam`` is the relative form (see ``noam``)."""
    if name == "noam":
        return noam(optimizer, max(warmup, 1))
    if name == "cosine":
        return warmup_cosine(optimizer, warmup, max(total, warmup + 1))
    if name == "constant":
        return constant(optimizer, warmup)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")
