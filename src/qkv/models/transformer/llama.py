"""Llama: the decoder every language model since 2023 is shaped like (Touvron et al. 2023, "LLaMA:
Open and Efficient Foundation Language Models", arXiv:2302.13971; Llama 2, arXiv:2307.09288), a
preset of the shared stack — GPT's decoder with today's parts:

    h_0 = E[ids]                                     (no absolute positions)
    a_l = h_{l-1} + Attn(RMSNorm(h_{l-1}))           rotary q, k (Su et al. 2021); G key/value heads (GQA)
    h_l = a_l + SwiGLU(RMSNorm(a_l))                 (Swish_1(x W) * x V) W2 (Shazeer 2020)
    P(u) = softmax(RMSNorm(h_n) W_out)               W_out = E^T when tie_embeddings

with no biases anywhere. The same decoder with a sliding window is Mistral (Jiang et al. 2023:
``sliding_window``, through the ``window`` kernel), with biases on q/k/v Qwen2 (``qkv_bias``),
with qk-norm Qwen3 (``qk_norm``); ``Llama.from_pretrained`` reads all four from transformers'
checkpoints (``qkv/hf/llama.py``). Every kernel of ``qkv.list_attention()`` runs inside it
(``--attention NAME``); only softmax takes the key/value groups as they are (the others get them
repeated, ``MultiHeadAttention``).

Defaults: SmolLM2-135M's shape (a Llama of 30 layers, width 576, 9 query / 3 key-value heads).
Generation, left padding, the classification head: GPT's (``gpt.py``), with the per-key/value-head cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from torch import Tensor

from ... import _checks
from ...registry import register
from ..base import CHECKPOINT_FORMATS
from .gpt import GPT, GPTConfig

__all__ = ["Llama", "LlamaConfig"]


@dataclass
class LlamaConfig(GPTConfig):
    """SmolLM2-135M by default (HuggingFaceTB 2024; a Llama)."""

    vocab_size: int = 49152  # token vocabulary (the task's vocab size when trained from the CLI)
    max_len: int = 8192  # context length (rotary: no table; a longer sequence is allowed)
    n_layers: int = 30  # blocks
    d_model: int = 576  # width
    n_heads: int = 9  # query heads
    n_kv_heads: Optional[int] = 3  # key/value heads (grouped-query attention); None: n_heads (multi-head)
    d_ff: int = 1536  # SwiGLU hidden width (Llama: about 8/3 d_model)
    dropout: float = 0.0  # no dropout (Llama trains without)
    activation: str = "silu"  # Swish_1, SwiGLU's gate
    glu: bool = True  # the gated feed-forward network (SwiGLU)
    residual: str = "pre-ln"  # x + F(RMSNorm(x)), final RMSNorm
    norm: str = "rmsnorm"  # RMSNorm (Zhang & Sennrich 2019)
    layer_norm_eps: float = 1e-5  # RMSNorm epsilon (transformers' rms_norm_eps)
    positional: str = "rotary"  # rotary positions (Su et al. 2021)
    rope_theta: float = 100000.0  # rotary base (Llama 2: 10000, Llama 3: 500000, SmolLM2: 100000)
    rope_scaling: Dict[str, Any] = field(default_factory=dict)  # transformers' rope_parameters (linear, dynamic, yarn, llama3); {}: none
    bias: bool = False  # no biases in the attention and feed-forward projections
    tie_embeddings: bool = True  # output projection = token embedding matrix transposed (SmolLM2; Llama 2: False)
    sliding_window: Optional[int] = None  # Mistral: a query sees the last sliding_window keys (itself included), the window kernel

    def __post_init__(self) -> None:
        if self.sliding_window is not None:
            _checks.positive_int("sliding_window", self.sliding_window)
            if self.attention not in ("softmax", "window"):
                raise ValueError(f"sliding_window is the window kernel's radius + 1; attention must be 'softmax' or "
                                 f"'window' with it, got {self.attention!r}")
            radius = self.sliding_window - 1  # i - j < sliding_window
            given = self.attention_kwargs.get("radius", radius) if isinstance(self.attention_kwargs, dict) else radius
            if given != radius:
                raise ValueError(f"attention_kwargs radius={given!r} disagrees with sliding_window={self.sliding_window} "
                                 f"(radius = sliding_window - 1)")
            self.attention = "window"
            self.attention_kwargs = {**self.attention_kwargs, "radius": radius}
        super().__post_init__()


@register("model", "llama")
class Llama(GPT):
    """Llama decoder-only language model (Touvron et al. 2023): pre-RMSNorm, rotary, SwiGLU, GQA, no biases.

    ``forward(input_ids (B, L), labels=None (B, L), attention_mask=None (B, L), position_ids=None
    (B, L), state=None, return_state=False)`` -> ``ModelOutput(loss, logits (B, L, V), weights, state)``;
    ``generate`` as GPT's. ``Llama.from_pretrained(DIR)`` also reads transformers' Llama, Mistral,
    Qwen2 and Qwen3 checkpoints; ``save_pretrained(DIR, format="huggingface")`` writes one.
    """

    config_class = LlamaConfig
    suggested_tasks = ("shakespeare-char", "enwiki-bytes")
    # "smollm2-135m": the config's defaults; "cpu": trains on shakespeare-char in minutes on 2 cores
    presets = {"smollm2-135m": {},
               "cpu": {"n_layers": 4, "d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 344, "max_len": 256,
                       "rope_theta": 10000.0, "tie_embeddings": True,
                       "train": {"steps": 600, "batch_size": 32, "lr": 3e-3, "warmup": 50}}}
    default_preset = "cpu"

    @classmethod
    def from_hf(cls, config: Dict[str, Any], state_dict: Dict[str, Tensor], **overrides: Any) -> "Llama":
        """A Llama from a transformers config dict (``config.json``'s contents: ``model_type`` llama,
        mistral, qwen2 or qwen3) and a state dict with transformers' tensor names (``model.layers.0
        .self_attn.q_proj.weight``, ...; a tied ``lm_head.weight`` may be left out) — what
        ``from_pretrained`` reads from a directory, with the same checks (``qkv/hf/llama.py``);
        ``overrides``: config fields that keep the weights' shapes (``attention="linear"``, ...)."""
        return CHECKPOINT_FORMATS["huggingface"].from_state(cls, config, state_dict, **overrides)
