"""Pure tensor functions of attention: masked softmax, generic attention pooling and
Nadaraya–Watson kernel regression.

Shapes use ``...`` for any leading batch dimensions, ``M`` queries, ``N`` keys, ``D`` features.
Boolean masks follow ``F.scaled_dot_product_attention``: True means "may attend".
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _checks, _chunkwise
from .types import AttentionOutput

__all__ = ["masked_softmax", "scaled_scores", "attend", "nadaraya_watson", "dot_score", "scaled_dot_score", "cosine_score",
           "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda", "fused_recurrent_kda"]

ScoreFn = Callable[[Tensor, Tensor], Tensor]


def masked_softmax(scores: Tensor, mask: Optional[Tensor] = None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` restricted to the positions where ``mask`` is True.

    ``weights_i = mask_i exp(s_i) / sum_j mask_j exp(s_j)``; a row whose positions are all masked
    returns zeros (never NaN). Computed in float32 for half types (exp of large logits overflows
    float16) and returned in the input dtype.

    Args:
        scores: ``(..., N)`` floating-point scores.
        mask: bool, broadcastable to ``scores``; None means nothing is masked.
    Returns:
        weights, same shape and dtype as ``scores``.
    """
    _checks.tensor("scores", scores, floating=True)
    if mask is None:
        return torch.softmax(scores, dim=dim, dtype=torch.float32).to(scores.dtype) if scores.dtype in (
            torch.float16, torch.bfloat16) else torch.softmax(scores, dim=dim)
    _checks.mask("mask", mask, scores.shape)
    # Accumulate in float32 for half types; float64 stays float64 (gradcheck).
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    # finfo.min rather than -inf: a fully masked row stays finite (uniform), and the final
    # multiplication by the mask turns it into zeros instead of NaN.
    filled = work.masked_fill(~mask, torch.finfo(work.dtype).min)
    weights = torch.softmax(filled, dim=dim) * mask
    return weights.to(scores.dtype)


def scaled_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``(q * scale) k^T``: ``(..., M, E)``, ``(..., N, E)`` -> ``(..., M, N)``.

    Scaled before the product, and in float32 for half types: ``q . k`` overflows float16 long
    before ``q . k / sqrt(d)`` does (``masked_softmax`` works in float32 for them anyway).
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k = q.float(), k.float()
    return (q * scale) @ k.transpose(-1, -2)


def dot_score(query: Tensor, key: Tensor) -> Tensor:
    """``s^T h`` (Luong et al. 2015): ``(..., M, D)``, ``(..., N, D)`` -> ``(..., M, N)``."""
    return query @ key.transpose(-1, -2)


def scaled_dot_score(query: Tensor, key: Tensor) -> Tensor:
    """``s^T h / sqrt(d_k)`` (Vaswani et al. 2017): ``(..., M, D)``, ``(..., N, D)`` -> ``(..., M, N)``."""
    return (query @ key.transpose(-1, -2)) / math.sqrt(key.shape[-1])


def cosine_score(query: Tensor, key: Tensor, eps: float = 1e-8) -> Tensor:
    """``cos(s, h)`` (Graves et al. 2014, content addressing); a zero vector scores 0."""
    return F.normalize(query, dim=-1, eps=eps) @ F.normalize(key, dim=-1, eps=eps).transpose(-1, -2)


_SCORES = {"dot": dot_score, "scaled_dot": scaled_dot_score, "cosine": cosine_score}


def _score(name: str) -> ScoreFn:
    if name not in _SCORES:
        raise ValueError(f"score must be one of {sorted(_SCORES)} or a callable, got {name!r}")
    return _SCORES[name]


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    score: Union[str, ScoreFn] = "scaled_dot",
    need_weights: bool = False,
) -> AttentionOutput:
    """Attention pooling ``out_i = sum_j softmax_j(score(q_i, k_j)) v_j``.

    Args:
        query: ``(..., M, D)``; key: ``(..., N, D)``; value: ``(..., N, Dv)``.
        mask: bool broadcastable to ``(..., M, N)``, True = may attend.
        score: ``"dot"``, ``"scaled_dot"`` (``q.k / sqrt(D)``, the default), ``"cosine"``, or a
            callable ``(query, key) -> (..., M, N)`` (e.g. a module from ``qkv.scores``).
        need_weights: also return the ``(..., M, N)`` weights.
    Returns:
        ``AttentionOutput(output (..., M, Dv), weights or None, None)``.
    """
    _checks.tensor("query", query, floating=True)
    _checks.tensor("key", key, floating=True)
    _checks.tensor("value", value, floating=True)
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            f"query, key and value must be at least 2-D (..., length, features), got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    _checks.same("key", key.shape[-2], "value", value.shape[-2], "the number of positions (dim -2)")
    fn = _score(score) if isinstance(score, str) else score
    if not callable(fn):
        raise TypeError(f"score must be a str or callable, got {type(score).__name__}")
    if isinstance(score, str):
        _checks.same("query", query.shape[-1], "key", key.shape[-1], "the feature size (dim -1)")
    scores = fn(query, key)  # (..., M, N)
    expected = (*torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]), query.shape[-2], key.shape[-2])
    if tuple(scores.shape) != expected:
        raise ValueError(f"score returned shape {tuple(scores.shape)}, expected {expected}")
    weights = masked_softmax(scores, _checks.mask("mask", mask, scores.shape))
    output = weights @ value  # (..., M, Dv)
    return AttentionOutput(output, weights if need_weights else None, None)


def nadaraya_watson(
    x_query: Tensor, x_keys: Tensor, y_values: Tensor, width: Union[float, Tensor] = 1.0, mask: Optional[Tensor] = None
) -> AttentionOutput:
    """Nadaraya–Watson kernel regression (Nadaraya 1964; Watson 1964) as attention pooling.

    ``f(x) = sum_i softmax_i(-(||x - x_i|| w)^2 / 2) y_i`` — a Gaussian kernel of bandwidth
    ``1/w`` normalised over the training points; ``w`` may be a learnable tensor.

    Args:
        x_query: ``(..., M, D)`` inputs; 1-D ``(M,)`` means ``M`` scalars.
        x_keys: ``(..., N, D)`` training inputs; 1-D ``(N,)`` means ``N`` scalars.
        y_values: ``(..., N)`` scalar targets or ``(..., N, Dv)``.
        width: ``w``, a float or a tensor broadcastable to the ``(..., M, N)`` scores.
        mask: optional bool broadcastable to ``(..., M, N)``, True = may attend.
    Returns:
        ``AttentionOutput(output (..., M) or (..., M, Dv), weights (..., M, N), None)``.
    """
    _checks.tensor("x_query", x_query, floating=True)
    _checks.tensor("x_keys", x_keys, floating=True)
    _checks.tensor("y_values", y_values, floating=True)
    if x_query.dim() == 1:
        x_query = x_query.unsqueeze(-1)  # (M, 1)
    if x_keys.dim() == 1:
        x_keys = x_keys.unsqueeze(-1)  # (N, 1)
    _checks.same("x_query", x_query.shape[-1], "x_keys", x_keys.shape[-1], "the feature size (dim -1)")
    scalar_targets = y_values.dim() == x_keys.dim() - 1
    n_targets = y_values.shape[-1] if scalar_targets else y_values.shape[-2] if y_values.dim() >= 2 else -1
    _checks.same("x_keys", x_keys.shape[-2], "y_values", n_targets, "the number of points")
    # squared distance ||x - x_i||^2
    diff2 = (x_query.unsqueeze(-2) - x_keys.unsqueeze(-3)).pow(2).sum(-1)  # (..., M, N)
    w2 = width.pow(2) if isinstance(width, Tensor) else float(width) ** 2
    scores = -diff2 * w2 / 2
    weights = masked_softmax(scores, _checks.mask("mask", mask, scores.shape))
    if scalar_targets:
        output = (weights @ y_values.unsqueeze(-1)).squeeze(-1)  # (..., M)
    else:
        output = weights @ y_values  # (..., M, Dv)
    return AttentionOutput(output, weights, None)


# --------------------------------------------------------------------- the gated delta rule and KDA, fla's signatures


def chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
                           initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[Tensor] = None,
                           chunk_size: int = 64) -> tuple[Tensor, Optional[Tensor]]:
    """The gated delta rule (Yang et al. 2024, Gated DeltaNet; the attention of Qwen3-Next) in its
    chunkwise form, with fla's signature and layout — a drop-in for ``fla.ops.gated_delta_rule.
    chunk_gated_delta_rule`` and transformers' ``torch_chunk_gated_delta_rule`` (qkv's engine,
    ``qkv/_chunkwise.py``: the UT transform batched over every chunk, one linear scan over chunks).

    ``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t (scale q_t)``.

    Args:
        q, k: ``(B, T, H, K)``; v: ``(B, T, Hv, V)``, ``Hv`` a multiple of ``H`` (each query/key head
            serves ``Hv / H`` consecutive value heads, as transformers).
        g: ``(B, T, Hv)``, the log of the decay: finite, ``<= 0``. beta: ``(B, T, Hv)`` in ``[0, 1]``.
        scale: the queries' factor (default ``K^{-1/2}``, applied after the L2 norm).
        initial_state: ``(B, Hv, K, V)`` — fla's and transformers' layout, the transpose of the
            paper's ``d_v x d_k`` state that qkv keeps inside.
        output_final_state: also return the state after the last token, ``(B, Hv, K, V)``.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (``x / sqrt(|x|^2 + 1e-6)``, fla's).
        cu_seqlens: ``(n + 1,)`` document offsets of a packed batch (``B = 1``): the state restarts
            at each document (not with ``initial_state`` or ``output_final_state``: fla's per-document
            states are not kept).
        chunk_size: positions per chunk (the result is the same to rounding).
    Returns:
        ``(o (B, T, Hv, V)`` in q's dtype, the final state ``(B, Hv, K, V)`` or None``); computed in
        float32 for half inputs (float64 stays float64), the state in that precision.
    """
    return _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             cu_seqlens, _checks.positive_int("chunk_size", chunk_size))


def fused_recurrent_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                                     scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                                     cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """:func:`chunk_gated_delta_rule` one token at a time (decoding; fla's ``fused_recurrent_gated_delta_rule``,
    transformers' ``torch_recurrent_gated_delta_rule``): the same arguments but ``chunk_size``, the same results."""
    return _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             cu_seqlens, None)


def chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Optional[Tensor] = None,
              chunk_size: int = 8) -> tuple[Tensor, Optional[Tensor]]:
    """Kimi Delta Attention (KDA; Kimi Team 2025, Kimi Linear, arXiv:2510.26692): the gated delta rule
    with a decay per key channel, in its chunkwise form, with fla's signature and layout — a drop-in
    for ``fla.ops.kda.chunk_kda`` and transformers' ``chunk_kimi_delta_attention`` (qkv's engine,
    ``qkv/_chunkwise.py``, as :func:`chunk_gated_delta_rule`; in the paper's ``d_v x d_k`` layout the
    state is ``S_{t-1} Diag(exp(g_t)) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``).

    ``S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T`` (``K x V``), ``o_t = S_t^T (scale q_t)``.

    Args:
        q, k: ``(B, T, H, K)``; v: ``(B, T, Hv, V)``, ``Hv`` a multiple of ``H`` (fla's grouped value heads).
        g: ``(B, T, Hv, K)``, the log of the decay of each key channel: finite, ``<= 0`` (fla's
            ``use_gate_in_kernel=False``: the gate already computed, as transformers' layer passes it).
        beta: ``(B, T, Hv)`` in ``[0, 1]``.
        scale, initial_state ``(B, Hv, K, V)``, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens:
            as :func:`chunk_gated_delta_rule`.
        chunk_size: positions per chunk (the result is the same to rounding). 8 by default: the pairwise
            per-channel decays cost ``O(T C K)``, and on one CPU thread chunks of 8 took 0.6-0.7 of the
            time of 16 and 0.3-0.4 of 32 (T = 2,048 and 8,192, 8 heads of 128, forward and backward).
    Returns:
        ``(o (B, T, Hv, V)`` in q's dtype, the final state ``(B, Hv, K, V)`` or None``); computed in
        float32 for half inputs (float64 stays float64). Cost: ``O(T C K)`` memory for the pairwise
        per-channel decays of chunks of ``C`` positions.
    """
    return _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             cu_seqlens, _checks.positive_int("chunk_size", chunk_size), channel=True)


def fused_recurrent_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
                        initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                        use_qk_l2norm_in_kernel: bool = False,
                        cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """:func:`chunk_kda` one token at a time (decoding; fla's ``fused_recurrent_kda``, transformers'
    ``recurrent_kimi_delta_attention``): the same arguments but ``chunk_size``, the same results."""
    return _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             cu_seqlens, None, channel=True)


def _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm, cu_seqlens,
                      chunk_size: Optional[int], channel: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """The gated delta rule's drop-ins and KDA's: checks at the boundary, fla's layout to the engine's
    and back. ``g`` is one log decay per value head ``(B, T, Hv)``, or with ``channel`` one per key
    channel of each value head ``(B, T, Hv, K)`` (KDA); ``chunk_size`` None: token by token."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(name, x, ndim=4, floating=True)
    B, T, H, K = k.shape
    Hv, V = v.shape[-2:]
    if tuple(q.shape) != (B, T, H, K):
        raise ValueError(f"q must have k's shape (B, T, H, K) = {(B, T, H, K)}, got {tuple(q.shape)}")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v must be (B, T, Hv, V) with (B, T) = {(B, T)} of q and k, got {tuple(v.shape)}")
    if H == 0 or Hv % H:
        raise ValueError(f"v's heads ({Hv}) must be a multiple of q's and k's heads ({H})")
    _chunkwise.check_gates(g, beta, ((B, T, Hv, K) if channel else (B, T, Hv),), (B, T, Hv))
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
        raise ValueError(f"scale must be a float > 0 or None (K^-1/2), got {scale!r}")
    if initial_state is not None:
        _checks.tensor("initial_state", initial_state, ndim=4, floating=True)
        if tuple(initial_state.shape) != (B, Hv, K, V):
            raise ValueError(f"initial_state must have shape (B, Hv, K, V) = {(B, Hv, K, V)}, got {tuple(initial_state.shape)}")
    resets = None
    if cu_seqlens is not None:
        _checks.tensor("cu_seqlens", cu_seqlens, ndim=1)
        if cu_seqlens.is_floating_point() or B != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must be integer offsets [0, ..., T] of the documents packed in one row "
                             f"(B = 1), got dtype {cu_seqlens.dtype}, {cu_seqlens.numel()} offsets for B = {B}")
        if not torch.compiler.is_compiling() and (int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != T
                                                  or bool((cu_seqlens[1:] < cu_seqlens[:-1]).any())):
            raise ValueError(f"cu_seqlens must rise from 0 to T = {T}, got {cu_seqlens.tolist()}")
        if initial_state is not None or output_final_state:
            raise ValueError("cu_seqlens with initial_state or output_final_state: the states of each packed "
                             "document are not kept; pass the documents as a batch instead")
        resets = _chunkwise.resets_from_cu_seqlens(cu_seqlens, T)
    out_dtype = q.dtype
    acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    heads = lambda x: x.transpose(1, 2).to(acc)  # (B, T, H, *) -> (B, H, T, *)
    q, k, v, g, beta = heads(q), heads(k), heads(v), heads(g), beta.transpose(1, 2).to(acc)  # g: (B, Hv, T[, K])
    if use_qk_l2norm:
        q, k = _chunkwise.l2_normalize(q), _chunkwise.l2_normalize(k)
    q = q * (K ** -0.5 if scale is None else float(scale))
    S0 = None if initial_state is None else initial_state.to(acc).transpose(-1, -2)  # (B, Hv, V, K): the paper's S
    if chunk_size is None:
        if Hv != H:
            q, k = q.repeat_interleave(Hv // H, dim=1), k.repeat_interleave(Hv // H, dim=1)  # (B, Hv, T, K)
        o, S = _chunkwise.recurrent(q, k, v, g, beta, delta=True, state=S0, resets=resets)
    else:
        # q and k keep their H heads: the engine shares their products across each group of value heads
        o, S = _chunkwise.chunkwise(q, k, v, g, beta, delta=True, state=S0, resets=resets, chunk_size=chunk_size)
    out = o.transpose(1, 2).to(out_dtype).contiguous()  # (B, T, Hv, V)
    return out, (S.transpose(-1, -2).contiguous() if output_final_state else None)  # (B, Hv, K, V)
