"""Language-model losses, including the auxiliary losses of Al-Rfou et al. 2018, "Character-Level
Language Modeling with Deeper Self-Attention" (arXiv:1808.04444), §2.2:

- **multiple positions**: predict the next token at every position of the window (the ordinary
  causal LM loss, ``lm_loss``);
- **intermediate layers**: the same prediction from each intermediate layer's output; layer
  ``l`` of ``n`` stops predicting after the fraction ``l / (2n)`` of training, lower layers first,
  all gone half-way (``layer_loss_active``), so that the final model relies on the top layer;
- **multiple targets**: extra heads predict the token ``k`` steps ahead, ``k = 2 .. K``
  (``future_loss``), each weighted 0.5 and added to the loss of every layer that predicts.

The losses are summed. ``layer_loss_weight`` is an earlier simplification kept as an option (the
mean of the intermediate losses under one linearly decaying weight).

Labels follow the qkv LM convention (docs/contracts.md): ``labels[:, t]`` is the next token
after position ``t`` (so ``labels[:, t + k - 1]`` is the token ``k`` steps ahead), ``-100``
ignored.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _checks

__all__ = ["IGNORE_INDEX", "float32_at_least", "check_labels", "lm_loss", "future_loss", "layer_loss_weight",
           "layer_loss_active"]

IGNORE_INDEX = -100


def float32_at_least(logits: Tensor) -> Tensor:
    """Half-precision logits in float32 (log-softmax of large vocabularies loses accuracy in
    float16/bfloat16); float32 and float64 unchanged."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def check_labels(name: str, labels: Any, n_classes: int, shape: Sequence[int]) -> Tensor:
    """Check integer targets of ``shape`` with values in ``[0, n_classes)`` or ``-100`` (ignored)."""
    _checks.tensor(name, labels)
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer (torch.long) tensor, got dtype {labels.dtype}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(labels.shape)}")
    if torch.compiler.is_compiling():  # a traced graph does not read values (checked eagerly only)
        return labels
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= n_classes))
    if bool(bad.any()):
        raise ValueError(f"{name} must lie in [0, {n_classes}) or be {IGNORE_INDEX} (ignored), "
                         f"got {int(labels[bad][0])}")
    return labels


def lm_loss(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy ``-1/|T| sum_{t in T} log p(labels_t | x_{<=t})`` over the non-ignored positions ``T``
    (0 when there are none).

    ``logits (B, L, V)``, ``labels (B, L)`` long with ``-100`` ignored. Computed in float32 at least.
    """
    total = F.cross_entropy(float32_at_least(logits).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                            label_smoothing=label_smoothing, reduction="sum")
    # a batch with no target (e.g. nothing masked for MLM) gives 0, not 0/0 = NaN
    return total / (labels != IGNORE_INDEX).sum().clamp_min(1)


def future_loss(logits: Tensor, labels: Tensor, k: int) -> Tensor:
    """Loss of a head predicting the token ``k`` steps ahead: position ``t`` is scored against
    ``labels[:, t + k - 1]`` for ``t = 0 .. L - k`` (``k = 1`` is ``lm_loss``).

    ``logits (B, L, V)``, ``labels (B, L)``. A window shorter than ``k`` has no such target: 0.
    """
    _checks.positive_int("k", k)
    L = labels.shape[1]
    if k > L:
        return logits.sum() * 0.0  # keeps the graph (and DDP) aware of the head
    return lm_loss(logits[:, :L - k + 1], labels[:, k - 1:])


def layer_loss_weight(step: int, decay_steps: int) -> float:
    """Weight of the intermediate-layer losses at training ``step``: ``max(0, 1 - step / decay_steps)``,
    linear from 1 to 0 over ``decay_steps`` updates (Al-Rfou et al. 2018 stop each intermediate
    loss part-way through training); ``decay_steps = 0`` keeps the weight at 1."""
    _checks.positive_int("step", step, allow_zero=True)
    _checks.positive_int("decay_steps", decay_steps, allow_zero=True)
    if decay_steps == 0:
        return 1.0
    return max(0.0, 1.0 - step / decay_steps)


def layer_loss_active(layer: int, n_layers: int, step: int, total_steps: int) -> bool:
    """Whether layer ``layer`` (1-based, of ``n_layers``) still predicts at training ``step`` of
    ``total_steps`` (Al-Rfou et al. 2018, §2.2): an intermediate layer ``l`` stops after the fraction
    ``l / (2n)`` of training, i.e. it is active while ``step / total_steps < l / (2n)``; the top
    layer always predicts. ``total_steps = 0`` (length unknown) keeps every layer active."""
    _checks.positive_int("n_layers", n_layers)
    _checks.positive_int("layer", layer)
    if layer > n_layers:
        raise ValueError(f"layer must be in [1, n_layers={n_layers}], got {layer}")
    _checks.positive_int("step", step, allow_zero=True)
    _checks.positive_int("total_steps", total_steps, allow_zero=True)
    if layer == n_layers or total_steps == 0:
        return True
    return 2 * n_layers * step < layer * total_steps  # exact in integers
