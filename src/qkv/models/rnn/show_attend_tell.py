"""Show, Attend and Tell: an LSTM captioner that attends over a CNN's grid of feature vectors.

Xu, Ba, Kiros, Cho, Courville, Salakhutdinov, Zemel & Bengio 2015, "Show, Attend and Tell: Neural
Image Caption Generation with Visual Attention" (arXiv:1502.03044).

The encoder turns an image into ``L`` annotation vectors ``a_i`` (one per cell of a feature grid);
at output step ``t`` the decoder LSTM attends over them from its previous state ``h_{t-1}``::

    e_ti = f_att(a_i, h_{t-1}) = v^T tanh(W a_i + U h_{t-1}),  alpha_t = softmax(e_t)
    soft:  z_t = beta_t sum_i alpha_ti a_i,  beta_t = sigma(f_beta(h_{t-1}))      (§4.2, gate)
    hard:  s_t ~ Multinoulli(alpha_t), z_t = a_{s_t}  (argmax in eval)            (§4.1)
    [i; f; o; g] = LSTM([E y_{t-1}; z_t], h_{t-1}),   h_0, c_0 = tanh(f_init(mean_i a_i))
    p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))                           (eq. 7)

Losses: soft — ``-log p(y) + lambda sum_i (1 - sum_t alpha_ti)^2`` (doubly stochastic penalty,
eq. 14); hard — ``-log p(y)`` plus the REINFORCE surrogate of ``qkv`` ``HardAttention.reinforce_loss``
with reward ``log p(y | a, s)`` per caption, a moving-average baseline and an entropy bonus (eq. 12).
Hard, in training, as §4.1: "with probability 0.5 for a given image, we set the sampled attention
location ``s~`` to its expected value ``alpha``" (``hard_mix``): that caption reads the expected
context ``z_t = sum_i alpha_ti a_i``, whose gradient reaches the attention directly, and takes no
part in the REINFORCE term (nor in the baseline's average).

The attention is ``qkv.attention.alignment.SoftAttention`` / ``HardAttention`` (additive score).
Deviation: a 3-layer CNN trained from scratch stands in for the paper's pretrained VGG.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import _checks
from ...attention.alignment import HardAttention, HardAttentionSample, SoftAttention
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..beam import beam_search, expand_to_beams

__all__ = ["ShowAttendTell", "ShowAttendTellConfig"]


@dataclass
class ShowAttendTellConfig:
    """Configuration of :class:`ShowAttendTell`."""

    vocab_size: int = 14  # caption vocabulary size (digits + 4 specials for digit-captions)
    in_channels: int = 1  # image channels
    channels: Tuple[int, ...] = (32, 64, 64)  # CNN widths; each block is conv3x3 -> ReLU -> 2x2 max-pool
    d_embed: int = 32  # word embedding size (E y)
    d_hidden: int = 128  # decoder LSTM state size
    attn_dim: int = 64  # size of v in f_att
    attention: str = "soft"  # "soft" (deterministic, with gate beta) | "hard" (sampled, REINFORCE)
    doubly_stochastic: float = 0.1  # lambda of the penalty sum_i (1 - sum_t alpha_ti)^2 (soft only; Xu et al. used 1 with L = 196 cells and longer captions)
    entropy_bonus: float = 0.01  # lambda_e of the entropy bonus in the REINFORCE loss (hard only)
    baseline_decay: float = 0.9  # moving-average baseline decay (hard only)
    hard_mix: float = 0.5  # hard only: probability that a training caption uses the expected context sum_i alpha_i a_i (Xu et al.: 0.5)
    dropout: float = 0.0  # dropout before the output layer
    pad_id: int = 0  # padding id of captions
    bos_id: int = 1  # start token
    eos_id: int = 2  # end token


@register("model", "show-attend-tell")
class ShowAttendTell(QKVModel):
    """CNN encoder + attentive LSTM decoder (Xu et al. 2015), soft or hard attention.

    Call ``model(images (B, C, H, W), tgt_ids (B, T), labels=None (B, T), need_weights=False)`` ->
    ``ModelOutput(loss, logits (B, T, V), weights (B, T, L) or None, aux)``: ``weights[b, t]`` is
    ``alpha_t`` over the ``L = Hg * Wg`` grid cells (row-major; ``aux["grid"] = (Hg, Wg)``); ``aux``
    also holds ``"nll"`` and ``"doubly_stochastic"`` (soft) or ``"reinforce"`` (hard).
    """

    config_class = ShowAttendTellConfig
    suggested_tasks = ('digit-captions',)  # `qkv list model`
    task_kinds = frozenset({"captioning"})

    def __init__(self, config: ShowAttendTellConfig) -> None:
        super().__init__(config)
        cfg = config
        for name in ("vocab_size", "in_channels", "d_embed", "d_hidden", "attn_dim"):
            _checks.positive_int(name, getattr(cfg, name))
        if cfg.attention not in ("soft", "hard"):
            raise ValueError(f"attention must be 'soft' or 'hard', got {cfg.attention!r}")
        if isinstance(cfg.hard_mix, bool) or not isinstance(cfg.hard_mix, (int, float)) or not 0 <= cfg.hard_mix <= 1:
            raise ValueError(f"hard_mix must be a probability in [0, 1], got {cfg.hard_mix!r}")
        if not cfg.channels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in cfg.channels):
            raise ValueError(f"channels must be a non-empty tuple of positive ints, got {cfg.channels!r}")
        layers, c_in = [], cfg.in_channels
        for c_out in cfg.channels:
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c_out
        self.cnn = nn.Sequential(*layers)
        D, H, E = c_in, cfg.d_hidden, cfg.d_embed
        self.d_feature = D
        self.init_h = nn.Linear(D, H)  # h_0 = tanh(f_init,h(mean a))
        self.init_c = nn.Linear(D, H)  # c_0 = tanh(f_init,c(mean a))
        if cfg.attention == "soft":
            self.attention: nn.Module = SoftAttention("additive", query_dim=H, key_dim=D, hidden_dim=cfg.attn_dim)
            self.f_beta = nn.Linear(H, 1)  # beta_t = sigma(f_beta(h_{t-1}))
        else:
            self.attention = HardAttention("additive", query_dim=H, key_dim=D, hidden_dim=cfg.attn_dim,
                                           baseline_decay=cfg.baseline_decay, entropy_bonus=cfg.entropy_bonus)
        self.embed = nn.Embedding(cfg.vocab_size, E, padding_idx=cfg.pad_id)
        self.lstm = nn.LSTMCell(E + D, H)
        self.L_h = nn.Linear(H, E)
        self.L_z = nn.Linear(D, E, bias=False)
        self.L_o = nn.Linear(E, cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)

    def encode(self, images: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Annotation vectors ``a (B, L, D)`` and the grid ``(Hg, Wg)``, ``L = Hg * Wg``."""
        _checks.tensor("images", images, ndim=4, floating=True)
        if images.shape[1] != self.config.in_channels:
            raise ValueError(f"images must have in_channels={self.config.in_channels} channels (dim 1), got shape {tuple(images.shape)}")
        min_side = 2 ** len(self.config.channels)
        if images.shape[2] < min_side or images.shape[3] < min_side:
            raise ValueError(f"images must be at least {min_side}x{min_side} for {len(self.config.channels)} pooling layers, "
                             f"got shape {tuple(images.shape)}")
        f = self.cnn(images)  # (B, D, Hg, Wg)
        B, D, Hg, Wg = f.shape
        return f.flatten(2).transpose(1, 2), (Hg, Wg)  # (B, L, D)

    def init_state(self, a: Tensor) -> Tuple[Tensor, Tensor]:
        mean = a.mean(1)  # (B, D)
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))

    def decode_step(self, y_prev: Tensor, state: Tuple[Tensor, Tensor], a: Tensor, expected: Optional[Tensor] = None):
        """One step: ``(y_{t-1} (B,), (h, c) (B, H) each, a (B, L, D))`` ->
        ``(logits (B, V), (h, c), alpha_t (B, L), HardAttentionSample or None)``. ``expected (B,)``
        bool (hard only): the rows that read the expected context instead of the sample."""
        h, c = state
        att = self.attention(h, a)  # attends from h_{t-1}
        if self.config.attention == "soft":
            # z_t = beta_t sum_i alpha_ti a_i,  beta_t = sigma(f_beta(h_{t-1}))
            z = torch.sigmoid(self.f_beta(h)) * att.output  # (B, D)
            alpha, sample = att.weights, None
        else:
            # z_t = a_{s_t}, s_t ~ Multinoulli(alpha_t); alpha_t itself is sample.probs
            z, sample = att.output, att.state
            alpha = sample.probs
            if expected is not None:
                # s~ set to its expected value: z_t = sum_i alpha_ti a_i
                mean = torch.bmm(alpha.unsqueeze(1), a).squeeze(1)  # (B, D)
                z = torch.where(expected.unsqueeze(-1), mean, z)
        e = self.embed(y_prev)  # E y_{t-1}, (B, E)
        h, c = self.lstm(torch.cat([e, z], -1), (h, c))
        # p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))
        logits = self.L_o(self.drop(e + self.L_h(h) + self.L_z(z)))  # (B, V)
        return logits, (h, c), alpha, sample

    def forward(self, images: Tensor, tgt_ids: Tensor, labels: Optional[Tensor] = None,
                need_weights: bool = False) -> ModelOutput:
        cfg = self.config
        _checks.token_ids("tgt_ids", tgt_ids, cfg.vocab_size)
        a, grid = self.encode(images)
        if tgt_ids.shape[0] != a.shape[0]:
            raise ValueError(f"tgt_ids has batch size {tgt_ids.shape[0]}, images {a.shape[0]}: they must match")
        if labels is not None and (not isinstance(labels, Tensor) or tuple(labels.shape) != tuple(tgt_ids.shape)):
            got = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
            raise ValueError(f"labels must be a tensor shaped like tgt_ids {tuple(tgt_ids.shape)}, got {got}")
        state = self.init_state(a)
        expected = None
        if cfg.attention == "hard" and self.training and cfg.hard_mix > 0:
            # Xu et al. §4.1: with probability 0.5 per image the location is its expected value
            expected = torch.rand(a.shape[0], device=a.device) < cfg.hard_mix  # (B,)
        logits, alphas, samples = [], [], []
        for t in range(tgt_ids.shape[1]):
            step_logits, state, alpha, sample = self.decode_step(tgt_ids[:, t], state, a, expected)
            logits.append(step_logits)
            alphas.append(alpha)
            samples.append(sample)
        logits_t = torch.stack(logits, 1)  # (B, T, V)
        alpha_t = torch.stack(alphas, 1)  # (B, T, L)
        aux = {"grid": grid}
        loss = None
        if labels is not None:
            keep = labels != -100  # (B, T)
            token_nll = F.cross_entropy(logits_t.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                        reduction="none").view_as(labels)  # (B, T)
            nll = token_nll.sum() / keep.sum().clamp(min=1)
            loss = nll
            aux["nll"] = nll.detach()
            if cfg.attention == "soft":
                # lambda sum_i (1 - sum_t alpha_ti)^2, summed over the caption's real steps
                coverage = (alpha_t * keep.unsqueeze(-1)).sum(1)  # (B, L)
                penalty = ((1.0 - coverage) ** 2).sum(1).mean()
                aux["doubly_stochastic"] = penalty.detach()
                loss = loss + cfg.doubly_stochastic * penalty
            elif self.training:
                # REINFORCE with reward R = log p(y | a, s), one per caption that sampled its locations
                sampled = torch.ones_like(keep[:, 0]) if expected is None else ~expected  # (B,)
                reward = -token_nll.sum(1).detach()  # (B,)
                stacked = HardAttentionSample(
                    index=torch.stack([s.index for s in samples], 1)[sampled],
                    log_prob=(torch.stack([s.log_prob for s in samples], 1) * keep)[sampled],  # (B', T), padded steps 0
                    entropy=(torch.stack([s.entropy for s in samples], 1) * keep)[sampled],
                    probs=alpha_t[sampled])
                if bool(sampled.any()):
                    reinforce = self.attention.reinforce_loss(reward[sampled], stacked)
                    aux["reinforce"] = reinforce.detach()
                    loss = loss + reinforce
        return ModelOutput(loss=loss, logits=logits_t, weights=alpha_t if need_weights else None, aux=aux)

    @torch.no_grad()
    def generate(self, images: Tensor, max_new_tokens: int = 8, beam_size: int = 1, return_weights: bool = False
                 ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Greedy (``beam_size=1``) or beam-search captions.

        Returns ids ``(B, T)`` (no ``bos``; ``eos`` then ``pad_id``) and, with ``return_weights``,
        the attention ``(B, T, L)`` over the grid.
        """
        cfg = self.config
        for name, value in (("max_new_tokens", max_new_tokens), ("beam_size", beam_size)):
            _checks.positive_int(name, value)
        a, _ = self.encode(images)
        B = a.shape[0]
        state = self.init_state(a)
        if beam_size > 1:
            a_k, state_k = expand_to_beams((a, state), beam_size)

            def step(tokens: Tensor, st):
                logits, st, alpha, _ = self.decode_step(tokens, st, a_k)
                return F.log_softmax(logits.float(), -1), st, alpha

            res = beam_search(step, state_k, batch_size=B, beam_size=beam_size, bos_id=cfg.bos_id, eos_id=cfg.eos_id,
                              pad_id=cfg.pad_id, max_new_tokens=max_new_tokens)
            return (res.tokens, res.extras) if return_weights else res.tokens
        y = torch.full((B,), cfg.bos_id, dtype=torch.long, device=a.device)
        done = torch.zeros(B, dtype=torch.bool, device=a.device)
        ids, alphas = [], []
        for _ in range(max_new_tokens):
            logits, state, alpha, _ = self.decode_step(y, state, a)
            y = torch.where(done, torch.full_like(y, cfg.pad_id), logits.argmax(-1))
            ids.append(y)
            alphas.append(alpha)
            done = done | (y == cfg.eos_id) | (y == cfg.pad_id)
            if bool(done.all()):
                break
        out = torch.stack(ids, 1)
        return (out, torch.stack(alphas, 1)) if return_weights else out
