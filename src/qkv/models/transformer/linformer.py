"""Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity",
arXiv:2006.04768): BERT's encoder, MLM and classification heads with the ``linformer`` kernel.

    head = softmax( Q W^Q (E K W^K)^T / sqrt(d_k) ) (F V W^V)        E, F: (k x n)   (eq. 7)

The paper's system is RoBERTa pre-training with every self-attention replaced; here the BERT
preset (``models/transformer/bert.py``: embeddings, post-LN blocks, MLM/NSP and classification
heads) is reused unchanged, only the kernel and its three knobs differ. ``sharing="layerwise"``
shares one projection across every layer (the stack hands the first layer's ``E`` to the
others through ``AttentionKernel.share_across_layers``). Not causal: the projection mixes all
positions. Cost per layer: O(n k d) instead of O(n^2 d).
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import _checks
from ...attention.linformer import SHARING
from ...registry import register
from .bert import BERT, BERTConfig

__all__ = ["Linformer", "LinformerConfig"]


@dataclass
class LinformerConfig(BERTConfig):
    """A CPU-sized Linformer encoder; ``k``, ``sharing`` and ``max_len`` (= ``n``) set the kernel."""

    vocab_size: int = 30522  # token vocabulary (the task's when trained from the CLI)
    max_len: int = 512  # n: the longest input, columns of E and F (shorter inputs use the first columns)
    n_layers: int = 4  # blocks
    d_model: int = 256  # width
    n_heads: int = 4  # heads
    d_ff: int = 1024  # feed-forward width
    attention: str = "linformer"  # the self-attention kernel
    k: int = 64  # projected length of keys and values (rows of E and F)
    sharing: str = "headwise"  # "headwise" (E, F per layer) | "key-value" (E = F per layer) | "layerwise" (one E for the stack)
    head: str = "classification"  # "classification" (logits (B, num_labels)) | "pretraining" (MLM + NSP)

    def __post_init__(self) -> None:
        _checks.positive_int("k", self.k)
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        if self.attention == "linformer":  # the dedicated fields are the kernel's knobs (one source of truth)
            self.attention_kwargs = {**self.attention_kwargs, "seq_len": self.max_len, "k": self.k,
                                     "sharing": self.sharing}
        super().__post_init__()


@register("model", "linformer")
class Linformer(BERT):
    """Linformer encoder: BERT with softmax(Q (E K)^T / sqrt(d)) (F V) self-attention, E, F (k x n) (Wang et al. 2020).

    ``forward(input_ids (B, L <= max_len), token_type_ids=None, attention_mask=None (B, L) bool,
    labels=None, next_sentence_label=None)`` as ``BERT`` (padding is applied before the length
    projection). ``weights`` per layer are the implied ``P F (B, H, L, L)`` when asked.
    """

    config_class = LinformerConfig
    train_defaults = {"steps": 300, "batch_size": 16, "lr": 5e-4, "warmup": 30}
