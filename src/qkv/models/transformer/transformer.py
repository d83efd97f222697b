"""The Transformer encoder–decoder (Vaswani et al. 2017, "Attention Is All You Need",
arXiv:1706.03762) on the shared stack.

    memory = Encoder(src)                             N blocks: self-attention + FFN
    h      = Decoder(tgt, memory)                     N blocks: causal self-attention + cross-attention + FFN
    P(y_t | y_<t, x) = softmax(h_t E^T)               output tied to the (shared) embedding (§3.4)

Training uses label smoothing ``eps_ls = 0.1`` (§5.4). Decoding is greedy or beam search with the
GNMT length penalty ``lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha`` (Wu et al. 2016, eq. 14; the paper
uses beam 4, alpha 0.6, at most ``len(src) + 50`` tokens), one token at a time through the
kernels' state, the memory's cross-attention keys/values projected once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn

from ... import _checks
from ...registry import lookup, register
from ..base import ModelOutput, QKVModel
from ..losses import check_labels, lm_loss
from ..beam import beam_search, expand_to_beams
from .stack import StackConfig, StackState, TransformerStack, reorder_state

__all__ = ["Transformer", "TransformerConfig"]


@dataclass
class TransformerConfig(StackConfig):
    """The paper's base model (Vaswani et al. 2017, Table 3) by default."""

    vocab_size: int = 37000  # source vocabulary (and target vocabulary when tgt_vocab_size is None)
    tgt_vocab_size: Optional[int] = None  # target vocabulary; None shares one embedding matrix for source, target and output
    n_decoder_layers: Optional[int] = None  # decoder depth; None: n_layers
    label_smoothing: float = 0.1  # eps_ls of the training loss
    cross_attention: str = "softmax"  # kernel of the decoder's attention over the encoder output
    cross_attention_kwargs: Dict[str, Any] = field(default_factory=dict)  # its knobs
    pad_id: int = 0  # fills generated sequences after their EOS
    bos_id: int = 1  # first decoder input of generate
    eos_id: int = 2  # ends a generated sequence

    def __post_init__(self) -> None:
        super().__post_init__()
        _checks.positive_int("vocab_size", self.vocab_size)
        if self.tgt_vocab_size is not None:
            _checks.positive_int("tgt_vocab_size", self.tgt_vocab_size)
        if self.n_decoder_layers is not None:
            _checks.positive_int("n_decoder_layers", self.n_decoder_layers)
        _checks.probability("label_smoothing", self.label_smoothing)
        try:
            lookup("attention", self.cross_attention)
        except (ValueError, TypeError) as e:
            raise ValueError(f"cross_attention: {e}") from None
        if not isinstance(self.cross_attention_kwargs, dict):
            raise TypeError(f"cross_attention_kwargs must be a dict, got {type(self.cross_attention_kwargs).__name__}")
        target = self.tgt_vocab_size or self.vocab_size
        for name in ("pad_id", "bos_id", "eos_id"):
            value = _checks.positive_int(name, getattr(self, name), allow_zero=True)
            if value >= target:
                raise ValueError(f"{name}={value} is outside the target vocabulary of size {target}")


@register("model", "transformer")
class Transformer(QKVModel):
    """Transformer encoder-decoder (Vaswani et al. 2017) with greedy and beam-search decoding.

    ``forward(src_ids (B, S), tgt_ids (B, T), src_mask=None (B, S) bool, labels=None (B, T))``
    -> ``ModelOutput(loss, logits (B, T, V), weights={"encoder", "decoder_self", "decoder_cross"})``,
    each weights entry a list over layers of ``(B, H, M, N)``.
    """

    config_class = TransformerConfig
    context_parallel = "its decoder attends across to a second sequence (cross-attention)"
    suggested_tasks = ('reverse', 'dates', 'bible-en-es')  # `qkv list model`
    task_kinds = frozenset({"seq2seq"})
    stack_class = TransformerStack  # the encoder's and decoder's stack (Universal Transformer: a shared-depth stack)
    # "paper": the base model of Table 3 (the config's defaults); "cpu": minutes on 2 cores
    presets = {"paper": {}, "cpu": {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 512}}
    default_preset = "cpu"

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        c = config
        self.tgt_vocab_size = c.tgt_vocab_size or c.vocab_size
        scale = math.sqrt(c.d_model)  # §3.4: embeddings are multiplied by sqrt(d_model)
        self.encoder = self.stack_class(c, vocab_size=c.vocab_size, embedding_scale=scale)
        shared = self.encoder.embed.token if c.tgt_vocab_size is None else None
        self.decoder = self.stack_class(c, vocab_size=self.tgt_vocab_size, causal=True, n_layers=c.n_decoder_layers,
                                        cross_attention=c.cross_attention,
                                        cross_attention_kwargs=c.cross_attention_kwargs,
                                        token_embedding=shared, embedding_scale=scale)
        self.lm_head = nn.Linear(c.d_model, self.tgt_vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        for table in {id(m): m for m in (self.encoder.embed.token, self.decoder.embed.token)}.values():
            nn.init.normal_(table.weight, std=c.d_model ** -0.5)  # unit scale after the sqrt(d_model) factor
        self.lm_head.weight = self.decoder.embed.token.weight  # output tied to the target embedding

    def encode(self, src_ids: Tensor, src_mask: Optional[Tensor] = None, need_weights: bool = False):
        """``src_ids (B, S)`` -> encoder output (``StackOutput``; ``.hidden (B, S, d_model)``)."""
        _checks.token_ids("src_ids", src_ids, self.config.vocab_size)
        src_mask = self._check_mask(src_mask, src_ids)
        return self.encoder(src_ids, mask=src_mask, need_weights=need_weights)

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Optional[Tensor] = None,
               state: Optional[StackState] = None, need_weights: bool = False, return_state: bool = False):
        """Decoder output for ``tgt_ids (B, T)`` (continuing ``state``) attending to ``memory (B, S, d_model)``."""
        _checks.token_ids("tgt_ids", tgt_ids, self.tgt_vocab_size)
        return self.decoder(tgt_ids, memory=memory, memory_mask=src_mask, state=state,
                            need_weights=need_weights, return_state=return_state)

    @staticmethod
    def _check_mask(src_mask: Optional[Tensor], src_ids: Tensor) -> Optional[Tensor]:
        if src_mask is None:
            return None
        _checks.tensor("src_mask", src_mask, ndim=2)
        if src_mask.dtype != torch.bool:
            raise TypeError(f"src_mask must be a bool tensor (True = real token), got dtype {src_mask.dtype}")
        _checks.same("src_mask", tuple(src_mask.shape), "src_ids", tuple(src_ids.shape), "the shape")
        return src_mask

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        """Teacher-forced logits ``(B, T, V)``; with ``labels (B, T)`` the label-smoothed loss."""
        enc = self.encode(src_ids, src_mask, need_weights)
        dec = self.decode(tgt_ids, enc.hidden, src_mask, need_weights=need_weights)
        logits = self.lm_head(dec.hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            check_labels("labels", labels, self.tgt_vocab_size, tgt_ids.shape)
            loss = lm_loss(logits, labels, label_smoothing=self.config.label_smoothing)
        weights = None
        if need_weights:
            weights = {"encoder": enc.weights, "decoder_self": dec.weights, "decoder_cross": dec.cross_weights}
        return ModelOutput(loss=loss, logits=logits, weights=weights, hidden=dec.hidden)  # the decoder's

    # ------------------------------------------------------------------------- decoding

    @torch.no_grad()
    def generate(self, src_ids: Tensor, src_mask: Optional[Tensor] = None, max_new_tokens: Optional[int] = None,
                 beam_size: int = 1, length_penalty: float = 0.6, bos_id: Optional[int] = None,
                 eos_id: Optional[int] = None) -> Tensor:
        """Translate ``src_ids (B, S)`` -> ``(B, T)`` target ids (no BOS; EOS kept; ``pad_id`` after it).

        ``qkv.models.beam.beam_search`` over the decoder run one token at a time through the
        kernels' state (the memory's cross-attention keys/values projected once): ``beam_size = 1``
        is greedy decoding; larger beams keep that many hypotheses and choose the final one by
        ``log P(Y) / lp(Y)``, ``lp(Y) = ((5 + |Y|) / 6)^length_penalty``. ``max_new_tokens``
        defaults to ``S + 50`` (§6.1). Runs in the module's current mode.
        """
        c = self.config
        bos = c.bos_id if bos_id is None else bos_id
        eos = c.eos_id if eos_id is None else eos_id
        for name, value in (("bos_id", bos), ("eos_id", eos)):
            if _checks.positive_int(name, value, allow_zero=True) >= self.tgt_vocab_size:
                raise ValueError(f"{name}={value} is outside the target vocabulary of size {self.tgt_vocab_size}")
        _checks.positive_int("beam_size", beam_size)
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
            raise TypeError(f"length_penalty must be a float, got {type(length_penalty).__name__}")
        memory = self.encode(src_ids, src_mask).hidden  # (B, S, d_model)
        if max_new_tokens is None:
            max_new_tokens = src_ids.shape[1] + 50
        _checks.positive_int("max_new_tokens", max_new_tokens)
        # every hypothesis row reads its sentence's memory: rows b K .. b K + K - 1 are sentence b
        memory, src_mask = expand_to_beams((memory, src_mask), beam_size)  # (B K, S, d_model), (B K, S)

        def step(tokens: Tensor, state: Optional[StackState]):
            """One decoder step for the last tokens ``(B K,)``: log-probabilities ``(B K, V)``."""
            out = self.decode(tokens[:, None], memory, src_mask, state=state, return_state=True)
            return torch.log_softmax(self.lm_head(out.hidden[:, -1]), dim=-1), out.state, None

        result = beam_search(step, None, batch_size=src_ids.shape[0], beam_size=beam_size, bos_id=bos, eos_id=eos,
                             pad_id=c.pad_id, max_new_tokens=max_new_tokens, length_penalty=float(length_penalty),
                             reorder=reorder_state, device=memory.device)
        return result.tokens
