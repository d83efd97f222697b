"""The position-wise feed-forward network of the Transformer (Vaswani et al. 2017, "Attention Is
All You Need", arXiv:1706.03762, §3.3, eq. 2), its gated variants (Shazeer 2020, "GLU Variants
Improve Transformer", arXiv:2002.05202: SwiGLU, GeGLU) and the activations by name.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from .. import _checks, _linear

__all__ = ["FeedForward", "GatedFeedForward", "ACTIVATIONS", "build_feedforward"]

#: activations of the feed-forward network, by name. "gelu" is exact (erf, BERT's); "gelu-tanh" is
#: the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of GPT-2 ("gelu_new");
#: "silu" is x sigmoid(x) (Swish_1, the gate of SwiGLU).
#: (One table: ``qkv._linear.ACTIVATIONS``, which can also fuse them into the product.)
ACTIVATIONS = {name: fn for name, (_, fn) in _linear.ACTIVATIONS.items()}


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``FFN(x) = max(0, x W1 + b1) W2 + b2`` (Vaswani et al. 2017, eq. 2).

    Args:
        d_model: input and output width.
        d_ff: hidden width (the paper: ``4 d_model``).
        activation: ``"relu"`` (the paper) or ``"gelu"`` (BERT, GPT).
        chunk_size: compute over length chunks of this many positions (Kitaev et al. 2020, §3:
            the network is position-wise, so chunks are independent); bounds the ``(B, L, d_ff)``
            hidden activation to ``(B, chunk_size, d_ff)`` when nothing keeps it for backward
            (inference, or inside gradient checkpointing). None: one chunk.
        linear: the factory ``linear(in_features, out_features, bias=)`` of W1 and W2 (``nn.Linear``;
            ``LINEAR_LAYERS`` names the others, e.g. ``QuaternionLinear``).
        bias: ``b1`` and ``b2`` (False: bias-free).
    Shapes: ``x (B, L, d_model) -> (B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", chunk_size: Optional[int] = None,
                 linear: Callable[..., nn.Module] = nn.Linear, bias: bool = True) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        _checks.positive_int("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.chunk_size = None if chunk_size is None else _checks.positive_int("chunk_size", chunk_size)
        self.activation = activation
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {bias!r}")
        self.w1 = linear(d_model, d_ff, bias=bias)  # x W1 + b1
        self.w2 = linear(d_ff, d_model, bias=bias)  # (.) W2 + b2

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, chunk_size={self.chunk_size}"

    def _ffn(self, x: Tensor) -> Tensor:
        w1, w2 = self.w1, self.w2
        if _linear.plain_dense(w1) and _linear.plain_dense(w2):
            # the activation fused into the first product where qkv._linear can (CPU inference)
            h = _linear.linear(x, w1.weight, w1.bias, self.activation)
            return _linear.linear(h, w2.weight, w2.bias)
        return w2(ACTIVATIONS[self.activation](w1(x)))

    def forward(self, x: Tensor) -> Tensor:
        if self.chunk_size is None or x.shape[1] <= self.chunk_size:
            return self._ffn(x)
        return torch.cat([self._ffn(c) for c in x.split(self.chunk_size, dim=1)], dim=1)  # (B, L, d_model)


class GatedFeedForward(FeedForward):
    """Gated feed-forward network FFN_GLU(x) = (act(x W) * x V) W2 (Shazeer 2020): SwiGLU with silu, GeGLU with gelu.

    ``FFN_SwiGLU(x) = (Swish_1(x W) ⊗ x V) W2`` (eq. 6; ``activation="silu"``, Llama's),
    ``FFN_GEGLU(x) = (GELU(x W) ⊗ x V) W2`` (``"gelu"``, or ``"gelu-tanh"`` as Gemma), ``ReGLU``
    with ``"relu"``; the paper's are bias-free, ``bias=True`` adds one to each of the three.
    Parameters: ``w1`` is ``W`` (the gate), ``v`` is ``V``, ``w2`` is ``W2``; a GLU network of
    hidden width ``d_ff`` has 3/2 the parameters of the plain one (the paper shrinks ``d_ff`` by 2/3).
    Shapes and ``chunk_size``, ``linear`` as ``FeedForward``.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu", chunk_size: Optional[int] = None,
                 linear: Callable[..., nn.Module] = nn.Linear, bias: bool = True) -> None:
        super().__init__(d_model, d_ff, activation, chunk_size, linear, bias)
        self.v = linear(d_model, d_ff, bias=bias)  # x V

    def _ffn(self, x: Tensor) -> Tensor:
        w1, v, w2 = self.w1, self.v, self.w2
        if _linear.plain_dense(w1) and _linear.plain_dense(v) and _linear.plain_dense(w2):
            gate = _linear.linear(x, w1.weight, w1.bias, self.activation)  # act(x W), fused where it can be
            return _linear.linear(gate * _linear.linear(x, v.weight, v.bias), w2.weight, w2.bias)
        # (act(x W) ⊗ x V) W2
        return w2(ACTIVATIONS[self.activation](w1(x)) * v(x))


def build_feedforward(d_model: int, d_ff: int, activation: str, *, glu: bool = False, chunk_size: Optional[int] = None,
                      linear: Callable[..., nn.Module] = nn.Linear, bias: bool = True) -> FeedForward:
    """``GatedFeedForward`` when ``glu`` (SwiGLU, GeGLU, ... by ``activation``), else ``FeedForward``."""
    cls = GatedFeedForward if glu else FeedForward
    return cls(d_model, d_ff, activation, chunk_size=chunk_size, linear=linear, bias=bias)
