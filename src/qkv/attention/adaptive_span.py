"""Adaptive attention span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers",
arXiv:1905.07799).

Each head learns how far back it looks. A soft mask of the distance ``x = t - r`` between query
``t`` and key ``r``,

    m_z(x) = clamp((R + z - x) / R, 0, 1)                      (ramp of width R after the span z)

multiplies the attention weights, which are renormalised:

    a_tr = m_z(t - r) exp(s_tr) / sum_q m_z(t - q) exp(s_tq)

``z`` is learned per head and kept in ``[0, S]``; the model adds the L1 penalty ``sum z`` (times a
small coefficient) to its loss (``.span_loss()``), so a head keeps a long span only where it pays.
Dynamic variant: ``z_t = S sigmoid(v^T x_t + b)`` per query position.

Structured cost: the kernel computes scores only for the keys inside the current largest span
plus the ramp, ``W = min(S, ceil(max z + R))`` keys per query (in query blocks against their band
of ``b + W - 1`` keys, as the ``window`` kernel does), so time and memory follow the learned span,
not ``S``. The mask is applied as the additive score bias ``log m_z(x)`` (``-inf`` where
``m = 0``), which is the renormalised product above and lets the fused SDPA kernel do the work.

Relative positions (``relative=True``): the scores get the paper's learned relative position
embeddings on the keys (the authors' ``key_pe``), ``s_tr = q_t . (k_r + p_{t-r}) / sqrt(d)`` with
one ``p_x`` (``d``-vector) per distance ``x in [0, S)``, shared by the heads. Without them the
soft mask's ramp is the only thing that tells near keys from far ones, so a longer span can only
blur the order (a bag of the last ``z + R`` keys): the language model then pulls every span down
to the ramp, and spans started at 0 never grow (measured on shakespeare-char, docs/reproductions).

Deviations from the paper: the dynamic span reads the head's query ``q_t = x_t W^Q_h`` rather
than ``x_t`` itself (``v^T q_t`` is a linear function of ``x_t``, restricted to ``W^Q_h``'s row
space), because a kernel sees projected heads only. The non-causal form (not in the paper) uses
``x = |t - r|`` (for the relative embeddings too). The authors share one ``p`` across layers;
here each layer has its own. The paper also keeps ``z`` in ``[0, S]`` by clamping the parameter after each
update: ``clamp_()`` does that (models call it from ``set_step``), and ``z`` is clamped again
where it is used.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _checks, masks
from ..functional import masked_softmax, scaled_scores
from ..registry import register
from ..types import AttentionOutput, KVCache
from .base import AttentionKernel
from .softmax import append_cache
from .window import band_blocks, scatter_band

__all__ = ["AdaptiveSpanAttention", "soft_span_mask"]


def soft_span_mask(distance: Tensor, z: Tensor, ramp: float) -> Tensor:
    """``m_z(x) = clamp((R + z - x) / R, 0, 1)`` for distances ``x`` and spans ``z`` (broadcast)."""
    return ((ramp + z - distance) / ramp).clamp(0.0, 1.0)


def _attend_band(q_blocks: Tensor, k_blocks: Tensor, v_blocks: Tensor, bias: Tensor, row_valid: Tensor,
                 need_weights: bool, dropout_p: float):
    """Attention of each query block ``(..., b, E)`` to its key band ``(..., W, E)`` with the score
    bias ``(..., b, W)`` (``log m``, ``-inf`` outside); rows without a key (``row_valid`` False)
    give zeros. Every score this kernel computes is computed here (tests count them)."""
    if not need_weights:
        out = F.scaled_dot_product_attention(q_blocks, k_blocks, v_blocks, attn_mask=bias.to(q_blocks.dtype),
                                             dropout_p=dropout_p)
        return out.masked_fill(~row_valid.unsqueeze(-1), 0.0), None
    scale = 1.0 / math.sqrt(q_blocks.shape[-1])
    allowed = torch.isfinite(bias) & row_valid.unsqueeze(-1)
    scores = scaled_scores(q_blocks, k_blocks, scale)  # (..., b, W), float32 for half types
    # a_tr = m exp(s) / sum m exp(s) = softmax(s + log m) over the keys with m > 0
    weights = masked_softmax(scores + bias.masked_fill(~allowed, 0.0).to(scores.dtype), allowed).to(v_blocks.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ v_blocks, weights


@register("attention", "adaptive-span", "adaptive_span")
class AdaptiveSpanAttention(AttentionKernel):
    """Adaptive attention span (Sukhbaatar et al. 2019): softmax weights times m_z(t - r) = clamp((R + z - t + r)/R, 0, 1), renormalised.

    Args:
        max_span: ``S``, the longest span (a query sees at most its last ``S`` keys, itself included).
        ramp: ``R``, width of the soft ramp (the paper: 32).
        n_heads: one learned span per head; None shares one span among all heads.
        init_span: initial ``z`` in positions, in ``[0, S]``; None: ``S`` (the full span). The
            paper's code starts from 0 and lets spans grow.
        dynamic: ``z_t = S sigmoid(v^T q_t + b)`` per query position and head (needs ``d_head``).
        d_head: head size (filled in by ``MultiHeadAttention``); needed when ``dynamic``.
        block: query block length (default ``W / 4`` clamped to ``[64, 256]``).
        relative: add the learned relative position embeddings ``q_t . p_{t-r}`` to the scores (the
            paper's ``key_pe``; needs ``d_head``), ``p ~ N(0, 1)`` as in the authors' code.
    Shapes: ``q (B, H, M, E)``, ``k, v (B, H, N, E)`` -> ``(B, H, M, E)``. Cost
    ``O(M (b + W) E)`` per head with ``W = min(S, ceil(max z + R))``. Incremental decoding keeps
    the last ``S - 1`` keys and values (a bounded ``KVCache``).
    """

    supports_mask = "key_padding"
    supports_state = True

    def __init__(self, *, max_span: int, ramp: float = 32, n_heads: Optional[int] = None,
                 init_span: Optional[float] = None, dynamic: bool = False, d_head: Optional[int] = None,
                 block: Optional[int] = None, relative: bool = False, causal: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__(causal=causal, dropout=dropout)
        self.max_span = _checks.positive_int("max_span", max_span)
        if isinstance(ramp, bool) or not isinstance(ramp, (int, float)) or not ramp > 0:
            raise ValueError(f"ramp must be a positive number (R, in positions), got {ramp!r}")
        self.ramp = float(ramp)
        self.n_heads = None if n_heads is None else _checks.positive_int("n_heads", n_heads)
        init = float(self.max_span) if init_span is None else init_span
        if isinstance(init, bool) or not isinstance(init, (int, float)) or not 0 <= init <= self.max_span:
            raise ValueError(f"init_span must be a number in [0, max_span={self.max_span}], got {init_span!r}")
        if not isinstance(dynamic, bool):
            raise TypeError(f"dynamic must be a bool, got {dynamic!r}")
        if not isinstance(relative, bool):
            raise TypeError(f"relative must be a bool, got {relative!r}")
        self.dynamic = dynamic
        self.relative = relative
        if relative:
            if d_head is None:
                raise ValueError("relative=True needs d_head (the head size; MultiHeadAttention fills it in)")
            # p_x for the distances x = 0 .. S - 1, (d, S), shared by the heads (the authors' key_pe)
            self.key_pe = nn.Parameter(torch.randn(_checks.positive_int("d_head", d_head), self.max_span))
        self.block = None if block is None else _checks.positive_int("block", block)
        heads = self.n_heads or 1
        frac = init / self.max_span
        if dynamic:
            if d_head is None:
                raise ValueError("dynamic=True needs d_head (the head size; MultiHeadAttention fills it in)")
            _checks.positive_int("d_head", d_head)
            # z_t = S sigmoid(v^T q_t + b): v starts at 0, b at logit(init / S), so z_t starts at init_span
            self.span_weight = nn.Parameter(torch.zeros(heads, d_head))  # v, one per head
            logit = math.log(max(frac, 1e-4)) - math.log(max(1.0 - frac, 1e-4))
            self.span_bias = nn.Parameter(torch.full((heads,), logit))  # b
            self._last_spans: Optional[Tensor] = None  # (heads,) mean z_t of the last call, for span_loss
        else:
            self.span = nn.Parameter(torch.full((heads,), frac))  # z / S, kept in [0, 1]

    def extra_repr(self) -> str:
        return (f"max_span={self.max_span}, ramp={self.ramp}, n_heads={self.n_heads}, dynamic={self.dynamic}, "
                f"relative={self.relative}, {super().extra_repr()}")

    # ------------------------------------------------------------------ spans

    def spans(self) -> Tensor:
        """The learned spans ``z`` in positions, ``(n_heads,)`` (or ``(1,)`` when shared); for the
        dynamic variant the mean ``z_t`` of the last call (``S sigmoid(b)`` before any call)."""
        if not self.dynamic:
            return self.max_span * self.span.clamp(0.0, 1.0)
        if self._last_spans is not None:
            return self._last_spans
        return self.max_span * torch.sigmoid(self.span_bias)

    def span_loss(self) -> Tensor:
        """The L1 span penalty of this layer, ``sum_h z_h`` (in positions); the model scales it."""
        return self.spans().sum()

    @torch.no_grad()
    def clamp_(self) -> None:
        """Keep the learned span in ``[0, S]`` (the paper clamps after each update)."""
        if not self.dynamic:
            self.span.clamp_(0.0, 1.0)

    def current_span(self) -> int:
        """``W = min(S, ceil(max z + R))``: keys per query whose weight can be non-zero (static spans)."""
        if self.dynamic:
            return self.max_span
        return self._width(float(self.spans().detach().max()))

    def _width(self, z_max: float) -> int:
        return max(1, min(self.max_span, math.ceil(z_max + self.ramp)))

    @property
    def exact(self) -> bool:  # type: ignore[override]
        """Plain softmax on its pattern when every mask value inside the band is 1 (``z >= W - 1``)."""
        if self.dynamic:
            return False
        z = self.spans().detach()
        return bool(z.min() >= self._width(float(z.max())) - 1)

    def pattern(self, n_queries: int, n_keys: int):
        return masks.window(self.current_span() - 1, causal=self.causal, offset=n_keys - n_queries)

    def _state_length(self, state) -> int:
        return state.length if isinstance(state, KVCache) else 0

    # ------------------------------------------------------------------ attention

    def _check_heads(self, H: int) -> None:
        if self.n_heads is not None and H != self.n_heads:
            raise ValueError(f"q has {H} heads, but the kernel learns spans for n_heads={self.n_heads}")

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        self._check_heads(H)
        cache = None
        if state is not None or return_state:
            k, v, cache = append_cache(state, k, v, keep=self.max_span - 1)
        N = k.shape[-2]
        S = self.max_span
        if M == 0:
            weights = q.new_zeros(B, H, 0, N) if need_weights else None
            return AttentionOutput(q.new_zeros(B, H, 0, v.shape[-1]), weights, cache)

        if self.dynamic:
            # z_t = S sigmoid(v^T q_t + b)   (B, H, M)
            z = S * torch.sigmoid(torch.einsum("bhme,he->bhm", q, self.span_weight.to(q.dtype))
                                  + self.span_bias.to(q.dtype).view(-1, 1))
            self._last_spans = z.float().mean(dim=(0, 2))
            width = self._width(float(z.detach().max()) if z.numel() else 0.0)  # no query (B = 0): any width
        else:
            z = self.spans().to(q.dtype).view(-1, 1, 1, 1)  # (H|1, 1, 1, 1)
            width = self.current_span()
        r = min(width - 1, N + M)  # keys before (and, bidirectional, after) a query that can carry weight
        right = 0 if self.causal else r
        # blocks of W / 4 queries (64 .. 256): the band of W + b keys then wastes at most ~25-60% of its scores
        b = min(M, self.block or max(64, min(256, (r + 1) // 4)))
        nb = -(-M // b)  # query blocks
        W = b + r + right  # keys seen by one query block

        q_blocks, k_blocks, v_blocks, x, valid, key_pos = band_blocks(q, k, v, mask, r, right, b)
        distance = x.abs().to(q.dtype)  # (b, W)
        if self.dynamic:
            z_blocks = F.pad(z, (0, nb * b - M)).view(B, H, nb, b, 1)  # (B, H, nb, b, 1)
            m = soft_span_mask(distance, z_blocks, self.ramp)  # (B, H, nb, b, W)
        else:
            m = soft_span_mask(distance, z, self.ramp)  # (H|1, 1, b, W)
        allowed = valid & (m > 0)
        # log m where m > 0 (m clamped first so that log's gradient stays finite where m = 0)
        bias = torch.where(allowed, m.clamp_min(torch.finfo(m.dtype).tiny).log(), float("-inf"))
        if self.relative:
            # + q_t . p_{t-r} / sqrt(E) (SDPA scales only q . k): the relative position embeddings
            pe = self.key_pe.to(q.dtype)[:, distance.long().clamp(0, S - 1)]  # (E, b, W): p_x at each x
            bias = bias + torch.einsum("bhnie,eiw->bhniw", q_blocks, pe) / math.sqrt(E)  # (B, H, nb, b, W)
        row_valid = allowed.any(-1)  # (..., nb, b)
        bias = bias.masked_fill(~row_valid.unsqueeze(-1), 0.0)  # no -inf-only rows (zeroed after)

        dropout_p = self.dropout if self.training else 0.0
        out, weights = _attend_band(q_blocks, k_blocks, v_blocks, bias, row_valid, need_weights, dropout_p)
        out = out.reshape(B, H, nb * b, v.shape[-1])[:, :, :M]  # (B, H, M, Ev)
        if weights is None:
            return AttentionOutput(out, None, cache)
        # the band scattered into (B, H, M, N) for inspection (O(M N): on request only)
        return AttentionOutput(out, scatter_band(weights.expand(B, H, nb, b, W), key_pos, N)[:, :, :M], cache)
