"""qkv's gated delta rule inside transformers' Qwen3-Next (``models/qwen3_next/modeling_qwen3_next.py``):
``torch_chunk_gated_delta_rule`` and ``torch_recurrent_gated_delta_rule`` served by
``qkv.functional.chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``. The mechanism, shared
with Kimi Linear's KDA, is ``qkv.hf.delta_rule`` (how the layer picks its function, how its arguments
are passed on); this module is its Qwen3-Next row, under the names it has always had.
``qkv.hf.attention.register()`` patches.
"""

from __future__ import annotations

from typing import List, Tuple

from . import delta_rule

__all__ = ["patch", "unpatch", "patched", "MODULES"]

#: the transformers modules whose gated-delta-rule globals are replaced
MODULES: Tuple[str, ...] = (delta_rule.QWEN3_NEXT,)


def patch() -> List[str]:
    """Put qkv's gated delta rule in place in Qwen3-Next; returns ``["module.global", ...]`` patched."""
    return delta_rule.patch(MODULES)


def unpatch() -> List[str]:
    """Give Qwen3-Next transformers' own functions back; returns what was restored."""
    return delta_rule.unpatch(MODULES)


def patched() -> List[str]:
    """Qwen3-Next's globals that qkv's functions serve now."""
    return delta_rule.patched(MODULES)
