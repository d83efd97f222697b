"""Alignment score functions ``e = score(s, h)`` of RNN-era attention.

A score compares each query (decoder state) ``s_t`` with each key (encoder state) ``h_i`` and
returns one unnormalised logit per pair; an attention module turns a row of logits into weights
with a (masked) softmax.

* ``dot`` — ``s^T h`` (Luong et al. 2015, arXiv:1508.04025);
* ``scaled_dot`` — ``s^T h / sqrt(d_k)`` (Vaswani et al. 2017, arXiv:1706.03762);
* ``general`` — bilinear ``s^T W h`` (Luong et al. 2015);
* ``additive`` (aliases ``concat``, ``bahdanau``, ``mlp``) — ``v^T tanh(W1 s + W2 h)``
  (Bahdanau et al. 2014, arXiv:1409.0473); Luong's ``concat`` ``v^T tanh(W [s; h])`` is the same
  function with ``W = [W1, W2]``;
* ``cosine`` (alias ``content``) — ``beta * cos(s, h)``, the NTM's content addressing
  ``softmax(beta * cos)`` (Graves et al. 2014, arXiv:1410.5401);
* ``location`` — ``a_t = softmax(W_a s_t)``: logits from the query alone (Luong et al. 2015).

Every score module has the call ``score(query (B, M, Dq), keys (B, N, Dk)) -> (B, M, N)``.
``build(name, query_dim=, key_dim=, hidden_dim=, max_keys=, **options)`` builds one by name,
taking only the sizes that score needs.

Deviations from the papers: ``additive`` has a bias inside the ``tanh`` by default (Bahdanau et
al. write the equations without biases "to make the equations less cluttered"; ``bias=False``
gives the printed form). ``location`` scores the first ``N`` of ``max_keys`` learned rows, so one
module serves any source length up to ``max_keys``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _checks
from .functional import cosine_score, dot_score, scaled_dot_score
from .registry import check_kwargs, lookup, names as _names, register

__all__ = [
    "Score", "DotScore", "ScaledDotScore", "GeneralScore", "AdditiveScore", "CosineScore",
    "LocationScore", "build", "names",
]

#: the size arguments ``build`` knows; each score takes the subset it lists in ``Score.sizes``.
SIZE_ARGS = ("query_dim", "key_dim", "hidden_dim", "max_keys")


class Score(nn.Module):
    """Base class: validates ``query (B, M, Dq)`` and ``keys (B, N, Dk)`` and calls ``_score``.

    Subclasses set ``sizes`` (the constructor's size arguments, all required) and implement
    ``_score(query, keys) -> (B, M, N)`` on validated inputs.
    """

    #: size arguments the constructor requires (a subset of ``SIZE_ARGS``).
    sizes: ClassVar[tuple[str, ...]] = ()
    #: the query and key feature sizes must be equal (dot products between them).
    same_dim: ClassVar[bool] = False
    registry_name: ClassVar[str] = ""

    query_dim: Optional[int] = None
    key_dim: Optional[int] = None

    def __init__(self) -> None:
        super().__init__()

    def prepare_keys(self, keys: Tensor) -> Optional[Tensor]:
        """The part of the score that does not depend on the query (e.g. ``W2 h`` of the additive
        score), to compute once when the same keys meet many queries — an RNN decoder's steps —
        and pass back as ``forward(..., prepared=)``. None when there is no such part."""
        return None

    def forward(self, query: Tensor, keys: Tensor, prepared: Optional[Tensor] = None) -> Tensor:
        """Scores ``e (B, M, N)`` of ``query (B, M, Dq)`` against ``keys (B, N, Dk)``; ``prepared``
        is ``prepare_keys(keys)`` computed earlier."""
        _checks.tensor("query", query, ndim=3, floating=True)
        _checks.tensor("keys", keys, ndim=3, floating=True)
        _checks.same("query", query.shape[0], "keys", keys.shape[0], "the batch size (dim 0)")
        if query.dtype != keys.dtype:
            raise TypeError(f"query and keys must share a dtype, got {query.dtype} and {keys.dtype}")
        if self.same_dim:
            _checks.same("query", query.shape[-1], "keys", keys.shape[-1], "the feature size (dim -1)")
        if self.query_dim is not None and query.shape[-1] != self.query_dim:
            raise ValueError(f"query must have query_dim={self.query_dim} features (dim -1), got shape {tuple(query.shape)}")
        if self.key_dim is not None and keys.shape[-1] != self.key_dim:
            raise ValueError(f"keys must have key_dim={self.key_dim} features (dim -1), got shape {tuple(keys.shape)}")
        if prepared is not None:
            return self._score_prepared(query, prepared)
        return self._score(query, keys)

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        raise NotImplementedError  # abstract: every score implements it

    def _score_prepared(self, query: Tensor, prepared: Tensor) -> Tensor:
        raise TypeError(f"score {self.registry_name!r} has no prepared keys (prepare_keys returns None)")


@register("score", "dot")
class DotScore(Score):
    """Dot-product score ``e_ti = s_t^T h_i`` (Luong et al. 2015); needs ``Dq == Dk``.

    query ``(B, M, D)``, keys ``(B, N, D)`` -> ``(B, M, N)``. No parameters; cost ``O(B M N D)``.
    """

    same_dim = True

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        return dot_score(query, keys)  # (B, M, N)


@register("score", "scaled_dot")
class ScaledDotScore(Score):
    """Scaled dot-product score ``e_ti = s_t^T h_i / sqrt(d_k)`` (Vaswani et al. 2017); needs ``Dq == Dk``.

    query ``(B, M, D)``, keys ``(B, N, D)`` -> ``(B, M, N)``; ``d_k = D``. No parameters.
    """

    same_dim = True

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        return scaled_dot_score(query, keys)  # (B, M, N)


@register("score", "general")
class GeneralScore(Score):
    """Bilinear ("general") score ``e_ti = s_t^T W h_i`` (Luong et al. 2015).

    Args:
        query_dim: ``Dq``; key_dim: ``Dk``. ``W`` is ``(Dq, Dk)``, stored as ``self.W.weight``.
    Shapes: query ``(B, M, Dq)``, keys ``(B, N, Dk)`` -> ``(B, M, N)``; cost ``O(B M Dq Dk + B M N Dk)``.
    """

    sizes = ("query_dim", "key_dim")

    def __init__(self, *, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.query_dim = _checks.positive_int("query_dim", query_dim)
        self.key_dim = _checks.positive_int("key_dim", key_dim)
        # nn.Linear(Dk -> Dq) holds W (Dq, Dk) with the usual fan-in initialisation.
        self.W = nn.Linear(key_dim, query_dim, bias=False)

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        # s^T W, computed once per query
        sW = query @ self.W.weight  # (B, M, Dk)
        return sW @ keys.transpose(1, 2)  # (B, M, N)


@register("score", "additive", "concat", "bahdanau", "mlp")
class AdditiveScore(Score):
    """Additive ("concat", Bahdanau) score ``e_ti = v^T tanh(W1 s_t + W2 h_i + b)`` (Bahdanau et al. 2014).

    Luong's ``concat`` score ``v^T tanh(W [s_t; h_i])`` is the same function with ``W = [W1, W2]``.
    ``W1 s`` and ``W2 h`` are computed once and broadcast to ``(B, M, N, H)``.

    Args:
        query_dim: ``Dq``; key_dim: ``Dk``; hidden_dim: ``H``, the size of ``v``.
        bias: add ``b`` (in ``W2``) inside the ``tanh``; ``False`` gives the paper's printed form.
    Shapes: query ``(B, M, Dq)``, keys ``(B, N, Dk)`` -> ``(B, M, N)``; memory ``O(B M N H)``.
    """

    sizes = ("query_dim", "key_dim", "hidden_dim")

    def __init__(self, *, query_dim: int, key_dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.query_dim = _checks.positive_int("query_dim", query_dim)
        self.key_dim = _checks.positive_int("key_dim", key_dim)
        self.hidden_dim = _checks.positive_int("hidden_dim", hidden_dim)
        self.W1 = nn.Linear(query_dim, hidden_dim, bias=False)
        self.W2 = nn.Linear(key_dim, hidden_dim, bias=bias)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return self.W2(keys)  # W2 h_i (+ b), (B, N, H): the same at every decoder step

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        return self._score_prepared(query, self.W2(keys))

    def _score_prepared(self, query: Tensor, Uh: Tensor) -> Tensor:
        Ws = self.W1(query)  # (B, M, H)
        # tanh(W1 s_t + W2 h_i) for every pair (t, i)
        hidden = torch.tanh(Ws.unsqueeze(2) + Uh.unsqueeze(1))  # (B, M, N, H)
        return self.v(hidden).squeeze(-1)  # (B, M, N)


@register("score", "cosine", "content")
class CosineScore(Score):
    """Content score ``e_ti = beta * cos(s_t, h_i)`` (Graves et al. 2014, NTM content addressing).

    ``softmax(beta * cos)`` is the NTM's content weighting; ``beta >= 0`` sharpens it (``beta = 1``
    is plain cosine similarity). Needs ``Dq == Dk``.

    Args:
        beta: a float, the default sharpening. ``forward(query, keys, beta=...)`` overrides it with a
            float or a per-query tensor ``(B,)`` (one per sequence) or ``(B, M)`` (one per query),
            e.g. the NTM's emitted ``beta_t``.
        eps: lower bound on the norms (a zero vector has cosine 0 with everything).
    Shapes: query ``(B, M, D)``, keys ``(B, N, D)`` -> ``(B, M, N)``.
    """

    same_dim = True

    def __init__(self, *, beta: float = 1.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.beta = _float("beta", beta)
        self.eps = _float("eps", eps)

    def forward(self, query: Tensor, keys: Tensor, beta: Union[float, Tensor, None] = None) -> Tensor:
        """Scores ``(B, M, N)``; ``beta`` (float, ``(B,)`` or ``(B, M)``) overrides the module's."""
        scores = super().forward(query, keys)  # (B, M, N), cos(s_t, h_i)
        if beta is None:
            beta = self.beta
        if isinstance(beta, Tensor):
            _checks.tensor("beta", beta, ndim=(1, 2), floating=True)
            B, M = scores.shape[:2]
            if beta.dim() == 1:
                beta = beta.reshape(-1, 1)  # (B, 1)
            if beta.shape[0] != B or beta.shape[1] not in (1, M):
                raise ValueError(f"beta must be (B={B},) or (B={B}, M={M}), got shape {tuple(beta.shape)}")
            return beta.unsqueeze(-1).to(scores.dtype) * scores  # (B, M, N)
        return _float("beta", beta) * scores

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        return cosine_score(query, keys, eps=self.eps)  # (B, M, N)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, eps={self.eps}"


@register("score", "location")
class LocationScore(Score):
    """Location-based score ``a_t = softmax(W_a s_t)`` (Luong et al. 2015): the logits ``W_a s_t``.

    The scores depend on the query only (the keys give just the batch size and their number
    ``N``). ``W_a`` has ``max_keys`` rows; a source of ``N <= max_keys`` keys uses the first ``N``.

    Args:
        query_dim: ``Dq``; max_keys: the longest source the module scores.
    Shapes: query ``(B, M, Dq)``, keys ``(B, N, Dk)`` with ``N <= max_keys`` -> ``(B, M, N)``.
    """

    sizes = ("query_dim", "max_keys")

    def __init__(self, *, query_dim: int, max_keys: int) -> None:
        super().__init__()
        self.query_dim = _checks.positive_int("query_dim", query_dim)
        self.max_keys = _checks.positive_int("max_keys", max_keys)
        self.W_a = nn.Linear(query_dim, max_keys, bias=False)

    def _score(self, query: Tensor, keys: Tensor) -> Tensor:
        N = keys.shape[1]
        if N > self.max_keys:
            raise ValueError(f"keys has {N} positions (dim 1) but the location score was built with max_keys={self.max_keys}")
        # W_a s_t restricted to the first N rows of W_a
        return F.linear(query, self.W_a.weight[:N])  # (B, M, N)


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__} {value!r}")
    return float(value)


def names() -> list[str]:
    """Canonical score names (aliases left out)."""
    return _names("score")


def build(
    name: str,
    *,
    query_dim: Optional[int] = None,
    key_dim: Optional[int] = None,
    hidden_dim: Optional[int] = None,
    max_keys: Optional[int] = None,
    **options: Any,
) -> Score:
    """Build the score registered as ``name`` (or one of its aliases).

    Each score takes only the sizes it needs (``Score.sizes``); sizes it does not need are
    accepted and ignored, except that ``dot``, ``scaled_dot`` and ``cosine`` check
    ``query_dim == key_dim`` when both are given. ``options`` go to the constructor (e.g.
    ``bias=`` for ``additive``, ``beta=`` for ``cosine``); unknown ones raise ``TypeError``.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones) or a needed size missing.
    """
    cls = lookup("score", name)
    given = {"query_dim": query_dim, "key_dim": key_dim, "hidden_dim": hidden_dim, "max_keys": max_keys}
    missing = [k for k in cls.sizes if given[k] is None]
    if missing:
        raise ValueError(f"score {name!r} needs {', '.join(missing)} (it takes {', '.join(cls.sizes)})")
    if cls.same_dim and query_dim is not None and key_dim is not None and query_dim != key_dim:
        raise ValueError(f"score {name!r} compares query and keys directly: query_dim ({query_dim}) and "
                         f"key_dim ({key_dim}) must match; use 'general' or 'additive' for different sizes")
    kwargs = {k: given[k] for k in cls.sizes}
    check_kwargs(cls, options, f"score {name!r}")
    return cls(**kwargs, **options)
