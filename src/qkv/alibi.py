"""ALiBi, attention with linear biases (Press et al. 2022, "Train Short, Test Long", arXiv:2108.12409).

No position is added to the embeddings; each head ``h = 1 .. H`` adds to its scores a penalty
linear in the distance between query ``i`` and key ``j`` (§3)::

    score_ij = q_i . k_j / sqrt(d) - m_h (i - j),        m_h = 2^(-8 h / H)

for ``H`` a power of two. For other ``H`` the paper's rule (its reference code): the ``2^a``
slopes of the largest power of two ``2^a < H``, then every other slope of ``2^(a+1)`` heads
until there are ``H``. The bias depends on ``i - j`` only, so a kernel adds it from the
distances inside its own key axis (queries aligned to the end of the keys): a cache, a bounded
cache or padding in front leave it unchanged.

Deviation: the paper is causal (``i >= j``); a non-causal kernel uses ``|i - j|`` (symmetric).
Kernels that form their scores take it as the knob ``alibi=True`` (softmax, window); the stack
sets it for every self-attention under ``positional="alibi"``.
"""

from __future__ import annotations

import math
from typing import List

import torch
from torch import Tensor

from . import _checks

__all__ = ["alibi_slopes", "alibi_bias"]


def alibi_slopes(n_heads: int) -> List[float]:
    """The ``n_heads`` head slopes ``m_h`` (geometric from ``2^(-8/H)``; the paper's rule for ``H``
    not a power of two)."""
    _checks.positive_int("n_heads", n_heads)

    def powers(n: int) -> List[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    low = 2 ** int(math.floor(math.log2(n_heads)))
    return powers(low) + powers(2 * low)[0::2][:n_heads - low]


def alibi_bias(n_heads: int, distance: Tensor, causal: bool, dtype: torch.dtype = torch.float32) -> Tensor:
    """The score bias ``-m_h (i - j)`` (``|i - j|`` when not ``causal``) of ``distance = i - j``
    (an integer tensor of any shape ``S``) for every head: ``(H, *S)`` in ``dtype``."""
    slopes = torch.tensor(alibi_slopes(n_heads), dtype=dtype, device=distance.device)
    d = distance.to(dtype)
    d = d if causal else d.abs()
    return -slopes.view(-1, *(1,) * distance.dim()) * d
