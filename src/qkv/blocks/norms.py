"""Normalisation layers by name: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019,
"Root Mean Square Layer Normalization", arXiv:1910.07467).

RMSNorm drops LayerNorm's re-centring and its bias (eq. 4)::

    RMSNorm(x) = x / RMS(x) * g,    RMS(x) = sqrt(mean_i x_i^2 + eps)

(the paper puts ``eps`` outside the root; every Llama-family checkpoint, and transformers, inside).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import _checks

__all__ = ["RMSNorm", "NORMS", "build_norm"]


class RMSNorm(nn.Module):
    """Root mean square normalisation x / sqrt(mean(x^2) + eps) * g (Zhang & Sennrich 2019).

    Args:
        d: the normalised (last) dimension.
        eps: inside the root.
    The mean square is taken in float32 at least (half inputs), the result cast back before the
    gain ``g`` (ones at initialisation) multiplies it, as the checkpoints were trained.
    Shapes: ``(..., d) -> (..., d)``.
    """

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.d = _checks.positive_int("d", d)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"eps must be a positive float, got {eps!r}")
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d))  # g

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:
        work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        # x / sqrt(mean_i x_i^2 + eps)
        normed = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


#: normalisation layers by name: ``factory(d, eps=)``
NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": RMSNorm}


def build_norm(name: str, d: int, eps: float = 1e-5) -> nn.Module:
    """The normalisation layer ``name`` (``NORMS``: ``"layernorm"`` or ``"rmsnorm"``) over ``d`` features."""
    if name not in NORMS:
        raise ValueError(f"norm must be one of {sorted(NORMS)}, got {name!r}")
    return NORMS[name](d, eps=eps)
