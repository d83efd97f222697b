"""Linear attention's gated and delta-rule descendants: retention, GLA, DeltaNet, Gated DeltaNet.

Katharopoulos et al. 2020 (``linear``) keep ``S_t = S_{t-1} + v_t phi(k_t)^T``. Its descendants
change how the state forgets and writes (the state ``S_t`` is ``d_v x d_k``, ``o_t = S_t q_t``, as
in the papers; fla and transformers store the transpose):

- ``retention`` — RetNet (Sun et al. 2023, arXiv:2307.08621, eq. 1–5): ``S_t = gamma_h S_{t-1} + v_t k_t^T``,
  a fixed decay per head ``gamma_h = 1 - 2^{-5-h}`` (multi-scale retention); parallel form
  ``O = (Q K^T o D) V``, ``D_nm = gamma^{n-m}`` for ``n >= m``, else 0.
- ``gla`` — gated linear attention (Yang et al. 2023, arXiv:2312.06635, eq. 5):
  ``S_t = S_{t-1} Diag(alpha_t) + v_t k_t^T``, a data-dependent decay per key channel,
  ``alpha_t = sigmoid(x_t W_1 W_2 + b)^{1/tau}`` (tau = 16).
- ``deltanet`` — the delta rule (Schlag et al. 2021, arXiv:2102.11174; chunkwise training Yang et al. 2024,
  arXiv:2406.06484): ``S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` with L2-normalised
  keys, i.e. ``S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T``: the value stored at ``k_t`` moves
  toward ``v_t``; ``beta_t = sigmoid(x_t W_beta)``.
- ``gated-deltanet`` — Gated DeltaNet (Yang et al. 2024, arXiv:2412.06464, eq. 10), the attention
  of Qwen3-Next: ``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``alpha_t = exp(g_t)``
  per head, ``g_t = -exp(A) softplus(x_t W_a + dt_bias)`` (Mamba-2's discretisation).

The recurrence, its chunkwise form (the UT transform for the delta rule) and the parallel form live
in ``qkv/_chunkwise.py``; this module turns them into registered kernels (masks, states, gates).

Gates. In the papers ``alpha``/``beta`` are computed from the token's hidden state ``x_t``, which a
kernel (seeing projected heads) does not have. So a kernel call takes them as keyword tensors —
``g (B, H, N)`` (``gla``: ``(B, H, N, E)``), the log of the decay, ``<= 0``; ``beta (B, H, N)`` in
``[0, 1]`` — and ``gate_projections`` builds the module through which
``MultiHeadAttention`` computes them from its key input (``GLAGates``, ``DeltaGates``; the hook is
``AttentionKernel.gate_projections``). Without
them (a bare kernel): ``g`` is RetNet's fixed multi-scale decay ``log gamma_h`` and ``beta = 1``.

Deviations, all documented knobs: ``q`` is scaled by ``scale`` (default ``d^{-1/2}``, as RetNet, GLA
and fla); ``deltanet`` and ``gated-deltanet`` L2-normalise queries as well as keys (Yang et al. 2024,
fla, Qwen3-Next); ``norm=True`` (default) divides each head's output by its root mean square
(``o / sqrt(mean(o^2) + 1e-6)``), the papers' head normalisation (RetNet and GLA use GroupNorm,
Gated DeltaNet RMSNorm) without its gain, which the output projection absorbs — and which keeps
the outputs in range in half precision. The papers' output gates (``SiLU(x W_r) o ...``) belong to
the layer, not the kernel, and are not applied here.

Key padding: a masked key is skipped — no write and no decay (the state passes through it
unchanged), so a left-padded row gives the same outputs as the row alone. Packed documents:
``position_ids (B, N)`` (transformers' ``DataCollatorWithFlattening``: restarting at 0 at each
document) reset the state at each document's first token. Not causal (``causal=False``): every query
reads the state after the whole sequence, ``o_i = S_N q_i`` (the memory once every token wrote).
Weights (``need_weights=True``): the matrix ``W`` with ``o_i = sum_j W_ij v_j`` — the output is
linear in the values (the head normalisation included as its per-row factor), computed by feeding
the identity as values, O(N^2).
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import ClassVar, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks, _chunkwise
from ..registry import register
from ..types import AttentionOutput, RecurrentState
from ._ops import _summed, accumulation_dtype, decoding, full_precision, split_key_mask
from .base import AttentionKernel, clamp_knob

__all__ = ["GatedRecurrence", "RetentionAttention", "GatedLinearAttention", "DeltaNetAttention",
           "GatedDeltaNetAttention", "GLAGates", "DeltaGates", "RecurrentState"]


@dataclass(frozen=True)
class _Gates:
    """What one call passed beside ``q, k, v``: gates of its ``N`` new keys and document starts."""

    g: Optional[Tensor] = None  # (B, H, N) or (B, H, N, E)
    beta: Optional[Tensor] = None  # (B, H, N)
    resets: Optional[Tensor] = None  # (B, N) bool


#: the gates of the call in progress, from ``forward`` (which checks them) to ``_attend`` (which the
#: base class reaches after its own checks and edge cases); a context variable, so nothing is stored
#: on the module and concurrent calls do not meet. While ``torch.compile``/``torch.export`` trace
#: (which cannot read a context variable) the module holds them for the call instead
#: (``GatedRecurrence._traced_call``): a traced graph runs the call as one function.
_CALL: ContextVar[_Gates] = ContextVar("qkv_gated_linear_call", default=_Gates())

NORM_EPS = 1e-6  # the head normalisation's eps (RMSNorm's usual value)


class GatedRecurrence(AttentionKernel):
    """Base of the four kernels: ``S_t = S_{t-1} Diag(a_t) [(I - beta_t k_t k_t^T)] + beta_t v_t k_t^T``, ``o_t = S_t q_t``.

    Args:
        chunk_size: positions per chunk of the chunkwise form (a speed and memory knob: the result is
            the same to rounding).
        form: ``"chunkwise"`` (training), ``"recurrent"`` (one token at a time, the literal form),
            and for ``retention`` ``"parallel"`` (``(Q K^T o D) V``, O(N^2)).
        scale: the queries' factor (default ``d^{-1/2}``).
        norm: divide each head's output by its root mean square (the module docstring).
        causal: as every kernel (non-causal: every query reads the final state). dropout: must be 0.
    Call: ``kernel(q, k, v, mask=None, state=None, need_weights=False, return_state=False, *, g=None,
    beta=None, position_ids=None)`` with ``q (B, H, M, E)``, ``k (B, H, N, E)``, ``v (B, H, N, Ev)``;
    ``g``, ``beta`` the gates of the ``N`` keys (shapes in the subclass), ``position_ids (B, N)``
    (a 0 starts a document: causal only). ``return_state=True`` returns ``RecurrentState(S (B, H, Ev, E))``.
    Cost: ``O(N C (E + Ev) + N E Ev)`` time (the delta rule: three ``N E Ev`` products), ``O(E Ev)`` state.
    Decoding (a ``state`` and at most ``_chunkwise.DECODE_KEYS`` new keys, ``_ops.decoding``) runs the
    recurrent form whatever ``form``: a few products per token, none of the chunked form's machinery.
    """

    supports_mask = "key_padding"
    supports_state = True
    state_type = RecurrentState
    exact = False  # a different attention, not an approximation of softmax
    applies_dropout = False  # no attention matrix is formed; the papers apply none inside
    # qkv.parallel: each shard's affine map of the state (decays and delta-rule factors) all-gathered and
    # composed, the shard rerun from its true entering state (LASP-2); the gates are cut like q, k, v
    context_parallel = "affine"
    #: the delta rule (else additive)
    delta: ClassVar[bool] = False
    #: which ``g`` a call takes: None (none), ``"head"`` ``(B, H, N)``, ``"channel"`` ``(B, H, N, E)``
    gate: ClassVar[Optional[str]] = None
    #: whether a call takes ``beta``
    takes_beta: ClassVar[bool] = False
    #: L2-normalise queries and keys
    normalize_qk: ClassVar[bool] = False
    #: without a ``g`` from the call: RetNet's fixed ``log gamma_h`` (else no decay)
    default_decay: ClassVar[bool] = True
    #: why a call may not pass ``g`` (kernels with ``gate = None``)
    no_gate_reason: ClassVar[str] = ""
    forms: ClassVar[Tuple[str, ...]] = ("chunkwise", "recurrent")
    default_chunk: ClassVar[int] = 64
    # AttentionKernel.static_length: the chunkwise scan loops over the chunks, the recurrent form over tokens
    static_length = "its state is scanned chunk by chunk (token by token in the recurrent form), in numbers of the length"

    def __init__(self, *, causal: bool = False, dropout: float = 0.0, chunk_size: int = 64,
                 form: str = "chunkwise", scale: Optional[float] = None, norm: bool = True) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.chunk_size = _checks.positive_int("chunk_size", chunk_size)
        if form not in self.forms:
            raise ValueError(f"form must be one of {self.forms} for attention {self.registry_name!r}, got {form!r}")
        self.form = form
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale) or scale <= 0):
            raise ValueError(f"scale must be a finite float > 0 or None (d^-1/2), got {scale!r}")
        self.scale = None if scale is None else float(scale)
        if not isinstance(norm, bool):
            raise TypeError(f"norm must be a bool, got {type(norm).__name__}")
        self.norm = norm

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """Chunks of ``max_len / 4`` in ``[1, default_chunk]`` (a speed knob: the result is the same)."""
        return {**super().default_knobs(max_len, n_heads, d_head),
                "chunk_size": clamp_knob(max_len // 4, 1, cls.default_chunk)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"chunk_size": (1, 2, 3, 4), "form": cls.forms}

    def extra_repr(self) -> str:
        return f"chunk_size={self.chunk_size}, form={self.form!r}, scale={self.scale}, norm={self.norm}, {super().extra_repr()}"

    # ------------------------------------------------------------------ the call

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, state=None,
                need_weights: bool = False, return_state: bool = False, *, g: Optional[Tensor] = None,
                beta: Optional[Tensor] = None, position_ids: Optional[Tensor] = None) -> AttentionOutput:
        """``AttentionKernel.forward`` with the gates of the ``N`` new keys (the class docstring)."""
        if g is None and beta is None and position_ids is None:
            return super().forward(q, k, v, mask, state, need_weights, return_state)
        _checks.tensor("k", k, ndim=4, floating=True)
        B, H, N, E = k.shape
        if g is not None and self.gate is None:
            raise ValueError(f"attention {self.registry_name!r} takes no g: {self.no_gate_reason}")
        if beta is not None and not self.takes_beta:
            raise ValueError(f"attention {self.registry_name!r} takes no beta (it writes every key with strength 1)")
        shapes = ((B, H, N, E),) if self.gate == "channel" else ((B, H, N),)
        _chunkwise.check_gates(g, beta, shapes, (B, H, N))
        resets = None
        if position_ids is not None:
            if not self.causal:
                raise ValueError(f"position_ids (packed documents) need causal=True: attention {self.registry_name!r} "
                                 f"built with causal=False reads the state after the whole row")
            if not isinstance(position_ids, Tensor) or position_ids.is_floating_point() or position_ids.dtype == torch.bool:
                raise TypeError(f"position_ids must be an integer tensor (B, N), got "
                                f"{position_ids.dtype if isinstance(position_ids, Tensor) else type(position_ids).__name__}")
            if tuple(position_ids.shape) != (B, N):
                raise ValueError(f"position_ids must have shape (B, N) = {(B, N)}, got {tuple(position_ids.shape)}")
            resets = _chunkwise.resets_from_position_ids(position_ids)
        if torch.compiler.is_compiling():
            self._traced_call = _Gates(g, beta, resets)
            try:
                return super().forward(q, k, v, mask, state, need_weights, return_state)
            finally:
                self._traced_call = None
        token = _CALL.set(_Gates(g, beta, resets))
        try:
            return super().forward(q, k, v, mask, state, need_weights, return_state)
        finally:
            _CALL.reset(token)

    _traced_call: Optional[_Gates] = None  # the call's gates while a compiler traces it (see _CALL)

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        if torch.compiler.is_compiling():
            call = self._traced_call if self._traced_call is not None else _Gates()
        else:
            call = _CALL.get()
        B, H, M, E = q.shape
        N, Ev = k.shape[-2], v.shape[-1]
        cached = self._state_length(state)
        if need_weights and state is not None:
            raise ValueError("need_weights=True with a state: the weights over cached keys were summed into the "
                             "state; call without state to see them")
        if self.causal and M > N:
            raise ValueError(f"attention {self.registry_name!r} aligns queries to the end of the keys: got {M} queries "
                             f"for {N} new keys after a state of {cached}; a query may not precede the new keys "
                             f"(its keys are summed into the state)")
        if state is not None and state.S.shape != (B, H, Ev, E):
            raise ValueError(f"state holds S {tuple(state.S.shape)}, incompatible with (B, H, Ev, E) = {(B, H, Ev, E)}")
        key_mask = split_key_mask(mask, state, N, cached)  # (B|1, H|1, N) or None
        out_dtype, acc = q.dtype, accumulation_dtype(q.dtype)
        with full_precision(q.device):
            q, k, v = q.to(acc), k.to(acc), v.to(acc)
            if self.normalize_qk:
                q, k = _chunkwise.l2_normalize(q), _chunkwise.l2_normalize(k)
            q = q * (self.scale if self.scale is not None else E ** -0.5)
            g = self._log_decay(call.g, B, H, N, acc, q.device)
            beta = None if call.beta is None else call.beta.to(acc)
            if key_mask is not None:  # a masked key is skipped: no write (k = v = 0) and no decay (g = 0)
                keep = key_mask.to(acc)  # (B|1, H|1, N)
                k, v = k * keep.unsqueeze(-1), v * keep.unsqueeze(-1)
                if g is not None:
                    g = g * (keep if g.dim() == 3 else keep.unsqueeze(-1))
            S0 = None if state is None else state.S.to(acc)
            # decoding (a state and a few new keys): token by token, whatever the form (the same numbers to rounding)
            form = "recurrent" if self.causal and decoding(state, N, need_weights) else self.form
            out, S = self._read(q, k, v, g, beta, S0, call.resets, form)
            weights = None
            if need_weights:
                eye = torch.eye(N, dtype=acc, device=q.device).expand(B, H, N, N)
                weights, _ = self._read(q, k, eye if key_mask is None else eye * keep.unsqueeze(-1), g, beta, None,
                                        call.resets, self.form)  # (B, H, M, N): o = W v, the values' coefficients
            if self.norm:
                inv = torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + NORM_EPS)  # (B, H, M, 1): 1 / RMS(o_i)
                out = out * inv
                weights = None if weights is None else weights * inv
        new_state = RecurrentState(S, cached + N, _summed(state, key_mask, N, q.device)) if return_state else None
        return AttentionOutput(out.to(out_dtype), None if weights is None else weights.to(out_dtype), new_state)

    def _read(self, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor],
              S0: Optional[Tensor], resets: Optional[Tensor], form: str) -> Tuple[Tensor, Tensor]:
        """``(o (B, H, M, Ev), S_N)`` in ``form`` (one of ``forms``): causal, query ``i`` reads ``S``
        after key ``N - M + i``; else every query reads ``S_N``."""
        M, N = q.shape[-2], k.shape[-2]
        run = {"chunkwise": lambda *a, **kw: _chunkwise.chunkwise(*a, **kw, chunk_size=self.chunk_size),
               "recurrent": _chunkwise.recurrent, "parallel": _chunkwise.parallel}[form]
        if not self.causal:
            _, S = run(k, k, v, g, beta, delta=self.delta, state=S0, resets=resets)  # the queries read only S_N
            return q @ S.transpose(-1, -2), S  # (B, H, M, Ev): o_i = S_N q_i
        q_all = F.pad(q, (0, 0, N - M, 0)) if N > M else q  # (B, H, N, E): queries aligned to the end of the keys
        out, S = run(q_all, k, v, g, beta, delta=self.delta, state=S0, resets=resets)
        return out[:, :, N - M:], S

    def _log_decay(self, g: Optional[Tensor], B: int, H: int, N: int, dtype: torch.dtype, device) -> Optional[Tensor]:
        """The call's ``g``, or (kernels with a decay) RetNet's ``log gamma_h`` for every key ``(B, H, N)``."""
        if g is not None:
            return g.to(dtype)
        if not self.default_decay:
            return None
        return _chunkwise.multiscale_log_decay(H, device, dtype).view(1, H, 1).expand(B, H, N)


@register("attention", "retention", "retnet")
class RetentionAttention(GatedRecurrence):
    """Retention S_t = gamma_h S_{t-1} + v_t k_t^T, o_t = S_t q_t, gamma_h = 1 - 2^(-5-h) (Sun et al. 2023, RetNet), O(N).

    Parallel form ``O = (Q K^T o D) V``, ``D_nm = gamma^{n-m}`` (``n >= m``) — ``form="parallel"``;
    chunkwise and recurrent forms as every kernel here (``GatedRecurrence``). Takes no gates.
    """

    forms = ("chunkwise", "recurrent", "parallel")
    no_gate_reason = "its decay is fixed per head (gamma_h = 1 - 2^(-5-h))"


@register("attention", "gla", "gated-linear")
class GatedLinearAttention(GatedRecurrence):
    """Gated linear attention S_t = S_{t-1} Diag(alpha_t) + v_t k_t^T, a decay per key channel (Yang et al. 2023, GLA), O(N).

    ``g = log alpha (B, H, N, E)`` per call (``GLAGates`` from ``x``: ``alpha_t = sigmoid(x W_1 W_2 + b)^{1/16}``);
    without it the fixed ``log gamma_h`` of every channel. Its pairwise decays take ``O(N C E)``
    memory: chunks of 8 by default (on one CPU thread 1.6x faster than 16 for training at 128 and
    2,048 positions, and 3-4x faster than 32).
    """

    gate = "channel"
    default_chunk = 8

    def __init__(self, *, causal: bool = False, dropout: float = 0.0, chunk_size: int = 8,
                 form: str = "chunkwise", scale: Optional[float] = None, norm: bool = True) -> None:
        super().__init__(causal=causal, dropout=dropout, chunk_size=chunk_size, form=form, scale=scale, norm=norm)

    def gate_projections(self, d_in: int, n_heads: int, d_head: int) -> nn.Module:
        return GLAGates(d_in, n_heads, d_head)


@register("attention", "deltanet", "delta-rule")
class DeltaNetAttention(GatedRecurrence):
    """DeltaNet S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T, L2-normalised q and k (Schlag et al. 2021; Yang et al. 2024), O(N).

    ``beta (B, H, N)`` in ``[0, 1]`` per call (``DeltaGates`` from ``x``: ``sigmoid(x W_beta)``); without it 1.
    """

    delta = True
    takes_beta = True
    normalize_qk = True
    default_decay = False
    no_gate_reason = "the delta rule here has no decay (a decay per head: 'gated-deltanet')"

    def gate_projections(self, d_in: int, n_heads: int, d_head: int) -> nn.Module:
        return DeltaGates(d_in, n_heads, decay=False)


@register("attention", "gated-deltanet", "gated-delta-rule")
class GatedDeltaNetAttention(GatedRecurrence):
    """Gated DeltaNet S_t = alpha_t S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T (Yang et al. 2024; Qwen3-Next), O(N).

    ``g = log alpha (B, H, N)`` and ``beta (B, H, N)`` per call (``DeltaGates`` from ``x``); without
    them RetNet's fixed ``log gamma_h`` and 1.
    """

    delta = True
    gate = "head"
    takes_beta = True
    normalize_qk = True

    def gate_projections(self, d_in: int, n_heads: int, d_head: int) -> nn.Module:
        return DeltaGates(d_in, n_heads, decay=True)


# ----------------------------------------------------------------------------- gates from the hidden states


def _at_least_float(x: Tensor) -> Tensor:
    """``x`` in float32 when it is half precision (gates are accumulated in float32), else as it is
    (float64 gates stay float64, so a float64 model is exact end to end)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class GLAGates(nn.Module):
    """GLA's forget gate (Yang et al. 2023, §4.4): ``alpha_t = sigmoid(x_t W_1 W_2 + b)^{1/tau}`` per key
    channel, a low-rank projection (rank 16) and ``tau = 16``; returns ``{"g": log alpha (B, H, N, E)}``
    (``logsigmoid(...) / tau``, in float32 for half inputs)."""

    def __init__(self, d_in: int, n_heads: int, d_head: int, rank: int = 16, tau: float = 16.0) -> None:
        super().__init__()
        self.n_heads, self.d_head, self.tau = n_heads, d_head, float(tau)
        self.down = nn.Linear(d_in, rank, bias=False)  # W_1
        self.up = nn.Linear(rank, n_heads * d_head)  # W_2, b

    def forward(self, x: Tensor) -> dict:
        B, N, _ = x.shape
        logits = _at_least_float(self.up(self.down(x)))  # (B, N, H E)
        g = F.logsigmoid(logits) / self.tau  # log alpha_t = log sigmoid(.) / tau <= 0
        return {"g": g.view(B, N, self.n_heads, self.d_head).transpose(1, 2)}  # (B, H, N, E)


class DeltaGates(nn.Module):
    """The delta rule's writing strength ``beta_t = sigmoid(x_t W_beta)`` per head and, with ``decay``,
    Gated DeltaNet's ``g_t = log alpha_t = -exp(A) softplus(x_t W_a + dt_bias)`` (Mamba-2's
    discretisation, as Qwen3-Next; ``A`` in ``[1, 16]``, ``softplus(dt_bias)`` in ``[0.001, 0.1]`` at
    initialisation). Returns ``{"beta": (B, H, N)[, "g": (B, H, N)]}`` in float32 for half inputs, else in the input dtype."""

    def __init__(self, d_in: int, n_heads: int, decay: bool) -> None:
        super().__init__()
        self.beta = nn.Linear(d_in, n_heads, bias=False)  # W_beta
        self.a = nn.Linear(d_in, n_heads, bias=False) if decay else None  # W_a
        if decay:
            self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(1.0, 16.0).log())
            dt = torch.exp(torch.empty(n_heads).uniform_(math.log(1e-3), math.log(1e-1)))
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)

    def forward(self, x: Tensor) -> dict:
        gates = {"beta": torch.sigmoid(_at_least_float(self.beta(x))).transpose(1, 2)}  # (B, H, N)
        if self.a is not None:
            a = _at_least_float(self.a(x))
            g = -self.A_log.to(a.dtype).exp() * F.softplus(a + self.dt_bias.to(a.dtype))  # (B, N, H), <= 0
            gates["g"] = g.transpose(1, 2)
        return gates
