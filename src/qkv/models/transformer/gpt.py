"""GPT: a decoder-only Transformer language model (Radford et al. 2018, "Improving Language
Understanding by Generative Pre-Training"; Radford et al. 2019, GPT-2), on the shared stack.

    h_0 = W_e[U] + W_p            (token + learned position embeddings)
    h_l = block(h_{l-1})          l = 1 .. n   (causal self-attention, pre-LN as in GPT-2)
    P(u) = softmax(LN(h_n) W_e^T) (output tied to the input embedding)

Options from Al-Rfou et al. 2018 (arXiv:1808.04444) for the loss (``qkv.models.losses``):
intermediate-layer losses, layer ``l`` of ``n`` dropped after the fraction ``l / (2n)`` of
training, and extra heads for the tokens 2 .. K steps ahead, each weighted 0.5 and applied at
every layer that predicts; all summed (``aux_schedule="paper"``). ``aux_schedule="linear-decay"``
is an earlier simplification kept as an option: the mean of the intermediate losses times
``max(0, 1 - step / aux_layer_decay_steps)``, extra targets on the top layer only. The schedule
depends on the training step: the trainer calls ``model.set_step(step, total_steps)`` before each
update (step 0 and an unknown length when nobody does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ... import _checks
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..losses import check_labels, future_loss, layer_loss_active, layer_loss_weight, lm_loss
from ..sampling import sample_logits
from .stack import init_normal, StackConfig, StackState, TransformerStack

__all__ = ["GPT", "GPTConfig"]


@dataclass
class GPTConfig(StackConfig):
    """GPT-2 small by default (Radford et al. 2019)."""

    vocab_size: int = 50257  # token vocabulary (the task's vocab size when trained from the CLI)
    max_len: int = 1024  # context length (learned positions)
    n_layers: int = 12  # blocks
    d_model: int = 768  # width
    n_heads: int = 12  # heads
    d_ff: int = 3072  # feed-forward width (4 d_model)
    dropout: float = 0.1  # embedding and residual dropout
    activation: str = "gelu"  # feed-forward activation
    residual: str = "pre-ln"  # GPT-2 wiring: x + F(LN(x)), final LayerNorm
    positional: str = "learned"  # learned absolute positions
    tie_embeddings: bool = True  # output projection = token embedding matrix transposed
    aux_layer_losses: bool = False  # Al-Rfou 2018: add the LM loss of every intermediate layer (shared head)
    aux_schedule: str = "paper"  # "paper": layer l stops after l/(2n) of training, targets at every layer, summed; "linear-decay": the earlier variant
    aux_total_steps: int = 0  # "paper": the training length the schedule spans; 0 takes the trainer's (set_step)
    aux_layer_decay_steps: int = 0  # "linear-decay": weight max(0, 1 - step / decay_steps); 0 keeps the weight at 1
    n_targets: int = 1  # Al-Rfou 2018: K > 1 adds heads predicting the tokens 2 .. K steps ahead
    target_weight: float = 0.5  # weight of each extra target's loss (the paper: 0.5)

    def __post_init__(self) -> None:
        super().__post_init__()
        _checks.positive_int("vocab_size", self.vocab_size)
        _checks.positive_int("aux_layer_decay_steps", self.aux_layer_decay_steps, allow_zero=True)
        _checks.positive_int("aux_total_steps", self.aux_total_steps, allow_zero=True)
        if self.aux_schedule not in ("paper", "linear-decay"):
            raise ValueError(f"aux_schedule must be 'paper' or 'linear-decay', got {self.aux_schedule!r}")
        _checks.positive_int("n_targets", self.n_targets)
        for name in ("tie_embeddings", "aux_layer_losses"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.target_weight, bool) or not isinstance(self.target_weight, (int, float)) or self.target_weight < 0:
            raise ValueError(f"target_weight must be a float >= 0, got {self.target_weight!r}")


@register("model", "gpt")
class GPT(QKVModel):
    """GPT decoder-only language model (Radford et al. 2018/2019) on the shared Transformer stack.

    ``forward(input_ids (B, L), labels=None (B, L), need_weights=False, state=None, return_state=False)``
    -> ``ModelOutput(loss, logits (B, L, V), weights [per layer (B, H, L, N)], state)``.
    """

    config_class = GPTConfig
    suggested_tasks = ('shakespeare-char', 'enwiki-bytes')  # `qkv list model`
    task_kinds = frozenset({"lm"})
    input_key = "input_ids"  # token ids
    stack_class = TransformerStack  # the decoder stack (Universal Transformer: a shared-depth stack)
    # "paper": GPT-2 small (the config's defaults); "cpu": trains on shakespeare-char in minutes on 2 cores
    presets = {"paper": {},
               "cpu": {"n_layers": 4, "d_model": 128, "n_heads": 4, "d_ff": 512, "dropout": 0.0,
                       "train": {"steps": 600, "batch_size": 32, "lr": 3e-3, "warmup": 50}}}
    default_preset = "cpu"

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        c = config
        self.stack = self.stack_class(c, vocab_size=c.vocab_size, causal=True)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        # Al-Rfou 2018 multiple targets: head k - 2 predicts the token k steps ahead, k = 2 .. K
        self.target_heads = nn.ModuleList(nn.Linear(c.d_model, c.vocab_size, bias=False) for _ in range(c.n_targets - 1))
        self.apply(init_normal)  # N(0, 0.02) weights, zero biases (GPT-2)
        if c.tie_embeddings:
            self.lm_head.weight = self.stack.embed.token.weight
        self.step = 0  # current training step, for the intermediate-layer loss schedule (set_step)
        self.total_steps = 0  # the run's length when the trainer tells it (set_step); 0: unknown

    def set_step(self, step: int, total_steps: Optional[int] = None) -> None:
        """Tell the model the current training step (and the run's length): the intermediate-layer
        losses are scheduled over training."""
        self.step = _checks.positive_int("step", step, allow_zero=True)
        if total_steps is not None:
            self.total_steps = _checks.positive_int("total_steps", total_steps, allow_zero=True)

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, need_weights: bool = False,
                state: Optional[StackState] = None, return_state: bool = False) -> ModelOutput:
        """Next-token logits for every position of ``input_ids (B, L)``.

        ``labels (B, L)``: next-token targets (``-100`` ignored). In training mode the loss adds
        the Al-Rfou auxiliary terms the config enables; ``aux_schedule="paper"``::

            loss = sum_{l active} (L_l + target_weight * sum_{k=2..K} L_{l,+k})

        with layer ``l < N`` active while ``step / T < l / (2N)`` (``T`` = ``aux_total_steps`` or
        the trainer's length) and ``N`` always; ``"linear-decay"``::

            loss = L_N + w(step) * mean_{l < N} L_l + target_weight * sum_{k=2..K} L_{N,+k}

        ``L_l`` is the LM loss read from layer ``l`` through the final LayerNorm and the shared head
        (``L_{l,+k}``: through the shared head for ``k`` steps ahead); in eval mode ``loss = L_N``
        (perplexity stays comparable). ``aux`` reports each term.
        ``state``/``return_state``: continue a sequence (KV caches of the kernels).
        """
        c = self.config
        if labels is not None:
            check_labels("labels", labels, c.vocab_size, getattr(input_ids, "shape", ()))
        layer_aux = labels is not None and self.training and c.aux_layer_losses and c.n_layers > 1
        out = self.stack(input_ids, state=state, need_weights=need_weights, return_state=return_state,
                         return_hidden=layer_aux)
        logits = self.lm_head(out.hidden)  # (B, L, V)
        loss, aux = None, {}
        if labels is not None and self.training and c.aux_schedule == "paper" and (layer_aux or c.n_targets > 1):
            loss, aux = self._paper_loss(out, logits, labels)
        elif labels is not None:
            loss = lm_loss(logits, labels)
            aux["lm_loss"] = loss.detach()
            if self.training and c.n_targets > 1:
                # Al-Rfou 2018, multiple targets: head for k = 2 .. K on the top layer
                extra = [future_loss(head(out.hidden), labels, k) for k, head in enumerate(self.target_heads, start=2)]
                target_loss = torch.stack(extra).sum()
                loss = loss + c.target_weight * target_loss
                aux["target_loss"] = target_loss.detach()
            if layer_aux:
                # Al-Rfou 2018, intermediate layers: the same LM loss from layers 1 .. N-1
                w = layer_loss_weight(self.step, c.aux_layer_decay_steps)
                if w > 0:
                    per_layer = [lm_loss(self.lm_head(self.stack.final_norm(h)), labels) for h in out.hidden_states[:-1]]
                    layer_loss = torch.stack(per_layer).mean()
                    loss = loss + w * layer_loss
                    aux["layer_loss"] = layer_loss.detach()
                aux["layer_weight"] = w
        return ModelOutput(loss=loss, logits=logits, weights=out.weights, state=out.state, aux=aux)

    def _paper_loss(self, out, logits: Tensor, labels: Tensor):
        """Al-Rfou et al. 2018 §2.2: every active layer's next-token loss plus 0.5 (target_weight)
        times its losses for the tokens 2 .. K ahead, summed over the active layers."""
        c = self.config
        total_steps = c.aux_total_steps or self.total_steps
        n = c.n_layers
        hidden = list(out.hidden_states[:-1]) if c.aux_layer_losses and n > 1 else []
        layers = [(l, self.stack.final_norm(h)) for l, h in enumerate(hidden, start=1)
                  if layer_loss_active(l, n, self.step, total_steps)]
        layers.append((n, out.hidden))  # the top layer always predicts
        loss = logits.new_zeros((), dtype=torch.float32)
        aux: dict = {}
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

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, use_cache: bool = True,
                 generator: Optional[torch.Generator] = None) -> Tensor:
        """Extend ``input_ids (B, L)`` by ``max_new_tokens`` sampled tokens -> ``(B, L + max_new_tokens)``.

        ``temperature = 0`` decodes greedily; ``top_k``/``top_p`` restrict sampling (``sample_logits``).
        ``use_cache=True`` feeds one token at a time with the kernels' state (KV cache);
        ``use_cache=False`` re-reads the whole sequence each step — same tokens, slower. With
        learned positions a sequence longer than ``max_len`` is continued from its last ``max_len``
        tokens, re-read each step (a sliding context, as in nanoGPT). Runs in the module's current
        mode: call ``model.eval()`` first to turn dropout off.
        """
        c = self.config
        _checks.token_ids("input_ids", input_ids, c.vocab_size)
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids must hold at least one token (the prompt), got length 0")
        _checks.positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
        window = c.max_len if c.positional == "learned" else None
        B, L = input_ids.shape
        ids = input_ids.new_empty(B, L + max_new_tokens)  # filled in place: no per-token copy of the sequence
        ids[:, :L] = input_ids
        state = None
        for n in range(L, L + max_new_tokens):
            seq = ids[:, :n]  # (B, n): the sequence so far (a view)
            if window is not None and n > window:
                # past the learned positions: the context slides, its positions restart at 0, so re-read it
                out, state = self(seq[:, -window:]), None
            elif use_cache:
                out = self(seq if state is None else seq[:, -1:], state=state, return_state=True)
                state = out.state
            else:
                out = self(seq)
            ids[:, n] = sample_logits(out.logits[:, -1], temperature, top_k, top_p, generator).to(ids.dtype)  # (B,)
        return ids
