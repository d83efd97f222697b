"""BERT: a bidirectional Transformer encoder pre-trained by masked language modelling and
next-sentence prediction (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional
Transformers for Language Understanding", arXiv:1810.04805), on the shared stack.

    x   = LN(token + segment + position embeddings)          (§3, Figure 2)
    h   = Encoder(x)                                         (post-LN blocks, GELU)
    MLM: P(w | h_i) = softmax(LN(gelu(h_i W_t + b_t)) E^T + b)   (output tied to the token embeddings)
    pooled = tanh(h_[CLS] W_p + b_p); NSP: softmax(pooled W_nsp); classification: softmax(pooled W_c)

``head="encoder"`` is the encoder alone (a checkpoint without heads, e.g. all-MiniLM-L6-v2, loads
as one): no MLM, NSP or classification layers are built or computed, and the output carries
transformers' names beside qkv's: ``last_hidden_state`` (``hidden``) and ``pooler_output``.

The masked LM's 80/10/10 corruption of §3.1 (Task #1) is done to the data, by the task:
``qkv.tasks.bert_tasks.mask_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...blocks import ACTIVATIONS
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..losses import IGNORE_INDEX, check_labels, float32_at_least, lm_loss
from .stack import bool_token_mask, init_normal, StackConfig, TransformerStack, check_token_mask

__all__ = ["BERT", "BERTConfig", "BERTOutput", "attention_mask_bool"]

HEADS = ("pretraining", "classification", "encoder")


@dataclass
class BERTOutput(ModelOutput):
    """``ModelOutput`` with transformers' names for the encoder's results: ``last_hidden_state``
    (the same tensor as ``hidden``, ``(B, L, d_model)``) and ``pooler_output``
    (``tanh(h_[CLS] W_p + b_p)``, ``(B, d_model)``). With ``head="encoder"`` ``logits`` is None."""

    pooler_output: Optional[Tensor] = None

    @property
    def last_hidden_state(self) -> Optional[Tensor]:
        return self.hidden


# a pytree node as ModelOutput is: torch.export and torch.compile return it from a traced graph
torch.utils._pytree.register_dataclass(BERTOutput, serialized_type_name="qkv.models.transformer.bert.BERTOutput")


def attention_mask_bool(name: str, mask: Any, ids: Tensor) -> Optional[Tensor]:
    """A ``(B, L)`` padding mask as bool (True = real token): a bool mask as it is, or an integer
    one of 0s and 1s as transformers takes it (``tokenizer(...)["attention_mask"]``); other values
    (a float mask, a 2) are refused naming ``name``."""
    return check_token_mask(name, bool_token_mask(name, mask), ids)


class Activation(nn.Module):
    """The feed-forward activation ``config.activation`` as a module (the MLM transform's, as in
    the original implementation, which uses ``hidden_act`` there too)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def extra_repr(self) -> str:
        return repr(self.name)

    def forward(self, x: Tensor) -> Tensor:
        return ACTIVATIONS[self.name](x)


@dataclass
class BERTConfig(StackConfig):
    """BERT-base by default (Devlin et al. 2019, §3)."""

    vocab_size: int = 30522  # WordPiece vocabulary
    n_segments: int = 2  # segment (token type) embeddings: sentence A / B
    max_len: int = 512  # learned positions
    n_layers: int = 12  # blocks
    d_model: int = 768  # width
    n_heads: int = 12  # heads
    d_ff: int = 3072  # feed-forward width
    dropout: float = 0.1  # embedding and residual dropout
    attention_dropout: float = 0.1  # dropout on the attention weights
    activation: str = "gelu"  # feed-forward activation
    residual: str = "post-ln"  # BERT keeps the paper's post-LN wiring
    positional: str = "learned"  # learned absolute positions
    layer_norm_eps: float = 1e-12  # BERT's LayerNorm epsilon
    num_labels: int = 2  # classes of the sequence-classification head
    head: str = "pretraining"  # "pretraining": logits = MLM (B, L, V), loss = MLM + NSP | "classification": logits (B, num_labels) | "encoder": no head
    mlm_logits: str = "all"  # "all": MLM logits at every position | "selected": with labels, only at the selected positions (M, V)

    def __post_init__(self) -> None:
        super().__post_init__()
        _checks.positive_int("vocab_size", self.vocab_size)
        _checks.positive_int("n_segments", self.n_segments, allow_zero=True)
        _checks.positive_int("num_labels", self.num_labels)
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if self.mlm_logits not in ("all", "selected"):
            raise ValueError(f"mlm_logits must be 'all' or 'selected', got {self.mlm_logits!r}")


@register("model", "bert")
class BERT(QKVModel):
    """BERT bidirectional encoder with MLM, NSP and sequence-classification heads (Devlin et al. 2019).

    ``forward(input_ids (B, L), token_type_ids=None (B, L), attention_mask=None (B, L) bool,
    labels=None, next_sentence_label=None (B,))``. With ``head="pretraining"``: ``labels (B, L)``
    are MLM targets (-100 ignored), ``logits (B, L, V)`` (with ``mlm_logits="selected"`` and
    labels: ``(M, V)`` at the ``M`` labelled positions in row-major order, as the original
    implementation gathers ``masked_lm_positions``), ``aux["nsp_logits"] (B, 2)``; with
    ``head="classification"``: ``labels (B,)``, ``logits (B, num_labels)``. ``weights``: per layer
    ``(B, H, L, L)``. With ``head="encoder"`` (no head is built): ``logits`` None, no labels.
    Every head returns a ``BERTOutput``: ``hidden``/``last_hidden_state (B, L, d_model)``,
    ``pooler_output (B, d_model)``. ``attention_mask`` may be bool or 0/1 integers.
    """

    suggested_tasks = ("bert-pretrain", "bbc-news-tokens")  # `qkv list model`
    config_class = BERTConfig
    task_kinds = frozenset({"classification", "pretraining"})
    input_key = "input_ids"  # token ids (bbc-news is given as bbc-news-tokens)
    context_parallel = True  # the encoder; the heads that read [CLS] refuse (below)
    init_task_fields = ("head", "num_labels")  # a fine-tuning task chooses the head (qkv train --init)
    init_fresh = ("classifier.",)  # ...which starts fresh; the encoder, pooler and MLM/NSP heads are copied
    # "paper": BERT-base (the config's defaults); "cpu": a small encoder that trains in minutes on 2 cores
    presets = {"paper": {}, "cpu": {"n_layers": 2, "d_model": 128, "n_heads": 2, "d_ff": 512}}
    default_preset = "cpu"

    def context_parallel_refusal(self) -> Optional[str]:
        if self.config.head == "pretraining":
            return ("with head='pretraining' its loss adds next-sentence prediction from the [CLS] token, the "
                    "sequence's first position, which the first rank alone holds")
        if self.config.head == "classification":
            return ("with head='classification' it classifies from the [CLS] token, the sequence's first "
                    "position, which the first rank alone holds")
        return super().context_parallel_refusal()

    def __init__(self, config: BERTConfig) -> None:
        super().__init__(config)
        c = config
        self.stack = TransformerStack(c, vocab_size=c.vocab_size, n_segments=c.n_segments, embedding_norm=True)
        heads = c.head != "encoder"  # an encoder alone builds (and computes) none of the heads
        if heads:  # MLM head: transform, then the output projection tied to the token embeddings, plus a bias
            self.mlm_transform = nn.Sequential(nn.Linear(c.d_model, c.d_model), Activation(c.activation),
                                               nn.LayerNorm(c.d_model, eps=c.layer_norm_eps))
            self.mlm_decoder = nn.Linear(c.d_model, c.vocab_size)
        self.pooler = nn.Linear(c.d_model, c.d_model)  # pooled = tanh(h_[CLS] W_p + b_p)
        if heads:
            self.nsp_head = nn.Linear(c.d_model, 2)  # IsNext / NotNext
            self.classifier_dropout = nn.Dropout(c.dropout)
            self.classifier = nn.Linear(c.d_model, c.num_labels)
        self.apply(init_normal)  # N(0, 0.02) weights, zero biases (BERT)
        if heads:
            self.mlm_decoder.weight = self.stack.embed.token.weight

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                next_sentence_label: Optional[Tensor] = None, need_weights: bool = False) -> BERTOutput:
        """``attention_mask (B, L)`` bool or 0/1 integers: True/1 = real token (padding keys are masked out)."""
        c = self.config
        _checks.token_ids("input_ids", input_ids, c.vocab_size)
        if input_ids.shape[1] == 0 and input_ids.shape[0] > 0:
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: BERT pools its first position (the [CLS] "
                             "token); give each sequence at least one position")
        attention_mask = attention_mask_bool("attention_mask", attention_mask, input_ids)
        out = self.stack(input_ids, token_type_ids, mask=attention_mask, need_weights=need_weights)
        h = out.hidden  # (B, L, d_model)
        first = h[:, 0] if h.shape[1] else h.new_zeros(0, h.shape[2])  # an empty batch (0, 0) has no position
        pooled = torch.tanh(self.pooler(first))  # (B, d_model): the [CLS] position
        loss, aux, logits = None, {}, None
        if c.head == "encoder":
            given = [n for n, v in (("labels", labels), ("next_sentence_label", next_sentence_label)) if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} given to a BERT with head='encoder' (no head to train); "
                                 "build it with head='classification' or 'pretraining'")
        elif c.head == "classification":
            if next_sentence_label is not None:
                raise ValueError("next_sentence_label is a pre-training target; this BERT has head='classification'")
            logits = self.classifier(self.classifier_dropout(pooled))  # (B, num_labels)
            if labels is not None:
                check_labels("labels", labels, c.num_labels, (input_ids.shape[0],))
                loss = F.cross_entropy(float32_at_least(logits), labels, ignore_index=IGNORE_INDEX)
        else:
            if labels is not None:
                check_labels("labels", labels, c.vocab_size, input_ids.shape)
            if labels is not None and c.mlm_logits == "selected":
                # the original implementation's masked_lm_positions: decode the selected positions only
                picked = labels != IGNORE_INDEX  # (B, L)
                logits = self.mlm_decoder(self.mlm_transform(h[picked]))  # (M, V), row-major order
                targets = labels[picked][None]  # (1, M)
            else:
                logits = self.mlm_decoder(self.mlm_transform(h))  # (B, L, V)
                targets = labels
            nsp_logits = self.nsp_head(pooled)  # (B, 2)
            aux["nsp_logits"] = nsp_logits
            terms = []
            if labels is not None:
                terms.append(lm_loss(logits if logits.dim() == 3 else logits[None], targets))
                aux["mlm_loss"] = terms[-1].detach()
            if next_sentence_label is not None:
                check_labels("next_sentence_label", next_sentence_label, 2, (input_ids.shape[0],))
                terms.append(F.cross_entropy(float32_at_least(nsp_logits), next_sentence_label, ignore_index=IGNORE_INDEX))
                aux["nsp_loss"] = terms[-1].detach()
            loss = sum(terms[1:], terms[0]) if terms else None
        return BERTOutput(loss=loss, logits=logits, weights=out.weights, aux=aux, hidden=h, pooler_output=pooled)
