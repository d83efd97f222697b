"""Quaternion linear layers (Parcollet et al. 2019, "Quaternion Recurrent Neural Networks",
arXiv:1806.04418; Tay et al. 2019, "Lightweight and Efficient Neural Natural Language Processing
with Quaternion Networks", arXiv:1906.04393) and the linear layers a stack is built with, by name.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks

__all__ = ["QuaternionLinear", "LINEAR_LAYERS"]


class QuaternionLinear(nn.Module):
    """Quaternion linear layer: the Hamilton product with a quaternion weight (Parcollet et al. 2019,
    "Quaternion Recurrent Neural Networks", arXiv:1806.04418; Tay et al. 2019, "Lightweight and
    Efficient Neural Natural Language Processing with Quaternion Networks", arXiv:1906.04393).

    Input and output are read as ``in/4`` and ``out/4`` quaternions ``[r; x; y; z]`` (the four
    quarters of the feature vector). The weight ``W = W_r + W_x i + W_y j + W_z k`` has four real
    components of shape ``(in/4, out/4)``; ``W (x) Q`` is the real block matrix (formulas.md)

        [[W_r, -W_x, -W_y, -W_z],
         [W_x,  W_r, -W_z,  W_y],
         [W_y,  W_z,  W_r, -W_x],
         [W_z, -W_y,  W_x,  W_r]]  applied to [r; x; y; z]

    so the layer has a quarter of the weights of ``nn.Linear(in, out)`` (the bias, ``out``, is
    kept whole). Initialisation (Parcollet et al. 2019, §3.4, polar form): each weight is
    ``phi (cos theta + u sin theta)`` with modulus ``phi ~ chi_4`` scaled by
    ``sigma = 1 / sqrt(2 (in/4 + out/4))`` (Glorot), phase ``theta ~ U(-pi, pi)`` and ``u`` a random
    unit pure quaternion; the bias starts at 0.

    Shapes: ``x (..., in_features) -> (..., out_features)``; both must be multiples of 4.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            _checks.positive_int(name, n)
            if n % 4:
                raise ValueError(f"{name} must be a multiple of 4 (four quaternion components), got {n}")
        self.in_features, self.out_features = in_features, out_features
        shape = (in_features // 4, out_features // 4)
        self.weight_r, self.weight_x, self.weight_y, self.weight_z = (nn.Parameter(torch.empty(shape)) for _ in range(4))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Parcollet et al.'s polar-form quaternion initialisation (see the class docstring)."""
        n_in, n_out = self.weight_r.shape
        sigma = 1.0 / math.sqrt(2.0 * (n_in + n_out))
        phi = torch.randn(4, n_in, n_out, generator=generator).norm(dim=0) * sigma  # chi with 4 dof, scaled
        theta = (torch.rand(n_in, n_out, generator=generator) * 2 - 1) * math.pi  # U(-pi, pi)
        u = torch.randn(3, n_in, n_out, generator=generator)
        u = u / u.norm(dim=0).clamp_min(1e-12)  # unit pure quaternion (x, y, z)
        self.weight_r.copy_(phi * torch.cos(theta))
        for w, ui in zip((self.weight_x, self.weight_y, self.weight_z), u):
            w.copy_(phi * ui * torch.sin(theta))
        if self.bias is not None:
            self.bias.zero_()

    @property
    def weight(self) -> Tensor:
        """The real ``(out_features, in_features)`` matrix of the Hamilton product (``nn.Linear`` layout)."""
        r, x, y, z = (w.T for w in (self.weight_r, self.weight_x, self.weight_y, self.weight_z))  # (out/4, in/4)
        return torch.cat([torch.cat([r, -x, -y, -z], dim=1),
                          torch.cat([x, r, -z, y], dim=1),
                          torch.cat([y, z, r, -x], dim=1),
                          torch.cat([z, -y, x, r], dim=1)], dim=0)  # (out, in)

    def forward(self, x: Tensor) -> Tensor:
        _checks.tensor("x", x, floating=True)
        _checks.same("x", x.shape[-1], "in_features", self.in_features, "the feature size")
        _checks.same_dtype("x", x, "QuaternionLinear", self.weight_r)
        return F.linear(x, self.weight, self.bias)


#: linear layers a Transformer stack can be built with (``StackConfig.linear``), by name.
LINEAR_LAYERS = {"dense": nn.Linear, "quaternion": QuaternionLinear}
