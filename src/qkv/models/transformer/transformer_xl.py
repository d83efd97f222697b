"""Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context", arXiv:1901.02860) and GTrXL (Parisotto et al. 2019, "Stabilizing
Transformers for Reinforcement Learning", arXiv:1910.06764), on the shared stack.

Segment-level recurrence (§3.2): layer ``n`` of segment ``tau + 1`` reads the stop-gradient
memory of the previous segments' inputs to the same layer,

    h~^{n-1}_{tau+1} = [SG(m^{n-1}_tau) o h^{n-1}_{tau+1}]          (concatenation along length)
    q = h^{n-1}_{tau+1} W_q,   k = h~ W_{k,E},   v = h~ W_v
    h^n_{tau+1} = Block(q, k, v)      with relative positions (``attention="relative"``)
    m^{n-1}_{tau+1} = last mem_len positions of h~^{n-1}_{tau+1}

so the receptive field grows by one segment per layer. Relative positions (§3.3) are the
``relative`` kernel; ``u``, ``v`` are one pair owned by the model and shared by every layer (the
authors' code). The memory is a typed state, ``XLMemory``, returned by ``forward`` and passed back
by the caller: nothing is stored on the module. On a stream task (``--set task.stream=true``) the
trainer carries it from one step to the next (``carries_state``) and checkpoints it
(``export_state`` / ``import_state``), so resumed runs are exact.

GTrXL is Transformer-XL with the gated residual wiring ``gru-gate`` (``qkv.blocks.GRUGate``):
layer norm on the sub-layer input only and ``g(x, relu(y))`` in place of each residual sum;
``residual="input-gate"`` / ``"relu-sum"`` select the paper's comparison variants.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ... import _checks
from ...blocks import GatedResidual
from ...registry import register
from ..base import ModelOutput, QKVModel
from ..losses import check_labels, lm_loss
from ..sampling import sample_logits
from .stack import StackConfig, TransformerStack, init_normal

__all__ = ["XLMemory", "TransformerXL", "TransformerXLConfig", "GTrXL", "GTrXLConfig"]


@dataclass(frozen=True)
class XLMemory:
    """Transformer-XL segment memory: per layer ``n``, the last ``m`` inputs ``h^{n-1}``
    ``(B, m, d_model)`` of that layer (layer 0: the embeddings), detached (stop-gradient)."""

    hidden: Tuple[Tensor, ...]

    @property
    def length(self) -> int:
        """Number of remembered positions ``m``."""
        return self.hidden[0].shape[1] if self.hidden else 0


@dataclass
class TransformerXLConfig(StackConfig):
    """A CPU-sized character model (the paper's enwik8 model: 12 layers, d 512, 8 heads, segment and memory 512)."""

    vocab_size: int = 256  # token vocabulary (the task's vocab size when trained from the CLI)
    n_layers: int = 4  # blocks
    d_model: int = 128  # width
    n_heads: int = 4  # heads
    d_ff: int = 512  # feed-forward width
    dropout: float = 0.1  # embedding and residual dropout
    residual: str = "post-ln"  # the paper: LN(x + F(x)); "pre-ln"; GTrXL's "gru-gate" / "input-gate" / "relu-sum"
    positional: str = "none"  # positions enter through the relative kernel, never added to the embeddings
    attention: str = "relative"  # Transformer-XL's kernel (required)
    max_len: int = 128  # the training segment length (a hint only: relative positions work at any length)
    mem_len: int = 128  # m: hidden states kept per layer while training (the paper: = the segment length)
    eval_mem_len: Optional[int] = None  # m at evaluation (None: mem_len); a longer memory than in training works (§4)
    clamp_len: Optional[int] = None  # distances beyond clamp_len use R_clamp_len (None: no clipping)
    tie_embeddings: bool = True  # output projection = token embedding matrix transposed
    share_biases: bool = True  # one (u, v) pair for all layers, as the authors' code (untie_r=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention != "relative":
            raise ValueError(f"attention must be 'relative' for Transformer-XL, got {self.attention!r}")
        if self.positional != "none":
            raise ValueError(f"positional must be 'none' (the relative kernel sees the positions), got {self.positional!r}")
        _checks.positive_int("vocab_size", self.vocab_size)
        _checks.positive_int("mem_len", self.mem_len, allow_zero=True)
        for name in ("eval_mem_len", "clamp_len"):
            if getattr(self, name) is not None:
                _checks.positive_int(name, getattr(self, name), allow_zero=True)
        for name in ("tie_embeddings", "share_biases"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")


@register("model", "transformer-xl", "xl")
class TransformerXL(QKVModel):
    """Transformer-XL language model (Dai et al. 2019): segment memory of detached hidden states + relative attention.

    ``forward(input_ids (B, L), labels=None, state=None, return_state=False, need_weights=False)``
    -> ``ModelOutput(loss, logits (B, L, V), weights [per layer (B, H, L, m + L)], state XLMemory)``.
    ``state`` is the ``XLMemory`` a previous call returned (the previous segment of the same rows).
    """

    config_class = TransformerXLConfig
    suggested_tasks = ("shakespeare-char", "enwiki-bytes")  # `qkv list model`
    task_kinds = frozenset({"lm"})
    input_key = "input_ids"  # token ids
    #: the trainer passes ``state=`` / ``return_state=True`` and keeps ``out.state`` on stream tasks
    carries_state = True
    context_parallel = True  # on batches of their own; the memory carried across segments refuses (the trainer)
    train_defaults = {"steps": 1000, "batch_size": 16, "lr": 1e-3, "warmup": 50, "weight_decay": 0.0}

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__(config)
        c = config
        kernel_kwargs = {**c.attention_kwargs, "mem_len": c.mem_len, "clamp_len": c.clamp_len}
        self.stack = TransformerStack(dataclasses.replace(c, attention_kwargs=kernel_kwargs),
                                      vocab_size=c.vocab_size, causal=True)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(init_normal)  # N(0, 0.02) weights, zero biases
        if c.tie_embeddings:
            self.lm_head.weight = self.stack.embed.token.weight
        if c.share_biases:
            d_head = c.d_model // c.n_heads
            self.u = nn.Parameter(torch.randn(c.n_heads, d_head) * 0.02)  # content bias, all layers
            self.v = nn.Parameter(torch.randn(c.n_heads, d_head) * 0.02)  # position bias, all layers
            for layer in self.stack.layers:
                layer.self_attn.kernel.share_biases(self.u, self.v)

    def memory_length(self) -> int:
        """``m``: ``eval_mem_len`` in eval mode when set, else ``mem_len``."""
        c = self.config
        return c.eval_mem_len if not self.training and c.eval_mem_len is not None else c.mem_len

    def _check_state(self, state: Optional[XLMemory], input_ids: Tensor) -> Optional[XLMemory]:
        if state is None:
            return None
        if not isinstance(state, XLMemory):
            raise TypeError(f"state must be the XLMemory a previous call returned, got {type(state).__name__}")
        if len(state.hidden) != len(self.stack.layers):
            raise ValueError(f"state holds {len(state.hidden)} layers of memory, the model has {len(self.stack.layers)}")
        for n, h in enumerate(state.hidden):
            name = f"state.hidden[{n}]"
            _checks.tensor(name, h, ndim=3, floating=True)
            _checks.same(name, h.shape[0], "input_ids", input_ids.shape[0], "the batch size")
            _checks.same(name, h.shape[2], "d_model", self.config.d_model, "the feature size (dim -1)")
            _checks.same(name, h.shape[1], "state.hidden[0]", state.hidden[0].shape[1], "the remembered positions (dim 1)")
        return state

    def encode(self, input_ids: Tensor, state: Optional[XLMemory] = None, mask: Optional[Tensor] = None,
               need_weights: bool = False, return_state: bool = False
               ) -> Tuple[Tensor, Optional[List[Tensor]], Optional[XLMemory]]:
        """The top hidden states ``(B, L, d_model)`` of ``input_ids (B, L)`` after the memory ``state``.

        ``mask``: self-attention mask over (memory + segment) keys, True = may attend,
        broadcastable to ``(B, H, L, m + L)``. Returns ``(hidden, weights, new_state)``.
        """
        _checks.token_ids("input_ids", input_ids, self.config.vocab_size)
        state = self._check_state(state, input_ids)
        m = self.memory_length()
        x = self.stack.embed(input_ids)  # (B, L, d_model), no absolute positions
        memories = state.hidden if state is not None else (None,) * len(self.stack.layers)
        weights, kept = [], []
        for layer, memory in zip(self.stack.layers, memories):
            if memory is not None and memory.shape[1] == 0:
                memory = None
            if return_state:
                context = x if memory is None else torch.cat([memory, x], dim=1)  # [SG(m) o h], (B, m + L, d)
                kept.append(context[:, max(context.shape[1] - m, 0):].detach())  # SG: no gradient into the memory
            out = layer(x, mask=mask, need_weights=need_weights, prefix=memory)
            x = out.hidden
            weights.append(out.self_weights)
        new_state = XLMemory(tuple(kept)) if return_state else None
        return self.stack.final_norm(x), weights if need_weights else None, new_state

    def forward(self, input_ids: Tensor, labels: Optional[Tensor] = None, state: Optional[XLMemory] = None,
                return_state: bool = False, need_weights: bool = False) -> ModelOutput:
        """Next-token logits for ``input_ids (B, L)`` continuing the segments in ``state``."""
        if labels is not None:
            check_labels("labels", labels, self.config.vocab_size, getattr(input_ids, "shape", ()))
        hidden, weights, new_state = self.encode(input_ids, state, need_weights=need_weights, return_state=return_state)
        logits = self.lm_head(hidden)  # (B, L, V)
        loss = lm_loss(logits, labels) if labels is not None else None
        return ModelOutput(loss=loss, logits=logits, weights=weights, state=new_state, hidden=hidden)

    # -- carried state in checkpoints (the trainer's hooks)

    def export_state(self, state: Optional[XLMemory]) -> Dict[str, Tensor]:
        """The memory as named tensors for a checkpoint (``{}`` for none)."""
        return {} if state is None else {f"memory.{n}": h for n, h in enumerate(state.hidden)}

    def import_state(self, tensors: Dict[str, Tensor]) -> Optional[XLMemory]:
        """Inverse of ``export_state``."""
        if not tensors:
            return None
        try:
            return XLMemory(tuple(tensors[f"memory.{n}"] for n in range(len(self.stack.layers))))
        except KeyError as e:
            raise ValueError(f"saved memory lacks {e.args[0]!r}; it holds {sorted(tensors)}") from None

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> Tensor:
        """Extend ``input_ids (B, L)`` by ``max_new_tokens`` sampled tokens, one at a time after
        the memory of everything before (the last ``memory_length()`` positions per layer)."""
        _checks.token_ids("input_ids", input_ids, self.config.vocab_size)
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids must hold at least one token (the prompt), got length 0")
        _checks.positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
        ids, step, state = input_ids, input_ids, None
        for _ in range(max_new_tokens):
            out = self(step, state=state, return_state=True)
            state = out.state
            step = sample_logits(out.logits[:, -1], temperature, top_k, top_p, generator)[:, None].to(ids.dtype)
            ids = torch.cat([ids, step], dim=1)  # (B, L + t)
        return ids


@dataclass
class GTrXLConfig(TransformerXLConfig):
    """GTrXL (Parisotto et al. 2019): Transformer-XL with the GRU-type gated residual."""

    residual: str = "gru-gate"  # "gru-gate" (GTrXL), "input-gate", "relu-sum" (TrXL-I), or XL's "post-ln"/"pre-ln"
    gate_bias: float = 2.0  # b_g: z = sigmoid(W_z y + U_z x - b_g) starts near 0.12, close to the identity

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.gate_bias, bool) or not isinstance(self.gate_bias, (int, float)):
            raise TypeError(f"gate_bias must be a float, got {self.gate_bias!r}")


@register("model", "gtrxl")
class GTrXL(TransformerXL):
    """GTrXL (Parisotto et al. 2019): Transformer-XL with LN on sub-layer inputs and g = (1 - z) x + z h^ for each residual sum."""

    config_class = GTrXLConfig

    def __init__(self, config: GTrXLConfig) -> None:
        super().__init__(config)
        for module in self.modules():
            if isinstance(module, GatedResidual):
                module.gate_bias = float(config.gate_bias)
