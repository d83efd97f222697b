"""Hierarchical attention networks — Yang, Yang, Dyer, He, Smola, Hovy, "Hierarchical Attention
Networks for Document Classification", NAACL 2016.

A document is sentences of words. Words are read by a bidirectional GRU and pooled into a
sentence vector by attention with a word context vector ``u_w``; sentence vectors are read by a
second bidirectional GRU and pooled into the document vector with a sentence context ``u_s``::

    h_it = [GRU_fwd(x_it); GRU_bwd(x_it)]
    u_it = tanh(W_w h_it + b_w),   a_it = softmax_t(u_it^T u_w),   s_i = sum_t a_it h_it
    h_i  = [GRU_fwd(s_i); GRU_bwd(s_i)]
    u_i  = tanh(W_s h_i + b_s),    a_i  = softmax_i(u_i^T u_s),    v   = sum_i a_i h_i
    p    = softmax(W_c v + b_c)

Both attention layers are :class:`qkv.models.pooling.sets.AttentionPooling` (the same function as
Ilse et al.'s MIL attention, with ``w = u_w`` or ``u_s``). The GRUs run on packed sequences, so
padding words and sentences (id 0) change nothing. :class:`FlatGRU` is the baseline of the
paper's Table 2 family: one bidirectional GRU over all the words, mean-pooled.

Deviations: the paper uses 200-d word2vec-initialised embeddings and 50-d GRUs; here embeddings
are learned from scratch (sizes in the config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ... import _checks
from ...registry import register
from ..base import ModelOutput, QKVModel
from .sets import AttentionPooling, masked_pool

__all__ = ["HANConfig", "HierarchicalAttentionNetwork", "FlatGRUConfig", "FlatGRU", "bigru"]


def bigru(gru: nn.GRU, x: Tensor, lengths: Tensor) -> Tensor:
    """Run a bidirectional ``gru`` over ``x (B, L, D)`` with ``lengths (B,)`` real steps (packed, so
    the backward direction starts at each sequence's own end); outputs beyond a length are 0.
    A zero length is run as length 1 (callers mask such rows). Returns ``(B, L, 2H)``."""
    packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
    out, _ = gru(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])  # (B, L, 2H)
    return out


def check_doc(doc: Tensor) -> None:
    _checks.tensor("doc", doc, ndim=3)
    if doc.dtype != torch.long:
        raise TypeError(f"doc must hold long word ids (0 = padding), got dtype {doc.dtype}")


@dataclass
class HANConfig:
    vocab_size: int = 20000  # word ids, 0 = padding (task.vocab.size)
    d_embed: int = 100  # word embedding size (Yang et al.: 200)
    d_hidden: int = 50  # GRU hidden size per direction (Yang et al.: 50); h_it, h_i are 2 * d_hidden
    d_attention: int = 100  # size of u_it, u_w (and u_i, u_s) (Yang et al.: 100)
    n_classes: int = 5  # document classes
    dropout: float = 0.2  # dropout on embeddings and the document vector


def _loss(logits: Tensor, labels: Optional[Tensor]) -> Optional[Tensor]:
    return None if labels is None else F.cross_entropy(logits, labels)


@register("model", "han")
class HierarchicalAttentionNetwork(QKVModel):
    """Hierarchical attention network (Yang et al. 2016): word-level and sentence-level
    bidirectional GRUs, each followed by attention pooling with a learned context vector.

    ``forward(doc (B, S, J) long (0 = padding), labels (B,) or None, need_weights=False)`` ->
    ``ModelOutput(loss, logits (B, n_classes), weights {"word": (B, S, J), "sentence": (B, S)})``.
    """

    config_class = HANConfig
    suggested_tasks = ('bbc-news',)  # `qkv list model`
    input_key = "doc"  # documents as (sentences, words) ids
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 200, "batch_size": 32, "lr": 2e-3, "warmup": 20, "weight_decay": 0.0}

    def __init__(self, config: HANConfig) -> None:
        super().__init__(config)
        for name in ("vocab_size", "d_embed", "d_hidden", "d_attention", "n_classes"):
            _checks.positive_int(name, getattr(config, name))
        H2 = 2 * config.d_hidden
        self.embedding = nn.Embedding(config.vocab_size, config.d_embed, padding_idx=0)
        self.word_gru = nn.GRU(config.d_embed, config.d_hidden, batch_first=True, bidirectional=True)
        self.word_attention = AttentionPooling(input_dim=H2, hidden_dim=config.d_attention)  # u_w is .w
        self.sentence_gru = nn.GRU(H2, config.d_hidden, batch_first=True, bidirectional=True)
        self.sentence_attention = AttentionPooling(input_dim=H2, hidden_dim=config.d_attention)  # u_s is .w
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(H2, config.n_classes)

    def forward(self, doc: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        check_doc(doc)
        B, S, J = doc.shape
        word_mask = doc != 0  # (B, S, J)
        sentence_mask = word_mask.any(-1)  # (B, S)
        # word level: h_it = biGRU(x_it), s_i = sum_t a_it h_it
        x = self.dropout(self.embedding(doc.view(B * S, J)))  # (B*S, J, E)
        h_words = bigru(self.word_gru, x, word_mask.view(B * S, J).sum(-1))  # (B*S, J, 2H)
        s, a_words, _ = self.word_attention(h_words, word_mask.view(B * S, J))  # (B*S, 2H), (B*S, J)
        # sentence level: h_i = biGRU(s_i), v = sum_i a_i h_i
        h_sent = bigru(self.sentence_gru, s.view(B, S, -1), sentence_mask.sum(-1))  # (B, S, 2H)
        v, a_sent, _ = self.sentence_attention(h_sent, sentence_mask)  # (B, 2H), (B, S)
        logits = self.classifier(self.dropout(v))  # (B, C)
        weights = {"word": a_words.view(B, S, J), "sentence": a_sent} if need_weights else None
        return ModelOutput(loss=_loss(logits, labels), logits=logits, weights=weights)


@dataclass
class FlatGRUConfig:
    vocab_size: int = 20000  # word ids, 0 = padding
    d_embed: int = 100  # word embedding size
    d_hidden: int = 50  # GRU hidden size per direction
    n_classes: int = 5  # document classes
    dropout: float = 0.2  # dropout on embeddings and the document vector


@register("model", "flat-gru")
class FlatGRU(QKVModel):
    """Baseline: one bidirectional GRU over the document's words (sentence breaks dropped),
    mean-pooled over the real words.

    ``forward(doc (B, S, J) long, labels (B,) or None, need_weights=False)`` ->
    ``ModelOutput(loss, logits (B, n_classes), weights=None)``.
    """

    config_class = FlatGRUConfig
    suggested_tasks = ('bbc-news',)  # `qkv list model`
    input_key = "doc"  # documents as (sentences, words) ids
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 200, "batch_size": 32, "lr": 2e-3, "warmup": 20, "weight_decay": 0.0}

    def __init__(self, config: FlatGRUConfig) -> None:
        super().__init__(config)
        self.embedding = nn.Embedding(config.vocab_size, config.d_embed, padding_idx=0)
        self.gru = nn.GRU(config.d_embed, config.d_hidden, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(2 * config.d_hidden, config.n_classes)

    def forward(self, doc: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        check_doc(doc)
        B = doc.shape[0]
        flat = doc.view(B, -1)  # (B, S*J)
        mask = flat != 0
        lengths = mask.sum(-1)  # (B,)
        # move the real words to the front, in order: a stable sort of "is padding"
        order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices  # (B, S*J)
        words = flat.gather(1, order)[:, : max(1, int(lengths.max()))]  # (B, L)
        h = bigru(self.gru, self.dropout(self.embedding(words)), lengths)  # (B, L, 2H)
        v = masked_pool(h, words != 0, "mean")  # (B, 2H)
        logits = self.classifier(self.dropout(v))
        return ModelOutput(loss=_loss(logits, labels), logits=logits)
