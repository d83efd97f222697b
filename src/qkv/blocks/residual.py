"""Residual wirings: how a sub-layer of a Transformer block joins the residual stream (Vaswani et
al. 2017, "Attention Is All You Need", arXiv:1706.03762; GTrXL's gates, Parisotto et al. 2019).

A residual wiring is a small object with two hooks, so that every sub-layer of every block reads

    h = wiring.enter(x)          # what the sub-layer sees
    x = wiring.exit(x, F(h))     # how its output rejoins the stream

- post-LN (the paper, §3.1):  ``enter(x) = x``,     ``exit(x, y) = LayerNorm(x + Dropout(y))``
- pre-LN (GPT-2, Xiong 2020): ``enter(x) = LN(x)``, ``exit(x, y) = x + Dropout(y)``; the stack
  then ends with a final LayerNorm (``final_norm = True``).

A later wiring (GTrXL's GRU gate ``g(x, relu(y))``) is one more subclass registered as
``@register("residual", name)``; the stack builds wirings by name and never changes. Reversible
residuals (Reformer, ``blocks/reversible.py``) couple two sub-layers and so replace the stack's
layer loop instead.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks
from ..registry import lookup, register
from .norms import build_norm

__all__ = ["ResidualWiring", "PostLN", "PreLN", "build_residual", "GatedResidual", "GRUGate", "InputGate", "ReLUSum"]


class ResidualWiring(nn.Module):
    """How a sub-layer ``F`` joins the residual stream: ``x' = exit(x, F(enter(x)))``.

    ``dropout`` is the paper's residual dropout (§5.4), applied to the sub-layer output before
    it is added. ``final_norm`` says whether a stack of such blocks needs a closing LayerNorm.
    ``norm`` names the normalisation (``qkv.blocks.NORMS``: ``"layernorm"``, ``"rmsnorm"``).
    """

    final_norm: ClassVar[bool] = False
    registry_name: ClassVar[str] = ""

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, *, norm: str = "layernorm") -> None:
        super().__init__()
        _checks.positive_int("d_model", d_model)
        self.norm = build_norm(norm, d_model, eps=eps)
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


class GatedResidual(ResidualWiring):
    """GTrXL's wirings (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning",
    arXiv:1910.06764, §3): layer norm on the sub-layer *input* only, and a gating layer
    ``g(x, relu(y))`` in place of the residual sum::

        enter(x) = LN(x)            exit(x, y) = g(x, relu(Dropout(y)))

    ``x`` is the residual stream, ``y`` the sub-layer output. Subclasses define the gate ``g``;
    ``gate_bias`` is ``b_g`` where the gate has one. The stream is never normalised, so a stack
    of these ends with a final LayerNorm, as pre-LN.
    """

    final_norm = True

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, gate_bias: float = 2.0, *,
                 norm: str = "layernorm") -> None:
        super().__init__(d_model, dropout, eps, norm=norm)
        if isinstance(gate_bias, bool) or not isinstance(gate_bias, (int, float)):
            raise TypeError(f"gate_bias must be a float, got {gate_bias!r}")
        self.gate_bias = float(gate_bias)

    def enter(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def exit(self, x: Tensor, y: Tensor) -> Tensor:
        return self.gate(x, F.relu(self.dropout(y)))

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: each gate defines it


@register("residual", "relu-sum", "identity-map")
class ReLUSum(GatedResidual):
    """Identity map reordering of TrXL-I (Parisotto et al. 2019): x + relu(Sublayer(LayerNorm(x))) — GTrXL's plain-sum gate."""

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        return x + y


@register("residual", "input-gate")
class InputGate(GatedResidual):
    """GTrXL input gating (Parisotto et al. 2019): g = sigmoid(W_g x) * x + y, y = relu(Sublayer(LayerNorm(x)))."""

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, gate_bias: float = 2.0, *,
                 norm: str = "layernorm") -> None:
        super().__init__(d_model, dropout, eps, gate_bias, norm=norm)
        self.w_g = nn.Linear(d_model, d_model)  # W_g (with a bias)

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.sigmoid(self.w_g(x)) * x + y


@register("residual", "gru-gate", "gtrxl")
class GRUGate(GatedResidual):
    """GTrXL GRU-type gate (Parisotto et al. 2019): g = (1 - z) * x + z * tanh(W_g y + U_g (r * x)), z = sigmoid(W_z y + U_z x - b_g).

    ::

        r = sigmoid(W_r y + U_r x)
        z = sigmoid(W_z y + U_z x - b_g)
        h^ = tanh(W_g y + U_g (r * x))
        g = (1 - z) * x + z * h^

    with ``x`` the stream and ``y = relu(Sublayer(LN(x)))``. ``b_g = 2`` makes ``z ~ sigmoid(-2)
    = 0.12`` at initialisation, so each sub-layer starts close to the identity on ``x`` — the
    paper's explanation of GTrXL's stability. The six matrices are initialised ``N(0, 0.02)``
    (GPT's scale), which keeps the other terms small at initialisation too.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, gate_bias: float = 2.0, *,
                 norm: str = "layernorm") -> None:
        super().__init__(d_model, dropout, eps, gate_bias, norm=norm)
        self.w = nn.Linear(d_model, 3 * d_model, bias=False)  # [W_r; W_z; W_g] y
        self.u_rz = nn.Linear(d_model, 2 * d_model, bias=False)  # [U_r; U_z] x
        self.u_g = nn.Linear(d_model, d_model, bias=False)  # U_g (r * x)
        for linear in (self.w, self.u_rz, self.u_g):
            nn.init.normal_(linear.weight, std=0.02)

    def update_gate(self, x: Tensor, y: Tensor) -> Tensor:
        """``z = sigmoid(W_z y + U_z x - b_g)``, the share of the new value in ``g``."""
        return torch.sigmoid(self.w(y).chunk(3, -1)[1] + self.u_rz(x).chunk(2, -1)[1] - self.gate_bias)

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)  # (..., d) each
        ur, uz = self.u_rz(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return (1 - z) * x + z * h


def build_residual(name: str, d_model: int, dropout: float = 0.0, eps: float = 1e-5,
                   norm: str = "layernorm") -> ResidualWiring:
    """The residual wiring registered as ``name`` (``"post-ln"``, ``"pre-ln"``, ...), normalising with
    ``norm`` (a wiring registered without a ``norm`` argument gets none when it is LayerNorm)."""
    cls = lookup("residual", name)
    return cls(d_model, dropout=dropout, eps=eps, **({} if norm == "layernorm" else {"norm": norm}))
