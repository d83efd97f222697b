"""Long Short-Term Memory-Network (LSTMN): an LSTM that reads a memory tape of all its earlier
states by attention at every step.

Cheng, Dong & Lapata 2016, "Long Short-Term Memory-Networks for Machine Reading"
(arXiv:1601.06733), §3 ("intra-attention"). At step ``t`` the tape holds the hidden states
``h_1 .. h_{t-1}`` and cells ``c_1 .. c_{t-1}``::

    a_i^t = v^T tanh(W_h h_i + W_x x_t + W_h~ h~_{t-1})          (the additive score)
    s^t   = softmax(a^t)
    [h~_t; c~_t] = sum_i s_i^t [h_i; c_i]                         (adaptive summary of the tape)
    [i_t; f_t; o_t] = sigma(W [h~_t; x_t] + b),  c^_t = tanh(W_c [h~_t; x_t] + b_c)
    c_t = f_t * c~_t + i_t * c^_t,   h_t = o_t * tanh(c_t)

The score is ``qkv.scores.AdditiveScore`` with the query ``[x_t; h~_{t-1}]`` (its ``W1`` is
``[W_x, W_h~]``) and the attention ``qkv.attention.alignment.SoftAttention`` with values ``[h_i; c_i]``.

Deviation: the tape starts with one slot holding the zero initial state ``h_0 = c_0 = 0`` (always
attendable), so the first step is a plain LSTM step and every step has a non-empty tape. Cost:
``O(L^2 H)`` per sequence (each step scores the whole tape).

Memory span: the paper's memory "grows with time until an upper bound of the memory span is
reached". With ``memory_span=N`` step ``t`` attends only to the last ``N`` slots of the tape (the
initial slot counts while it is among them; masked steps occupy no slot), so ``N = 1`` is an
LSTM whose previous state is ``(h~_t, c~_t) = (h_{t-1}, c_{t-1})`` and the cost is ``O(L N H)``
without padding.

:class:`LSTMNEncoder` is the recurrence (also the ``encoder="lstmn"`` of ``Seq2Seq``); :class:`LSTMN`
is the registered model, a language model or (``n_classes > 0``) a sequence classifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...attention.alignment import SoftAttention
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..sampling import sample_logits

__all__ = ["LSTMN", "LSTMNConfig", "LSTMNEncoder", "LSTMNOutput"]


class LSTMNOutput(NamedTuple):
    """outputs ``(B, L, H)`` the ``h_t``; cells ``(B, L, H)`` the ``c_t``; weights ``(B, L, L + 1)``
    the tape attention ``s^t`` (slot 0 is the initial state, slot ``i + 1`` step ``i``); final
    ``(h, c)`` each ``(B, H)``, the state at each row's last unmasked step."""

    outputs: Tensor
    cells: Tensor
    weights: Tensor
    final: Tuple[Tensor, Tensor]


class LSTMNEncoder(nn.Module):
    """The LSTMN recurrence over a sequence of vectors (Cheng et al. 2016; equations in the module docstring).

    Args:
        input_size: ``D`` of ``x_t``; hidden_size: ``H``; attn_dim: size of ``v`` in the score;
        memory_span: ``None`` (the whole tape) or ``N >= 1``: attend to the last ``N`` tape slots.

    Call ``enc(x (B, L, D), mask=None (B, L) bool)`` -> :class:`LSTMNOutput`. Masked steps are
    skipped: never read from the tape and the next query keeps the previous ``h~``, so they do
    not affect the unmasked ones (their own outputs are computed but meaningless).
    """

    def __init__(self, input_size: int, hidden_size: int, *, attn_dim: int = 64, memory_span: Optional[int] = None) -> None:
        super().__init__()
        self.input_size = _checks.positive_int("input_size", input_size)
        self.hidden_size = _checks.positive_int("hidden_size", hidden_size)
        self.memory_span = None if memory_span is None else _checks.positive_int("memory_span", memory_span)
        _checks.positive_int("attn_dim", attn_dim)
        # a_i^t = v^T tanh(W1 [x_t; h~_{t-1}] + W2 h_i + b),  W1 = [W_x, W_h~],  W2 = W_h
        self.attention = SoftAttention("additive", query_dim=input_size + hidden_size, key_dim=hidden_size,
                                       hidden_dim=attn_dim)
        # [i; f; o; c^] from [h~_t; x_t]
        self.gates = nn.Linear(hidden_size + input_size, 4 * hidden_size)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> LSTMNOutput:
        _checks.tensor("x", x, ndim=3, floating=True)
        B, L, D = x.shape
        if D != self.input_size:
            raise ValueError(f"x must have input_size={self.input_size} features (dim -1), got shape {tuple(x.shape)}")
        if L == 0:
            raise ValueError("x must have at least one step (dim 1), got length 0")
        if mask is not None:
            _checks.tensor("mask", mask, ndim=2)
            if mask.dtype != torch.bool or tuple(mask.shape) != (B, L):
                raise ValueError(f"mask must be bool (B={B}, L={L}), got {mask.dtype} {tuple(mask.shape)}")
        H = self.hidden_size
        zero = x.new_zeros(B, H)
        tape_h, tape_c = [zero], [zero]  # slot 0: the initial state h_0 = c_0 = 0
        slot_ok = [torch.ones(B, dtype=torch.bool, device=x.device)]
        h_tilde = zero  # h~_0
        outputs, cells, weights = [], [], []
        span = self.memory_span
        for t in range(L):
            # without padding the span is a window of the tape; with it, masked slots do not count
            first = 0 if span is None or mask is not None else max(0, t + 1 - span)
            keys = torch.stack(tape_h[first:], 1)  # (B, t+1-first, H)
            values = torch.cat([keys, torch.stack(tape_c[first:], 1)], -1)  # [h_i; c_i]
            allowed = torch.stack(slot_ok[first:], 1)  # (B, t+1-first)
            if span is not None and mask is not None:
                # keep the last `span` real slots: count real slots from the newest one backwards
                newer = allowed.flip(1).cumsum(1).flip(1)  # real slots at or after slot i
                allowed = allowed & (newer <= span)
            # s^t = softmax(v^T tanh(W_h h_i + W_x x_t + W_h~ h~_{t-1}));  [h~_t; c~_t] = sum_i s_i^t [h_i; c_i]
            read, s_t, _ = self.attention(torch.cat([x[:, t], h_tilde], -1), keys, values, mask=allowed)
            s_t = F.pad(s_t, (first, 0))  # (B, t+1): weights over the whole tape
            read_h, c_tilde = read[:, :H], read[:, H:]  # h~_t, c~_t: (B, H) each
            i, f, o, c_hat = self.gates(torch.cat([read_h, x[:, t]], -1)).chunk(4, -1)
            # c_t = f * c~_t + i * c^_t;  h_t = o * tanh(c_t)
            c = torch.sigmoid(f) * c_tilde + torch.sigmoid(i) * torch.tanh(c_hat)
            h = torch.sigmoid(o) * torch.tanh(c)
            # a masked step is skipped: the next query keeps the previous h~
            h_tilde = read_h if mask is None else torch.where(mask[:, t, None], read_h, h_tilde)
            outputs.append(h)
            cells.append(c)
            weights.append(F.pad(s_t, (0, L - t)))  # (B, L+1)
            tape_h.append(h)
            tape_c.append(c)
            slot_ok.append(mask[:, t] if mask is not None else slot_ok[0])
        out = torch.stack(outputs, 1)  # (B, L, H)
        cell = torch.stack(cells, 1)  # (B, L, H)
        if mask is None:
            last = torch.full((B,), L - 1, dtype=torch.long, device=x.device)
        else:
            # index of the last unmasked step (0 for an all-masked row)
            last = (torch.arange(L, device=x.device) * mask).argmax(1)  # (B,)
        pick = last.view(B, 1, 1).expand(B, 1, H)
        final = (out.gather(1, pick).squeeze(1), cell.gather(1, pick).squeeze(1))
        return LSTMNOutput(out, cell, torch.stack(weights, 1), final)


@dataclass
class LSTMNConfig:
    """Configuration of :class:`LSTMN`."""

    vocab_size: int = 256  # input vocabulary size
    d_embed: int = 64  # token embedding size (x_t)
    d_hidden: int = 128  # LSTMN state size H
    attn_dim: int = 64  # size of v in the tape score
    n_classes: int = 0  # 0: language model (next-token logits at every step); > 0: sequence classifier
    dropout: float = 0.0  # dropout on embeddings and before the output layer
    pad_id: int = 0  # padding id (its embedding is zero)
    memory_span: Optional[int] = None  # None: attend to the whole tape; N: only to its last N slots


@register("model", "lstmn")
class LSTMN(QKVModel):
    """LSTMN language model or classifier (Cheng et al. 2016): embedding -> LSTMN -> linear.

    Call ``model(input_ids (B, L), labels=None, attention_mask=None (B, L) bool, need_weights=False)``:

    * ``n_classes == 0`` (LM): logits ``(B, L, V)``, loss = cross-entropy with ``labels (B, L)``
      (next tokens, ``-100`` ignored).
    * ``n_classes > 0``: logits ``(B, n_classes)`` from the state at the last unmasked step,
      loss = cross-entropy with ``labels (B,)``.

    ``weights`` (when asked): the tape attention ``(B, L, L + 1)`` (slot 0 = initial state).
    """

    config_class = LSTMNConfig
    input_key = "input_ids"  # token ids
    suggested_tasks = ('shakespeare-char', 'enwiki-bytes')  # `qkv list model`

    def __init__(self, config: LSTMNConfig) -> None:
        super().__init__(config)
        for name in ("vocab_size", "d_embed", "d_hidden", "attn_dim"):
            _checks.positive_int(name, getattr(config, name))
        _checks.positive_int("n_classes", config.n_classes, allow_zero=True)
        self.embed = nn.Embedding(config.vocab_size, config.d_embed, padding_idx=config.pad_id)
        self.drop = nn.Dropout(config.dropout)
        self.lstmn = LSTMNEncoder(config.d_embed, config.d_hidden, attn_dim=config.attn_dim,
                                  memory_span=config.memory_span)
        self.head = nn.Linear(config.d_hidden, config.n_classes or config.vocab_size)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        _checks.token_ids("input_ids", input_ids, self.config.vocab_size)
        enc = self.lstmn(self.drop(self.embed(input_ids)), attention_mask)
        if self.config.n_classes:
            logits = self.head(self.drop(enc.final[0]))  # (B, C)
        else:
            logits = self.head(self.drop(enc.outputs))  # (B, L, V)
        loss = None
        if labels is not None:
            want = logits.shape[:-1]
            if not isinstance(labels, Tensor) or tuple(labels.shape) != tuple(want):
                got = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
                raise ValueError(f"labels must have shape {tuple(want)}, got {got}")
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)
        return ModelOutput(loss=loss, logits=logits, weights=enc.weights if need_weights else None)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> Tensor:
        """Sample ``max_new_tokens`` tokens after ``input_ids (B, L)`` (language models, ``n_classes == 0``).

        Each step re-reads the whole sequence: the tape attention of every new token reads all
        earlier hidden states anyway (``O(L)`` per token, ``O(L^2)`` per sequence, as the model).
        Returns ``(B, L + max_new_tokens)`` ids.
        """
        if self.config.n_classes:
            raise ValueError(f"this LSTMN is a classifier (n_classes={self.config.n_classes}); only a language model generates")
        _checks.positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
        ids = input_ids
        for _ in range(max_new_tokens):
            logits = self(input_ids=ids).logits[:, -1]  # (B, V)
            next_id = sample_logits(logits, temperature, top_k, top_p, generator=generator)  # (B,)
            ids = torch.cat([ids, next_id[:, None].to(ids.dtype)], dim=1)
        return ids
