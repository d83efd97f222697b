"""Attention mechanisms: the self-attention kernel registry, multi-head attention and the
alignment (RNN-era) attention modules.

Every kernel module is imported here explicitly so that ``import qkv`` registers it.
"""

from __future__ import annotations

from ..registry import describe, lookup, names
from .base import AttentionKernel, normalize_mask

# Kernels, in the order `qkv list` shows them (registration order): exact, then sparse, then approximate.
from .softmax import SoftmaxAttention
from .window import WindowAttention
from .local import Local1DAttention, Local2DAttention
from .sparse import FixedAttention, StridedAttention
from ..types import LinearState
from .linear import LinearAttention
from .linear_window import LinearWindowAttention, LinearWindowState
from .gated_linear import (DeltaNetAttention, GatedDeltaNetAttention, GatedLinearAttention, RecurrentState,
                           RetentionAttention)
from .performer import PerformerAttention
from .efficient import EfficientAttention
from .relative import RelativeAttention
from .adaptive_span import AdaptiveSpanAttention
from .linformer import LinformerAttention
from .lsh import LSHAttention, LSHState

from .alignment import HardAttention, HardAttentionSample, LocalAttention, SoftAttention
from .multihead import MultiHeadAttention, build_attention

__all__ = [
    "AttentionKernel", "MultiHeadAttention", "build_attention", "list_attention", "normalize_mask",
    "SoftmaxAttention", "WindowAttention", "SoftAttention", "HardAttention", "HardAttentionSample",
    "LocalAttention", "LinearAttention", "LinearState", "LinearWindowAttention", "LinearWindowState", "PerformerAttention", "EfficientAttention",
    "StridedAttention", "FixedAttention", "Local1DAttention", "Local2DAttention",
    "RelativeAttention",
    "AdaptiveSpanAttention",
    "LinformerAttention",
    "LSHAttention", "LSHState",
    "RetentionAttention", "GatedLinearAttention", "DeltaNetAttention", "GatedDeltaNetAttention", "RecurrentState",
]


def list_attention() -> dict[str, str]:
    """The registered kernel names, each with its one-line description."""
    return {name: describe(lookup("attention", name)) for name in names("attention")}
