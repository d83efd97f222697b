"""Alignment attention: one query vector (a decoder state) against a memory of keys.

The RNN-era mechanisms, all with one call (design.md §3)::

    out = att(query, keys, values=None, mask=None)   # LocalAttention also takes position=
    # query (B, Dq) or (B, M, Dq); keys (B, N, Dk); values (B, N, Dv), default keys
    # mask: bool, True = may attend; (B, N) key padding or (B, M, N)
    out.output   # (B, Dv) or (B, M, Dv)
    out.weights  # (B, N) or (B, M, N), always returned (they are computed anyway)

* ``SoftAttention`` — ``a_t = softmax(e_t)``, ``c_t = sum_i a_ti h_i`` with a score from
  ``qkv.scores`` (Bahdanau et al. 2014, arXiv:1409.0473; Luong et al. 2015, arXiv:1508.04025).
* ``HardAttention`` — one location ``s_t ~ Multinoulli(a_t)``, ``c_t = h_{s_t}``, trained with
  REINFORCE with a moving-average baseline and an entropy bonus (Xu et al. 2015, "Show, Attend and
  Tell", arXiv:1502.03044, §4.1); argmax in eval mode.
* ``LocalAttention`` — Luong et al. 2015 §3.2: scores normalised over the window
  ``[p_t - D, p_t + D]`` only; ``monotonic`` (local-m, ``p_t`` given) or ``predictive`` (local-p,
  ``p_t = S sigmoid(v_p^T tanh(W_p s_t))`` and a Gaussian ``exp(-(i - p_t)^2 / (2 (D/2)^2))``).

Scores may be any name of ``qkv.scores`` (``dot``, ``scaled_dot``, ``general``, ``additive``/
``concat``/``bahdanau``/``mlp``, ``cosine``/``content`` (Graves et al. 2014, arXiv:1410.5401),
``location``), a score module, or a callable ``(query (B, M, Dq), keys (B, N, Dk)) -> (B, M, N)``.

A query whose keys are all masked (or whose local window holds no unmasked key) gets a zero
output and zero weights, never NaN.

Deviations from the papers: Xu et al. also replace the sampled location by the soft expectation
with probability 0.5 during training; that is a training-loop choice (mix ``SoftAttention`` and
``HardAttention`` outputs) and is not built in. The local-p window is centred at ``floor(p_t)``
(the paper leaves the rounding open; ``floor`` maps ``p_t in [0, S)`` onto a real key index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Categorical

from .. import _checks, scores as _scores
from ..functional import masked_softmax
from ..types import AttentionOutput

__all__ = ["SoftAttention", "HardAttention", "HardAttentionSample", "LocalAttention"]

ScoreLike = Union[str, nn.Module, Callable[[Tensor, Tensor], Tensor]]


# ----------------------------------------------------------------------------- shared plumbing


def _prepare(query: Tensor, keys: Tensor, values: Optional[Tensor], mask: Optional[Tensor]):
    """Validate the alignment call and bring it to 3-D.

    Returns ``(query (B, M, Dq), keys (B, N, Dk), values (B, N, Dv), mask (B|1, M|1, N) or None,
    single)`` where ``single`` says the query was ``(B, Dq)`` (``M = 1``, squeezed on return).
    """
    _checks.tensor("query", query, ndim=(2, 3), floating=True)
    _checks.tensor("keys", keys, ndim=3, floating=True)
    single = query.dim() == 2
    if single:
        query = query.unsqueeze(1)  # (B, 1, Dq)
    B, M, _ = query.shape
    N = keys.shape[1]
    _checks.same("query", B, "keys", keys.shape[0], "the batch size (dim 0)")
    if values is None:
        values = keys
    else:
        _checks.tensor("values", values, ndim=3, floating=True)
        _checks.same("keys", B, "values", values.shape[0], "the batch size (dim 0)")
        _checks.same("keys", N, "values", values.shape[1], "the number of positions (dim 1)")
    if not (query.dtype == keys.dtype == values.dtype):
        raise TypeError(f"query, keys and values must share a dtype, got {query.dtype}, {keys.dtype}, {values.dtype}")
    mask = _checks.attention_mask("mask", mask, B, M, N)  # (B|1, M|1, N)
    return query, keys, values, mask, single


def _build_score(score: ScoreLike, sizes: dict, options: dict) -> nn.Module | Callable:
    if isinstance(score, str):
        return _scores.build(score, **sizes, **options)
    if not callable(score):
        raise TypeError(f"score must be a score name, an nn.Module or a callable, got {type(score).__name__}")
    given = sorted(k for k, v in sizes.items() if v is not None) + sorted(options)
    if given:
        raise ValueError(f"score is a module/callable, so the score arguments {given} have no use; "
                         f"pass a score name to have them build it")
    return score


class _AlignmentAttention(nn.Module):
    """Owns the score; validates the call and computes ``e (B, M, N)``."""

    def __init__(self, score: ScoreLike, sizes: dict, options: dict) -> None:
        super().__init__()
        # a module registers as a submodule; a plain callable is kept as an attribute
        self.score = _build_score(score, sizes, options)

    def _scores(self, query: Tensor, keys: Tensor, prepared: Optional[Tensor] = None) -> Tensor:
        e = self.score(query, keys) if prepared is None else self.score(query, keys, prepared=prepared)
        expected = (query.shape[0], query.shape[1], keys.shape[1])
        if not isinstance(e, Tensor) or tuple(e.shape) != expected:
            got = tuple(e.shape) if isinstance(e, Tensor) else type(e).__name__
            raise ValueError(f"score returned {got}, expected (B, M, N) = {expected}")
        return e


def _finish(output: Tensor, weights: Tensor, single: bool, state: Any = None) -> AttentionOutput:
    if single:
        output, weights = output.squeeze(1), weights.squeeze(1)  # (B, Dv), (B, N)
    return AttentionOutput(output, weights, state)


# ----------------------------------------------------------------------------- soft


class SoftAttention(_AlignmentAttention):
    """Soft (global) alignment attention (Bahdanau et al. 2014; Luong et al. 2015).

    ``e_ti = score(s_t, h_i)``, ``a_ti = exp(e_ti) / sum_j exp(e_tj)`` over the unmasked keys,
    ``c_t = sum_i a_ti v_i`` (``v_i = h_i`` unless ``values`` are given).

    Args:
        score: a name of ``qkv.scores`` (default ``"additive"``), a score module, or a callable
            ``(query (B, M, Dq), keys (B, N, Dk)) -> (B, M, N)``.
        query_dim, key_dim, hidden_dim, max_keys: sizes for ``qkv.scores.build``; each score uses
            only those it needs.
        **score_options: further score arguments (``bias=``, ``beta=``, ...).

    Call ``att(query, keys, values=None, mask=None)``:
        query ``(B, Dq)`` or ``(B, M, Dq)``; keys ``(B, N, Dk)``; values ``(B, N, Dv)``;
        mask bool ``(B, N)`` or ``(B, M, N)``, True = may attend.
    Returns:
        ``AttentionOutput(output (B, Dv) or (B, M, Dv), weights (B, N) or (B, M, N), None)``.
    Cost: the score's, plus ``O(B M N Dv)``.
    """

    def __init__(
        self,
        score: ScoreLike = "additive",
        *,
        query_dim: Optional[int] = None,
        key_dim: Optional[int] = None,
        hidden_dim: Optional[int] = None,
        max_keys: Optional[int] = None,
        **score_options: Any,
    ) -> None:
        sizes = dict(query_dim=query_dim, key_dim=key_dim, hidden_dim=hidden_dim, max_keys=max_keys)
        super().__init__(score, sizes, score_options)

    def forward(self, query: Tensor, keys: Tensor, values: Optional[Tensor] = None,
                mask: Optional[Tensor] = None, prepared_keys: Optional[Tensor] = None) -> AttentionOutput:
        """``prepared_keys``: ``self.score.prepare_keys(keys)`` computed once for many calls with
        the same keys (see ``qkv.scores.Score.prepare_keys``)."""
        query, keys, values, mask, single = _prepare(query, keys, values, mask)
        e = self._scores(query, keys, prepared_keys)  # (B, M, N)
        # a_t = softmax(e_t) over the unmasked keys; all-masked rows are zeros
        a = masked_softmax(e, mask)  # (B, M, N)
        # c_t = sum_i a_ti v_i
        c = a @ values  # (B, M, Dv)
        return _finish(c, a, single)


# ----------------------------------------------------------------------------- hard


@dataclass(frozen=True)
class HardAttentionSample:
    """The location ``HardAttention`` selected, with what REINFORCE needs.

    index:    ``(B,)`` or ``(B, M)`` long, the selected key ``s_t`` (0 for a query with no key).
    log_prob: ``log p(s_t | a_t)``, same shape, differentiable w.r.t. the score parameters
              (0 for a query with no key).
    entropy:  ``H[a_t]``, same shape, differentiable (0 for a query with no key).
    probs:    ``a_t``, ``(B, N)`` or ``(B, M, N)``, the Multinoulli parameters.
    """

    index: Tensor
    log_prob: Tensor
    entropy: Tensor
    probs: Tensor


class HardAttention(_AlignmentAttention):
    """Stochastic hard attention (Xu et al. 2015, §4.1): select one key per query.

    ``a_t = softmax(e_t)`` as in ``SoftAttention``; in training ``s_t ~ Multinoulli(a_t)``
    (``torch.distributions.Categorical``), in eval ``s_t = argmax_i a_ti``; ``c_t = v_{s_t}``.
    The weights returned are the one-hot selection; ``out.state`` is a ``HardAttentionSample``
    (index, log-probability, entropy, probabilities).

    The output's gradient reaches the values only; the score parameters learn through
    ``reinforce_loss`` (the score-function estimator of Xu et al. eq. 12)::

        L_r = -sum_t (R - b) log p(s_t | a_t) - lambda_e sum_t H[a_t]
        b  <- decay * b + (1 - decay) * mean(R)        (moving-average baseline, a buffer)

    with the reward ``R`` (Xu et al.: ``log p(y | s, a)``, i.e. minus the per-sequence task loss).

    Args: as ``SoftAttention``, plus
        baseline_decay: decay of the moving-average baseline (Xu et al.: 0.9).
        entropy_bonus: ``lambda_e``, weight of the entropy bonus in ``reinforce_loss``.

    Call ``att(query, keys, values=None, mask=None)`` with ``SoftAttention``'s shapes.
    Returns ``AttentionOutput(output (B, Dv) or (B, M, Dv), one-hot weights (B, N) or (B, M, N),
    HardAttentionSample)``; a query with no unmasked key gets zeros.
    """

    reward_baseline: Tensor
    baseline_steps: Tensor

    def __init__(
        self,
        score: ScoreLike = "additive",
        *,
        query_dim: Optional[int] = None,
        key_dim: Optional[int] = None,
        hidden_dim: Optional[int] = None,
        max_keys: Optional[int] = None,
        baseline_decay: float = 0.9,
        entropy_bonus: float = 0.0,
        **score_options: Any,
    ) -> None:
        sizes = dict(query_dim=query_dim, key_dim=key_dim, hidden_dim=hidden_dim, max_keys=max_keys)
        super().__init__(score, sizes, score_options)
        self.baseline_decay = _checks.probability("baseline_decay", baseline_decay)
        if isinstance(entropy_bonus, bool) or not isinstance(entropy_bonus, (int, float)):
            raise TypeError(f"entropy_bonus must be a float, got {type(entropy_bonus).__name__}")
        self.entropy_bonus = float(entropy_bonus)
        # b, the moving average of the reward; its first value is the first batch's mean reward
        self.register_buffer("reward_baseline", torch.zeros(()))
        self.register_buffer("baseline_steps", torch.zeros((), dtype=torch.long))

    def forward(self, query: Tensor, keys: Tensor, values: Optional[Tensor] = None,
                mask: Optional[Tensor] = None) -> AttentionOutput:
        query, keys, values, mask, single = _prepare(query, keys, values, mask)
        B, M, _ = query.shape
        N, Dv = values.shape[1], values.shape[2]
        if N == 0:
            raise ValueError(f"keys must have at least one position (dim 1) to select from, got shape {tuple(keys.shape)}")
        e = self._scores(query, keys)  # (B, M, N)
        a = masked_softmax(e, mask)  # (B, M, N), Multinoulli parameters a_t
        # The distribution in float32 for half types (log-probabilities of small a_ti).
        work = e.float() if e.dtype in (torch.float16, torch.bfloat16) else e
        if mask is not None:
            # finfo.min, not -inf: an all-masked row stays a finite (uniform) distribution, zeroed below
            work = work.masked_fill(~mask, torch.finfo(work.dtype).min)
            valid = mask.any(-1).expand(B, M)  # (B, M), the query has a key to select
        else:
            valid = torch.ones(B, M, dtype=torch.bool, device=e.device)
        dist = Categorical(logits=work, validate_args=False)
        # s_t ~ Multinoulli(a_t) in training, argmax in eval
        index = dist.sample() if self.training else work.argmax(-1)  # (B, M)
        index = torch.where(valid, index, torch.zeros_like(index))  # 0 where there is no key
        zero = work.new_zeros(())
        log_prob = torch.where(valid, dist.log_prob(index), zero).to(e.dtype)  # (B, M)
        entropy = torch.where(valid, dist.entropy(), zero).to(e.dtype)  # (B, M)
        weights = F.one_hot(index, N).to(values.dtype) * valid.unsqueeze(-1)  # (B, M, N)
        # c_t = v_{s_t}
        c = values.gather(1, index.unsqueeze(-1).expand(B, M, Dv)) * valid.unsqueeze(-1)  # (B, M, Dv)
        if single:
            index, log_prob, entropy = index.squeeze(1), log_prob.squeeze(1), entropy.squeeze(1)  # (B,)
            a = a.squeeze(1)  # (B, N)
        sample = HardAttentionSample(index=index, log_prob=log_prob, entropy=entropy, probs=a)
        return _finish(c, weights, single, sample)

    def reinforce_loss(self, reward: Tensor, sample: HardAttentionSample,
                       baseline: Union[str, float, Tensor, None] = "moving") -> Tensor:
        """REINFORCE surrogate loss whose gradient is the score-function estimator (Xu et al. 2015).

        ``L_r = -(1/B) sum_{b,t} (R_b - baseline) log p(s_bt) - entropy_bonus (1/B) sum_{b,t} H[a_bt]``
        (summed over queries, averaged over the batch). Add it to the task loss; minimising it
        raises the probability of locations with an above-baseline reward.

        Args:
            reward: ``R``, ``(B,)`` (one per sequence, shared by its queries) or the shape of
                ``sample.log_prob`` (one per query); treated as a constant (detached).
            sample: ``out.state`` of the forward call.
            baseline: ``"moving"`` (default) uses the moving-average buffer ``reward_baseline``
                and, in training mode, updates it with this batch's mean reward afterwards;
                ``None`` uses no baseline; a float or tensor broadcastable to the reward (e.g. a
                learned baseline's prediction) is used as given (detached).
        Returns:
            a scalar loss.
        """
        if not isinstance(sample, HardAttentionSample):
            raise TypeError(f"sample must be the HardAttentionSample in out.state, got {type(sample).__name__}")
        _checks.tensor("reward", reward, ndim=(1, 2), floating=True)
        log_prob = sample.log_prob  # (B,) or (B, M)
        if tuple(reward.shape) != tuple(log_prob.shape) and tuple(reward.shape) != tuple(log_prob.shape[:1]):
            raise ValueError(f"reward must be (B,) = {tuple(log_prob.shape[:1])} or the shape of sample.log_prob "
                             f"{tuple(log_prob.shape)}, got {tuple(reward.shape)}")
        reward = reward.detach().to(log_prob.dtype)
        if reward.dim() < log_prob.dim():
            reward = reward.unsqueeze(-1)  # (B, 1), shared by the queries of a sequence
        if isinstance(baseline, str):
            if baseline != "moving":
                raise ValueError(f"baseline must be 'moving', None, a float or a tensor, got {baseline!r}")
            b: Union[Tensor, float] = self.reward_baseline.to(log_prob.dtype)
        elif baseline is None:
            b = 0.0
        elif isinstance(baseline, Tensor):
            b = baseline.detach().to(log_prob.dtype)
        elif isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
            b = float(baseline)
        else:
            raise TypeError(f"baseline must be 'moving', None, a float or a tensor, got {type(baseline).__name__}")
        advantage = reward - b  # R - b, a constant
        batch = log_prob.shape[0]
        loss = -(advantage * log_prob).sum() / batch
        if self.entropy_bonus:
            loss = loss - self.entropy_bonus * sample.entropy.sum() / batch
        if baseline == "moving" and self.training:
            self._update_baseline(reward.mean())
        return loss

    @torch.no_grad()
    def _update_baseline(self, mean_reward: Tensor) -> None:
        # b <- decay * b + (1 - decay) * mean(R); the first step starts from mean(R), not 0
        mean_reward = mean_reward.to(self.reward_baseline.dtype)
        if int(self.baseline_steps) == 0:
            self.reward_baseline.copy_(mean_reward)
        else:
            self.reward_baseline.mul_(self.baseline_decay).add_((1 - self.baseline_decay) * mean_reward)
        self.baseline_steps.add_(1)

    def extra_repr(self) -> str:
        return f"baseline_decay={self.baseline_decay}, entropy_bonus={self.entropy_bonus}"


# ----------------------------------------------------------------------------- local


class LocalAttention(_AlignmentAttention):
    """Luong et al. 2015 local attention over the window ``[p_t - D, p_t + D]``.

    ``a_t(i) = align(s_t, h_i)`` — the softmax of the scores over the keys ``i`` of the window that
    are in the sequence and unmasked (normalised over the window only); ``c_t = sum_i a_t(i) v_i``.

    * ``mode="monotonic"`` (local-m): ``p_t`` is the integer ``position`` the caller passes
      (Luong: ``p_t = t``); no Gaussian. Windows are clipped to ``[0, N)``; a window that holds
      no unmasked key gives a zero row.
    * ``mode="predictive"`` (local-p): ``p_t = S sigmoid(v_p^T tanh(W_p s_t))``, the window is
      centred at ``floor(p_t)`` and the window-normalised weights are multiplied by
      ``exp(-(i - p_t)^2 / (2 sigma^2))``, ``sigma = D / 2`` — not renormalised afterwards, as in
      the paper (rows sum to at most 1). ``S`` is the number of keys the query may attend to:
      ``N`` without a mask, the per-sequence length (count of True) with a key-padding mask (the
      source length when padding is at the end), the row's count with a ``(B, M, N)`` mask.
      ``p_t`` gets its gradient through the Gaussian (``floor`` has none), as in the paper.

    Computation: the dense ``(B, M, N)`` score row is computed and masked to the window — no
    Python loops, ``O(M N)`` scores rather than the ``O(M D)`` of gathering a window, which is fine
    at the RNN-era lengths this is for.

    Args:
        score: as ``SoftAttention`` (default ``"general"``, Luong's choice for local attention).
        window: ``D >= 0`` (``>= 1`` for ``predictive``: ``sigma = D / 2``).
        mode: ``"predictive"`` (local-p) or ``"monotonic"`` (local-m).
        query_dim, key_dim, hidden_dim, max_keys, **score_options: for the score; ``predictive``
            also needs ``query_dim`` for its position predictor.
        position_dim: size of ``W_p`` (``predictive``), default ``query_dim``.

    Call ``att(query, keys, values=None, mask=None, position=None)``: ``SoftAttention``'s shapes;
    ``position`` integer ``(B,)`` or ``(B, M)``, required for (and only for) ``monotonic``.
    Returns ``AttentionOutput(output (B, Dv) or (B, M, Dv), weights (B, N) or (B, M, N), None)``,
    weights zero outside the window.
    """

    MODES = ("predictive", "monotonic")

    def __init__(
        self,
        score: ScoreLike = "general",
        *,
        window: int,
        mode: str = "predictive",
        query_dim: Optional[int] = None,
        key_dim: Optional[int] = None,
        hidden_dim: Optional[int] = None,
        max_keys: Optional[int] = None,
        position_dim: Optional[int] = None,
        **score_options: Any,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        window = _checks.positive_int("window", window, allow_zero=mode == "monotonic")
        sizes = dict(query_dim=query_dim, key_dim=key_dim, hidden_dim=hidden_dim, max_keys=max_keys)
        super().__init__(score, sizes, score_options)
        self.window = window  # D
        self.mode = mode
        if mode == "predictive":
            if query_dim is None:
                raise ValueError("mode='predictive' needs query_dim (for the position predictor W_p)")
            _checks.positive_int("query_dim", query_dim)
            position_dim = query_dim if position_dim is None else _checks.positive_int("position_dim", position_dim)
            self.W_p = nn.Linear(query_dim, position_dim, bias=False)
            self.v_p = nn.Linear(position_dim, 1, bias=False)
        elif position_dim is not None:
            raise ValueError("position_dim is used only by mode='predictive'")

    def predict_position(self, query: Tensor, source_length: Union[Tensor, float]) -> Tensor:
        """local-p's ``p_t = S sigmoid(v_p^T tanh(W_p s_t))``.

        Args:
            query: ``(B, M, Dq)`` or ``(B, Dq)``.
            source_length: ``S``, a number or a tensor broadcastable to ``(B, M)`` (or ``(B,)``).
        Returns:
            ``p_t``, ``(B, M)`` or ``(B,)``, real-valued in ``[0, S]``.
        """
        if self.mode != "predictive":
            raise ValueError("predict_position needs mode='predictive'")
        _checks.tensor("query", query, ndim=(2, 3), floating=True)
        z = self.v_p(torch.tanh(self.W_p(query))).squeeze(-1)  # (B, M) or (B,)
        return source_length * torch.sigmoid(z)

    def forward(self, query: Tensor, keys: Tensor, values: Optional[Tensor] = None,
                mask: Optional[Tensor] = None, position: Optional[Tensor] = None) -> AttentionOutput:
        single_in = isinstance(query, Tensor) and query.dim() == 2
        query, keys, values, mask, single = _prepare(query, keys, values, mask)
        B, M, _ = query.shape
        N = keys.shape[1]
        D = self.window
        i = torch.arange(N, device=query.device)  # key positions
        if self.mode == "monotonic":
            if position is None:
                raise ValueError("mode='monotonic' (local-m) needs position: the integer p_t of each query, (B,) or (B, M)")
            center = self._check_position(position, B, M, single_in)  # (B, M) long
            p = None
        else:
            if position is not None:
                raise ValueError("position is only used by mode='monotonic'; mode='predictive' predicts p_t")
            # S: the source length each query sees
            S = mask.sum(-1).expand(B, M).to(query.dtype) if mask is not None else query.new_full((B, M), float(N))
            p = self.predict_position(query, S)  # (B, M), p_t in [0, S]
            center = torch.floor(p.detach()).long()  # (B, M)
        # the window [p_t - D, p_t + D], clipped to the sequence by construction of i
        in_window = (i >= center.unsqueeze(-1) - D) & (i <= center.unsqueeze(-1) + D)  # (B, M, N)
        allowed = in_window if mask is None else in_window & mask  # (B, M, N)
        e = self._scores(query, keys)  # (B, M, N)
        # align(s_t, h_i): softmax over the window only
        a = masked_softmax(e, allowed)  # (B, M, N)
        if p is not None:
            # a_t(i) * exp(-(i - p_t)^2 / (2 sigma^2)), sigma = D / 2
            sigma = D / 2
            dist2 = (i.to(p.dtype) - p.unsqueeze(-1)) ** 2  # (B, M, N)
            a = a * torch.exp(-dist2 / (2 * sigma ** 2))
        c = a @ values  # (B, M, Dv)
        return _finish(c, a, single)

    @staticmethod
    def _check_position(position: Any, B: int, M: int, single: bool) -> Tensor:
        if not isinstance(position, Tensor):
            raise TypeError(f"position must be an integer torch.Tensor, got {type(position).__name__}")
        if position.is_floating_point() or position.is_complex() or position.dtype == torch.bool:
            raise TypeError(f"position must be an integer tensor (p_t of local-m), got dtype {position.dtype}")
        if position.dim() == 1 and position.shape[0] == B:
            return position.long().unsqueeze(1).expand(B, M)  # (B, M)
        if position.dim() == 2 and tuple(position.shape) == (B, M):
            return position.long()
        want = f"(B={B},)" + ("" if single else f" or (B={B}, M={M})")
        raise ValueError(f"position must be {want}, got shape {tuple(position.shape)}")

    def extra_repr(self) -> str:
        return f"window={self.window}, mode={self.mode!r}"
