"""Transformer building blocks around the attention module (Vaswani et al. 2017, "Attention Is
All You Need", arXiv:1706.03762): the position-wise feed-forward network and the residual
wirings that join a sub-layer to the residual stream.

A residual wiring is a small object with two hooks, so that every sub-layer of every block reads

    h = wiring.enter(x)          # what the sub-layer sees
    x = wiring.exit(x, F(h))     # how its output rejoins the stream

- post-LN (the paper, §3.1):  ``enter(x) = x``,     ``exit(x, y) = LayerNorm(x + Dropout(y))``
- pre-LN (GPT-2, Xiong 2020): ``enter(x) = LN(x)``, ``exit(x, y) = x + Dropout(y)``; the stack
  then ends with a final LayerNorm (``final_norm = True``).

A later wiring (GTrXL's GRU gate ``g(x, relu(y))``) is one more subclass registered as
``@register("residual", name)``; the stack builds wirings by name and never changes. Reversible
residuals (Reformer) couple two sub-layers and so replace the stack's layer loop instead.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _checks
from .registry import lookup, register

__all__ = ["FeedForward", "ResidualWiring", "PostLN", "PreLN", "build_residual", "ACTIVATIONS"]

#: activations of the feed-forward network, by name.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


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
    Shapes: ``x (B, L, d_model) -> (B, L, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", chunk_size: Optional[int] = None) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        _checks.positive_int("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.chunk_size = None if chunk_size is None else _checks.positive_int("chunk_size", chunk_size)
        self.activation = activation
        self.w1 = nn.Linear(d_model, d_ff)  # x W1 + b1
        self.w2 = nn.Linear(d_ff, d_model)  # (.) W2 + b2

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, chunk_size={self.chunk_size}"

    def _ffn(self, x: Tensor) -> Tensor:
        return self.w2(ACTIVATIONS[self.activation](self.w1(x)))

    def forward(self, x: Tensor) -> Tensor:
        if self.chunk_size is None or x.shape[1] <= self.chunk_size:
            return self._ffn(x)
        return torch.cat([self._ffn(c) for c in x.split(self.chunk_size, dim=1)], dim=1)  # (B, L, d_model)


class ResidualWiring(nn.Module):
    """How a sub-layer ``F`` joins the residual stream: ``x' = exit(x, F(enter(x)))``.

    ``dropout`` is the paper's residual dropout (§5.4), applied to the sub-layer output before
    it is added. ``final_norm`` says whether a stack of such blocks needs a closing LayerNorm.
    """

    final_norm: ClassVar[bool] = False
    registry_name: ClassVar[str] = ""

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5) -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(_checks.probability("dropout", dropout))

    def enter(self, x: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: each wiring defines it

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: each wiring defines it


@register("residual", "post-ln", "post_ln")
class PostLN(ResidualWiring):
    """Post-LN residual LayerNorm(x + Sublayer(x)) (Vaswani et al. 2017, §3.1)."""

    def enter(self, x: Tensor) -> Tensor:
        return x

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        return self.norm(x + self.dropout(y))


@register("residual", "pre-ln", "pre_ln")
class PreLN(ResidualWiring):
    """Pre-LN residual x + Sublayer(LayerNorm(x)) (Radford et al. 2019; Xiong et al. 2020); needs a final LayerNorm."""

    final_norm = True

    def enter(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        return x + self.dropout(y)


def build_residual(name: str, d_model: int, dropout: float = 0.0, eps: float = 1e-5) -> ResidualWiring:
    """The residual wiring registered as ``name`` (``"post-ln"``, ``"pre-ln"``, ...)."""
    return lookup("residual", name)(d_model, dropout=dropout, eps=eps)
