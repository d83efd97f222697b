"""The Performer (Choromanski et al. 2020, "Rethinking Attention with Performers",
arXiv:2009.14794): FAVOR+ attention in a causal LM (GPT's) and in an encoder (BERT's).

    Att(Q, K, V) ~ D^{-1} (Q' ((K')^T V)),  D = diag(Q' ((K')^T 1)),   Q' = phi(Q), K' = phi(K)
    phi(x) = exp(-||x||^2 / 2) / sqrt(m) [exp(w_1^T x), ..., exp(w_m^T x)],   w orthogonal Gaussian

Positions: learned absolute position embeddings (``positional="learned"``) in both models. The
paper changes attention only and keeps the Transformer around it — Performer is presented as
backwards-compatible with pretrained regular Transformers (the BERT/GPT kind, learned absolute
positions), whose weights it can take over — so the LM uses GPT's learned positions as the encoder
uses BERT's. Generation beyond ``max_len`` slides its window (GPT's ``generate``).

Feature redrawing: the paper redraws the random features ``w`` periodically during training. The
trainer calls ``model.set_step(step)`` before each update (docs/contracts.md); every
``redraw_every`` steps each layer draws new features from a generator seeded by
``(seed, step, layer)`` — so a run and its exact resume draw the same features. The features are
a buffer of the kernel, saved with the model: evaluation and generation use the last ones drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ... import _checks
from ..._seeding import stable_seed
from ...attention.performer import PerformerAttention
from ...registry import register
from .bert import BERT, BERTConfig
from .gpt import GPT, GPTConfig

__all__ = ["Performer", "PerformerConfig", "PerformerEncoder", "PerformerEncoderConfig", "redraw_features"]


def redraw_features(model: nn.Module, step: int, every: int, seed: int = 0) -> bool:
    """Redraw every ``PerformerAttention``'s features in ``model`` when ``step`` is a positive
    multiple of ``every`` (0: never); layer ``l`` draws from ``Generator(stable_seed(seed, step, l))``.
    Returns whether it redrew."""
    _checks.positive_int("redraw_every", every, allow_zero=True)
    if every == 0 or step == 0 or step % every:
        return False
    for layer, kernel in enumerate(m for m in model.modules() if isinstance(m, PerformerAttention)):
        kernel.redraw_features(generator=torch.Generator().manual_seed(stable_seed("performer", seed, step, layer)))
    return True


def _performer_fields(config: Any) -> None:
    _checks.positive_int("nb_features", config.nb_features)
    _checks.positive_int("redraw_every", config.redraw_every, allow_zero=True)
    if not isinstance(config.orthogonal, bool):
        raise TypeError(f"orthogonal must be a bool, got {config.orthogonal!r}")
    if config.attention == "performer":  # the dedicated fields are the kernel's knobs
        config.attention_kwargs = {**config.attention_kwargs, "nb_features": config.nb_features,
                                   "orthogonal": config.orthogonal}


@dataclass
class PerformerConfig(GPTConfig):
    """A CPU-sized causal Performer LM."""

    vocab_size: int = 256  # token vocabulary (the task's when trained from the CLI)
    max_len: int = 256  # training context
    n_layers: int = 4  # blocks
    d_model: int = 256  # width
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width
    positional: str = "learned"  # the Transformer's learned absolute positions (see the module docstring)
    attention: str = "performer"  # FAVOR+
    nb_features: int = 128  # m: random features per head
    orthogonal: bool = True  # orthogonal (FAVOR+) rather than iid features
    redraw_every: int = 1000  # redraw the features every this many training steps (0: never)
    seed: int = 0  # seeds the redraws

    def __post_init__(self) -> None:
        _performer_fields(self)
        super().__post_init__()


@register("model", "performer")
class Performer(GPT):
    """Performer causal LM: GPT with FAVOR+ attention, features redrawn every redraw_every steps (Choromanski et al. 2020).

    ``forward``/``generate`` as ``GPT`` (generation continues the per-layer ``LinearState``).
    """

    config_class = PerformerConfig
    task_kinds = frozenset({"lm"})  # GPT's classification head is untried with FAVOR+
    train_defaults = {"steps": 500, "batch_size": 16, "lr": 1e-3, "warmup": 50}

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """The trainer's hook: redraw the random features every ``redraw_every`` steps."""
        _checks.positive_int("step", step, allow_zero=True)
        redraw_features(self, step, self.config.redraw_every, self.config.seed)


@dataclass
class PerformerEncoderConfig(BERTConfig):
    """A CPU-sized Performer encoder (BERT's heads)."""

    vocab_size: int = 30522  # token vocabulary (the task's when trained from the CLI)
    n_layers: int = 4  # blocks
    d_model: int = 256  # width
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width
    attention_dropout: float = 0.0  # FAVOR+ forms no weight matrix: no attention dropout
    attention: str = "performer"  # FAVOR+ (bidirectional)
    nb_features: int = 128  # m: random features per head
    orthogonal: bool = True  # orthogonal (FAVOR+) rather than iid features
    redraw_every: int = 1000  # redraw the features every this many training steps (0: never)
    seed: int = 0  # seeds the redraws
    head: str = "classification"  # "classification" | "pretraining" (MLM + NSP)

    def __post_init__(self) -> None:
        _performer_fields(self)
        super().__post_init__()


@register("model", "performer-encoder")
class PerformerEncoder(BERT):
    """Performer encoder: BERT with bidirectional FAVOR+ attention, features redrawn on a schedule (Choromanski et al. 2020)."""

    config_class = PerformerEncoderConfig
    train_defaults = {"steps": 300, "batch_size": 16, "lr": 5e-4, "warmup": 30}

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """The trainer's hook: redraw the random features every ``redraw_every`` steps."""
        self.step = _checks.positive_int("step", step, allow_zero=True)
        redraw_features(self, step, self.config.redraw_every, self.config.seed)
