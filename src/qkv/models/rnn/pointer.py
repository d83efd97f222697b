"""Pointer network: attention weights used as the output distribution over input positions.

Vinyals, Fortunato & Jaitly 2015, "Pointer Networks" (arXiv:1506.03134), §2.3::

    u_ij = v^T tanh(W1 e_j + W2 d_i),    p(C_i | C_1 .. C_{i-1}, P) = softmax_j(u_ij)

``e_j`` are the encoder LSTM's states over the input vectors ``P_1 .. P_n``, ``d_i`` the decoder
LSTM's state; the decoder's next input is the (embedded) input vector it just pointed at. The score
is ``qkv.scores.AdditiveScore``; the pointer distribution is its masked softmax. Output lengths vary
(convex hull), so one extra learned key ``e_END`` at position ``n`` ends the output sequence (the
paper's ``=>`` symbol).

The paper's baseline (``output="vocabulary"``; "+ATTENTION" in its Table 1, convex hull) is the
same model with a sequence-to-sequence output layer in place of the pointer: a FIXED dictionary of
the input positions ``1 .. n_max`` (``max_inputs``) plus END, read through content attention
(Bahdanau et al. 2014; §2.2 of the paper)::

    a_ij = softmax_j(v^T tanh(W1 d_i + W2 e_j)),   c_i = sum_j a_ij e_j,   z_i = W_o [d_i; c_i] + b_o

and the decoder is fed the embedding of its previous output class, not the input it names. Such a
model cannot answer for more than ``n_max`` inputs: the output dictionary is what the pointer replaces.

Deviations: the first decoder input is a learned vector (the paper's ``=>``); ``generate`` can
forbid pointing twice at the same input (Vinyals et al. constrain the beam to valid outputs). In
the baseline, the dictionary classes ``>= n`` are not offered for an input of ``n`` elements (the
softmax runs over classes ``0 .. n-1`` and END, the pointer's support), and ``[d_i; c_i]`` feeds the
output layer only (the paper also feeds it to the next step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ... import _checks
from ...functional import masked_softmax
from ...registry import register
from ...scores import AdditiveScore
from ..base import ModelOutput, QKVModel
from .seq2seq import check_prefix_mask

__all__ = ["PointerNetwork", "PointerNetworkConfig", "OUTPUTS"]

#: output layers: the pointer, or the baseline's fixed dictionary of input positions (+ATTENTION)
OUTPUTS = ("pointer", "vocabulary")


@dataclass
class PointerNetworkConfig:
    """Configuration of :class:`PointerNetwork`."""

    d_input: int = 2  # features per input element (1 for numbers to sort, 2 for planar points)
    d_embed: int = 64  # linear embedding of each input vector
    d_hidden: int = 128  # encoder and decoder LSTM state size
    attn_dim: int = 128  # size of v in u_ij = v^T tanh(W1 e_j + W2 d_i)
    output: str = "pointer"  # "pointer": softmax over the inputs | "vocabulary": the seq2seq baseline's fixed dictionary
    max_inputs: int = 50  # n_max, the dictionary's input positions (output="vocabulary" only; longer inputs are refused)


@register("model", "pointer-network")
class PointerNetwork(QKVModel):
    """Pointer network (Vinyals et al. 2015): ``p(C_i = j) = softmax_j(v^T tanh(W1 e_j + W2 d_i))``.

    Call ``model(inputs (B, n, d_input), labels=None (B, T), input_mask=None (B, n) bool,
    need_weights=False)``. ``labels[b, i]`` is the index the ``i``-th output points at, ``n`` for
    END, ``-100`` padding; the decoder is teacher forced with them.

    Returns ``ModelOutput(loss, logits (B, T, n + 1), weights (B, T, n + 1))``: ``logits`` are the
    scores ``u_ij`` (masked positions at the dtype's minimum), ``weights = softmax(logits)`` the
    pointer distributions (rows sum to 1 over the unmasked inputs and END).

    ``config.output = "vocabulary"`` (the paper's "+ATTENTION" baseline): the logits are instead
    ``z_i = W_o [d_i; c_i] + b_o`` over a fixed dictionary of ``max_inputs + 1`` classes (input
    positions ``0 .. max_inputs-1``, then END), ``c_i`` the additive-attention context over the
    ``e_j``; returned in the same layout (column ``k < n``: class ``k``; column ``n``: END). The
    classes ``n .. max_inputs-1`` are not offered for an input of ``n`` elements, and inputs longer
    than ``max_inputs`` are refused. The decoder reads the embedding of its previous output class.
    """

    config_class = PointerNetworkConfig
    suggested_tasks = ('pointer-sort', 'convex-hull')  # `qkv list model`
    task_kinds = frozenset({"pointer"})

    def __init__(self, config: PointerNetworkConfig) -> None:
        super().__init__(config)
        for name in ("d_input", "d_embed", "d_hidden", "attn_dim", "max_inputs"):
            _checks.positive_int(name, getattr(config, name))
        if config.output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {config.output!r}")
        E, H = config.d_embed, config.d_hidden
        self.embed = nn.Linear(config.d_input, E)  # P_j -> embedded input
        self.encoder = nn.LSTM(E, H, batch_first=True)
        self.decoder = nn.LSTMCell(E, H)
        self.start = nn.Parameter(torch.randn(E) * 0.1)  # first decoder input ("=>")
        if config.output == "pointer":
            self.end_key = nn.Parameter(torch.randn(H) * 0.1)  # e_END, pointed at to stop
        # u_ij = v^T tanh(W1 d_i + W2 e_j + b)   (W1 is the query side: the decoder state)
        self.score = AdditiveScore(query_dim=H, key_dim=H, hidden_dim=config.attn_dim)
        if config.output == "vocabulary":
            K = config.max_inputs + 1  # input positions 0 .. max_inputs-1, END at max_inputs
            self.out = nn.Linear(2 * H, K)  # z_i = W_o [d_i; c_i] + b_o
            self.class_embed = nn.Embedding(K, E)  # the previous output class -> next decoder input

    def _encode(self, inputs: Tensor, input_mask: Optional[Tensor]):
        _checks.tensor("inputs", inputs, ndim=3, floating=True)
        B, n, d = inputs.shape
        if d != self.config.d_input:
            raise ValueError(f"inputs must have d_input={self.config.d_input} features (dim -1), got shape {tuple(inputs.shape)}")
        if n == 0:
            raise ValueError("inputs must have at least one element (dim 1), got 0")
        if self.config.output == "vocabulary" and n > self.config.max_inputs:
            raise ValueError(f"inputs have {n} elements (dim 1), more than max_inputs={self.config.max_inputs}, the "
                             f"output dictionary's size in output='vocabulary' mode: build the model with max_inputs >= {n}")
        if input_mask is None:
            input_mask = torch.ones(B, n, dtype=torch.bool, device=inputs.device)
        check_prefix_mask("input_mask", input_mask, (B, n))
        x = self.embed(inputs)  # (B, n, E)
        packed = pack_padded_sequence(x, input_mask.sum(1).cpu(), batch_first=True, enforce_sorted=False)
        out, (h, c) = self.encoder(packed)
        e, _ = pad_packed_sequence(out, batch_first=True, total_length=n)  # (B, n, H)
        mask = torch.cat([input_mask, input_mask.new_ones(B, 1)], 1)  # (B, n + 1): the inputs, then END
        if self.config.output == "pointer":
            keys = torch.cat([e, self.end_key.expand(B, 1, -1)], 1)  # (B, n + 1, H), e_END at n
        else:
            keys = e  # (B, n, H): attended, not pointed at
        return x, keys, mask, (h[0], c[0])

    def _point(self, d: Tensor, keys: Tensor, mask: Tensor) -> Tensor:
        """Scores ``u_i (B, n + 1)`` of decoder states ``d (B, H)``, masked positions at finfo.min."""
        u = self.score(d.unsqueeze(1), keys).squeeze(1)  # (B, n + 1)
        return u.masked_fill(~mask, torch.finfo(u.dtype).min)

    def _vocabulary(self, d: Tensor, e: Tensor, Ue: Tensor, mask: Tensor, allowed: Tensor) -> Tensor:
        """Dictionary logits ``(B, n + 1)`` of decoder states ``d (B, H)``: classes ``0 .. n-1``, then
        END; attention over the real inputs (``mask``), positions not ``allowed`` at finfo.min."""
        n = e.shape[1]
        # a_ij = softmax_j v^T tanh(W1 d_i + W2 e_j), over the real inputs
        a = masked_softmax(self.score(d.unsqueeze(1), e, prepared=Ue), mask[:, None, :n])  # (B, 1, n)
        c = torch.bmm(a, e).squeeze(1)  # c_i = sum_j a_ij e_j, (B, H)
        z = self.out(torch.cat([d, c], -1))  # z_i = W_o [d_i; c_i] + b_o, (B, max_inputs + 1)
        u = torch.cat([z[:, :n], z[:, -1:]], 1)  # (B, n + 1): classes n .. max_inputs-1 are not offered
        return u.masked_fill(~allowed, torch.finfo(u.dtype).min)

    def _outputs(self, keys: Tensor, mask: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        """The output layer, ``(d (B, H), allowed (B, n + 1)) -> logits (B, n + 1)``."""
        if self.config.output == "pointer":
            return lambda d, allowed: self._point(d, keys, allowed)
        Ue = self.score.prepare_keys(keys)  # W2 e_j + b, the same at every step
        return lambda d, allowed: self._vocabulary(d, keys, Ue, mask, allowed)

    @staticmethod
    def _next_input(x: Tensor, start: Tensor, index: Tensor) -> Tensor:
        """The embedded input at ``index (B,)``; the start vector where ``index`` is END or padding."""
        B, n, E = x.shape
        valid = (index >= 0) & (index < n)
        picked = x.gather(1, index.clamp(0, n - 1).view(B, 1, 1).expand(B, 1, E)).squeeze(1)  # (B, E)
        return torch.where(valid.unsqueeze(1), picked, start.expand(B, E))

    def _feed(self, x: Tensor, index: Tensor) -> Tensor:
        """The decoder's next input after output ``index (B,)`` (``n`` = END, negative = none): the
        input pointed at (pointer), or the embedding of the output class (vocabulary)."""
        if self.config.output == "pointer":
            return self._next_input(x, self.start, index)
        B, n, E = x.shape
        K = self.config.max_inputs
        cls = torch.where(index == n, torch.full_like(index, K), index).clamp(0, K)  # column n is the END class
        return torch.where(((index >= 0) & (index <= n)).unsqueeze(1), self.class_embed(cls), self.start.expand(B, E))

    def forward(self, inputs: Tensor, labels: Optional[Tensor] = None, input_mask: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        if labels is None:
            raise ValueError("labels (B, T) is required: the decoder is teacher forced with the target indices; "
                             "use generate() to decode without them")
        if not isinstance(labels, Tensor) or labels.dim() != 2 or labels.is_floating_point():
            raise TypeError(f"labels must be a 2-D integer tensor (B, T), got "
                            f"{tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__}")
        x, keys, mask, (h, c) = self._encode(inputs, input_mask)
        B, n = inputs.shape[:2]
        if labels.shape[0] != B:
            raise ValueError(f"labels has batch size {labels.shape[0]}, inputs {B}: they must match")
        bad = (labels != -100) & ((labels < 0) | (labels > n))
        if bool(bad.any()):
            raise ValueError(f"labels must be input indices in [0, {n - 1}], {n} (END) or -100, got {labels[bad][:5].tolist()}")
        output = self._outputs(keys, mask)
        inp = self.start.expand(B, -1)
        logits = []
        for i in range(labels.shape[1]):
            h, c = self.decoder(inp, (h, c))  # d_i
            logits.append(output(h, mask))
            inp = self._feed(x, labels[:, i])  # teacher forcing: P_{C_i} (pointer) or the class C_i (vocabulary)
        u = torch.stack(logits, 1)  # (B, T, n + 1)
        loss = F.cross_entropy(u.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        w = masked_softmax(u, mask.unsqueeze(1)) if need_weights else None
        return ModelOutput(loss=loss, logits=u, weights=w)

    @torch.no_grad()
    def generate(self, inputs: Tensor, input_mask: Optional[Tensor] = None, max_new_tokens: Optional[int] = None,
                 forbid_repeats: bool = True, return_weights: bool = False, point_all: bool = False
                 ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Greedy pointing (greedy decoding over the dictionary in ``output="vocabulary"`` mode).

        Args:
            inputs ``(B, n, d_input)``, input_mask ``(B, n)``; max_new_tokens: the most outputs
            (default ``n + 1``); forbid_repeats: never point at an input twice; point_all: END only
            once every unmasked input was pointed at (valid TSP tours; needs ``forbid_repeats``).
        Returns:
            indices ``(B, T)`` long: input positions, ``n`` for END, ``-1`` after END; with
            ``return_weights`` also the output distributions ``(B, T, n + 1)``.
        """
        if point_all and not forbid_repeats:
            raise ValueError("point_all=True needs forbid_repeats=True (otherwise the output never has to end)")
        x, keys, mask, (h, c) = self._encode(inputs, input_mask)
        B, n = inputs.shape[:2]
        steps = n + 1 if max_new_tokens is None else _checks.positive_int("max_new_tokens", max_new_tokens)
        output = self._outputs(keys, mask)
        allowed = mask.clone()  # (B, n + 1)
        done = torch.zeros(B, dtype=torch.bool, device=inputs.device)
        inp = self.start.expand(B, -1)
        out, weights = [], []
        for _ in range(steps):
            h, c = self.decoder(inp, (h, c))
            now = allowed
            if point_all:  # END only when no input is left
                now = torch.cat([allowed[:, :n], allowed[:, n:] & ~allowed[:, :n].any(1, keepdim=True)], 1)
            u = output(h, now)  # (B, n + 1)
            weights.append(masked_softmax(u, now))
            j = u.argmax(-1)  # (B,)
            j = torch.where(done, torch.full_like(j, -1), j)
            out.append(j)
            if forbid_repeats:
                hit = F.one_hot(j.clamp(0, n - 1), n + 1).bool() & (j < n).unsqueeze(1) & (j >= 0).unsqueeze(1)
                allowed = allowed & ~hit
            done = done | (j == n) | (j < 0)
            inp = self._feed(x, j)
            if bool(done.all()):
                break
        ids = torch.stack(out, 1)  # (B, T)
        return (ids, torch.stack(weights, 1)) if return_weights else ids
