"""Drawing the next token from a model's scores: greedy, temperature, top-k and nucleus (top-p)
sampling, shared by every model that generates text one token at a time."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import _checks

__all__ = ["sample_logits", "check_sampling"]


def check_sampling(temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None) -> None:
    """Refuses sampling options out of range, naming the option (``ValueError``/``TypeError``)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a float >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        _checks.positive_int("top_k", top_k)
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def sample_logits(logits: Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                  top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> Tensor:
    """Draw one token per row of ``logits (B, V)`` -> ``(B,)``.

    ``temperature = 0`` is greedy (argmax). Otherwise sample from ``softmax(logits / temperature)``
    restricted to the ``top_k`` largest logits and to the smallest set whose probability reaches
    ``top_p`` (nucleus sampling, Holtzman et al. 2020).
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already reach top_p (the first always stays)
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
