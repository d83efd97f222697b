"""Adaptive-span Transformer language model (Sukhbaatar et al. 2019, "Adaptive Attention Span in
Transformers", arXiv:1905.07799): a causal Transformer LM whose every head learns its span with
the ``adaptive-span`` kernel (``qkv.attention.adaptive_span``), trained with the L1 span penalty

    loss = L_LM + lambda * sum_layers mean_heads z_{l,h}        (z in positions)

(the coefficient applies to the mean over heads, as in the authors' code). The kernels' state is
a cache of the last ``S - 1`` keys and values per layer, so a segment continued with ``state=``
looks up to ``S`` positions back across the segment boundary (as the paper's XL-style cache);
evaluation segment by segment with the state equals one pass over the concatenation.

Training on ``--set task.stream=true`` carries that cache from one batch to the next (the
trainer's ``carries_state`` hook; detached, no gradient flows into it, and saved in checkpoints),
so every position sees ``S`` back, as in the paper; on random windows a span can only use the
``block_size - 1`` positions of its window.

Positions: the paper's — learned relative position embeddings on the keys, ``s_tr = q_t^T (k_r +
p_{t-r})`` (§2; ``position_embeddings=True`` on the kernel), one ``(S, d_head)`` table shared by
every head and layer as in the authors' code — and no absolute positions (``positional="none"``):
a score sees the distance ``t - r``, which is also what the span mask acts on, and a segment
continued from the cache needs no position offset.
``set_step`` (called by the trainer before every update) clamps each span into ``[0, S]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import Tensor

from ... import _checks
from ..._plot import pyplot, save_figure
from ...attention.adaptive_span import AdaptiveSpanAttention
from ...registry import register
from ..base import ModelOutput
from .gpt import GPT, GPTConfig
from ...types import KVCache
from .stack import BlockState, StackState

__all__ = ["AdaptiveSpanTransformer", "AdaptiveSpanTransformerConfig"]


def _detach(cache: KVCache) -> KVCache:
    return KVCache(cache.key.detach(), cache.value.detach(), cache.offset)


@dataclass
class AdaptiveSpanTransformerConfig(GPTConfig):
    """A small character LM (the paper's small enwik8/text8 model scaled to CPU minutes)."""

    vocab_size: int = 256  # the task's vocabulary when trained from the CLI
    n_layers: int = 4  # blocks
    d_model: int = 128  # width
    n_heads: int = 4  # heads, each with its own span
    d_ff: int = 512  # feed-forward width
    dropout: float = 0.1  # residual and embedding dropout
    activation: str = "relu"  # feed-forward activation (the paper: ReLU)
    residual: str = "pre-ln"  # x + F(LN(x)), final LayerNorm
    positional: str = "none"  # no absolute positions: the relative position embeddings below give the order
    max_len: int = 4096  # sinusoid rows cached when positional="sinusoidal" (any length works)
    position_embeddings: bool = True  # the paper's learned relative position embeddings p_{t-r} on the keys
    tie_embeddings: bool = True  # output projection = token embedding transposed
    attention: str = "adaptive-span"  # the kernel (fixed)
    attention_kwargs: Dict[str, Any] = field(default_factory=dict)  # filled from the fields below
    max_span: int = 256  # S: the longest span a head may learn
    ramp: float = 32.0  # R: width of the soft mask's ramp (the paper: 32)
    init_span: float = 0.0  # z at initialisation (the authors' code: 0, spans grow as needed)
    dynamic: bool = False  # z_t = S sigmoid(v^T q_t + b) per position instead of one z per head
    span_loss_coef: float = 2e-6  # lambda of the span penalty (the paper's character LMs: 2e-6)

    def __post_init__(self) -> None:
        if self.attention != "adaptive-span":
            raise ValueError(f"attention must be 'adaptive-span' for this model, got {self.attention!r}")
        _checks.positive_int("max_span", self.max_span)
        if isinstance(self.span_loss_coef, bool) or not isinstance(self.span_loss_coef, (int, float)) or self.span_loss_coef < 0:
            raise ValueError(f"span_loss_coef must be a float >= 0, got {self.span_loss_coef!r}")
        if not isinstance(self.position_embeddings, bool):
            raise TypeError(f"position_embeddings must be a bool, got {self.position_embeddings!r}")
        self.attention_kwargs = {"max_span": self.max_span, "ramp": self.ramp, "init_span": self.init_span,
                                 "dynamic": self.dynamic, "position_embeddings": self.position_embeddings}
        super().__post_init__()
        AdaptiveSpanAttention(causal=True, n_heads=self.n_heads, d_head=self.d_model // self.n_heads,
                              **self.attention_kwargs)  # validates the span knobs, naming the bad one


@register("model", "adaptive-span", "adaptive-span-transformer")
class AdaptiveSpanTransformer(GPT):
    """Adaptive-span Transformer LM (Sukhbaatar et al. 2019): each head's soft mask clamp((R + z - x)/R, 0, 1), L1 span penalty.

    ``forward(input_ids (B, L), labels=None, need_weights=False, state=None, return_state=False)``
    -> ``ModelOutput``; in training mode ``loss`` adds ``span_loss_coef * span_penalty()``;
    ``aux``: ``lm_loss``, ``span_penalty``, ``mean_span``. ``spans()`` gives ``(n_layers, n_heads)``.
    """

    config_class = AdaptiveSpanTransformerConfig
    task_kinds = frozenset({"lm"})  # its forward has no classification head
    carries_state = True  # on stream tasks the trainer passes the span cache from one batch to the next
    train_defaults = {"lr": 1e-3, "steps": 1500, "batch_size": 16, "warmup": 100}

    def kernels(self) -> list:
        """The ``adaptive-span`` kernel of every layer, bottom first."""
        return [block.self_attn.kernel for block in self.stack.layers]

    def spans(self) -> Tensor:
        """``(n_layers, n_heads)`` the learned spans ``z`` in positions (dynamic: mean ``z_t`` of the last call)."""
        return torch.stack([k.spans().detach().float().expand(self.config.n_heads) for k in self.kernels()])

    def span_penalty(self) -> Tensor:
        """``sum_layers mean_heads z`` (differentiable)."""
        return torch.stack([k.span_loss() / (k.n_heads or 1) for k in self.kernels()]).sum()

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """Before each update: keep every span in ``[0, S]`` (the paper clamps after each update)."""
        super().set_step(step, total_steps)
        for kernel in self.kernels():
            kernel.clamp_()

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False,
                state: Optional[StackState] = None, return_state: bool = False) -> ModelOutput:
        out = super().forward(input_ids, labels=labels, need_weights=need_weights, state=state, return_state=return_state)
        penalty = self.span_penalty()
        out.aux["span_penalty"] = penalty.detach()
        out.aux["mean_span"] = self.spans().mean()
        if out.loss is not None and self.training:
            out.loss = out.loss + self.config.span_loss_coef * penalty
        if out.state is not None:  # stop-gradient: the cache is context, not a path for gradients
            out.state = StackState(tuple(BlockState(_detach(b.self_attn), b.cross_kv) for b in out.state.layers),
                                   out.state.position)
        return out

    # -- carried state in checkpoints (the trainer's hooks)

    def export_state(self, state: Optional[StackState]) -> Dict[str, Tensor]:
        """The span caches as named tensors for a checkpoint (``{}`` for none)."""
        if state is None:
            return {}
        tensors = {"position": torch.tensor(state.position)}
        for n, block in enumerate(state.layers):
            tensors.update({f"cache.{n}.key": block.self_attn.key, f"cache.{n}.value": block.self_attn.value,
                            f"cache.{n}.offset": torch.tensor(block.self_attn.offset)})
        return tensors

    def import_state(self, tensors: Dict[str, Tensor]) -> Optional[StackState]:
        """Inverse of ``export_state``."""
        if not tensors:
            return None
        try:
            layers = tuple(BlockState(KVCache(tensors[f"cache.{n}.key"], tensors[f"cache.{n}.value"],
                                              int(tensors[f"cache.{n}.offset"])))
                           for n in range(len(self.stack.layers)))
            return StackState(layers, int(tensors["position"]))
        except KeyError as e:
            raise ValueError(f"saved span cache lacks {e.args[0]!r}; it holds {sorted(tensors)}") from None

    def attention_cost(self) -> Dict[str, float]:
        """Attention score computations per query, as fractions of the full span ``S`` in every layer:
        ``computed`` — what the kernel computes (per layer, the band of the largest span + ramp);
        ``per_head`` — if every head were sliced to its own ``min(S, z + R)``."""
        c = self.config
        widths = torch.tensor([k.current_span() for k in self.kernels()], dtype=torch.float32)
        per_head = (self.spans() + c.ramp).clamp(max=c.max_span)  # (n_layers, n_heads)
        return {"computed": float(widths.sum() / (c.n_layers * c.max_span)),
                "per_head": float(per_head.mean() / c.max_span)}

    def eval_report(self) -> Dict[str, float]:
        """What ``qkv eval`` prints besides the task's metrics: every span and the attention cost."""
        report = {f"span_l{l}_h{h}": float(z) for l, row in enumerate(self.spans()) for h, z in enumerate(row)}
        report["mean_span"] = float(self.spans().mean())
        cost = self.attention_cost()
        report["attention_cost_computed"] = cost["computed"]
        report["attention_cost_per_head"] = cost["per_head"]
        return report

    def visualize(self, path) -> Path:
        """``qkv viz``: the learned spans per layer (rows) and head (columns) as a heat map, to ``path``."""
        import numpy as np

        spans = self.spans().numpy()
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(1.2 + 0.7 * spans.shape[1], 1.0 + 0.5 * spans.shape[0]))
        image = ax.imshow(spans, cmap="viridis", vmin=0, vmax=self.config.max_span, origin="lower", aspect="auto")
        for (l, h), z in np.ndenumerate(spans):
            ax.text(h, l, f"{z:.0f}", ha="center", va="center", color="w" if z < self.config.max_span / 2 else "k", fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"learned span z (S = {self.config.max_span})")
        fig.colorbar(image, ax=ax)
        return save_figure(fig, path)
