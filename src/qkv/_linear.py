"""``x W^T + b`` for inference on the CPU through oneDNN's matrix product.

PyTorch's float32 ``F.linear`` on the CPU calls MKL's sgemm. Where MKL does not take its fast
kernels (on the AMD EPYC of our benchmarks it runs (2048 x 256)(256 x 768) 2.2 times slower than
oneDNN, one thread each), oneDNN's matmul — the kernel ``torch.compile`` puts behind CPU linear
layers (``torch.ops.mkldnn._linear_pointwise``) — computes the same float32 products (float32
accumulation; results differ by rounding only). That kernel has no backward, so it serves only
when no gradient is recorded, and only from ``MIN_ROWS`` rows, below which its call costs more
than MKL's (a decoding step's single row). ``torch.backends.mkldnn.flags(enabled=False)`` turns
it off, as it does PyTorch's own oneDNN paths.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear", "MIN_ROWS"]

#: fewest rows (product of the leading dimensions of ``x``) sent to oneDNN
MIN_ROWS = 16

_ONEDNN: Optional[bool] = None  # the op is there (checked once)


def _onednn_available() -> bool:
    global _ONEDNN
    if _ONEDNN is None:
        try:
            _ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        except (AttributeError, RuntimeError):  # a build without the mkldnn namespace
            _ONEDNN = False
    return _ONEDNN


def _onednn_fits(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """float32 CPU tensors of at least ``MIN_ROWS`` rows, contiguous, no gradient recorded."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False  # the oneDNN op has no backward
    rows = x.numel() // x.shape[-1] if x.dim() >= 2 and x.shape[-1] else 0
    return (rows >= MIN_ROWS and weight.dim() == 2 and x.shape[-1] == weight.shape[1]
            and torch.backends.mkldnn.enabled and _onednn_available())


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(x, weight, bias)``: ``x (..., in) -> (..., out)``; through oneDNN for float32 CPU
    inputs of at least ``MIN_ROWS`` rows when no gradient is recorded, else ``F.linear``."""
    if _onednn_fits(x, weight, bias):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
