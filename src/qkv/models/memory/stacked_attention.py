"""Stacked attention networks — Yang, He, Gao, Deng, Smola, "Stacked Attention Networks for Image
Question Answering", CVPR 2016, arXiv:1511.02274.

A question vector ``u`` queries a set of region vectors ``v_i`` several times, each layer refining
the query with what it attended to::

    h^k   = tanh(W_I^k V + (W_Q^k u^{k-1} + b_A^k))
    p^k   = softmax(W_P^k h^k + b_P^k)
    v~^k  = sum_i p^k_i v_i
    u^k   = v~^k + u^{k-1}                                 (K layers; answer softmax(W_u u^K + b_u))

The score ``W_P tanh(W_I v_i + W_Q u + b)`` is the additive score, so each layer is a
:class:`qkv.attention.alignment.SoftAttention` with ``score="additive"`` (``b_P`` is the same for
every ``i`` and cancels in the softmax).

Here the "regions" are the sentences of a bAbI-style story (the tasks of :mod:`qkv.tasks.babi`):
``v_i`` and ``u`` are position-encoded bags of word embeddings (:class:`qkv.models.memory.memnet.BagOfWords`),
and ``v_i`` adds a learned embedding of the sentence's age (the paper's regions have a place in the
image; sentences need their place in time). Deviations: the paper's CNN/LSTM image and question
encoders are replaced by these bag-of-words encoders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...attention.alignment import SoftAttention
from ...registry import register
from ..base import ModelOutput, QKVModel
from .memnet import BagOfWords, check_story, temporal_index

__all__ = ["StackedAttentionConfig", "StackedAttention"]


@dataclass
class StackedAttentionConfig:
    vocab_size: int = 64  # word ids, 0 = padding (task.vocab.size)
    d_model: int = 64  # d, size of u and v_i
    d_attention: int = 64  # k, size of h (Yang et al.: 512 for 1024-d features)
    n_layers: int = 2  # K, attention layers (Yang et al.: 2 was best)
    max_sentences: int = 50  # story sentences the age embedding covers
    dropout: float = 0.0  # dropout on u before the answer layer


@register("model", "stacked-attention", "san")
class StackedAttention(QKVModel):
    """Stacked attention network (Yang et al. 2016): ``K`` additive-attention layers, ``u^k = v~^k + u^{k-1}``.

    ``forward(story (B, S, J) long, query (B, Jq) long, story_mask (B, S) bool or None,
    labels (B,) or None, need_weights=False)`` -> ``ModelOutput(loss, logits (B, vocab_size),
    weights [p^1..p^K], each (B, S))``.
    """

    config_class = StackedAttentionConfig
    suggested_tasks = ('babi-single', 'babi-two', 'babi-counting')  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 1500, "batch_size": 32, "lr": 3e-3, "weight_decay": 0.0}

    def __init__(self, config: StackedAttentionConfig) -> None:
        super().__init__(config)
        for name in ("vocab_size", "d_model", "d_attention", "n_layers", "max_sentences"):
            _checks.positive_int(name, getattr(config, name))
        d = config.d_model
        self.story_embedding = nn.Embedding(config.vocab_size, d, padding_idx=0)
        self.query_embedding = nn.Embedding(config.vocab_size, d, padding_idx=0)
        self.age = nn.Embedding(config.max_sentences, d)
        self.bow = BagOfWords(position=True)
        # W_P tanh(W_I v_i + W_Q u + b): the additive score, one attention per layer
        self.layers = nn.ModuleList(SoftAttention("additive", query_dim=d, key_dim=d, hidden_dim=config.d_attention)
                                    for _ in range(config.n_layers))
        self.dropout = nn.Dropout(config.dropout)
        self.answer = nn.Linear(d, config.vocab_size)  # W_u, b_u

    def forward(self, story: Tensor, query: Tensor, story_mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        story_mask = check_story(story, story_mask, query)
        if story.shape[1] > self.config.max_sentences:
            raise ValueError(f"story has {story.shape[1]} sentences (dim 1), more than max_sentences={self.config.max_sentences}")
        v = self.bow(story, self.story_embedding) + self.age(temporal_index(story_mask))  # (B, S, d)
        u = self.bow(query, self.query_embedding)  # (B, d)
        weights: List[Tensor] = []
        for attention in self.layers:
            # p^k = softmax(W_P tanh(W_I v_i + W_Q u + b)); v~^k = sum_i p_i v_i
            v_tilde, p, _ = attention(u, v, mask=story_mask)  # (B, d), (B, S)
            u = v_tilde + u  # u^k = v~^k + u^{k-1}
            weights.append(p)
        logits = self.answer(self.dropout(u))  # (B, V)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return ModelOutput(loss=loss, logits=logits, weights=weights if need_weights else None)
