"""The score transforms a kernel that forms its scores can take as knobs — one place for all of them.

* ``softcap = c`` (Gemma 2, Team et al. 2024): ``s -> c tanh(s / c)`` on the scaled scores;
* ``alibi = True`` (Press et al. 2022, ``qkv.alibi``): ``s -> s - m_h (i - j)``, after the cap;
* ``sinks = True`` (GPT-OSS, OpenAI 2025): a learned logit ``s_h`` per head joins each row's
  softmax and is dropped after it, ``w = softmax([s_i1 .. s_iN, s_h])[:N]`` — the weights of a row
  sum to less than 1 (what is left goes to the sink, whose value is zero); a row with no allowed
  key gets zero weights. The sinks start at 0 (an ``nn.Parameter (H,)``: ``n_heads`` is needed).

``setup`` checks the knobs and keeps them on the kernel (``kernel.alibi``, ``kernel.softcap``,
``kernel.sinks``); ``transform`` and ``softmax`` apply them to a kernel's scores of any layout
``(B, H, ..., M, N)``; ``sdpa_bias`` is ALiBi alone as a float mask for a fused kernel.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .. import _checks
from ..alibi import alibi_bias
from ..functional import masked_softmax

__all__ = ["setup", "fusable", "transform", "softmax", "bias", "sdpa_bias"]


def setup(kernel: nn.Module, *, alibi: bool, softcap: Optional[float], sinks: bool, n_heads: Optional[int]) -> None:
    """Check the knobs and set ``kernel.alibi``, ``kernel.softcap`` and ``kernel.sinks`` (a zero
    ``nn.Parameter (n_heads,)`` or None)."""
    for name, flag in (("alibi", alibi), ("sinks", sinks)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not 0 < softcap < float("inf")):
        raise ValueError(f"softcap must be a positive number (scores -> c tanh(scores / c)) or None, got {softcap!r}")
    kernel.alibi, kernel.softcap = alibi, None if softcap is None else float(softcap)
    kernel.sinks = None
    if sinks:
        if n_heads is None:
            raise ValueError("sinks=True learns one logit per head: give n_heads (MultiHeadAttention fills it in)")
        kernel.sinks = nn.Parameter(torch.zeros(_checks.positive_int("n_heads", n_heads)))


def fusable(kernel: Optional[nn.Module]) -> bool:
    """Whether a fused kernel (SDPA) computes the transformed attention: no cap and no sink (None: no kernel's knobs)."""
    return getattr(kernel, "softcap", None) is None and getattr(kernel, "sinks", None) is None


def bias(kernel: nn.Module, n_heads: int, distance: Tensor, dtype: torch.dtype, dims: Optional[int] = None) -> Optional[Tensor]:
    """ALiBi's bias of the signed distances ``i - j`` for scores ``(B, H, ...)`` with ``dims`` dimensions
    after the heads (default ``distance``'s): ``(H, 1, .., 1, *distance.shape)``, in float32 at least
    (the scores of half inputs are; ``sdpa_bias`` rounds it once); None without ALiBi."""
    if not getattr(kernel, "alibi", False):
        return None
    out = alibi_bias(n_heads, distance, kernel.causal, torch.promote_types(dtype, torch.float32))  # (H, *distance.shape)
    return out.view(n_heads, *(1,) * ((dims or distance.dim()) - distance.dim()), *distance.shape)


def transform(kernel: nn.Module, scores: Tensor, score_bias: Optional[Tensor]) -> Tensor:
    """Soft-cap the scaled ``scores (B, H, ..., M, N)``, then add ``score_bias`` (ALiBi's, laid out to broadcast)."""
    if kernel.softcap is not None:
        scores = kernel.softcap * torch.tanh(scores / kernel.softcap)
    return scores if score_bias is None else scores + score_bias


def softmax(kernel: nn.Module, scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``masked_softmax`` over the keys (dim -1) of ``scores (B, H, ...)``, with the kernel's sink
    logit per head (dim 1) in each row's denominator when it has sinks."""
    if kernel.sinks is None or scores.shape[-1] == 0:  # no key: nothing to weigh
        return masked_softmax(scores, mask)
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    sink = kernel.sinks.to(work.dtype).view(1, -1, *(1,) * (work.dim() - 2))  # (1, H, 1, ..., 1)
    if mask is not None:
        work = work.masked_fill(~mask, float("-inf"))
    top = torch.maximum(work.amax(-1, keepdim=True), sink)  # finite: the sink is
    e = torch.exp(work - top)
    return (e / (e.sum(-1, keepdim=True) + torch.exp(sink - top))).to(scores.dtype)


def sdpa_bias(score_bias: Tensor, allowed: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``score_bias`` as SDPA's float ``attn_mask``: ``-inf`` where ``allowed`` is False, 0 on a row
    with no allowed key (its output is zeroed by the caller: no NaN)."""
    out = score_bias.to(dtype)
    if allowed is None:
        return out
    out = out.masked_fill(~allowed, float("-inf"))
    return out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
