"""The two small parts that gated linear-attention layers put around their kernel:

- ``ShortConv`` — a causal depthwise convolution of a few positions, then SiLU, on the projected
  queries, keys and values (H3, Fu et al. 2023; DeltaNet, Yang et al. 2024, arXiv:2406.06484, §3.3;
  Gated DeltaNet, Qwen3-Next): each channel ``c`` mixes its last ``K`` inputs,
  ``y_t[c] = SiLU(sum_{j=0}^{K-1} w[c, j] x_{t-K+1+j}[c])`` (inputs before the first are 0). Decoding
  token by token carries the last ``K - 1`` inputs as its state.
- ``OutputGate`` — the output gate ``o'_t = SiLU(x_t W_r) ⊙ o_t`` on the (head-normalised) attention
  output before the output projection (GLA, Yang et al. 2023, arXiv:2312.06635, eq. 6; DeltaNet
  and Gated DeltaNet alike).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks

__all__ = ["ShortConv", "OutputGate"]


class ShortConv(nn.Module):
    """Causal depthwise convolution over ``kernel_size`` positions, then SiLU, on ``(B, L, channels)``.

    ``forward(x, cache=None)`` -> ``(y (B, L, channels), cache (B, kernel_size - 1, channels))``:
    ``cache`` holds the inputs before ``x`` (None: zeros, a sequence's start); the returned one
    holds the last ``kernel_size - 1`` inputs, so that feeding a sequence in pieces gives the
    outputs of feeding it whole. Weights ``(channels, kernel_size)``, no bias (as fla's
    ``ShortConvolution``); ``weight[:, -1]`` multiplies the current input.
    """

    def __init__(self, channels: int, kernel_size: int = 4) -> None:
        super().__init__()
        self.channels = _checks.positive_int("channels", channels)
        self.kernel_size = _checks.positive_int("kernel_size", kernel_size)
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))
        bound = 1.0 / math.sqrt(kernel_size)  # nn.Conv1d's default for a depthwise kernel (fan-in K)
        nn.init.uniform_(self.weight, -bound, bound)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}"

    def forward(self, x: Tensor, cache: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        _checks.tensor("x", x, ndim=3, floating=True)
        _checks.same("x", x.shape[-1], "channels", self.channels, "the feature size (dim -1)")
        B, _, C = x.shape
        K = self.kernel_size
        if cache is None:
            cache = x.new_zeros(B, K - 1, C)
        elif tuple(cache.shape) != (B, K - 1, C):
            raise ValueError(f"cache must be (B, kernel_size - 1, channels) = {(B, K - 1, C)}, got {tuple(cache.shape)}")
        padded = torch.cat([cache.to(x.dtype), x], dim=1)  # (B, K - 1 + L, C)
        y = F.conv1d(padded.transpose(1, 2), self.weight.to(x.dtype).unsqueeze(1), groups=C)  # (B, C, L)
        return F.silu(y.transpose(1, 2)), padded[:, padded.shape[1] - (K - 1):]


class OutputGate(nn.Module):
    """``SiLU(x W_r) ⊙ o``: the output gate of GLA / DeltaNet layers, ``x (B, L, d_in)``, ``o (B, L, d_out)``.

    Args:
        d_in, d_out: the sizes of the layer input ``x`` and of the gated output ``o``.
        linear: the factory of ``W_r`` (``nn.Linear``), built without bias.
    """

    def __init__(self, d_in: int, d_out: int, linear: Callable[..., nn.Module] = nn.Linear) -> None:
        super().__init__()
        self.proj = linear(_checks.positive_int("d_in", d_in), _checks.positive_int("d_out", d_out), bias=False)  # W_r

    def forward(self, x: Tensor, o: Tensor) -> Tensor:
        gate = self.proj(x)
        _checks.same("o", tuple(o.shape), "the gate", tuple(gate.shape), "the shape")
        return F.silu(gate) * o
