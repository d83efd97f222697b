"""The Sparse Transformer (Child et al. 2019, "Generating Long Sequences with Sparse Transformers",
arXiv:1904.10509): a decoder-only language model whose self-attention follows the factorised
patterns ``strided`` or ``fixed`` (``qkv.attention.sparse``):

    attention(X) = W_p . attend(X, S)                           (eq. 2, per head)
    A1, A2: the two halves of the factorisation (band / columns, or block / summaries)

and the three ways of combining them (§4.3):

* ``sparse_mode="interleave"``: one pattern per residual block, alternating A1, A2, A1, ...
  (``attend(X, A^{(r mod p)})``);
* ``"union"``: the merged head, every block attends to ``A1 ∪ A2`` (one softmax);
* ``"heads"``: in every block half of the heads attend to A1, the other half to A2 (multi-head
  attention over the split patterns, their outputs concatenated).

Residual blocks are pre-LN (§5.2: ``H_k = H_{k-1} + resblock(norm(H_{k-1}))``, a final norm), with
GELU; the output projections of attention (``W_p``) and of the feed-forward network (``W_2``) are
initialised with the residual scaling ``1 / sqrt(2 N)`` (N blocks, two residual sub-layers each);
gradient checkpointing (recompute the blocks in backward) is on by default (§5.3).

Deviations: learned absolute positions (the paper's factorised position embeddings are for images);
no fp16 / custom GPU block-sparse kernels (the kernels here are structured CPU/GPU PyTorch).
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import nn

from ... import _checks
from ...attention import build_attention
from ...attention.base import AttentionKernel
from ...registry import register
from ...types import AttentionOutput
from .gpt import GPT, GPTConfig

__all__ = ["SparseTransformer", "SparseTransformerConfig", "HeadSplitAttention"]

MODES = ("interleave", "union", "heads")


@dataclass
class SparseTransformerConfig(GPTConfig):
    """A CPU-sized Sparse Transformer for byte-level text (contexts of thousands of bytes)."""

    max_len: int = 4096  # context length (learned positions)
    n_layers: int = 4  # residual blocks N
    d_model: int = 128  # width
    n_heads: int = 4  # heads (even for sparse_mode="heads")
    d_ff: int = 512  # feed-forward width
    dropout: float = 0.0  # residual dropout (the paper trains enwik8 with 0.4 on much larger models)
    attention: str = "strided"  # the factorised pattern: "strided" | "fixed"
    stride: int = 64  # l, about sqrt(max_len)
    c: int = 8  # fixed: summary positions per block
    sparse_mode: str = "interleave"  # "interleave" | "union" | "heads" (§4.3)
    gradient_checkpointing: bool = True  # recompute each block in backward (§5.3)
    tie_embeddings: bool = True  # output projection = token embedding transposed

    def __post_init__(self) -> None:
        if self.attention not in ("strided", "fixed"):
            raise ValueError(f"attention must be 'strided' or 'fixed' (the factorised patterns), got {self.attention!r}")
        _checks.positive_int("stride", self.stride)
        _checks.positive_int("c", self.c)
        if self.sparse_mode not in MODES:
            raise ValueError(f"sparse_mode must be one of {MODES}, got {self.sparse_mode!r}")
        default_c = next(f.default for f in dataclasses.fields(SparseTransformerConfig) if f.name == "c")
        if self.attention != "fixed" and self.c != default_c:  # a setting that cannot act is an error
            raise ValueError(f"c={self.c} (summary positions per block) acts only with attention='fixed'; "
                             f"attention={self.attention!r} has none — set attention=fixed, or leave c")
        if self.sparse_mode == "heads" and self.n_heads % 2:
            raise ValueError(f"sparse_mode='heads' splits the heads in two halves: n_heads must be even, got {self.n_heads}")
        self.attention_kwargs = {"stride": self.stride, **({"c": self.c} if self.attention == "fixed" else {})}
        super().__post_init__()


class HeadSplitAttention(AttentionKernel):
    """Heads ``[0, h/2)`` attend with one kernel, heads ``[h/2, h)`` with another (the Sparse
    Transformer's "heads" mode: A1 and A2 in separate heads of one layer); the state is the pair."""

    supports_mask = "key_padding"
    supports_state = True
    registry_name = "head-split"
    context_parallel = "ulysses-batch"  # qkv.parallel: its heads differ, so whole batch rows (all heads) per rank

    def __init__(self, first: AttentionKernel, second: AttentionKernel) -> None:
        super().__init__(causal=first.causal, dropout=first.dropout)
        self.first, self.second = first, second

    def _state_length(self, state) -> int:
        if state is None:
            return 0
        if not (isinstance(state, tuple) and len(state) == 2):
            raise TypeError(f"state must be the (first, second) pair a head-split kernel returned, got {type(state).__name__}")
        return self.first._state_length(state[0])

    def _attend(self, q, k, v, mask, state, need_weights, return_state):
        h = q.shape[1] // 2
        if mask is not None and state is not None and self.first._state_length(state[0]) != self.second._state_length(state[1]):
            raise ValueError("a mask with a head-split state needs both halves to hold the same keys")
        s1, s2 = state if state is not None else (None, None)
        a = self.first(q[:, :h], k[:, :h], v[:, :h], mask=mask, state=s1, need_weights=need_weights, return_state=return_state)
        b = self.second(q[:, h:], k[:, h:], v[:, h:], mask=mask, state=s2, need_weights=need_weights, return_state=return_state)
        weights = torch.cat([a.weights, b.weights], dim=1) if need_weights else None
        return AttentionOutput(torch.cat([a.output, b.output], dim=1), weights,
                               (a.state, b.state) if return_state else None)

    def pattern(self, n_queries: int, n_keys: int):
        return None  # differs per head: see first.pattern / second.pattern


@register("model", "sparse-transformer")
class SparseTransformer(GPT):
    """Sparse Transformer (Child et al. 2019): a pre-LN decoder-only LM with strided/fixed factorised attention, interleaved, merged or split across heads.

    ``forward(input_ids (B, L), labels=None)`` and ``generate(...)`` as ``GPT``; incremental decoding
    keeps each kernel's pattern-bounded state, so a token costs O(l + n / l) per head.
    """

    config_class = SparseTransformerConfig
    task_kinds = frozenset({"lm"})
    train_defaults = {"lr": 1e-3, "steps": 300, "batch_size": 2, "warmup": 30, "eval_max_examples": 8,
                      "eval_batches": 2}

    def __init__(self, config: SparseTransformerConfig) -> None:
        super().__init__(config)
        c = config
        for i, block in enumerate(self.stack.layers):
            block.self_attn.kernel = self.layer_kernel(c, i)
        # Residual scaling of the initial weights (§5.2): the sub-layers' output projections ~ 1/sqrt(2N).
        scale = 1.0 / math.sqrt(2 * c.n_layers)
        with torch.no_grad():
            for block in self.stack.layers:
                block.self_attn.out_proj.weight.mul_(scale)
                block.ff.w2.weight.mul_(scale)

    @staticmethod
    def layer_kernel(config: SparseTransformerConfig, layer: int) -> AttentionKernel:
        """The self-attention kernel of block ``layer`` under ``config.sparse_mode``."""
        c = config

        def build(subsets: Sequence[int]) -> AttentionKernel:
            return build_attention(c.attention, causal=True, dropout=c.attention_dropout, subsets=tuple(subsets),
                                   **c.attention_kwargs)

        if c.sparse_mode == "union":
            return build((1, 2))
        if c.sparse_mode == "interleave":
            return build((1,) if layer % 2 == 0 else (2,))
        return HeadSplitAttention(build((1,)), build((2,)))

    def patterns(self) -> Any:
        """Per block, the subsets its heads attend to (for inspection)."""
        out = []
        for block in self.stack.layers:
            k = block.self_attn.kernel
            out.append((k.first.subsets, k.second.subsets) if isinstance(k, HeadSplitAttention) else k.subsets)
        return out
