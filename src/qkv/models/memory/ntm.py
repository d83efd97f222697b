"""Neural Turing Machine — Graves, Wayne, Danihelka, "Neural Turing Machines", 2014, arXiv:1410.5401.

An LSTM controller reads from and writes to a memory matrix ``M (N, W)`` through heads whose
weightings ``w (N,)`` come from content and location addressing (§3.3)::

    w^c_i = softmax_i(beta * cos(k, M_i))                       content (eq. 5-6)
    w^g   = g w^c + (1 - g) w_{t-1}                              interpolation (eq. 7)
    w~(i) = sum_j w^g(j) s(i - j)          (indices mod N)       circular shift (eq. 8)
    w(i)  = w~(i)^gamma / sum_j w~(j)^gamma                      sharpening (eq. 9)
    r     = sum_i w(i) M_i                                        read (eq. 2)
    M_i  <- M_i (1 - w(i) e) + w(i) a                             erase then add (eq. 3-4)

Each addressing step is a function of this module, tested on its own. :class:`LSTMBaseline` is
the paper's LSTM comparison (§4), sized to about the NTM's parameter count.

Deviations: one read and one write head by default (the paper's copy NTM: one each); the
controller's output ``y_t = W_o [h_t; r_t]`` uses the reads of the current step; the initial
memory and read vectors are learned, the initial weightings are one-hot on slot 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...functional import masked_softmax
from ...registry import register
from ...scores import CosineScore
from ..base import ModelOutput, QKVModel

__all__ = ["NTMConfig", "NeuralTuringMachine", "LSTMBaselineConfig", "LSTMBaseline", "content_addressing",
           "interpolate", "circular_shift", "sharpen", "read_memory", "write_memory", "NTMState"]

_cosine = CosineScore()


def content_addressing(key: Tensor, beta: Tensor, memory: Tensor) -> Tensor:
    """``w^c_i = softmax_i(beta * cos(k, M_i))`` — key ``(B, W)``, beta ``(B,)``, memory ``(B, N, W)`` -> ``(B, N)``."""
    scores = _cosine(key.unsqueeze(1), memory, beta=beta)  # (B, 1, N)
    return masked_softmax(scores.squeeze(1))  # (B, N)


def interpolate(w_content: Tensor, w_prev: Tensor, g: Tensor) -> Tensor:
    """``w^g = g w^c + (1 - g) w_{t-1}`` — weightings ``(B, N)``, gate ``g (B,)`` in [0, 1]."""
    g = g.unsqueeze(-1)  # (B, 1)
    return g * w_content + (1 - g) * w_prev


def circular_shift(w: Tensor, s: Tensor) -> Tensor:
    """``w~(i) = sum_j w(j) s(i - j)``, indices mod ``N``: a circular convolution.

    Args:
        w: ``(B, N)`` weighting; s: ``(B, 2R + 1)`` distribution over the shifts ``-R..R``.
    Returns:
        ``(B, N)``.
    """
    R = (s.shape[-1] - 1) // 2
    if s.shape[-1] != 2 * R + 1:
        raise ValueError(f"s must have an odd number 2R+1 of shifts (dim -1), got shape {tuple(s.shape)}")
    # roll(w, o)[i] = w[i - o]: the term of shift o = i - j
    rolled = torch.stack([torch.roll(w, o, dims=-1) for o in range(-R, R + 1)], dim=-1)  # (B, N, 2R+1)
    return (rolled * s.unsqueeze(1)).sum(-1)  # (B, N)


def sharpen(w: Tensor, gamma: Tensor, eps: float = 1e-12) -> Tensor:
    """``w(i) = w~(i)^gamma / sum_j w~(j)^gamma`` — ``w (B, N)``, ``gamma (B,) >= 1`` -> ``(B, N)``.

    ``eps`` keeps the power's gradient finite at ``w~(i) = 0``."""
    powered = (w + eps).pow(gamma.unsqueeze(-1))  # (B, N)
    return powered / powered.sum(-1, keepdim=True)


def read_memory(w: Tensor, memory: Tensor) -> Tensor:
    """``r = sum_i w(i) M_i`` — ``w (B, N)``, memory ``(B, N, W)`` -> ``(B, W)``."""
    return torch.einsum("bn,bnw->bw", w, memory)


def write_memory(memory: Tensor, w: Tensor, erase: Tensor, add: Tensor) -> Tensor:
    """``M_i <- M_i (1 - w(i) e) + w(i) a`` — memory ``(B, N, W)``, ``w (B, N)``, ``e, a (B, W)``.

    Returns the new memory (the input is not modified)."""
    we = w.unsqueeze(-1) * erase.unsqueeze(1)  # (B, N, W), w(i) e
    wa = w.unsqueeze(-1) * add.unsqueeze(1)  # (B, N, W), w(i) a
    return memory * (1 - we) + wa


class NTMState(NamedTuple):
    """What carries from one step to the next (returned, never stored on the module)."""

    memory: Tensor  # (B, N, W)
    reads: Tensor  # (B, n_read_heads, W), r_{t-1}
    read_w: Tensor  # (B, n_read_heads, N), w_{t-1} of the read heads
    write_w: Tensor  # (B, N), w_{t-1} of the write head
    controller: Tuple[Tensor, Tensor]  # LSTM (h, c), each (B, controller_size)


class Head(nn.Module):
    """Emits one head's addressing parameters from the controller output and addresses memory.

    ``k (W)``, ``beta = softplus``, ``g = sigmoid``, ``s = softmax`` over ``2R+1`` shifts,
    ``gamma = 1 + softplus``; a write head also emits ``e = sigmoid`` and ``a``.
    """

    def __init__(self, controller_size: int, width: int, shift_range: int, write: bool) -> None:
        super().__init__()
        self.width, self.n_shifts, self.write = width, 2 * shift_range + 1, write
        sizes = [width, 1, 1, self.n_shifts, 1] + ([width, width] if write else [])
        self.sizes = sizes
        self.proj = nn.Linear(controller_size, sum(sizes))

    def forward(self, h: Tensor, memory: Tensor, w_prev: Tensor) -> Tuple[Tensor, Dict[str, Tensor]]:
        parts = torch.split(self.proj(h), self.sizes, dim=-1)
        k, beta, g, s, gamma = parts[:5]
        w_c = content_addressing(k, F.softplus(beta).squeeze(-1), memory)  # (B, N)
        w_g = interpolate(w_c, w_prev, torch.sigmoid(g).squeeze(-1))  # (B, N)
        w_s = circular_shift(w_g, torch.softmax(s, -1))  # (B, N)
        w = sharpen(w_s, 1 + F.softplus(gamma).squeeze(-1))  # (B, N)
        extra = {"erase": torch.sigmoid(parts[5]), "add": parts[6]} if self.write else {}
        return w, extra


@dataclass
class NTMConfig:
    input_dim: int = 9  # features per input step (copy task: bits + 1 delimiter channel)
    output_dim: int = 8  # features per output step (copy task: bits)
    controller_size: int = 100  # LSTM controller hidden size (Graves et al. copy: 100)
    memory_slots: int = 128  # N, memory locations (Graves et al.: 128)
    memory_width: int = 20  # W, size of a memory location (Graves et al.: 20)
    n_read_heads: int = 1  # read heads (one write head)
    shift_range: int = 1  # R: shifts -R..R allowed by the location addressing


def _seq_loss(logits: Tensor, labels: Optional[Tensor], label_mask: Optional[Tensor]) -> Optional[Tensor]:
    """Mean binary cross-entropy per bit over the steps where ``label_mask`` is True."""
    if labels is None:
        return None
    _checks.same("logits", logits.shape[1], "labels", labels.shape[1], "the number of steps (dim 1)")
    bce = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")  # (B, T, D)
    if label_mask is None:
        return bce.mean()
    m = label_mask.unsqueeze(-1).to(bce.dtype)  # (B, T, 1)
    return (bce * m).sum() / (m.sum() * bce.shape[-1]).clamp(min=1)


def _check_seq(inputs: Tensor, input_dim: int, label_mask: Optional[Tensor]) -> None:
    _checks.tensor("inputs", inputs, ndim=3, floating=True)
    if inputs.shape[-1] != input_dim:
        raise ValueError(f"inputs must be (B, T, input_dim={input_dim}), got {tuple(inputs.shape)}")
    if label_mask is not None:
        _checks.mask("label_mask", label_mask, inputs.shape[:2])


@register("model", "ntm")
class NeuralTuringMachine(QKVModel):
    """Neural Turing Machine (Graves et al. 2014): an LSTM controller with content- and
    location-addressed reads and erase/add writes to an ``N x W`` memory.

    Per step ``t``: ``(h_t, c_t) = LSTM([x_t; r_{t-1}])``; each read head addresses ``M_{t-1}``
    and reads ``r_t``; the write head addresses and writes ``M_t``; ``y_t = W_o [h_t; r_t]``.

    ``forward(inputs (B, T, input_dim), labels (B, T, output_dim) or None, label_mask (B, T) or None,
    need_weights=False)`` -> ``ModelOutput(loss (BCE per bit over label_mask), logits (B, T, output_dim),
    weights {"read": (B, T, n_read_heads, N), "write": (B, T, N)})``. Cost ``O(T B N W)`` plus the LSTM.
    """

    config_class = NTMConfig
    suggested_tasks = ('ntm-copy',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 5000, "batch_size": 16, "lr": 1e-3, "grad_clip": 10.0, "betas": (0.9, 0.999), "eps": 1e-8, "schedule": "constant", "weight_decay": 0.0}

    def __init__(self, config: NTMConfig) -> None:
        super().__init__(config)
        for name in ("input_dim", "output_dim", "controller_size", "memory_slots", "memory_width", "n_read_heads"):
            _checks.positive_int(name, getattr(config, name))
        _checks.positive_int("shift_range", config.shift_range, allow_zero=True)
        if 2 * config.shift_range + 1 > config.memory_slots:
            raise ValueError(f"shift_range={config.shift_range} needs memory_slots >= {2 * config.shift_range + 1}")
        N, W, H, R = config.memory_slots, config.memory_width, config.controller_size, config.n_read_heads
        self.controller = nn.LSTMCell(config.input_dim + R * W, H)
        self.read_heads = nn.ModuleList(Head(H, W, config.shift_range, write=False) for _ in range(R))
        self.write_head = Head(H, W, config.shift_range, write=True)
        self.output = nn.Linear(H + R * W, config.output_dim)
        stdev = 1 / (N + W) ** 0.5
        self.memory0 = nn.Parameter(torch.empty(N, W).uniform_(-stdev, stdev))  # learned initial memory
        self.reads0 = nn.Parameter(torch.randn(R, W) * 0.01)  # learned initial read vectors
        self.register_buffer("w0", F.one_hot(torch.tensor(0), N).float(), persistent=False)  # one-hot slot 0

    def initial_state(self, batch_size: int) -> NTMState:
        """The state before the first step (learned memory and reads, weightings on slot 0)."""
        B, N, R, H = batch_size, self.config.memory_slots, self.config.n_read_heads, self.config.controller_size
        zeros = self.memory0.new_zeros(B, H)
        return NTMState(self.memory0.expand(B, -1, -1), self.reads0.expand(B, -1, -1),
                        self.w0.expand(B, R, N), self.w0.expand(B, N), (zeros, zeros))

    def step(self, x: Tensor, state: NTMState) -> Tuple[Tensor, NTMState]:
        """One time step: ``x (B, input_dim)`` -> ``(y (B, output_dim), new state)``."""
        h, c = self.controller(torch.cat([x, state.reads.flatten(1)], -1), state.controller)  # (B, H)
        read_w = [head(h, state.memory, state.read_w[:, i])[0] for i, head in enumerate(self.read_heads)]
        read_w = torch.stack(read_w, 1)  # (B, R, N)
        reads = torch.stack([read_memory(read_w[:, i], state.memory) for i in range(read_w.shape[1])], 1)  # (B, R, W)
        write_w, wp = self.write_head(h, state.memory, state.write_w)  # (B, N)
        memory = write_memory(state.memory, write_w, wp["erase"], wp["add"])  # (B, N, W)
        y = self.output(torch.cat([h, reads.flatten(1)], -1))  # (B, output_dim)
        return y, NTMState(memory, reads, read_w, write_w, (h, c))

    def forward(self, inputs: Tensor, labels: Optional[Tensor] = None, label_mask: Optional[Tensor] = None,
                need_weights: bool = False, state: Optional[NTMState] = None) -> ModelOutput:
        _check_seq(inputs, self.config.input_dim, label_mask)
        state = state if state is not None else self.initial_state(inputs.shape[0])
        ys: List[Tensor] = []
        read_ws: List[Tensor] = []
        write_ws: List[Tensor] = []
        for t in range(inputs.shape[1]):
            y, state = self.step(inputs[:, t], state)
            ys.append(y)
            read_ws.append(state.read_w)
            write_ws.append(state.write_w)
        logits = torch.stack(ys, 1)  # (B, T, output_dim)
        weights = {"read": torch.stack(read_ws, 1), "write": torch.stack(write_ws, 1)} if need_weights else None
        return ModelOutput(loss=_seq_loss(logits, labels, label_mask), logits=logits, weights=weights, state=state)


@dataclass
class LSTMBaselineConfig:
    input_dim: int = 9  # features per input step
    output_dim: int = 8  # features per output step
    hidden_size: int = 256  # LSTM hidden size (choose it to match the NTM's parameter count)
    n_layers: int = 1  # stacked LSTM layers (Graves et al. used 3 for the copy baseline)


@register("model", "lstm-seq")
class LSTMBaseline(QKVModel):
    """LSTM sequence-to-sequence-by-step baseline (Graves et al. 2014, §4): ``y_t = W h_t``.

    ``forward(inputs (B, T, input_dim), labels (B, T, output_dim) or None, label_mask (B, T) or None,
    need_weights=False)`` -> ``ModelOutput(loss, logits (B, T, output_dim), weights=None)``.
    """

    config_class = LSTMBaselineConfig
    suggested_tasks = ('ntm-copy',)  # `qkv list model`
    #: the recipe of docs/reproductions/pooling-memory.md (benchmarks/repro_pooling_memory.py)
    train_defaults = {"steps": 5000, "batch_size": 16, "lr": 1e-3, "grad_clip": 10.0, "betas": (0.9, 0.999), "eps": 1e-8, "schedule": "constant", "weight_decay": 0.0}

    def __init__(self, config: LSTMBaselineConfig) -> None:
        super().__init__(config)
        for name in ("input_dim", "output_dim", "hidden_size", "n_layers"):
            _checks.positive_int(name, getattr(config, name))
        self.lstm = nn.LSTM(config.input_dim, config.hidden_size, config.n_layers, batch_first=True)
        self.output = nn.Linear(config.hidden_size, config.output_dim)

    def forward(self, inputs: Tensor, labels: Optional[Tensor] = None, label_mask: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        _check_seq(inputs, self.config.input_dim, label_mask)
        h, _ = self.lstm(inputs)  # (B, T, hidden)
        logits = self.output(h)  # (B, T, output_dim)
        return ModelOutput(loss=_seq_loss(logits, labels, label_mask), logits=logits)
