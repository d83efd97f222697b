"""Set and bag pooling: Deep Sets and attention-based multiple-instance learning.

* Deep Sets — Zaheer, Kottur, Ravanbakhsh, Poczos, Salakhutdinov, Smola, "Deep Sets", NeurIPS 2017,
  arXiv:1703.06114: a permutation-invariant ``f(X) = rho(sum_{x in X} phi(x))``.
* Attention MIL — Ilse, Tomczak, Welling, "Attention-based Deep Multiple Instance Learning",
  ICML 2018, arXiv:1802.04712: a bag ``H = {h_1..h_K}`` of instance embeddings is pooled by
  ``z = sum_k a_k h_k`` with ``a_k = softmax_k(w^T tanh(V h_k))`` (attention) or
  ``a_k = softmax_k(w^T (tanh(V h_k) * sigma(U h_k)))`` (gated attention); mean and max pooling
  are the paper's baselines.

Inputs are padded bags ``bags (B, K, *instance_shape)`` with ``mask (B, K)`` (True = a real
instance); padding never changes the output. Instances are MNIST images ``(1, 28, 28)`` encoded by
Ilse et al.'s LeNet-5 variant (``encoder="lenet"``) or feature vectors ``(input_dim,)`` encoded by
an MLP (``encoder="mlp"``).

Deviations: the paper's ``tanh(V h_k)`` has no bias; :class:`AttentionPooling` has one inside the
``tanh`` by default (as in the authors' code and HAN's ``tanh(W_w h + b_w)``); ``bias=False``
gives the printed form. The bag classifier is a ``C``-way softmax (``n_classes=2``) rather than
the paper's single sigmoid, so every classifier in qkv is scored the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...functional import masked_softmax
from ...registry import register
from ...types import AttentionOutput
from ..base import ModelOutput, QKVModel

__all__ = ["AttentionPooling", "InstanceEncoder", "DeepSetsConfig", "DeepSets", "AttentionMILConfig", "AttentionMIL",
           "masked_pool", "check_bags"]

POOLINGS = ("mean", "max", "attention", "gated")


class AttentionPooling(nn.Module):
    """Attention pooling with a learned context vector (Ilse et al. 2018; Yang et al. 2016).

    ``a_k = softmax_k(w^T tanh(V h_k + b))`` or, gated, ``a_k = softmax_k(w^T (tanh(V h_k + b) * sigma(U h_k + c)))``;
    ``z = sum_k a_k h_k`` over the unmasked ``k``. ``w`` is HAN's context vector ``u_w``/``u_s``.

    Args:
        input_dim: ``D``, the size of ``h_k``; hidden_dim: ``L``, the size of ``V h_k`` and ``w``.
        gated: multiply by the sigmoid gate ``sigma(U h_k)``.
        bias: biases inside ``tanh``/``sigma`` (``False``: the paper's printed form).
    Call ``pool(h (B, K, D), mask (B, K) or None)`` -> ``AttentionOutput(z (B, D), a (B, K))``;
    a bag with no unmasked instance gets ``z = 0`` and ``a = 0``. Cost ``O(B K D L)``.
    """

    def __init__(self, *, input_dim: int, hidden_dim: int, gated: bool = False, bias: bool = True) -> None:
        super().__init__()
        _checks.positive_int("input_dim", input_dim)
        _checks.positive_int("hidden_dim", hidden_dim)
        self.V = nn.Linear(input_dim, hidden_dim, bias=bias)
        self.U = nn.Linear(input_dim, hidden_dim, bias=bias) if gated else None
        self.w = nn.Linear(hidden_dim, 1, bias=False)  # the context vector w (u_w in HAN)
        self.gated = gated

    def scores(self, h: Tensor) -> Tensor:
        """The logits ``w^T tanh(V h_k)`` (gated: ``w^T (tanh(V h_k) * sigma(U h_k))``), ``(B, K)``."""
        hidden = torch.tanh(self.V(h))  # (B, K, L)
        if self.U is not None:
            hidden = hidden * torch.sigmoid(self.U(h))  # (B, K, L)
        return self.w(hidden).squeeze(-1)  # (B, K)

    def forward(self, h: Tensor, mask: Optional[Tensor] = None) -> AttentionOutput:
        _checks.tensor("h", h, ndim=3, floating=True)
        if mask is not None:
            _checks.tensor("mask", mask, ndim=2)
            if tuple(mask.shape) != tuple(h.shape[:2]):
                raise ValueError(f"mask must be (B, K) = {tuple(h.shape[:2])}, got {tuple(mask.shape)}")
        # a_k = softmax_k(e_k) over the real instances
        a = masked_softmax(self.scores(h), mask)  # (B, K)
        # z = sum_k a_k h_k
        z = torch.einsum("bk,bkd->bd", a, h)  # (B, D)
        return AttentionOutput(z, a, None)


def masked_pool(h: Tensor, mask: Optional[Tensor], how: str) -> Tensor:
    """``sum``, ``mean`` or ``max`` of ``h (B, K, D)`` over the real instances -> ``(B, D)``;
    an empty bag pools to zeros."""
    if mask is None:
        mask = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device)
    m = mask.unsqueeze(-1)  # (B, K, 1)
    if how == "sum":
        return (h * m).sum(1)
    if how == "mean":
        return (h * m).sum(1) / m.sum(1).clamp(min=1)
    if how == "max":
        # finfo.min, not -inf: an empty bag stays finite and is zeroed below
        pooled = h.masked_fill(~m, torch.finfo(h.dtype).min).amax(1)  # (B, D)
        return pooled * mask.any(1, keepdim=True)
    raise ValueError(f"how must be 'sum', 'mean' or 'max', got {how!r}")


class InstanceEncoder(nn.Module):
    """Embeds each instance of a bag: ``(B, K, *instance_shape)`` -> ``(B, K, d_model)``.

    ``kind="lenet"``: Ilse et al.'s LeNet-5 variant for ``(1, 28, 28)`` images (conv 5x5 20, pool,
    conv 5x5 50, pool, linear to ``d_model``, ReLU). ``kind="mlp"``: ``(input_dim,)`` vectors,
    two linear layers with ReLU.
    """

    def __init__(self, kind: str, d_model: int, input_dim: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        if kind == "lenet":
            self.instance_shape: tuple = (1, 28, 28)
            self.net = nn.Sequential(
                nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),  # (20, 12, 12)
                nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),  # (50, 4, 4)
                nn.Flatten(), nn.Dropout(dropout), nn.Linear(50 * 4 * 4, d_model), nn.ReLU())
        elif kind == "mlp":
            _checks.positive_int("input_dim", input_dim)
            self.instance_shape = (input_dim,)
            self.net = nn.Sequential(nn.Linear(input_dim, d_model), nn.ReLU(), nn.Dropout(dropout),
                                     nn.Linear(d_model, d_model), nn.ReLU())
        else:
            raise ValueError(f"encoder must be 'lenet' or 'mlp', got {kind!r}")

    def forward(self, bags: Tensor) -> Tensor:
        B, K = bags.shape[:2]
        h = self.net(bags.flatten(0, 1))  # (B*K, d_model)
        return h.view(B, K, -1)  # (B, K, d_model)


def check_bags(bags: Tensor, mask: Optional[Tensor], instance_shape: tuple) -> None:
    """Validate ``bags (B, K, *instance_shape)`` and ``mask (B, K)`` bool."""
    _checks.tensor("bags", bags, ndim=2 + len(instance_shape), floating=True)
    if tuple(bags.shape[2:]) != tuple(instance_shape):
        raise ValueError(f"bags must be (B, K, {', '.join(map(str, instance_shape))}), got {tuple(bags.shape)}")
    if mask is not None:
        _checks.mask("mask", mask, bags.shape[:2])
        if tuple(mask.shape) != tuple(bags.shape[:2]):
            raise ValueError(f"mask must be (B, K) = {tuple(bags.shape[:2])}, got {tuple(mask.shape)}")


def _loss(logits: Tensor, labels: Optional[Tensor]) -> Optional[Tensor]:
    return None if labels is None else F.cross_entropy(logits, labels)


@dataclass
class DeepSetsConfig:
    encoder: str = "lenet"  # instance encoder phi's trunk: "lenet" (1x28x28 images) or "mlp" (vectors)
    input_dim: int = 0  # instance features for encoder="mlp" (unused by "lenet")
    d_model: int = 128  # size of phi(x)
    hidden_dim: int = 128  # hidden size of rho
    n_classes: int = 2  # bag classes
    dropout: float = 0.0  # dropout in phi and rho


@register("model", "deep-sets")
class DeepSets(QKVModel):
    """Deep Sets (Zaheer et al. 2017): ``f(X) = rho(sum_{x in X} phi(x))``, a sum over the real instances.

    ``forward(bags (B, K, *instance), mask (B, K) or None, labels (B,) or None, need_weights=False)``
    -> ``ModelOutput(loss, logits (B, n_classes), weights=None)`` (sum pooling has no weights).
    """

    config_class = DeepSetsConfig
    suggested_tasks = ('digit-bags',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 500, "batch_size": 8, "lr": 5e-4, "weight_decay": 1e-4, "betas": (0.9, 0.999)}

    def __init__(self, config: DeepSetsConfig) -> None:
        super().__init__(config)
        self.phi = InstanceEncoder(config.encoder, config.d_model, config.input_dim, config.dropout)
        self.rho = nn.Sequential(nn.Linear(config.d_model, config.hidden_dim), nn.ReLU(), nn.Dropout(config.dropout),
                                 nn.Linear(config.hidden_dim, config.n_classes))

    def forward(self, bags: Tensor, mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        check_bags(bags, mask, self.phi.instance_shape)
        # sum_{x in X} phi(x)
        pooled = masked_pool(self.phi(bags), mask, "sum")  # (B, d_model)
        logits = self.rho(pooled)  # (B, C)
        return ModelOutput(loss=_loss(logits, labels), logits=logits)


@dataclass
class AttentionMILConfig:
    encoder: str = "lenet"  # instance encoder: "lenet" (1x28x28 images, Ilse et al.) or "mlp" (vectors)
    input_dim: int = 0  # instance features for encoder="mlp" (unused by "lenet")
    d_model: int = 128  # M, size of the instance embedding h_k (Ilse et al.: 500)
    hidden_dim: int = 64  # L, size of V h_k and of w (Ilse et al.: 128)
    pooling: str = "gated"  # "mean" | "max" | "attention" | "gated"
    n_classes: int = 2  # bag classes
    dropout: float = 0.0  # dropout in the instance encoder


@register("model", "attention-mil")
class AttentionMIL(QKVModel):
    """Attention-based deep multiple-instance learning (Ilse et al. 2018).

    ``h_k = f_psi(x_k)``; ``z = sum_k a_k h_k`` with ``a_k = softmax_k(w^T tanh(V h_k))`` (attention),
    ``softmax_k(w^T (tanh(V h_k) * sigma(U h_k)))`` (gated), or mean/max pooling; ``logits = W z``.

    ``forward(bags (B, K, *instance), mask (B, K) or None, labels (B,) or None, need_weights=False)``
    -> ``ModelOutput(loss, logits (B, n_classes), weights (B, K) for attention pooling else None)``.
    """

    config_class = AttentionMILConfig
    suggested_tasks = ('digit-bags',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 500, "batch_size": 8, "lr": 5e-4, "weight_decay": 1e-4, "betas": (0.9, 0.999)}

    def __init__(self, config: AttentionMILConfig) -> None:
        super().__init__(config)
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {config.pooling!r}")
        self.encoder = InstanceEncoder(config.encoder, config.d_model, config.input_dim, config.dropout)
        self.attention = (AttentionPooling(input_dim=config.d_model, hidden_dim=config.hidden_dim,
                                           gated=config.pooling == "gated")
                          if config.pooling in ("attention", "gated") else None)
        self.classifier = nn.Linear(config.d_model, config.n_classes)

    def forward(self, bags: Tensor, mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        check_bags(bags, mask, self.encoder.instance_shape)
        h = self.encoder(bags)  # (B, K, M)
        weights = None
        if self.attention is not None:
            z, weights, _ = self.attention(h, mask)  # (B, M), (B, K)
        else:
            z = masked_pool(h, mask, self.config.pooling)  # (B, M)
        logits = self.classifier(z)  # (B, C)
        return ModelOutput(loss=_loss(logits, labels), logits=logits, weights=weights if need_weights else None)
