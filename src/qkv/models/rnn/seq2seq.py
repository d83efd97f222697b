"""Recurrent encoder–decoders with and without attention.

* No attention — Sutskever et al. 2014 (arXiv:1409.3215), Cho et al. 2014 (arXiv:1406.1078): the
  encoder's last state initialises the decoder, which sees the source through it alone.
* ``bahdanau`` — Bahdanau, Cho & Bengio 2014, "Neural Machine Translation by Jointly Learning to
  Align and Translate" (arXiv:1409.0473): bidirectional encoder ``h_i = [fwd_i; bwd_i]``;
  ``e_ti = v^T tanh(W s_{t-1} + U h_i)``, ``a_t = softmax(e_t)``, ``c_t = sum_i a_ti h_i``,
  ``s_t = f(s_{t-1}, y_{t-1}, c_t)``; deep output with maxout ``t_t = max(T [s_t; c_t; E y_{t-1}])``.
* ``luong-{dot,general,concat,location}``, ``local-m``, ``local-p`` — Luong, Pham & Manning 2015,
  "Effective Approaches to Attention-based Neural Machine Translation" (arXiv:1508.04025):
  ``s_t = f(s_{t-1}, [E y_{t-1}; h~_{t-1}])`` (input feeding), the score uses the current ``s_t``,
  ``h~_t = tanh(W_c [c_t; s_t])``, ``p(y_t) = softmax(W_s h~_t)``; local attention over
  ``[p_t - D, p_t + D]`` (``local-m``: ``p_t = t``; ``local-p``: predicted, with a Gaussian).

The attention itself is ``qkv.attention.alignment.SoftAttention`` / ``LocalAttention`` with a score
of ``qkv.scores``; this module only wires it into the recurrence.

Deviations from the papers: the decoder is initialised from the encoder's final states, through
``tanh(W [fwd_S; bwd_1])`` for a bidirectional encoder (Bahdanau: ``tanh(W_s bwd_1)``); the
Bahdanau readout takes ``s_t`` (Bahdanau §3.1, ``g(y_{t-1}, s_t, c_t)``; the appendix writes
``s_{t-1}``); Luong's ``dot`` score with a bidirectional encoder first projects the encoder states
to the decoder size. Sources are right-padded (``src_mask`` a prefix of True per row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ... import _checks
from ...attention.alignment import LocalAttention, SoftAttention
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..beam import beam_search, expand_to_beams
from .lstmn import LSTMNEncoder

__all__ = ["Seq2Seq", "Seq2SeqConfig", "DecoderState", "ATTENTIONS", "check_prefix_mask"]

#: the ``attention`` values and what builds them
ATTENTIONS = (None, "bahdanau", "luong-dot", "luong-general", "luong-concat", "luong-location", "local-m", "local-p")
CELLS = ("gru", "lstm")
ENCODERS = ("rnn", "lstmn")


@dataclass
class Seq2SeqConfig:
    """Configuration of :class:`Seq2Seq` (sizes default to a small CPU-friendly model)."""

    src_vocab_size: int = 64  # source vocabulary size (ids 0 .. V-1, specials included)
    tgt_vocab_size: Optional[int] = None  # target vocabulary size; None: same as the source (a shared vocabulary)
    d_embed: int = 64  # token embedding size (source and target each have their own table)
    d_hidden: int = 128  # recurrent state size of the decoder and of each encoder direction
    n_layers: int = 1  # stacked recurrent layers in the encoder and in the decoder
    cell: str = "gru"  # "gru" | "lstm" (Bahdanau used a gated unit like the GRU; Luong an LSTM)
    encoder: str = "rnn"  # "rnn" (the cell above) | "lstmn" (Cheng et al. 2016 memory-tape LSTM; 1 layer, unidirectional)
    bidirectional: Optional[bool] = None  # bidirectional encoder; None: True for "bahdanau", False otherwise
    attention: Optional[str] = "bahdanau"  # None | "bahdanau" | "luong-{dot,general,concat,location}" | "local-m" | "local-p"
    attn_dim: int = 128  # hidden size of the additive/concat scores (v, W), and of the LSTMN encoder's score
    window: int = 10  # D of local attention: the window is [p_t - D, p_t + D] (Luong used 10)
    max_src_len: int = 128  # longest source for "luong-location" (rows of W_a)
    d_readout: int = 128  # maxout units of the Bahdanau deep output layer
    dropout: float = 0.0  # dropout on embeddings, between layers and before the output layer
    pad_id: int = 0  # padding id (ignored in sources; emitted after eos by generate)
    bos_id: int = 1  # start token fed to the decoder first
    eos_id: int = 2  # end token


class DecoderState(NamedTuple):
    """The decoder's recurrent state, batch first so that beam search can reorder it.

    h:    ``(B, n_layers, H)`` hidden states (``s_t`` is ``h[:, -1]``).
    c:    ``(B, n_layers, H)`` LSTM cells, or None for a GRU.
    feed: ``(B, H)`` Luong's attentional state ``h~_{t-1}`` (input feeding), or None.
    t:    ``(B,)`` long, the index of the next output step (local-m's ``p_t = t``).
    """

    h: Tensor
    c: Optional[Tensor]
    feed: Optional[Tensor]
    t: Tensor


def check_prefix_mask(name: str, mask: Any, shape: Tuple[int, int]) -> Tensor:
    """A right-padding mask ``(B, S)`` bool: each row a prefix of at least one True."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a bool torch.Tensor (True = real token), got {got}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    lengths = mask.sum(1)  # (B,)
    if bool((lengths == 0).any()):
        raise ValueError(f"{name} has a row with no True entry: every sequence needs at least one token")
    prefix = torch.arange(shape[1], device=mask.device) < lengths.unsqueeze(1)  # (B, S)
    if not torch.equal(prefix, mask):
        raise ValueError(f"{name} must be right-padded: True for the first length positions of each row, then False")
    return mask


def _choice(name: str, value: Any, options: tuple) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class StackedCell(nn.Module):
    """``n_layers`` GRU or LSTM cells run one step: ``(x (B, D), h, c) -> (h, c)``, ``h, c (B, L, H)``."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, n_layers: int, dropout: float) -> None:
        super().__init__()
        _choice("cell", cell, CELLS)
        make = nn.GRUCell if cell == "gru" else nn.LSTMCell
        self.is_lstm = cell == "lstm"
        self.cells = nn.ModuleList(make(input_size if i == 0 else hidden_size, hidden_size) for i in range(n_layers))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, h: Tensor, c: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        hs, cs = [], []
        inp = x
        for layer, cell in enumerate(self.cells):
            if self.is_lstm:
                h_l, c_l = cell(inp, (h[:, layer], c[:, layer]))
                cs.append(c_l)
            else:
                h_l = cell(inp, h[:, layer])
            hs.append(h_l)
            inp = self.drop(h_l)
        return torch.stack(hs, 1), (torch.stack(cs, 1) if self.is_lstm else None)  # (B, L, H)


@register("model", "seq2seq")
class Seq2Seq(QKVModel):
    """RNN encoder–decoder with no, Bahdanau (additive), Luong global or Luong local attention.

    Decoder step ``t`` (teacher forced in ``forward``, greedy or beam search in ``generate``):

    * ``None``: ``s_t = f(s_{t-1}, E y_{t-1})``, ``p(y_t) = softmax(W_o s_t)``; ``s_0`` = encoder's last state.
    * ``bahdanau``: ``a_t = softmax(v^T tanh(W s_{t-1} + U h_i))``, ``c_t = sum_i a_ti h_i``,
      ``s_t = f(s_{t-1}, [E y_{t-1}; c_t])``, ``p(y_t) = softmax(W_o maxout(T [s_t; c_t; E y_{t-1}]))``.
    * Luong: ``s_t = f(s_{t-1}, [E y_{t-1}; h~_{t-1}])``, ``a_t = align(s_t, h)`` (score ``dot``
      ``s^T h``, ``general`` ``s^T W h``, ``concat`` ``v^T tanh(W [s; h])``, ``location``
      ``softmax(W_a s_t)``, or local), ``h~_t = tanh(W_c [c_t; s_t])``, ``p(y_t) = softmax(W_s h~_t)``.

    Call ``model(src_ids (B, S), tgt_ids (B, T), src_mask=None (B, S) bool, labels=None (B, T),
    need_weights=False)`` -> ``ModelOutput(loss, logits (B, T, V_tgt), weights (B, T, S) or None)``;
    ``weights[b, t]`` is the alignment of output ``t`` over the source (None without attention).
    Cost per output step: the cell's ``O(B H^2)`` plus the score's ``O(B S H)``.
    """

    config_class = Seq2SeqConfig
    suggested_tasks = ('dates', 'reverse', 'bible-en-es')  # `qkv list model`
    task_kinds = frozenset({"seq2seq"})
    #: the recipe ``qkv train seq2seq`` uses unless flags say otherwise: small recurrent models want a
    #: higher learning rate than the trainer's transformer default (``dates`` with Bahdanau attention:
    #: >95% exact match in a few CPU minutes; see docs/reproductions/rnn-attention.md)
    train_defaults = {"steps": 600, "batch_size": 64, "lr": 3e-3, "warmup": 50, "schedule": "cosine",
                      "weight_decay": 0.0, "eval_every": 200}

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__(config)
        cfg = config
        for name in ("src_vocab_size", "d_embed", "d_hidden", "n_layers", "attn_dim", "max_src_len", "d_readout"):
            _positive(name, getattr(cfg, name))
        _choice("cell", cfg.cell, CELLS)
        _choice("encoder", cfg.encoder, ENCODERS)
        _choice("attention", cfg.attention, ATTENTIONS)
        if cfg.tgt_vocab_size is not None:
            _positive("tgt_vocab_size", cfg.tgt_vocab_size)
        if not 0.0 <= cfg.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {cfg.dropout!r}")
        self.attention_kind = cfg.attention
        bidir = cfg.attention == "bahdanau" and cfg.encoder == "rnn" if cfg.bidirectional is None else cfg.bidirectional
        if cfg.encoder == "lstmn" and (bidir or cfg.n_layers != 1):
            raise ValueError("encoder='lstmn' is a single unidirectional layer: set bidirectional=False and n_layers=1")
        self.bidirectional = bool(bidir)
        H, E, L = cfg.d_hidden, cfg.d_embed, cfg.n_layers
        self.tgt_vocab = cfg.tgt_vocab_size or cfg.src_vocab_size
        self.src_embed = nn.Embedding(cfg.src_vocab_size, E, padding_idx=cfg.pad_id)
        self.tgt_embed = nn.Embedding(self.tgt_vocab, E, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)

        # ---- encoder: h_i, (B, S, H_enc)
        if cfg.encoder == "lstmn":
            self.encoder: nn.Module = LSTMNEncoder(E, H, attn_dim=cfg.attn_dim)
        else:
            rnn = nn.GRU if cfg.cell == "gru" else nn.LSTM
            self.encoder = rnn(E, H, num_layers=L, batch_first=True, bidirectional=self.bidirectional,
                               dropout=cfg.dropout if L > 1 else 0.0)
        H_enc = H * (2 if self.bidirectional else 1)
        # s_0 = tanh(W_init [fwd_S; bwd_1]) for a bidirectional encoder (identity otherwise)
        self.init_h = nn.Linear(H_enc, H) if self.bidirectional else None
        self.init_c = nn.Linear(H_enc, H) if self.bidirectional and cfg.cell == "lstm" else None
        # Luong's dot score compares s_t with h_i directly: bring h_i to the decoder size
        self.memory_proj = nn.Linear(H_enc, H, bias=False) if cfg.attention == "luong-dot" and H_enc != H else None
        K = H if self.memory_proj is not None else H_enc  # key (= value) size

        # ---- attention
        a = cfg.attention
        self.attention: Optional[nn.Module] = None
        if a == "bahdanau":
            self.attention = SoftAttention("additive", query_dim=H, key_dim=K, hidden_dim=cfg.attn_dim)
        elif a == "luong-dot":
            self.attention = SoftAttention("dot")
        elif a == "luong-general":
            self.attention = SoftAttention("general", query_dim=H, key_dim=K)
        elif a == "luong-concat":
            self.attention = SoftAttention("concat", query_dim=H, key_dim=K, hidden_dim=cfg.attn_dim)
        elif a == "luong-location":
            self.attention = SoftAttention("location", query_dim=H, max_keys=cfg.max_src_len)
        elif a in ("local-m", "local-p"):
            _positive("window", cfg.window)
            mode = "monotonic" if a == "local-m" else "predictive"
            self.attention = LocalAttention("general", window=cfg.window, mode=mode, query_dim=H, key_dim=K)

        # ---- decoder cell and output layer
        if a is None:
            self.decoder = StackedCell(cfg.cell, E, H, L, cfg.dropout)
            self.out = nn.Linear(H, self.tgt_vocab)  # W_o
        elif a == "bahdanau":
            self.decoder = StackedCell(cfg.cell, E + K, H, L, cfg.dropout)
            self.readout = nn.Linear(H + K + E, 2 * cfg.d_readout)  # T, maxout over pairs
            self.out = nn.Linear(cfg.d_readout, self.tgt_vocab)  # W_o
        else:
            self.decoder = StackedCell(cfg.cell, E + H, H, L, cfg.dropout)  # input feeding [E y; h~]
            self.W_c = nn.Linear(K + H, H, bias=False)
            self.out = nn.Linear(H, self.tgt_vocab)  # W_s

    # ------------------------------------------------------------------------------ encoder

    def encode(self, src_ids: Tensor, src_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, DecoderState]:
        """Run the encoder.

        Returns:
            memory ``(B, S, K)`` (the ``h_i``, zeros at padding), mask ``(B, S)`` bool and the
            decoder's initial :class:`DecoderState`.
        """
        cfg = self.config
        _checks.token_ids("src_ids", src_ids, cfg.src_vocab_size)
        B, S = src_ids.shape
        if S == 0:
            raise ValueError("src_ids must have at least one position (dim 1), got length 0")
        if src_mask is None:
            src_mask = torch.ones(B, S, dtype=torch.bool, device=src_ids.device)
        check_prefix_mask("src_mask", src_mask, (B, S))
        if cfg.attention == "luong-location" and S > cfg.max_src_len:
            raise ValueError(f"src_ids has length {S} > max_src_len={cfg.max_src_len} of the location score")
        x = self.drop(self.src_embed(src_ids))  # (B, S, E)
        lengths = src_mask.sum(1)  # (B,)
        L, H = cfg.n_layers, cfg.d_hidden
        if cfg.encoder == "lstmn":
            enc = self.encoder(x, src_mask)
            memory = enc.outputs * src_mask.unsqueeze(-1)  # (B, S, H)
            h_fin, c_fin = enc.final  # (B, H) each
            h0 = h_fin.unsqueeze(1)  # (B, 1, H)
            c0 = c_fin.unsqueeze(1) if cfg.cell == "lstm" else None
        else:
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            out, final = self.encoder(packed)
            memory, _ = pad_packed_sequence(out, batch_first=True, total_length=S)  # (B, S, H_enc)
            hn, cn = final if cfg.cell == "lstm" else (final, None)  # (L * dirs, B, H)
            h0, c0 = self._bridge(hn), (self._bridge(cn, cell=True) if cn is not None else None)  # (B, L, H)
        if self.memory_proj is not None:
            memory = self.memory_proj(memory)  # (B, S, H)
        feed = memory.new_zeros(B, H) if self.attention_kind not in (None, "bahdanau") else None  # h~_0 = 0
        t0 = torch.zeros(B, dtype=torch.long, device=src_ids.device)
        return memory, src_mask, DecoderState(h0, c0, feed, t0)

    def _bridge(self, hn: Tensor, cell: bool = False) -> Tensor:
        """Final encoder states ``(L * dirs, B, H)`` -> the decoder's initial ``(B, L, H)``."""
        L, H = self.config.n_layers, self.config.d_hidden
        if not self.bidirectional:
            return hn.transpose(0, 1)  # (B, L, H): the last encoder state initialises the decoder
        both = hn.view(L, 2, -1, H).permute(2, 0, 1, 3).reshape(-1, L, 2 * H)  # (B, L, [fwd_S; bwd_1])
        if cell:
            return self.init_c(both)  # (B, L, H)
        return torch.tanh(self.init_h(both))  # s_0 = tanh(W_init [fwd_S; bwd_1])

    # ------------------------------------------------------------------------------ decoder

    def prepare_memory(self, memory: Tensor) -> Optional[Tensor]:
        """The query-independent part of the attention score over ``memory`` (``U h_i`` of the
        additive score), computed once per sequence instead of at every decoder step; None when
        the attention has none."""
        score = getattr(self.attention, "score", None)
        if not isinstance(self.attention, SoftAttention) or not callable(getattr(score, "prepare_keys", None)):
            return None
        return score.prepare_keys(memory)

    def decode_step(self, y_prev: Tensor, state: DecoderState, memory: Tensor, mask: Tensor,
                    prepared: Optional[Tensor] = None) -> Tuple[Tensor, DecoderState, Optional[Tensor]]:
        """One decoder step.

        Args:
            y_prev: ``(B,)`` the previous target token (``bos_id`` first).
            state: the :class:`DecoderState` after step ``t - 1``.
            memory: ``(B, S, K)`` encoder states; mask ``(B, S)`` bool.
            prepared: ``prepare_memory(memory)``, when the caller computed it once for all steps.
        Returns:
            logits ``(B, V_tgt)``, the new state, alignment ``a_t (B, S)`` (None without attention).
        """
        e = self.drop(self.tgt_embed(y_prev))  # E y_{t-1}, (B, E)
        kind = self.attention_kind
        a_t = None
        feed = None
        if kind is None:
            # s_t = f(s_{t-1}, E y_{t-1});  p(y_t) = softmax(W_o s_t)
            h, c = self.decoder(e, state.h, state.c)
            logits = self.out(self.drop(h[:, -1]))
        elif kind == "bahdanau":
            # e_ti = v^T tanh(W s_{t-1} + U h_i), a_t = softmax(e_t), c_t = sum_i a_ti h_i
            ctx, a_t, _ = self.attention(state.h[:, -1], memory, mask=mask, prepared_keys=prepared)  # (B, K), (B, S)
            # s_t = f(s_{t-1}, [E y_{t-1}; c_t])
            h, c = self.decoder(torch.cat([e, ctx], -1), state.h, state.c)
            # t_t = maxout(T [s_t; c_t; E y_{t-1}]);  p(y_t) = softmax(W_o t_t)
            t = self.readout(torch.cat([h[:, -1], ctx, e], -1))  # (B, 2 * d_readout)
            t = t.view(t.shape[0], -1, 2).max(-1).values  # (B, d_readout)
            logits = self.out(self.drop(t))
        else:
            # s_t = f(s_{t-1}, [E y_{t-1}; h~_{t-1}])   (input feeding)
            h, c = self.decoder(torch.cat([e, state.feed], -1), state.h, state.c)
            s_t = h[:, -1]  # (B, H)
            if kind == "local-m":
                ctx, a_t, _ = self.attention(s_t, memory, mask=mask, position=state.t)  # p_t = t
            else:
                extra = {} if prepared is None else {"prepared_keys": prepared}  # local-p has nothing to prepare
                ctx, a_t, _ = self.attention(s_t, memory, mask=mask, **extra)  # (B, K), (B, S)
            # h~_t = tanh(W_c [c_t; s_t]);  p(y_t) = softmax(W_s h~_t)
            feed = torch.tanh(self.W_c(torch.cat([ctx, s_t], -1)))  # (B, H)
            logits = self.out(self.drop(feed))
        return logits, DecoderState(h, c, feed, state.t + 1), a_t

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, need_weights: bool = False) -> ModelOutput:
        """Teacher-forced decoding of ``tgt_ids`` (``bos`` + target); see the class docstring."""
        _checks.token_ids("src_ids", src_ids, self.config.src_vocab_size)
        _checks.token_ids("tgt_ids", tgt_ids, self.tgt_vocab)
        if tgt_ids.shape[0] != src_ids.shape[0]:
            raise ValueError(f"tgt_ids has batch size {tgt_ids.shape[0]}, src_ids {src_ids.shape[0]}: they must match")
        if labels is not None:
            if not isinstance(labels, Tensor) or tuple(labels.shape) != tuple(tgt_ids.shape):
                got = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
                raise ValueError(f"labels must be a tensor shaped like tgt_ids {tuple(tgt_ids.shape)}, got {got}")
        memory, mask, state = self.encode(src_ids, src_mask)
        prepared = self.prepare_memory(memory)
        logits, weights = [], []
        for t in range(tgt_ids.shape[1]):
            step_logits, state, a_t = self.decode_step(tgt_ids[:, t], state, memory, mask, prepared)
            logits.append(step_logits)
            if a_t is not None:
                weights.append(a_t)
        logits_t = torch.stack(logits, 1)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits_t.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        w = torch.stack(weights, 1) if need_weights and weights else None  # (B, T, S)
        return ModelOutput(loss=loss, logits=logits_t, weights=w)

    @torch.no_grad()
    def generate(self, src_ids: Tensor, src_mask: Optional[Tensor] = None, max_new_tokens: int = 64,
                 beam_size: int = 1, return_weights: bool = False, length_penalty: float = 0.0
                 ) -> Union[Tensor, Tuple[Tensor, Optional[Tensor]]]:
        """Greedy (``beam_size=1``) or beam-search decoding.

        Returns:
            ids ``(B, T)`` (no ``bos``; ``eos`` then ``pad_id`` after it), ``T <= max_new_tokens``;
            with ``return_weights=True`` also the alignments ``(B, T, S)`` (None without attention).
        """
        cfg = self.config
        for name, value in (("max_new_tokens", max_new_tokens), ("beam_size", beam_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        memory, mask, state = self.encode(src_ids, src_mask)
        B = memory.shape[0]
        if beam_size == 1:
            ids, weights = self._greedy(memory, mask, state, max_new_tokens)
        else:
            memory_k, mask_k, state_k = expand_to_beams((memory, mask, state), beam_size)
            prepared_k = self.prepare_memory(memory_k)

            def step(tokens: Tensor, st: DecoderState):
                logits, st, a_t = self.decode_step(tokens, st, memory_k, mask_k, prepared_k)
                return F.log_softmax(logits.float(), -1), st, a_t

            res = beam_search(step, state_k, batch_size=B, beam_size=beam_size, bos_id=cfg.bos_id,
                              eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_new_tokens=max_new_tokens,
                              length_penalty=length_penalty)
            ids, weights = res.tokens, res.extras
        return (ids, weights) if return_weights else ids

    def _greedy(self, memory: Tensor, mask: Tensor, state: DecoderState, max_new_tokens: int
                ) -> Tuple[Tensor, Optional[Tensor]]:
        cfg = self.config
        B = memory.shape[0]
        y = torch.full((B,), cfg.bos_id, dtype=torch.long, device=memory.device)
        done = torch.zeros(B, dtype=torch.bool, device=memory.device)
        ids, weights = [], []
        prepared = self.prepare_memory(memory)
        for _ in range(max_new_tokens):
            logits, state, a_t = self.decode_step(y, state, memory, mask, prepared)
            y = logits.argmax(-1)  # (B,)
            y = torch.where(done, torch.full_like(y, cfg.pad_id), y)  # pad after the end
            ids.append(y)
            if a_t is not None:
                weights.append(a_t)
            done = done | (y == cfg.eos_id) | (y == cfg.pad_id)
            if bool(done.all()):
                break
        return torch.stack(ids, 1), (torch.stack(weights, 1) if weights else None)
