"""Typed return values and incremental-decoding states shared by every attention mechanism.

State is returned, never stored on a module: a caller passes ``out.state`` back as ``state=``
to continue a sequence (style.md habit 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from torch import Tensor

__all__ = ["AttentionOutput", "KVCache", "LinearState", "RecurrentState"]


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


@dataclass(frozen=True)
class LinearState:
    """The running sums of causal linear attention (an RNN state; ``attention/_ops.linear_attention``).

    S: ``(B, H, E', Ev)`` = ``sum_j phi(K_j) V_j^T`` over the ``length`` keys seen.
    Z: ``(B, H, E')`` = ``sum_j phi(K_j)``.
    length: number of key positions summed (masks passed later cover these plus the new keys).
    log_scale: ``(B, H)`` or None. When the key features are given in log space (Performer),
        ``S`` and ``Z`` are stored divided by ``exp(log_scale)`` (the running maximum of the key
        log-features) so that they never overflow; the factor cancels in ``S / Z``.
    summed: ``(B|1, H|1, length)`` bool or None: which of the keys were summed (a key masked when
        it was fed was not); None when every key was. A mask given later over the cached keys must
        say the same (``split_key_mask``): the sums cannot forget a key or take one back.
    S and Z are float32 for half-precision inputs (see ``accumulation_dtype``).
    """

    S: Tensor
    Z: Tensor
    length: int = 0
    log_scale: Optional[Tensor] = None
    summed: Optional[Tensor] = None


@dataclass(frozen=True)
class RecurrentState:
    """The state of linear attention's gated and delta-rule descendants (``attention/gated_linear.py``:
    retention, gla, deltanet, gated-deltanet; the recurrence in ``qkv/_chunkwise.py``).

    S: ``(B, H, Ev, E)`` — the papers' layout, ``d_v x d_k``, ``o_t = S_t q_t`` (fla and transformers
        keep the transpose ``(B, H, E, Ev)``; ``qkv.functional``'s drop-ins convert).
    length: number of key positions fed (masks passed later cover these plus the new keys).
    summed: ``(B|1, H|1, length)`` bool or None: which keys were written (a key masked when it was
        fed was skipped); None when every key was. A later mask over them must say the same.
    S is float32 for half-precision inputs.
    """

    S: Tensor
    length: int = 0
    summed: Optional[Tensor] = None
