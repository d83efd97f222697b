"""Typed return values and incremental-decoding states shared by every attention mechanism.

State is returned, never stored on a module: a caller passes ``out.state`` back as ``state=``
to continue a sequence (style.md habit 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from torch import Tensor

__all__ = ["AttentionOutput", "KVCache"]


class AttentionOutput(NamedTuple):
    """What every attention call returns.

    output:  the attended values; shape documented by the callee.
    weights: the attention distribution, or None unless asked for (``need_weights=True``) or free.
    state:   what is needed to continue the sequence (``return_state=True``), else None.
    """

    output: Tensor
    weights: Optional[Tensor] = None
    state: Any = None


@dataclass(frozen=True)
class KVCache:
    """Keys and values seen so far, ``(B, H, S, E)`` each; ``offset`` counts positions trimmed
    from the front (a bounded cache keeps only what later queries can still see)."""

    key: Tensor
    value: Tensor
    offset: int = 0
    #: spare room after ``key``/``value`` for appending in place while decoding (no autograd):
    #: ``(key buffer, value buffer, [positions written])``; ``key``/``value`` are views of the
    #: buffers' first ``length`` positions. Only the state that wrote last may append in place, so
    #: a caller that continues an older state (a branch) gets a copy and every state stays true.
    room: Any = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        """Number of cached positions (after trimming)."""
        return self.key.shape[-2]
