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

Positions (``position_embeddings=True``): the paper's score has a learned relative position
embedding on the keys (§2, after Shaw et al. 2018),

    s_tr = q_t^T (k_r + p_{t-r}) / sqrt(d),          p_0 .. p_{S-1}: one (S, d) table,

one table for all heads; the authors' code also shares it across layers, and so does a stack
(``share_across_layers``). The term ``q_t . p_{t-r}`` is computed for the distances of the band
only (``O(M W d)``, like the scores) and joins the score bias. Non-causal: distances ``-(S-1) .. S-1``.

Deviations from the paper: the dynamic span reads the head's query ``q_t = x_t W^Q_h`` rather
than ``x_t`` itself (``v^T q_t`` is a linear function of ``x_t``, restricted to ``W^Q_h``'s row
space), because a kernel sees projected heads only. The non-causal form (not in the paper) uses
``x = |t - r|``. The paper also keeps ``z`` in ``[0, S]`` by clamping the parameter after each
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
from ._ops import append_cache, band_blocks, fused_blocks, scatter_band
from .base import AttentionKernel, clamp_knob

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
        out = fused_blocks(q_blocks, k_blocks, v_blocks, bias.to(q_blocks.dtype), dropout_p)
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
        position_embeddings: add the paper's learned relative position embeddings ``p_{t-r}`` to
            the keys (needs ``d_head``); shared across the layers of a stack.
    Shapes: ``q (B, H, M, E)``, ``k, v (B, H, N, E)`` -> ``(B, H, M, E)``. Cost
    ``O(M (b + W) E)`` per head with ``W = min(S, ceil(max z + R))``. Incremental decoding keeps
    the last ``S - 1`` keys and values (a bounded ``KVCache``).
    """

    supports_mask = "key_padding"
    context_parallel = "ulysses-batch"  # qkv.parallel: per-head spans, so whole batch rows per rank
    static_length = "its queries are cut into blocks of the spans' band, in numbers of the length"
    supports_state = True
    state_type = KVCache

    def __init__(self, *, max_span: int, ramp: float = 32, n_heads: Optional[int] = None,
                 init_span: Optional[float] = None, dynamic: bool = False, d_head: Optional[int] = None,
                 block: Optional[int] = None, position_embeddings: bool = False, causal: bool = False,
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
        self.dynamic = dynamic
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
        if not isinstance(position_embeddings, bool):
            raise TypeError(f"position_embeddings must be a bool, got {position_embeddings!r}")
        self.key_pe = None
        if position_embeddings:
            if d_head is None:
                raise ValueError("position_embeddings=True needs d_head (the head size; MultiHeadAttention fills it in)")
            n_distances = self.max_span if causal else 2 * self.max_span - 1
            # p_d for d = 0 .. S-1 (non-causal: -(S-1) .. S-1 at row d + S - 1); N(0, 1) as the authors' code
            self.key_pe = nn.Parameter(torch.randn(n_distances, _checks.positive_int("d_head", d_head)))

    @classmethod
    def head_kwargs(cls, n_heads: int, d_head: int) -> dict:
        return {"n_heads": n_heads, "d_head": d_head}

    @classmethod
    def default_knobs(cls, max_len: int, n_heads: int, d_head: int) -> dict:
        """Spans up to ``S = max_len / 2`` in ``[1, 512]``, a ramp ``R = S / 4`` in ``[1, 32]`` (the paper's 32)."""
        S = clamp_knob(max_len // 2, 1, 512)
        return {**super().default_knobs(max_len, n_heads, d_head), "max_span": S, "ramp": clamp_knob(S // 4, 1, 32)}

    @classmethod
    def knob_choices(cls) -> dict:
        return {"max_span": (1, 2, 3, 4, 5), "ramp": (1, 2, 3.5), "block": (None, 1, 2, 3),
                "init_span": (None, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 5.0)}

    def extra_repr(self) -> str:
        return (f"max_span={self.max_span}, ramp={self.ramp}, n_heads={self.n_heads}, dynamic={self.dynamic}, "
                f"position_embeddings={self.key_pe is not None}, {super().extra_repr()}")

    def share_across_layers(self, first: "AttentionKernel") -> None:
        """One position table for the whole stack, as the authors' code (its ``key_pe``)."""
        if self.key_pe is not None and isinstance(first, AdaptiveSpanAttention) and first.key_pe is not None:
            _checks.same("key_pe", tuple(self.key_pe.shape), "the first layer's", tuple(first.key_pe.shape), "the shape")
            self.key_pe = first.key_pe

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
        if self.dynamic or self.key_pe is not None:
            return False
        z = self.spans().detach()
        return bool(z.min() >= self._width(float(z.max())) - 1)

    def pattern(self, n_queries: int, n_keys: int):
        return masks.window(self.current_span() - 1, causal=self.causal, offset=n_keys - n_queries)

    # ------------------------------------------------------------------ attention

    def _check_heads(self, H: int) -> None:
        if self.n_heads is not None and H != self.n_heads:
            raise ValueError(f"q has {H} heads, but the kernel learns spans for n_heads={self.n_heads}")

    def _full_span(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        """Softmax attention over every key (causal: aligned to the end of the keys), fused."""
        M, N = q.shape[-2], k.shape[-2]
        dropout_p = self.dropout if self.training else 0.0
        if mask is None and (not self.causal or M == N):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=dropout_p)
        allowed = masks.causal_mask(M, N, offset=N - M, device=q.device) if self.causal else None
        if mask is not None:
            allowed = mask if allowed is None else mask & allowed  # (B|1, 1, M|1, N) & (M, N)
        row_valid = allowed.any(-1, keepdim=True)  # (..., M, 1): a row with no key gives zeros
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~row_valid, dropout_p=dropout_p)
        return out.masked_fill(~row_valid, 0.0)

    def _position_scores(self, q_blocks: Tensor, distance: Tensor, left: int, right: int) -> Tensor:
        """``q_t . p_{t-r} / sqrt(d)`` on the band: ``q_blocks (B, H, nb, b, E)``, signed
        ``distance (b, W)`` within ``[-right, left]`` on the band -> ``(B, H, nb, b, W)`` (float32
        for half inputs; entries off the band hold some distance's value and are masked)."""
        E = q_blocks.shape[-1]
        if self.key_pe.shape[-1] != E:
            raise ValueError(f"q has head size {E}, but the position embeddings were built for d_head={self.key_pe.shape[-1]}")
        acc = torch.float32 if q_blocks.dtype in (torch.float16, torch.bfloat16) else q_blocks.dtype
        zero = 0 if self.causal else self.max_span - 1  # row of distance 0
        table = self.key_pe[zero - right:zero + left + 1].to(acc)  # (right + 1 + left, E): distances -right .. left
        per_distance = q_blocks.to(acc) @ table.T / math.sqrt(E)  # (B, H, nb, b, right + 1 + left)
        index = (distance + right).clamp(0, left + right)  # (b, W)
        return per_distance.gather(-1, index.expand(*per_distance.shape[:-1], index.shape[-1]))

    def _validate(self, q, k, v, state):
        self._check_heads(q.shape[1])

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        B, H, M, E = q.shape
        cache = None
        if state is not None or return_state:
            k, v, cache = append_cache(state, k, v, keep=self.max_span - 1)
        N = k.shape[-2]
        S = self.max_span
        if M == 0:
            weights = q.new_zeros(B, H, 0, N) if need_weights else None
            return AttentionOutput(q.new_zeros(B, H, 0, v.shape[-1]), weights, cache)

        # A traced graph (torch.compile, torch.export) cannot size the band by the spans' values: it takes
        # the widest band, S keys, where the soft mask gives the keys beyond a span weight 0 as well.
        compiling = torch.compiler.is_compiling()
        if self.dynamic:
            # z_t = S sigmoid(v^T q_t + b)   (B, H, M)
            z = S * torch.sigmoid(torch.einsum("bhme,he->bhm", q, self.span_weight.to(q.dtype))
                                  + self.span_bias.to(q.dtype).view(-1, 1))
            self._last_spans = z.float().mean(dim=(0, 2))
        if self.dynamic and compiling:
            width = S
        elif self.dynamic:
            z_max = float(z.detach().max()) if z.numel() else 0.0  # no query (B = 0): any width
            if math.isnan(z_max):
                raise ValueError("q holds NaN: the dynamic span z_t = S sigmoid(v^T q_t + b) of some query is NaN, so "
                                 "no span can be set (check the layer's inputs for NaN)")
            width = self._width(z_max)
        else:
            z = self.spans().to(q.dtype).view(-1, 1, 1, 1)  # (H|1, 1, 1, 1)
            width = S if compiling else self.current_span()
        if (not compiling and not self.dynamic and self.key_pe is None and not need_weights and M <= N <= S
                and float(z.detach().min()) > N - 1):
            # the span covers the whole context: m_z(x) = 1 for every distance x <= N - 1 (clamped,
            # so z has no gradient there either) and, without position embeddings, the renormalised
            # weights are plain softmax attention -- one fused SDPA call instead of bands with a float bias
            return AttentionOutput(self._full_span(q, k, v, mask), None, cache)
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
        bias = m.clamp_min(torch.finfo(m.dtype).tiny).log()
        if self.key_pe is not None:  # + q_t . p_{t-r} / sqrt(d) (the paper's position term)
            bias = bias + self._position_scores(q_blocks, x, r, right)
        bias = torch.where(allowed, bias, float("-inf"))
        row_valid = allowed.any(-1)  # (..., nb, b)
        bias = bias.masked_fill(~row_valid.unsqueeze(-1), 0.0)  # no -inf-only rows (zeroed after)

        dropout_p = self.dropout if self.training else 0.0
        out, weights = _attend_band(q_blocks, k_blocks, v_blocks, bias, row_valid, need_weights, dropout_p)
        out = out.reshape(B, H, nb * b, v.shape[-1])[:, :, :M]  # (B, H, M, Ev)
        if weights is None:
            return AttentionOutput(out, None, cache)
        # the band scattered into (B, H, M, N) for inspection (O(M N): on request only)
        return AttentionOutput(out, scatter_band(weights.expand(B, H, nb, b, W), key_pos, N)[:, :, :M], cache)
