"""End-to-end memory networks — Sukhbaatar, Szlam, Weston, Fergus, "End-To-End Memory Networks",
NeurIPS 2015, arXiv:1503.08895.

A story of sentences ``x_1..x_n`` (each a bag of words ``x_ij``) is written into memory twice, as
input keys and output values::

    m_i = sum_j l_j * A x_ij + T_A(i)        c_i = sum_j l_j * C x_ij + T_C(i)
    p = softmax(u^T m)      o = sum_i p_i c_i      u^{k+1} = u^k + o^k      (one hop, K hops)
    a^ = softmax(W (o^K + u^K))

with the position encoding ``l_kj = (1 - j/J) - (k/d)(1 - 2j/J)`` (§4.1, 1-based word ``j`` of a
sentence of ``J`` words, embedding dimension ``k`` of ``d``), the temporal encoding ``T_A(i)``,
``T_C(i)`` (§4.1, ``i`` counted back from the most recent sentence) and adjacent weight tying
(§2.2): ``A^{k+1} = C^k``, ``B = A^1`` (question embedding), ``W^T = C^K``; ``T_A``/``T_C`` are
tied the same way.

Deviations: no linear start (LS) and no random noise (RN) training tricks; ``J`` is each
sentence's own number of words (padding words, id 0, embed to zero and carry no weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...functional import attend
from ...registry import register
from ..base import ModelOutput, QKVModel

__all__ = ["MemoryNetworkConfig", "EndToEndMemoryNetwork", "position_encoding", "BagOfWords", "check_story"]


def position_encoding(lengths: Tensor, max_words: int, d: int, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Sukhbaatar et al.'s ``l_kj = (1 - j/J) - (k/d)(1 - 2j/J)``, zero beyond each sentence's end.

    Args:
        lengths: ``(...)`` long, ``J`` of each sentence (number of real words).
        max_words: the padded sentence length; d: the embedding size.
        dtype: of the result (default: torch's default dtype); computed in it, not cast afterwards.
    Returns:
        ``(..., max_words, d)``: ``l[..., j-1, k-1]`` for 1-based ``j``, ``k``.
    """
    J = lengths.clamp(min=1).unsqueeze(-1).unsqueeze(-1).to(dtype or torch.get_default_dtype())  # (..., 1, 1)
    j = torch.arange(1, max_words + 1, device=lengths.device).view(-1, 1).to(J.dtype)  # (max_words, 1)
    k = torch.arange(1, d + 1, device=lengths.device).view(1, -1).to(J.dtype)  # (1, d)
    l = (1 - j / J) - (k / d) * (1 - 2 * j / J)  # (..., max_words, d)
    return l * (j <= J)  # zero on padding words


def check_story(story: Tensor, story_mask: Optional[Tensor], query: Tensor) -> Tensor:
    """Validate ``story (B, S, J)``, ``story_mask (B, S)``, ``query (B, Jq)``; return the mask."""
    _checks.tensor("story", story, ndim=3)
    _checks.tensor("query", query, ndim=2)
    for name, t in (("story", story), ("query", query)):
        if t.dtype != torch.long:
            raise TypeError(f"{name} must hold long word ids, got dtype {t.dtype}")
    _checks.same("story", story.shape[0], "query", query.shape[0], "the batch size (dim 0)")
    if story_mask is None:
        return (story != 0).any(-1)  # (B, S): a sentence with a word is real
    _checks.mask("story_mask", story_mask, story.shape[:2])
    if tuple(story_mask.shape) != tuple(story.shape[:2]):
        raise ValueError(f"story_mask must be (B, S) = {tuple(story.shape[:2])}, got {tuple(story_mask.shape)}")
    return story_mask


class BagOfWords(nn.Module):
    """``sum_j l_j * E x_ij`` (position encoding) or ``sum_j E x_ij`` (plain bag of words).

    ``forward(ids (..., J) long, embedding)`` -> ``(..., d)``; id 0 is padding.
    """

    def __init__(self, position: bool = True) -> None:
        super().__init__()
        self.position = position

    def forward(self, ids: Tensor, embedding: nn.Embedding) -> Tensor:
        e = embedding(ids)  # (..., J, d)
        e = e * (ids != 0).unsqueeze(-1)  # padding words contribute nothing
        if self.position:
            l = position_encoding((ids != 0).sum(-1), ids.shape[-1], e.shape[-1], dtype=e.dtype)  # (..., J, d)
            e = e * l
        return e.sum(-2)  # (..., d)


def temporal_index(story_mask: Tensor) -> Tensor:
    """``(B, S)`` long: sentence ``i``'s distance from the most recent real sentence (0 for it)."""
    n_real = story_mask.sum(-1, keepdim=True)  # (B, 1)
    i = torch.arange(story_mask.shape[-1], device=story_mask.device)  # (S,)
    return (n_real - 1 - i).clamp(min=0) * story_mask  # (B, S)


@dataclass
class MemoryNetworkConfig:
    vocab_size: int = 64  # word ids, 0 = padding (bAbI-style tasks: task.vocab.size)
    d_model: int = 32  # d, the embedding size (Sukhbaatar et al.: 20 on bAbI)
    n_hops: int = 3  # K, memory hops
    max_sentences: int = 50  # memory slots (sentences of a story), size of T_A / T_C
    position_encoding: bool = True  # l_kj weighting of words (False: plain bag of words)
    temporal_encoding: bool = True  # add T_A(i) / T_C(i)


@register("model", "memory-network", "memn2n")
class EndToEndMemoryNetwork(QKVModel):
    """End-to-end memory network (Sukhbaatar et al. 2015) with adjacent weight tying.

    ``p^k = softmax(u^k . m^k_i)``, ``o^k = sum_i p^k_i c^k_i``, ``u^{k+1} = u^k + o^k``,
    ``logits = W (o^K + u^K)``; ``A^{k+1} = C^k``, ``B = A^1``, ``W^T = C^K``.

    ``forward(story (B, S, J) long, story_mask (B, S) bool or None, query (B, Jq) long,
    labels (B,) or None, need_weights=False)`` -> ``ModelOutput(loss, logits (B, vocab_size),
    weights [p^1..p^K], each (B, S))``. Cost ``O(K B S J d)``.
    """

    config_class = MemoryNetworkConfig
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 1500, "batch_size": 32, "lr": 1e-2, "grad_clip": 40.0, "weight_decay": 0.0}

    def __init__(self, config: MemoryNetworkConfig) -> None:
        super().__init__(config)
        for name in ("vocab_size", "d_model", "n_hops", "max_sentences"):
            _checks.positive_int(name, getattr(config, name))
        K, d = config.n_hops, config.d_model
        # E_0 .. E_K: A^k = E_{k-1}, C^k = E_k (adjacent tying); B = E_0; W^T = E_K
        self.embeddings = nn.ModuleList(nn.Embedding(config.vocab_size, d, padding_idx=0) for _ in range(K + 1))
        # T_0 .. T_K tied the same way: T_A^k = T_{k-1}, T_C^k = T_k
        self.temporal = nn.ModuleList(nn.Embedding(config.max_sentences, d) for _ in range(K + 1))
        for e in list(self.embeddings) + list(self.temporal):
            nn.init.normal_(e.weight, std=0.1)  # Sukhbaatar et al.: N(0, 0.1)
        self.bow = BagOfWords(config.position_encoding)

    def memory(self, story: Tensor, t_index: Tensor, k: int) -> Tensor:
        """Memory vectors of embedding ``E_k``: ``sum_j l_j * E_k x_ij + T_k(i)``, ``(B, S, d)``."""
        mem = self.bow(story, self.embeddings[k])  # (B, S, d)
        if self.config.temporal_encoding:
            mem = mem + self.temporal[k](t_index)  # (B, S, d)
        return mem

    def forward(self, story: Tensor, query: Tensor, story_mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        story_mask = check_story(story, story_mask, query)
        if story.shape[1] > self.config.max_sentences:
            raise ValueError(f"story has {story.shape[1]} sentences (dim 1), more than max_sentences={self.config.max_sentences}")
        t_index = temporal_index(story_mask)  # (B, S)
        # u^1 = sum_j l_j * B q_j, B = A^1 = E_0
        u = self.bow(query, self.embeddings[0])  # (B, d)
        weights: List[Tensor] = []
        m = self.memory(story, t_index, 0)  # m^1 with A^1 = E_0
        for k in range(1, self.config.n_hops + 1):
            c = self.memory(story, t_index, k)  # c^k with C^k = E_k (= A^{k+1})
            # p = softmax(u^T m_i) over the real sentences; o = sum_i p_i c_i
            o, p, _ = attend(u.unsqueeze(1), m, c, mask=story_mask.unsqueeze(1), score="dot", need_weights=True)
            weights.append(p.squeeze(1))  # (B, S)
            u = u + o.squeeze(1)  # u^{k+1} = u^k + o^k, (B, d)
            m = c  # A^{k+1} = C^k
        # a^ = softmax(W (o^K + u^K)), W^T = C^K = E_K
        logits = u @ self.embeddings[-1].weight.t()  # (B, V)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return ModelOutput(loss=loss, logits=logits, weights=weights if need_weights else None)
