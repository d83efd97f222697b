"""End-to-end memory networks — Sukhbaatar, Szlam, Weston, Fergus, "End-To-End Memory Networks",
NeurIPS 2015, arXiv:1503.08895.

A story of sentences ``x_1..x_n`` (each a bag of words ``x_ij``) is written into memory twice, as
input keys and output values::

    m_i = sum_j l_j * A x_ij + T_A(i)        c_i = sum_j l_j * C x_ij + T_C(i)
    p = softmax(u^T m)      o = sum_i p_i c_i      u^{k+1} = u^k + o^k      (one hop, K hops)
    a^ = softmax(W (o^K + u^K))

with the position encoding ``l_kj = (1 - j/J) - (k/d)(1 - 2j/J)`` (§4.1, 1-based word ``j`` of a
sentence of ``J`` words, embedding dimension ``k`` of ``d``), the temporal encoding ``T_A(i)``,
``T_C(i)`` (§4.1, ``i`` counted back from the most recent sentence) and the two weight tyings of
§2.2 (``tying``; ``T_A``/``T_C`` are tied the same way):

- ``"adjacent"``: ``A^{k+1} = C^k``, ``B = A^1`` (question embedding), ``W^T = C^K``;
- ``"layer-wise"`` (RNN-like): ``A^1 = ... = A^K``, ``C^1 = ... = C^K``, and a linear map ``H``
  in the controller update, ``u^{k+1} = H u^k + o^k``; ``B`` and ``W`` are their own matrices.

Linear start (§4.2, ``linear_start=True``): training begins with the softmax of every hop removed,
``p_i = u^T m_i``; the first time the validation loss fails to fall the softmax is re-inserted
for good. The trainer reports each evaluation through :meth:`EndToEndMemoryNetwork.on_evaluate`
(so train with ``--eval-every``); the phase is a buffer, saved in checkpoints.

Deviations: no random noise (RN) training trick; ``J`` is each sentence's own number of words
(padding words, id 0, embed to zero and carry no weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

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
    tying: str = "adjacent"  # "adjacent" (A^{k+1} = C^k, B = A^1, W^T = C^K) or "layer-wise" (A^k = A, C^k = C, u^{k+1} = H u^k + o^k)
    linear_start: bool = False  # train without the hops' softmax until the validation loss stops falling (needs eval_every)


@register("model", "memory-network", "memn2n")
class EndToEndMemoryNetwork(QKVModel):
    """End-to-end memory network (Sukhbaatar et al. 2015) with adjacent or layer-wise weight tying.

    ``p^k = softmax(u^k . m^k_i)``, ``o^k = sum_i p^k_i c^k_i``, ``u^{k+1} = u^k + o^k``,
    ``logits = W u^{K+1}``; adjacent: ``A^{k+1} = C^k``, ``B = A^1``, ``W^T = C^K``; layer-wise:
    ``A^k = A``, ``C^k = C``, ``u^{k+1} = H u^k + o^k``. In the linear-start phase ``p^k = u^k . m^k_i``.

    ``forward(story (B, S, J) long, story_mask (B, S) bool or None, query (B, Jq) long,
    labels (B,) or None, need_weights=False)`` -> ``ModelOutput(loss, logits (B, vocab_size),
    weights [p^1..p^K], each (B, S))``. Cost ``O(K B S J d)``.
    """

    config_class = MemoryNetworkConfig
    suggested_tasks = ('babi-single', 'babi-two', 'babi-counting')  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 1500, "batch_size": 32, "lr": 1e-2, "grad_clip": 40.0, "weight_decay": 0.0}

    def __init__(self, config: MemoryNetworkConfig) -> None:
        super().__init__(config)
        for name in ("vocab_size", "d_model", "n_hops", "max_sentences"):
            _checks.positive_int(name, getattr(config, name))
        if config.tying not in ("adjacent", "layer-wise"):
            raise ValueError(f"tying must be 'adjacent' or 'layer-wise', got {config.tying!r}")
        K, d = config.n_hops, config.d_model
        layer_wise = config.tying == "layer-wise"
        # adjacent: E_0 .. E_K with A^k = E_{k-1}, C^k = E_k, B = E_0, W^T = E_K
        # layer-wise: E_0 = A, E_1 = C, E_2 = B, E_3 = W (all hops share A and C)
        n_emb = 4 if layer_wise else K + 1
        self.embeddings = nn.ModuleList(nn.Embedding(config.vocab_size, d, padding_idx=0) for _ in range(n_emb))
        # temporal encodings tied as A and C: adjacent T_A^k = T_{k-1}, T_C^k = T_k; layer-wise T_A = T_0, T_C = T_1
        self.temporal = nn.ModuleList(nn.Embedding(config.max_sentences, d) for _ in range(2 if layer_wise else K + 1))
        for e in list(self.embeddings) + list(self.temporal):
            nn.init.normal_(e.weight, std=0.1)  # Sukhbaatar et al.: N(0, 0.1)
        self.H = nn.Linear(d, d, bias=False) if layer_wise else None  # u^{k+1} = H u^k + o^k
        if self.H is not None:
            nn.init.normal_(self.H.weight, std=0.1)
        self.bow = BagOfWords(config.position_encoding)
        # linear start: True while the hops' softmax is removed; the best validation loss so far
        self.register_buffer("linear_phase", torch.tensor(bool(config.linear_start)))
        self.register_buffer("best_valid_loss", torch.tensor(float("inf")))

    def on_evaluate(self, metrics: Dict[str, float]) -> None:
        """Linear start (§4.2): re-insert the softmax the first time ``valid_loss`` does not fall.
        Called by the trainer after each evaluation; a no-op outside the linear phase."""
        if not bool(self.linear_phase) or "valid_loss" not in metrics:
            return
        loss = float(metrics["valid_loss"])
        if loss >= float(self.best_valid_loss):
            self.linear_phase.fill_(False)
        else:
            self.best_valid_loss.fill_(loss)

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
        layer_wise = self.H is not None
        linear = bool(self.linear_phase)
        # u^1 = sum_j l_j * B q_j; adjacent B = A^1 = E_0, layer-wise B = E_2
        u = self.bow(query, self.embeddings[2 if layer_wise else 0])  # (B, d)
        weights: List[Tensor] = []
        m = self.memory(story, t_index, 0)  # m^1 with A^1 = E_0
        c = self.memory(story, t_index, 1) if layer_wise else None  # layer-wise: C^k = E_1 for every hop
        for k in range(1, self.config.n_hops + 1):
            if not layer_wise:
                c = self.memory(story, t_index, k)  # c^k with C^k = E_k (= A^{k+1})
            if linear:
                # linear start: p_i = u^T m_i on the real sentences (no softmax); o = sum_i p_i c_i
                p = torch.einsum("bd,bsd->bs", u, m) * story_mask
                o = torch.einsum("bs,bsd->bd", p, c)
            else:
                # p = softmax(u^T m_i) over the real sentences; o = sum_i p_i c_i
                o, p, _ = attend(u.unsqueeze(1), m, c, mask=story_mask.unsqueeze(1), score="dot", need_weights=True)
                o, p = o.squeeze(1), p.squeeze(1)
            weights.append(p)  # (B, S)
            # u^{k+1} = u^k + o^k (adjacent) or H u^k + o^k (layer-wise), (B, d)
            u = (self.H(u) if layer_wise else u) + o
            if not layer_wise:
                m = c  # A^{k+1} = C^k
        # a^ = softmax(W u^{K+1}); adjacent W^T = C^K = E_K, layer-wise W = E_3
        logits = u @ self.embeddings[-1].weight.t()  # (B, V)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return ModelOutput(loss=loss, logits=logits, weights=weights if need_weights else None)
