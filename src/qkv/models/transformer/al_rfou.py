"""Al-Rfou et al. 2018, "Character-Level Language Modeling with Deeper Self-Attention"
(arXiv:1808.04444): GPT's deep causal Transformer LM trained with auxiliary losses (§2.2,
``qkv.models.losses``):

- **intermediate layers**: every layer ``l < n`` also predicts the next token, through the final
  LayerNorm and the shared head; its loss is dropped after the fraction ``l / (2n)`` of training
  (lower layers first, all gone half-way);
- **multiple targets**: extra heads predict the tokens ``2 .. K`` steps ahead, each weighted 0.5
  and added to the loss of every layer that predicts;

all summed (``aux_schedule="paper"``)::

    loss = sum_{l active} (L_l + target_weight * sum_{k=2..K} L_{l,+k})

with layer ``l < n`` active while ``step / T < l / (2n)`` (``T`` = ``aux_total_steps`` or the
trainer's length, ``set_step``) and ``n`` always. ``aux_schedule="linear-decay"`` is an earlier
simplification kept as an option::

    loss = L_n + w(step) * mean_{l < n} L_l + target_weight * sum_{k=2..K} L_{n,+k}

with ``w = max(0, 1 - step / aux_layer_decay_steps)`` and the extra targets on the top layer only.
In eval mode the loss is the top layer's next-token loss (perplexity stays comparable with GPT's);
the auxiliary heads play no part in ``generate``.

Deviation: the paper's learned positional embeddings are added once at the input (GPT's), not at
every layer.

Runs saved before this model had its own class are ``gpt`` runs with these six fields in their
config; they load as this model (``GPT.from_config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ... import _checks
from ...registry import register
from ..base import ModelOutput
from ..losses import check_labels, future_loss, layer_loss_active, layer_loss_weight, lm_loss
from .gpt import GPT, GPTConfig
from .stack import StackOutput, StackState, init_normal

__all__ = ["AlRfouLM", "AlRfouConfig"]


@dataclass
class AlRfouConfig(GPTConfig):
    """GPT's sizes with Al-Rfou et al.'s auxiliary losses on (§2.2)."""

    aux_layer_losses: bool = True  # add the LM loss of every intermediate layer (shared head)
    aux_schedule: str = "paper"  # "paper": layer l stops after l/(2n) of training, targets at every layer, summed; "linear-decay": the earlier variant
    aux_total_steps: int = 0  # "paper": the training length the schedule spans; 0 takes the trainer's (set_step)
    aux_layer_decay_steps: int = 0  # "linear-decay": weight max(0, 1 - step / decay_steps); 0 keeps the weight at 1
    n_targets: int = 2  # K: heads predicting the tokens 2 .. K steps ahead (K = 1: the next token only)
    target_weight: float = 0.5  # weight of each extra target's loss (the paper: 0.5)

    def __post_init__(self) -> None:
        super().__post_init__()
        _checks.positive_int("aux_layer_decay_steps", self.aux_layer_decay_steps, allow_zero=True)
        _checks.positive_int("aux_total_steps", self.aux_total_steps, allow_zero=True)
        if self.aux_schedule not in ("paper", "linear-decay"):
            raise ValueError(f"aux_schedule must be 'paper' or 'linear-decay', got {self.aux_schedule!r}")
        _checks.positive_int("n_targets", self.n_targets)
        if not isinstance(self.aux_layer_losses, bool):
            raise TypeError(f"aux_layer_losses must be a bool, got {self.aux_layer_losses!r}")
        if isinstance(self.target_weight, bool) or not isinstance(self.target_weight, (int, float)) or self.target_weight < 0:
            raise ValueError(f"target_weight must be a float >= 0, got {self.target_weight!r}")


@register("model", "al-rfou")
class AlRfouLM(GPT):
    """Deep character-level Transformer LM with intermediate-layer and multiple-target losses (Al-Rfou et al. 2018).

    ``forward``/``generate`` as ``GPT``; in training mode with ``labels`` the loss is the module
    docstring's (``aux`` reports each term).
    """

    config_class = AlRfouConfig
    task_kinds = frozenset({"lm"})  # its forward has no classification head
    # "paper": T64 (§3: 64 layers of width 512, 8 heads, feed-forward 2048, 512 characters of context);
    # "cpu": GPT's, trains on shakespeare-char in minutes on 2 cores
    presets = {"paper": {"n_layers": 64, "d_model": 512, "n_heads": 8, "d_ff": 2048, "max_len": 512},
               "cpu": GPT.presets["cpu"]}
    # the loss fields ``gpt`` configs held, at these values when unused, before this model had its own
    # class: ``GPT.from_config`` drops them unused and builds this model when they are used
    legacy_fields = {"aux_layer_losses": False, "aux_schedule": "paper", "aux_total_steps": 0, "aux_layer_decay_steps": 0,
                     "n_targets": 1, "target_weight": 0.5}

    def context_parallel_refusal(self) -> Optional[str]:
        if self.config.n_targets > 1:
            return (f"with n_targets={self.config.n_targets} a position also predicts the tokens 2 .. "
                    f"{self.config.n_targets} steps ahead, which lie on the next rank at a shard's end "
                    f"(train with --set n_targets=1)")
        return super().context_parallel_refusal()

    def __init__(self, config: AlRfouConfig) -> None:
        super().__init__(config)
        c = config
        # multiple targets: head k - 2 predicts the token k steps ahead, k = 2 .. K
        self.target_heads = nn.ModuleList(nn.Linear(c.d_model, c.vocab_size, bias=False) for _ in range(c.n_targets - 1))
        self.target_heads.apply(init_normal)  # N(0, 0.02), as GPT's layers
        self.step = 0  # current training step, for the intermediate-layer loss schedule (set_step)
        self.total_steps = 0  # the run's length when the trainer tells it (set_step); 0: unknown

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """The trainer's hook: the intermediate-layer losses are scheduled over training."""
        self.step = _checks.positive_int("step", step, allow_zero=True)
        if total_steps is not None:
            self.total_steps = _checks.positive_int("total_steps", total_steps, allow_zero=True)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False,
                state: Optional[StackState] = None, return_state: bool = False) -> ModelOutput:
        """GPT's forward; in training mode with ``labels`` the auxiliary losses are added."""
        if labels is None or not self.training:
            return super().forward(input_ids, labels=labels, need_weights=need_weights, state=state,
                                   return_state=return_state)
        c = self.config
        check_labels("labels", labels, c.vocab_size, getattr(input_ids, "shape", ()))
        layer_aux = c.aux_layer_losses and c.n_layers > 1
        out = self.stack(input_ids, state=state, need_weights=need_weights, return_state=return_state,
                         return_hidden=layer_aux)
        logits = self.lm_head(out.hidden)  # (B, L, V)
        if c.aux_schedule == "paper":
            loss, aux = self._paper_loss(out, logits, labels)
        else:
            loss, aux = self._linear_decay_loss(out, logits, labels, layer_aux)
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, state=out.state, aux=aux, hidden=out.hidden)

    def _paper_loss(self, out: StackOutput, logits: Tensor, labels: Tensor) -> Tuple[Tensor, Dict]:
        """§2.2: every active layer's next-token loss plus 0.5 (target_weight) times its losses for
        the tokens 2 .. K ahead, summed over the active layers."""
        c = self.config
        total_steps = c.aux_total_steps or self.total_steps
        n = c.n_layers
        hidden = list(out.hidden_states[:-1]) if c.aux_layer_losses and n > 1 else []
        layers = [(l, self.stack.final_norm(h)) for l, h in enumerate(hidden, start=1)
                  if layer_loss_active(l, n, self.step, total_steps)]
        layers.append((n, out.hidden))  # the top layer always predicts
        loss = logits.new_zeros((), dtype=torch.float32)
        aux: Dict = {}
        for l, h in layers:
            next_logits = logits if l == n else self.lm_head(h)
            layer_loss = lm_loss(next_logits, labels)
            for k, head in enumerate(self.target_heads, start=2):
                layer_loss = layer_loss + c.target_weight * future_loss(head(h), labels, k)
            loss = loss + layer_loss
            aux[f"loss_layer_{l}"] = layer_loss.detach()
        aux["lm_loss"] = lm_loss(logits.detach(), labels)
        aux["active_layers"] = len(layers)
        return loss, aux

    def _linear_decay_loss(self, out: StackOutput, logits: Tensor, labels: Tensor, layer_aux: bool) -> Tuple[Tensor, Dict]:
        """The earlier variant: the top layer's losses plus the mean of the intermediate layers'
        under one weight ``max(0, 1 - step / aux_layer_decay_steps)``."""
        c = self.config
        loss = lm_loss(logits, labels)
        aux: Dict = {"lm_loss": loss.detach()}
        if c.n_targets > 1:
            # multiple targets: head for k = 2 .. K on the top layer
            extra = [future_loss(head(out.hidden), labels, k) for k, head in enumerate(self.target_heads, start=2)]
            target_loss = torch.stack(extra).sum()
            loss = loss + c.target_weight * target_loss
            aux["target_loss"] = target_loss.detach()
        if layer_aux:
            # intermediate layers: the same LM loss from layers 1 .. N-1
            w = layer_loss_weight(self.step, c.aux_layer_decay_steps)
            if w > 0:
                per_layer = [lm_loss(self.lm_head(self.stack.final_norm(h)), labels) for h in out.hidden_states[:-1]]
                layer_loss = torch.stack(per_layer).mean()
                loss = loss + w * layer_loss
                aux["layer_loss"] = layer_loss.detach()
            aux["layer_weight"] = w
        return loss, aux
