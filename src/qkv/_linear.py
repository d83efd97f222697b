"""``x W^T + b`` for inference on the CPU through oneDNN's matrix product.

PyTorch's float32 ``F.linear`` on the CPU calls MKL's sgemm. Where MKL does not take its fast
kernels (non-Intel CPUs such as the AMD EPYC of our benchmarks, where it is markedly slower than
oneDNN on the same thread), oneDNN's matmul — the kernel ``torch.compile`` puts behind CPU linear
layers (``torch.ops.mkldnn._linear_pointwise``) — computes the same float32 products (float32
accumulation; results differ by rounding only). That kernel has no backward, so it serves only
when no gradient is recorded, and only from ``MIN_ROWS`` rows, below which its call costs more
than MKL's (a decoding step's single row), and never inside a graph that ``torch.compile`` or
``torch.export`` traces (Inductor cannot lower the op; it chooses its own kernels for ``F.linear``). ``torch.backends.mkldnn.flags(enabled=False)`` turns
it off, as it does PyTorch's own oneDNN paths. An activation after the product (a feed-forward
network's first layer) can be fused into it (``activation=``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["linear", "plain_dense", "MIN_ROWS", "ACTIVATIONS"]

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
    if torch.compiler.is_compiling():
        # first: Inductor cannot lower the op itself (it puts its own behind F.linear where it pays),
        # and a test of the rows would pin a dynamic length to >= MIN_ROWS in an exported program
        return False
    rows = x.numel() // x.shape[-1] if x.dim() >= 2 and x.shape[-1] else 0
    if rows < MIN_ROWS:  # the cheapest test: a decoding step's one row never goes to oneDNN
        return False
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False  # the oneDNN op has no backward
    return (weight.dim() == 2 and x.shape[-1] == weight.shape[1]
            and torch.backends.mkldnn.enabled and _onednn_available())


#: activations oneDNN applies inside the product (its post-op), by ``qkv.blocks.ACTIVATIONS`` name:
#: the op's (attribute, algorithm) and the same function unfused
ACTIVATIONS = {
    "relu": (("relu", ""), F.relu),
    "gelu": (("gelu", "none"), F.gelu),  # exact (erf)
    "gelu-tanh": (("gelu", "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (("swish", ""), F.silu),  # x sigmoid(x), Swish_1 (SwiGLU's gate)
}


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """``act(F.linear(x, weight, bias))``: ``x (..., in) -> (..., out)``; ``activation`` a name of
    ``ACTIVATIONS`` or None. Through oneDNN — the activation fused into the product, no second
    ``(..., out)`` tensor — for float32 CPU inputs of at least ``MIN_ROWS`` rows when no gradient
    is recorded, else ``F.linear`` and the activation."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if _onednn_fits(x, weight, bias):
        attr, algorithm = ("none", "") if activation is None else ACTIVATIONS[activation][0]
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm)
    y = F.linear(x, weight, bias)
    return y if activation is None else ACTIVATIONS[activation][1](y)


def plain_dense(module: Optional[nn.Module]) -> bool:
    """An ``nn.Linear`` itself (a subclass may compute something else) with no forward hooks (which
    calling its weights directly would skip): its product may go through :func:`linear`."""
    return (type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)
            and not (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks))
