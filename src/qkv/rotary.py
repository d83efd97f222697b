"""Rotary position embeddings (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position
Embedding", arXiv:2104.09864) and the frequency scalings of later long-context work.

RoFormer rotates each pair of a query's (and key's) features by an angle proportional to the
token's position ``m`` (eq. 14-16)::

    f(x, m)_{pair i} = R(m theta_i) x_{pair i},    R(a) = [[cos a, -sin a], [sin a, cos a]]
    theta_i = base^(-2i / d),  i = 0 .. d/2 - 1

so that ``f(q, m) . f(k, n)`` depends on ``m - n`` only (eq. 16): the score sees relative positions.

Pairs. RoFormer pairs adjacent features ``(x_{2i}, x_{2i+1})``; the Llama checkpoints (and
transformers' ``rotate_half``) pair the two halves ``(x_i, x_{i + d/2})``::

    f(x, m) = x * cos(m theta) + rotate_half(x) * sin(m theta),  rotate_half([x1, x2]) = [-x2, x1]

with ``cos``/``sin`` of ``(theta_0 .. theta_{d/2-1})`` repeated twice. The two are one function
up to a fixed permutation ``P`` of a head's features (``P`` sends feature ``2i`` to ``i`` and
``2i + 1`` to ``i + d/2``): ``half(P x, m) = P adjacent(x, m)``, and since ``q`` and ``k`` are
permuted alike the scores are equal — a model trained with one convention is the other's with the
rows of ``W^Q`` and ``W^K`` permuted within each head. qkv rotates halves, as the checkpoints do.

Scalings of ``theta`` (transformers' ``rope_parameters["rope_type"]``; ``d`` the rotated size,
``L_0`` the pre-training length ``original_max_position_embeddings``):

- ``default``: ``theta_i = base^(-2i/d)``.
- ``linear`` (Chen et al. 2023, position interpolation): ``theta_i / factor``.
- ``dynamic`` (NTK-aware, bloc97/emozilla 2023): at sequence length ``s`` beyond the model's
  ``max_len``, ``base' = base (factor s / max_len - (factor - 1))^(d / (d - 2))``; below it, default.
- ``yarn`` (Peng et al. 2023, arXiv:2309.00071): ``theta_i = theta_i^interp (1 - e_i) + theta_i e_i``
  with ``theta^interp = theta / factor`` and ``e_i = 1 - clamp((i - low) / (high - low), 0, 1)``,
  ``low``/``high`` the dimensions that turn ``beta_fast``/``beta_slow`` times over ``L_0``
  (``d ln(L_0 / (2 pi beta)) / (2 ln base)``, floored/ceiled unless ``truncate`` is False);
  ``cos`` and ``sin`` scaled by ``attention_factor = 0.1 ln(factor) + 1`` (or the given one, or
  ``mscale``/``mscale_all_dim``'s ratio).
- ``llama3`` (Meta 2024): wavelengths ``2 pi / theta_i`` above ``L_0 / low_freq_factor`` divided
  by ``factor``, below ``L_0 / high_freq_factor`` kept, between them the blend
  ``(1 - s) theta_i / factor + s theta_i`` with ``s = (L_0 / wavelength - low) / (high - low)``.

Deviation: ``dynamic`` takes ``s`` as the largest position of the current call plus one (keys
already in a cache keep the rotation they were stored with, as in transformers).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from . import _checks

__all__ = ["RotaryEmbedding", "rope_frequencies", "rotate_half", "apply_rotary", "check_rope_scaling", "ROPE_TYPES"]

#: each scaling's own keys: required, then optional (transformers' ``rope_parameters`` names)
ROPE_TYPES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ("original_max_position_embeddings",)),
    "yarn": (("factor",), ("original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                           "mscale", "mscale_all_dim", "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
}


def check_rope_scaling(scaling: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``scaling`` as a checked dict with ``rope_type`` (default ``"default"``): an unknown type or
    key, or a missing one, is refused in one line. ``rope_theta``/``type`` keys are dropped
    (transformers keeps the base beside the scaling, and older configs name the type ``type``)."""
    if scaling is None:
        return {"rope_type": "default"}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"rope_scaling must be a dict (transformers' rope_parameters), got {type(scaling).__name__}")
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "type")} | {
        "rope_type": scaling.get("rope_type", scaling.get("type", "default"))}
    kind = scaling["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling: rope_type must be one of {sorted(ROPE_TYPES)}, got {kind!r}")
    required, optional = ROPE_TYPES[kind]
    missing = [k for k in required if scaling.get(k) is None]
    if missing:
        raise ValueError(f"rope_scaling: rope_type {kind!r} needs {missing}")
    unknown = sorted(set(scaling) - {"rope_type", *required, *optional})
    if unknown:
        raise ValueError(f"rope_scaling: rope_type {kind!r} takes {sorted(required + optional)}, got unknown {unknown}")
    if kind != "default" and not (isinstance(scaling["factor"], (int, float)) and not isinstance(scaling["factor"], bool)
                                  and scaling["factor"] >= 1):
        raise ValueError(f"rope_scaling: factor must be a number >= 1, got {scaling['factor']!r}")
    return dict(scaling)


def rope_frequencies(d: int, base: float = 10000.0, scaling: Optional[Mapping[str, Any]] = None, *,
                     max_len: Optional[int] = None, seq_len: Optional[int] = None) -> Tuple[Tensor, float]:
    """``(theta (d/2,) float64, attention_factor)`` of a rotary embedding over ``d`` features
    (the module docstring's equations). ``max_len``: the model's length (``dynamic``, and the
    default ``original_max_position_embeddings``); ``seq_len``: the current length (``dynamic``)."""
    _checks.positive_int("d", d)
    if d % 2:
        raise ValueError(f"rotary embeddings rotate pairs of features: d must be even, got {d}")
    scaling = check_rope_scaling(scaling)
    kind = scaling["rope_type"]
    i = torch.arange(0, d, 2, dtype=torch.float64)  # 2i
    theta = base ** (-i / d)  # theta_i = base^(-2i/d)
    factor = scaling.get("factor", 1.0)
    original = scaling.get("original_max_position_embeddings") or max_len
    if kind == "linear":
        return theta / factor, 1.0
    if kind == "dynamic":
        if max_len is None:
            raise ValueError("rope_type 'dynamic' needs max_len (the length beyond which it rescales)")
        s = max(seq_len or 0, max_len)
        # base' = base (factor s / max_len - (factor - 1))^(d / (d - 2))
        return (base * (factor * s / max_len - (factor - 1)) ** (d / (d - 2))) ** (-i / d), 1.0
    if kind == "yarn":
        if original is None:
            raise ValueError("rope_type 'yarn' needs original_max_position_embeddings (or max_len)")
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            def m(scale: float, mscale: float = 1.0) -> float:
                return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
            mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attention_factor = m(factor, mscale) / m(factor, mscale_all) if mscale and mscale_all else m(factor)

        def turning_dim(rotations: float) -> float:  # the dimension that turns `rotations` times over L_0
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))
        low, high = turning_dim(scaling.get("beta_fast") or 32), turning_dim(scaling.get("beta_slow") or 1)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # no zero-width ramp
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        e = 1 - ramp  # share of the extrapolated (unscaled) frequency
        return theta / factor * (1 - e) + theta * e, float(attention_factor)
    if kind == "llama3":
        low_f, high_f = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelength = 2 * math.pi / theta
        scaled = torch.where(wavelength > original / low_f, theta / factor, theta)
        s = (original / wavelength - low_f) / (high_f - low_f)
        blend = (1 - s) * scaled / factor + s * scaled
        medium = (wavelength >= original / high_f) & (wavelength <= original / low_f)
        return torch.where(medium, blend, scaled), 1.0
    return theta, 1.0


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension's halves: the 90-degree turn of every pair ``(x_i, x_{i+d/2})``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``f(x, m) = x cos(m theta) + rotate_half(x) sin(m theta)``: ``x (B, H, L, d)``, ``cos``/``sin``
    ``(B|1, 1, L, d)`` (the half-size angles repeated twice)."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their positions (Su et al. 2021; halves paired, as the Llama checkpoints).

    ``q' = q cos(m theta) + rotate_half(q) sin(m theta)`` (and ``k``), ``theta`` from
    :func:`rope_frequencies`, ``cos`` and ``sin`` times the scaling's ``attention_factor``.

    Args:
        d_head: the head size (rotated whole; even).
        base: ``rope_theta`` (10,000 in RoFormer, 500,000 in Llama 3).
        scaling: transformers' ``rope_parameters`` without ``rope_theta`` (``{"rope_type": "yarn",
            "factor": 4.0, ...}``); None: default.
        max_len: the model's length (``dynamic`` rescales beyond it).
    ``forward(q (B, H, L, d), k (B, Hk, L, d), positions (L,) or (B, L) long)`` -> ``(q', k')``.
    The angles are computed in float32 (float64 for float64 inputs), as transformers does. The
    last ``cos``, ``sin`` are kept with the positions tensor they were made for: the layers of one
    forward pass share the stack's positions, so they are computed once per pass, not per layer.
    """

    def __init__(self, d_head: int, *, base: float = 10000.0, scaling: Optional[Mapping[str, Any]] = None,
                 max_len: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"rope_theta must be a number > 1, got {base!r}")
        self.d_head, self.base, self.max_len = d_head, float(base), max_len
        self.scaling = check_rope_scaling(scaling)
        theta, self.attention_factor = rope_frequencies(d_head, self.base, self.scaling, max_len=max_len)
        self.register_buffer("theta", theta, persistent=False)  # (d/2,) float64
        self._last: Optional[Tuple[Any, ...]] = None  # (positions, theta, (its version, dtype, inference mode), cos, sin)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, base={self.base}, scaling={self.scaling}"

    def angles(self, positions: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """``cos``, ``sin`` ``(B|1, 1, L, d)`` of ``positions (L,) or (B, L)``, in ``dtype`` (those of
        the previous call when it had the very same positions tensor, unchanged since)."""
        compiling = torch.compiler.is_compiling()
        key = (positions._version, dtype, torch.is_inference_mode_enabled())
        last = self._last
        if not compiling and last is not None and last[0] is positions and last[1] is self.theta and last[2] == key:
            return last[3], last[4]
        cos, sin = self._angles(positions, dtype)
        if not compiling:
            self._last = (positions, self.theta, key, cos, sin)
        return cos, sin

    def _angles(self, positions: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        theta = self.theta
        if self.scaling["rope_type"] == "dynamic" and positions.numel() and not torch.compiler.is_compiling():
            theta, _ = rope_frequencies(self.d_head, self.base, self.scaling, max_len=self.max_len,
                                        seq_len=int(positions.max()) + 1)
        work = torch.float64 if dtype == torch.float64 else torch.float32
        theta = theta.to(device=positions.device, dtype=work)
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)
        angle = positions.to(work).unsqueeze(-1) * theta  # (B|1, L, d/2): m theta_i
        angle = torch.cat([angle, angle], dim=-1).unsqueeze(1)  # (B|1, 1, L, d)
        return (angle.cos() * self.attention_factor).to(dtype), (angle.sin() * self.attention_factor).to(dtype)

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> Tuple[Tensor, Tensor]:
        _checks.same("q", q.shape[-1], "d_head", self.d_head, "the head size")
        if not isinstance(positions, Tensor) or positions.dim() not in (1, 2) or positions.is_floating_point():
            raise TypeError(f"positions must be an integer tensor (L,) or (B, L), got {positions!r:.80}")
        _checks.same("positions", positions.shape[-1], "q", q.shape[-2], "the length")
        cos, sin = self.angles(positions, q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
