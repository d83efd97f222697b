"""Beam search over any step-wise decoder (Sutskever et al. 2014, arXiv:1409.3215; Bahdanau et al.
2014 used a beam to find ``argmax_y p(y | x)``), with greedy decoding as its ``beam_size=1`` case.

The decoder is a function ``step(tokens (B*K,), state) -> (log_probs (B*K, V), state, extra)``:
the search knows nothing about RNNs or Transformers. ``state`` is any nest (tuple, NamedTuple,
dict, list) of tensors whose dim 0 is the ``B*K`` hypothesis rows; after each step the search
reorders it with ``reorder(state, index)`` (default: ``index_select`` on every tensor leaf; pass
your own for a state with other layouts, e.g. a KV cache stored heads-first). ``extra`` is an
optional per-step tensor ``(B*K, ...)`` — attention weights, say — that is carried along each
hypothesis and returned for the best one.

Rows are laid out hypothesis-major within each example: row ``b*K + k`` is hypothesis ``k`` of
example ``b``; :func:`expand_to_beams` repeats a batch-first nest into that layout.

Scoring: the sum of token log-probabilities; a finished hypothesis (it emitted ``eos_id``) is
extended by ``pad_id`` at no cost. The final choice divides by the GNMT length penalty
``((5 + |y|) / 6) ** length_penalty`` (Wu et al. 2016, arXiv:1609.08144); ``0`` compares raw sums.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

__all__ = ["BeamResult", "beam_search", "expand_to_beams", "reorder_rows"]

StepFn = Callable[[Tensor, Any], Tuple[Tensor, Any, Optional[Tensor]]]


class BeamResult(NamedTuple):
    """The best hypothesis of each example.

    tokens: ``(B, T)`` long, without the start token, ``eos_id`` included, ``pad_id`` after it.
    scores: ``(B,)`` its total log-probability (before the length penalty).
    extras: ``(B, T, ...)`` the per-step ``extra`` of that hypothesis, or None.
    """

    tokens: Tensor
    scores: Tensor
    extras: Optional[Tensor]


def reorder_rows(state: Any, index: Tensor) -> Any:
    """``index_select(0, index)`` on every tensor leaf of ``state`` (other leaves unchanged)."""
    return pytree.tree_map(lambda x: x.index_select(0, index) if isinstance(x, Tensor) else x, state)


def expand_to_beams(state: Any, beam_size: int) -> Any:
    """Repeat each example's row ``beam_size`` times (row ``b`` -> rows ``b*K .. b*K+K-1``)."""
    return pytree.tree_map(lambda x: x.repeat_interleave(beam_size, dim=0) if isinstance(x, Tensor) else x, state)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


@torch.no_grad()
def beam_search(
    step: StepFn,
    state: Any,
    *,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    length_penalty: float = 0.0,
    reorder: Callable[[Any, Tensor], Any] = reorder_rows,
    device: Optional[torch.device] = None,
) -> BeamResult:
    """Beam search with ``K = beam_size`` hypotheses per example.

    Args:
        step: the decoder, ``(tokens (B*K,), state) -> (log_probs (B*K, V), state, extra)``;
            ``log_probs`` normalised over the vocabulary; ``extra`` a tensor ``(B*K, ...)`` or None.
        state: the initial decoder state, already expanded to ``B*K`` rows (:func:`expand_to_beams`).
        batch_size: ``B``; beam_size: ``K`` (1 gives greedy decoding).
        bos_id, eos_id, pad_id: start token fed first, end token, filler after the end.
        max_new_tokens: the most tokens generated per hypothesis.
        length_penalty: ``alpha`` of the final ``score / ((5 + |y|) / 6) ** alpha``.
        reorder: ``(state, index (B*K,)) -> state`` keeping rows ``index``.
        device: where the token tensors live (default: the first tensor leaf of ``state``).
    Returns:
        :class:`BeamResult` ``(tokens (B, T), scores (B,), extras (B, T, ...) or None)`` with
        ``T <= max_new_tokens`` (stops once every hypothesis has ended).
    """
    B, K = _positive("batch_size", batch_size), _positive("beam_size", beam_size)
    _positive("max_new_tokens", max_new_tokens)
    if device is None:
        leaves = [x for x in pytree.tree_leaves(state) if isinstance(x, Tensor)]
        device = leaves[0].device if leaves else torch.device("cpu")
    tokens = torch.full((B * K,), bos_id, dtype=torch.long, device=device)  # (B*K,)
    # only hypothesis 0 is live at the start, so the first step expands one row per example
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0
    finished = torch.zeros(B * K, dtype=torch.bool, device=device)
    seqs = torch.empty((B * K, 0), dtype=torch.long, device=device)  # (B*K, t)
    extras: Optional[Tensor] = None
    offsets = (torch.arange(B, device=device) * K).unsqueeze(1)  # (B, 1)
    for _ in range(max_new_tokens):
        log_probs, state, extra = step(tokens, state)
        V = log_probs.shape[-1]
        if log_probs.shape[0] != B * K:
            raise ValueError(f"step returned log_probs of shape {tuple(log_probs.shape)}, expected (B*K={B * K}, V)")
        log_probs = log_probs.float()
        # a finished hypothesis continues with pad at no cost, and with nothing else
        done_row = torch.full((V,), float("-inf"), device=device)
        done_row[pad_id] = 0.0
        log_probs = torch.where(finished.unsqueeze(1), done_row, log_probs)  # (B*K, V)
        total = (scores.reshape(B * K, 1) + log_probs).reshape(B, K * V)  # (B, K*V)
        scores, flat = total.topk(K, dim=1)  # (B, K) each
        parent = (offsets + flat // V).reshape(-1)  # (B*K,) source row of each new hypothesis
        tokens = (flat % V).reshape(-1)  # (B*K,)
        state = reorder(state, parent)
        seqs = torch.cat([seqs[parent], tokens.unsqueeze(1)], dim=1)  # (B*K, t+1)
        if extra is not None:
            step_extra = extra[parent].unsqueeze(1)  # (B*K, 1, ...)
            extras = step_extra if extras is None else torch.cat([extras[parent], step_extra], dim=1)
        finished = finished[parent] | (tokens == eos_id) | (tokens == pad_id)
        if bool(finished.all()):
            break
    # length of each hypothesis: tokens up to and including eos (pad excluded)
    lengths = (seqs != pad_id).sum(1).clamp(min=1).float().reshape(B, K)  # (B, K)
    penalised = scores / ((5.0 + lengths) / 6.0) ** length_penalty if length_penalty else scores
    best = (offsets.squeeze(1) + penalised.argmax(1))  # (B,) rows
    best_scores = scores.reshape(-1)[best]
    return BeamResult(seqs[best], best_scores, None if extras is None else extras[best])
